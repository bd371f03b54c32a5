"""gennstack/system_capacity.py: the system node group's requests against its allocatable."""

from __future__ import annotations

import pytest

from gennstack import system_capacity as sc
from gennstack.config import ConfigError, GenNStackConfig


def test_max_pods_follows_nodeadm_eni_formula():
    """awslabs/amazon-eks-ami v20260714 nodeadm/internal/kubelet/eni_max_pods.go
    calculateStandardMaxPods: ENIs * (IPv4 per ENI - 1) + 2; instance-info.jsonl: m7i.large 3 x 10,
    m7i.xlarge 4 x 15."""
    assert sc.max_pods(sc.SYSTEM_INSTANCES["m7i.large"]) == 29
    assert sc.max_pods(sc.SYSTEM_INSTANCES["m7i.xlarge"]) == 58


@pytest.mark.parametrize(("vcpu", "reserved"), [(1, 60), (2, 70), (4, 80), (8, 90), (16, 110)])
def test_kube_reserved_cpu_follows_nodeadm(vcpu, reserved):
    """awslabs/amazon-eks-ami v20260714 nodeadm/internal/kubelet/config.go getCPUMillicoresToReserve:
    ranges 0/1000/2000/4000/total millicores at 600/100/50/25 basis points."""
    assert sc.kube_reserved_cpu_m(vcpu) == reserved


def test_kube_reserved_memory_follows_nodeadm():
    """awslabs/amazon-eks-ami v20260714 nodeadm/internal/kubelet/config.go getMemoryMebibytesToReserve:
    11 * maxPods + 255."""
    assert sc.kube_reserved_memory_mi(29) == 574
    assert sc.kube_reserved_memory_mi(58) == 893


def test_allocatable_subtracts_kube_reserved_and_eviction():
    """Capacity - kube-reserved - evictionHard memory.available 100Mi (nodeadm config.go v20260714)."""
    assert sc.allocatable("m7i.large") == sc.Requests(2000 - 70, 8192 - 574 - 100)
    assert sc.allocatable("m7i.xlarge") == sc.Requests(4000 - 80, 16384 - 893 - 100)


def test_unknown_instance_type_is_named():
    with pytest.raises(KeyError, match="c7i.large"):
        sc.allocatable("c7i.large")


def test_default_requests_per_component():
    """The sum at defaults (rate limit on, monitoring on on-demand nodes, 2 Envoy replicas, 2 rate-limit
    replicas, stream resume on: 2 routing proxies and 2 relays)."""
    lines = {line.component: line for line in sc.deployments(GenNStackConfig())}
    assert lines["karpenter"].total == sc.Requests(1000, 2048)
    assert lines["envoy-proxy"].total == sc.Requests(2 * 510, 2 * 544)
    assert lines["envoy-gateway"].total == sc.Requests(200, 512)
    assert lines["coredns"].total == sc.Requests(200, 140)
    assert lines["envoy-ratelimit"].total == sc.Requests(2 * 100, 2 * 512)
    assert lines["envoy-proxy (routing Gateway)"].total == sc.Requests(2 * 260, 2 * 544)
    assert lines["resume-relay"].total == sc.Requests(2 * 250, 2 * 256)
    assert "prometheus" not in lines
    assert sc.total(list(lines.values())) == sc.Requests(4540, 8236)
    assert sc.pods(list(lines.values())) == 31
    off = {line.component for line in sc.deployments(GenNStackConfig.model_validate({"gateway": {"resume": {"enabled": False}}}))}
    assert not off & {"envoy-proxy (routing Gateway)", "resume-relay"}


def test_daemonsets_per_node():
    """aws-node (2 x 25m with the network-policy agent), kube-proxy 100m, EBS CSI node 30m/104Mi;
    the pod identity agent and node-exporter request nothing."""
    per_node = sc.daemonsets_per_node()
    assert sc.total(per_node) == sc.Requests(180, 104)
    assert sc.pods(per_node) == 5


def test_worst_case_adds_monitoring_and_scales_with_envoy_replicas():
    config = GenNStackConfig.model_validate({"gateway": {"envoy_replicas": 4}})
    worst = sc.deployments(sc.worst_case(config))
    # the public proxies follow envoy_replicas; the routing ones gateway.resume.routing_replicas (2)
    assert sc.total(worst) == sc.Requests(4540 + 500 + 2 * 510, 8236 + 2048 + 2 * 544)
    assert sc.pods(worst) == 31 + 6 + 2


def _config(**cluster):
    return GenNStackConfig.model_validate({"cluster": cluster})


def test_defaults_fit_with_one_node_down():
    """4 x m7i.large: 1930m - 180m of DaemonSets = 1750m per node; 3 nodes leave 5250m for 4540m."""
    fit = sc.system_fit(GenNStackConfig())
    assert (fit.instance_type, fit.nodes) == ("m7i.large", 4)
    assert fit.room(3) == sc.Requests(3 * 1750, 3 * (7518 - 104))
    assert fit.pod_room(3) == 3 * (29 - 5)
    assert fit.fits(3)
    sc.check_system_fit(GenNStackConfig())


def test_worst_case_fits_at_default_size_with_one_node_down():
    """Every optional system pod on (monitoring on the system nodes, rate limit on, stream resume on): 5040m in 5250m."""
    fit = sc.system_fit(sc.worst_case(GenNStackConfig()))
    assert fit.requested == sc.Requests(5040, 10284)
    assert fit.fits(3)
    sc.check_system_fit(sc.worst_case(GenNStackConfig()))


def test_the_old_default_does_not_fit_with_one_node_down():
    """2 x m7i.large, the previous default: 4540m against 1750m once one node is down (and more than
    the 3500m both leave)."""
    fit = sc.system_fit(_config(system_nodes_min=2))
    assert not fit.fits(2) and not fit.fits(1)
    with pytest.raises(ConfigError) as error:
        sc.check_system_fit(_config(system_nodes_min=2))
    message = str(error.value)
    for part in ("cluster.system_nodes_min: 2 nodes of m7i.large", "4540m CPU", "1 node(s) leave 1750m",
                 "gateway.envoy_replicas=2", "monitoring.placement='on-demand'"):
        assert part in message


def test_envoy_replicas_beyond_the_room_are_rejected():
    """2 more proxies (510m each) overflow 5250m beside the relay and the routing proxies (4540m at the
    defaults); without stream resume 3 more fit; 2 x m7i.xlarge leave 3740m with one down."""
    with pytest.raises(ConfigError, match="gateway.envoy_replicas=4"):
        sc.check_system_fit(GenNStackConfig.model_validate({"gateway": {"envoy_replicas": 4}}))
    sc.check_system_fit(GenNStackConfig.model_validate({"gateway": {"envoy_replicas": 3}}))
    sc.check_system_fit(GenNStackConfig.model_validate({"gateway": {"envoy_replicas": 5, "resume": {"enabled": False}}}))
    fit = sc.system_fit(_config(system_node_instance_types=("m7i.xlarge",), system_nodes_min=2))
    assert fit.room(1) == sc.Requests(3920 - 180, 15391 - 104)


def test_smallest_type_decides():
    fit = sc.system_fit(_config(system_node_instance_types=("m7i.xlarge", "m6i.large")))
    assert fit.instance_type == "m6i.large"


def test_unknown_system_type_is_rejected_with_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"cluster.system_node_instance_types: 'c7i.large' has no capacity.*m7i.large"):
        sc.check_system_fit(_config(system_node_instance_types=("c7i.large",)))


def test_summary_line():
    assert sc.summary_line(sc.system_fit(GenNStackConfig())) == (
        "system nodes: 4 x m7i.large; pods request 4540m CPU / 8236Mi of 7000m / 29656Mi left after DaemonSets "
        "(5250m / 22242Mi with one node down)")


def test_build_app_rejects_a_system_group_too_small_before_any_construct(monkeypatch):
    """app.build_app runs the check after reading the config and before the stack exists."""
    import gennstack_infra.app as app_module

    created = []
    monkeypatch.setattr(app_module, "GenNStack", lambda *a, **k: created.append(1))
    with pytest.raises(ConfigError, match="cluster.system_nodes_min: 2 nodes of m7i.large"):
        app_module.build_app(context={"gennstack": {"cluster": {"system_nodes_min": 2}}})
    assert created == []


def test_chart_defaults_as_read_at_the_pinned_tags():
    """Upstream defaults, read at the tags gennstack/versions.py pins:
    envoyproxy/gateway v1.8.3 charts/gateway-helm/values.tmpl.yaml (controller 100m/256Mi) and
    api/v1alpha1/shared_types.go (rate limit 100m/512Mi, shutdown manager 10m/32Mi);
    kedacore/charts v2.20.2 keda/values.yaml (100m/100Mi per component);
    kubernetes-sigs/metrics-server chart 3.14.0 charts/metrics-server/values.yaml (100m/200Mi);
    kubernetes-sigs/aws-ebs-csi-driver helm-chart-aws-ebs-csi-driver-2.64.0 values.yaml, controller.yaml,
    _node.tpl (10m/40Mi, sidecars 10m/32Mi); aws/amazon-vpc-cni-k8s v1.23.0 values.yaml (25m);
    no requests: aws-load-balancer-controller v3.5.0, ai-gateway-helm v1.1.0, external-secrets 2.9.0,
    kube-prometheus-stack 88.3.0 (operator, alertmanager), kube-state-metrics 8.2.0,
    prometheus-node-exporter 4.56.1, YACE 0.47.0, grafana 12.10.4, eks-pod-identity-agent."""
    figures = {name: (d.requests.cpu_m, d.requests.memory_mi) for name, d in sc.CHART_DEFAULTS.items()}
    assert figures == {
        "aws-load-balancer-controller": (0, 0),
        "envoy-gateway": (100, 256),
        "envoy-shutdown-manager": (10, 32),
        "envoy-ratelimit": (100, 512),
        "ai-gateway-controller": (0, 0),
        "external-secrets": (0, 0),
        "keda": (100, 100),
        "metrics-server": (100, 200),
        "ebs-csi-controller": (50, 192),
        "ebs-csi-node": (30, 104),
        "vpc-cni": (50, 0),
        "pod-identity-agent": (0, 0),
        "kube-proxy": (100, 0),
        "coredns": (100, 70),
        "grafana": (0, 0),
        "prometheus-operator": (0, 0),
        "alertmanager": (0, 0),
        "kube-state-metrics": (0, 0),
        "node-exporter": (0, 0),
        "yace": (0, 0),
    }
    assert "not pinned" in sc.CHART_DEFAULTS["kube-proxy"].source
    assert all("no requests" in d.source for d in sc.CHART_DEFAULTS.values() if d.requests == sc.ZERO)


def test_rate_limit_service_runs_two_replicas_counted_and_readme_says_the_sums():
    """Envoy Gateway's rate-limit service: the replicas the Envoy Gateway values ask for
    (provider.kubernetes.rateLimitDeployment.replicas, with rateLimitPDB minAvailable 1) are the
    ones counted; none without the rate limit. docs/compute.md's figures are this model's."""
    from pathlib import Path

    from gennstack.gateway import values as gw

    config = GenNStackConfig()
    provider = gw.envoy_gateway_values(config.gateway)["config"]["envoyGateway"]["provider"]["kubernetes"]
    assert provider["rateLimitDeployment"]["replicas"] == gw.RATE_LIMIT_REPLICAS == 2
    assert provider["rateLimitPDB"] == {"minAvailable": 1}
    lines = {line.component: line for line in sc.deployments(config)}
    assert lines["envoy-ratelimit"].replicas == gw.RATE_LIMIT_REPLICAS
    off = GenNStackConfig.model_validate({"gateway": {"rate_limit": {"enabled": False}}})
    assert "envoy-ratelimit" not in {line.component for line in sc.deployments(off)}
    fit, worst = sc.system_fit(config), sc.system_fit(sc.worst_case(config))
    room = fit.room(fit.nodes - 1)
    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "compute.md").read_text().split())
    assert (f"at the defaults {fit.requested.cpu_m}m CPU / {fit.requested.memory_mi}Mi of the {room.cpu_m}m / "
            f"{room.memory_mi}Mi three m7i.large nodes leave after DaemonSets, and {worst.requested.cpu_m}m / "
            f"{worst.requested.memory_mi}Mi with `monitoring.placement: system`") in readme
