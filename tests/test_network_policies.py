"""Who may reach whom: the NetworkPolicies GenNStack renders, evaluated over every pod of the system.

The serving, gateway and bench charts are rendered with the real helm (with the values CDK builds),
the monitoring namespace's policies are the manifests the stack applies; every NetworkPolicy is
validated against Kubernetes 1.36's schema. Then tests/netpol.py (the NetworkPolicy v1 semantics)
decides, for each pair of endpoints and port in the tables below, allowed or denied, and the tables
are the intended matrix (docs/security.md, "Network policies"). The pods carry the labels of their
rendered pod templates plus those the controllers add (KubeRay v1.7.0's ray.io/*, LWS v0.10.0's
leaderworkerset.sigs.k8s.io/*, the Job controller's job-name); the peers outside GenNStack's charts
carry their upstream labels (gennstack/network_policy.py).

There is no CNI here: no real program enforces these policies locally. What the VPC CNI's agent
does differently from the specification (named ports, egress before DNAT, the node's own traffic)
is kept out of the policies, and the tests assert that too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import count

import pytest

from tests.gateway.conftest import RELAY_IMAGE
from gennstack import network_policy
from gennstack.config import load_config
from gennstack.gateway.config import routing_table
from gennstack.gateway.values import RATE_LIMIT_POD_LABELS, gateway_chart_values
from gennstack.observability.names import MONITORING_LABEL, MONITORING_NAMESPACE
from tests import helm
from tests.k8s_schema import validate
from tests.netpol import Endpoint, UnsupportedPolicy, allowed, network_policies, selects
from tests.serving.conftest import CHART as SERVING_CHART, NAMESPACE as SERVING, cdk_values
from tests.support import ROOT

pytestmark = pytest.mark.slow

GATEWAY_CHART = ROOT / "assets" / "charts" / "gennstack-gateway"
BENCH_CHART = ROOT / "assets" / "charts" / "gennstack-bench"
SPARES = f"{SERVING}-group-spares"
CONTEXT = {"serving": {"multi_node": {"enabled": True}, "staging": True}}
VPC = "10.0.0.0/16"
_ips = count(10)


def _pod_ip() -> str:
    n = next(_ips)
    return f"10.0.{128 + n // 250}.{n % 250 + 1}"


def _pod(name: str, namespace: str, labels: dict[str, str]) -> Endpoint:
    return Endpoint(name, _pod_ip(), namespace, dict(labels))


def _rendered() -> tuple[list[dict], list[dict], list[dict]]:
    config = load_config(CONTEXT)
    serving_values = cdk_values(CONTEXT, config.serving)
    serving_values["multiNode"]["replicas"] = 2  # two groups, so a group's isolation from another shows
    serving = helm.render(SERVING_CHART, serving_values, namespace=SERVING, release="gennstack-serving")
    gateway = config.gateway
    gateway_objects = helm.render(GATEWAY_CHART, gateway_chart_values(
        gateway, routing_table(gateway, set(config.generations.enabled())), region="us-east-1",
        resume_image=RELAY_IMAGE, api_keys_secret_name="k", redis_secret_name="r"), namespace=gateway.namespace, release="gennstack-gateway")
    bench = helm.render(BENCH_CHART, {
        "image": {"repository": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gennstack-bench"},
        "target": {"baseUrl": "https://envoy-gennstack-gateway.envoy-gateway-system.svc.cluster.local/v1",
                   "model": "llama-3-70b-instruct"},
        "results": {"s3Uri": "s3://gennstack-results/bench"}}, namespace=gateway.namespace, release="bench")
    return serving, gateway_objects, bench


def _pods_of(obj: dict, namespace: str) -> Iterator[tuple[str, dict[str, str]]]:
    """(name, labels) of the pods a workload makes, with the labels its controller adds."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Deployment":
        yield name, obj["spec"]["template"]["metadata"]["labels"]
    elif kind == "Job":
        yield name, {**obj["spec"]["template"]["metadata"]["labels"], "batch.kubernetes.io/job-name": name, "job-name": name}
    elif kind == "RayService":
        cluster = obj["spec"]["rayClusterConfig"]
        # KubeRay v1.7.0 labelPod: its labels first, the template's override them (not node-type/group/cluster).
        ray = {"ray.io/is-ray-node": "yes", "ray.io/cluster": f"{name}-x7k2p", "app.kubernetes.io/name": "kuberay",
               "app.kubernetes.io/created-by": "kuberay-operator"}
        yield f"{name}/head", {**ray, **cluster["headGroupSpec"]["template"]["metadata"]["labels"],
                               "ray.io/node-type": "head", "ray.io/group": "headgroup"}
        for group in cluster["workerGroupSpecs"]:
            yield f"{name}/{group['groupName']}", {**ray, **group["template"]["metadata"]["labels"],
                                                    "ray.io/node-type": "worker", "ray.io/group": group["groupName"]}
    elif kind == "LeaderWorkerSet":
        template = obj["spec"]["leaderWorkerTemplate"]
        for group in range(int(obj["spec"]["replicas"]) or 1):
            lws = {"leaderworkerset.sigs.k8s.io/name": name, "leaderworkerset.sigs.k8s.io/group-index": str(group),
                   "leaderworkerset.sigs.k8s.io/group-key": f"key{group}"}
            yield f"{name}/{group}/leader", {**template["leaderTemplate"]["metadata"]["labels"], **lws,
                                             "leaderworkerset.sigs.k8s.io/worker-index": "0"}
            yield f"{name}/{group}/worker", {**template["workerTemplate"]["metadata"]["labels"], **lws,
                                             "leaderworkerset.sigs.k8s.io/worker-index": "1"}


@pytest.fixture(scope="module")
def system() -> tuple[list[dict], dict[str, Endpoint]]:
    serving, gateway, bench = _rendered()
    config = load_config(CONTEXT)
    policies = (network_policies(serving, SERVING) + network_policies(gateway, config.gateway.namespace)
                + network_policies(bench, config.gateway.namespace)
                + network_policy.monitoring_policies(vpc_cidr=VPC, labels=MONITORING_LABEL))
    pods: dict[str, Endpoint] = {}
    for objects, default_namespace in ((serving, SERVING), (gateway, config.gateway.namespace),
                                       (bench, config.gateway.namespace)):
        for obj in objects:
            namespace = obj["metadata"].get("namespace", default_namespace)
            for name, labels in _pods_of(obj, namespace):
                pods[name] = _pod(name, namespace, labels)
    # Pods of the upstream charts, with their upstream labels (gennstack/network_policy.py).
    for name, namespace, labels in (
        ("envoy-proxy", network_policy.ENVOY_GATEWAY_NAMESPACE,
         {**network_policy.PROXY_POD_LABELS, "gateway.envoyproxy.io/owning-gateway-name": "gennstack-gateway"}),
        # the routing Gateway's proxies behind the stream-resume relay (templates/resume-routing.yaml)
        ("envoy-proxy-routing", network_policy.ENVOY_GATEWAY_NAMESPACE,
         {**network_policy.PROXY_POD_LABELS, "gateway.envoyproxy.io/owning-gateway-name": "gennstack-gateway-routing"}),
        ("envoy-ratelimit", network_policy.ENVOY_GATEWAY_NAMESPACE, RATE_LIMIT_POD_LABELS),
        ("envoy-gateway-controller", network_policy.ENVOY_GATEWAY_NAMESPACE, {"app.kubernetes.io/name": "gateway-helm"}),
        ("prometheus", MONITORING_NAMESPACE, {**network_policy.PROMETHEUS_POD_LABELS, "prometheus": "gennstack-monitoring-prometheus"}),
        ("alertmanager", MONITORING_NAMESPACE, {**network_policy.ALERTMANAGER_POD_LABELS, "alertmanager": "gennstack-monitoring-alertmanager"}),
        ("grafana", MONITORING_NAMESPACE, {"app.kubernetes.io/name": "grafana"}),
        ("kube-state-metrics", MONITORING_NAMESPACE, {"app.kubernetes.io/name": "kube-state-metrics"}),
        ("prometheus-operator", MONITORING_NAMESPACE, network_policy.KPS_OPERATOR_POD_LABELS),
        ("keda-operator", network_policy.KEDA_NAMESPACE, {"app": "keda-operator"}),
        ("kuberay-operator", "kuberay-system", network_policy.KUBERAY_OPERATOR_POD_LABELS),
        ("coredns", "kube-system", {"k8s-app": "kube-dns", "eks.amazonaws.com/component": "coredns"}),
        ("other-workload", "default", {"app": "anything"}),
    ):
        pods[name] = _pod(name, namespace, labels)
    for name, ip in (
        ("s3", "52.216.8.100"),                     # an S3 address, through the VPC's gateway endpoint
        ("internet", "140.82.112.3"),               # any other public address, through NAT
        ("pod-identity-agent", "169.254.170.23"),
        ("imds", "169.254.169.254"),
        ("api-server", "172.20.0.1"),               # the `kubernetes` Service's ClusterIP (before DNAT)
        ("api-server-eni", "10.0.0.50"),            # the control plane's network interface in the VPC
        ("interface-endpoint", "10.0.64.10"),       # e.g. Secrets Manager's, private DNS
        ("gateway-service", "172.20.45.6"),         # a ClusterIP on 443 (the proxies' Service, a webhook's)
        ("node", "10.0.32.5"),                      # another node (kubelet 10250, node-exporter 9100)
    ):
        pods[name] = Endpoint(name, ip)
    return policies, pods


SERVERS = ("gen3-g6e", "gen2-trn2", "gen1-inf2/inf2", "gen3-g6e-multinode/0/leader")
RAY_PORTS = (6379, 8265, 10001, 52365, 10002, 19999, 41234)  # GCS, dashboard, client, agent, workers, a random one

ALLOWED = [
    # the gateway's proxies to every server's port 8000
    *[("envoy-proxy", server, 8000) for server in SERVERS],
    # Prometheus scrapes vLLM (8000) and gen1's Ray (8080)
    ("prometheus", "gen3-g6e", 8000), ("prometheus", "gen2-trn2", 8000), ("prometheus", "gen3-g6e-multinode/1/leader", 8000),
    ("prometheus", "gen1-inf2/head", 8080), ("prometheus", "gen1-inf2/inf2", 8080),
    # KubeRay deploys gen1's Serve app through the head's dashboard
    ("kuberay-operator", "gen1-inf2/head", 8265),
    # one Ray cluster: every port both ways; its head to its GCS store
    *[("gen1-inf2/inf2", "gen1-inf2/head", port) for port in RAY_PORTS],
    *[("gen1-inf2/head", "gen1-inf2/inf2", port) for port in RAY_PORTS],
    ("gen1-inf2/head", "gen1-inf2-redis", 6379),
    # one multi-node group: every port both ways
    *[("gen3-g6e-multinode/0/worker", "gen3-g6e-multinode/0/leader", port) for port in RAY_PORTS],
    *[("gen3-g6e-multinode/1/leader", "gen3-g6e-multinode/1/worker", port) for port in RAY_PORTS],
    # S3 and credentials for whoever reads or writes the buckets
    *[(pod, "s3", 443) for pod in (*SERVERS, "gen1-inf2-warm-spare", "gen2-trn2-warm-spare")],
    *[(pod, "pod-identity-agent", 80) for pod in (*SERVERS, "gen1-inf2-warm-spare")],
    # the Kubernetes API for the stage and compile Jobs, gen1's autoscaler, the release sidecars
    ("gen1-inf2/head", "api-server", 443), ("gen3-g6e", "api-server", 443), ("gen1-inf2/inf2", "api-server", 443),
    # the stage Jobs: the Hub and Secrets Manager's interface endpoint, 443
    ("stage:gen3-g6e", "internet", 443), ("stage:gen3-g6e", "interface-endpoint", 443), ("stage:gen3-g6e", "api-server", 443),
    ("stage:gen3-g6e", "s3", 443), ("stage:gen2-trn2", "pod-identity-agent", 80),
    ("compile:gen2-trn2", "api-server", 443), ("compile:gen2-trn2", "s3", 443),
    # monitoring inside itself, KEDA to Prometheus, the API server to the operator's webhook
    ("prometheus", "alertmanager", 9093), ("grafana", "prometheus", 9090), ("prometheus", "kube-state-metrics", 8080),
    ("keda-operator", "prometheus", 9090), ("api-server-eni", "prometheus-operator", 10250),
    # the rate-limit Redis from Envoy Gateway's rate-limit pods
    ("envoy-ratelimit", "gennstack-gateway-redis", 6379),
    # the bench Job to the gateway and to S3
    ("bench", "envoy-proxy", 443), ("bench", "s3", 443), ("bench", "pod-identity-agent", 80),
    # stream resume: the public proxies to the relay, the relay to the routing proxies, those to every server;
    # Prometheus scrapes the relay and the routing proxies
    ("envoy-proxy", "gennstack-gateway-resume", 8080), ("gennstack-gateway-resume", "envoy-proxy-routing", 8080),
    *[("envoy-proxy-routing", server, 8000) for server in SERVERS],
    ("prometheus", "gennstack-gateway-resume", 9464), ("prometheus", "envoy-proxy-routing", 19001),
]

DENIED = [
    # no server reaches another generation's server, or a multi-node leader
    ("gen3-g6e", "gen2-trn2", 8000), ("gen2-trn2", "gen3-g6e", 8000), ("gen3-g6e", "gen1-inf2/inf2", 8000),
    ("gen3-g6e", "gen3-g6e-multinode/0/leader", 8000), ("gen3-g6e-multinode/0/leader", "gen2-trn2", 8000),
    ("gen2-trn2-warm-spare", "gen3-g6e", 8000),
    # no server reaches Alertmanager (silences), Prometheus (queries), Grafana
    *[(server, target, port) for server in SERVERS
      for target, port in (("alertmanager", 9093), ("prometheus", 9090), ("grafana", 3000))],
    # nobody outside gen1's Ray cluster reaches its control plane or its GCS store
    *[(pod, "gen1-inf2/head", port) for pod in ("gen3-g6e", "gen2-trn2", "gen3-g6e-multinode/0/leader", "bench",
                                                 "other-workload", "gen1-inf2-warm-spare", "stage:gen1-inf2")
      for port in (6379, 8265, 10001)],
    ("envoy-proxy", "gen1-inf2/head", 8265), ("prometheus", "gen1-inf2/head", 8265),
    ("gen1-inf2/inf2", "gen1-inf2-redis", 6379), ("gen3-g6e", "gen1-inf2-redis", 6379),
    # no multi-node group reaches another's Ray, nor any other pod a group's
    *[("gen3-g6e-multinode/0/leader", "gen3-g6e-multinode/1/worker", port) for port in RAY_PORTS],
    *[("gen3-g6e", "gen3-g6e-multinode/0/worker", port) for port in (6379, 41234)],
    ("gen1-inf2/inf2", "gen3-g6e-multinode/0/leader", 6379),
    # the proxies only on 8000; Prometheus never on gen1's Serve port
    ("envoy-proxy", "gen3-g6e", 9999), ("prometheus", "gen1-inf2/inf2", 8000),
    # the rest of the cluster reaches no server, no monitoring API
    *[(pod, target, port) for pod in ("other-workload", "bench")
      for target, port in (("gen3-g6e", 8000), ("gen1-inf2/inf2", 8000), ("alertmanager", 9093), ("prometheus", 9090))],
    ("envoy-proxy", "alertmanager", 9093),
    # servers: no plain HTTP out, no IMDS, no node, no in-VPC endpoint, nothing in the gateway's namespace
    *[(server, target, port) for server in SERVERS
      for target, port in (("internet", 80), ("imds", 80), ("node", 10250), ("interface-endpoint", 443),
                           ("gennstack-gateway-redis", 6379), ("envoy-proxy", 443), ("gateway-service", 443))],
    # the API server only for those that call it
    ("gen3-g6e-multinode/0/leader", "api-server", 443), ("gen3-g6e-warm-spare", "api-server", 443),
    ("gen1-inf2-redis", "api-server", 443), ("gen1-inf2-redis", "s3", 443), ("gen1-inf2/head", "s3", 443),
    # idle warm-spare groups: nothing in or out
    *[(a, b, 443) for a, b in (("gen3-g6e-multinode-warm-spare/0/leader", "s3"),
                               ("gen3-g6e-multinode-warm-spare/0/leader", "api-server"),
                               ("envoy-proxy", "gen3-g6e-multinode-warm-spare/0/leader"))],
    ("gen3-g6e-multinode-warm-spare/0/leader", "coredns", 53),
    # the gateway's Redis: only the rate-limit pods, and it calls nothing
    ("envoy-proxy", "gennstack-gateway-redis", 6379), ("gennstack-gateway-redis", "internet", 443),
    ("gennstack-gateway-redis", "coredns", 53),
    # the bench pod takes no connection
    ("other-workload", "bench", 8080),
    # the routing proxies check no API key: only the relay reaches them, nobody reaches the relay but the
    # public proxies, and the relay reaches nothing else (no server directly, no internet)
    *[(pod, "envoy-proxy-routing", 8080) for pod in ("other-workload", "bench", "gen3-g6e", "envoy-proxy")],
    *[(pod, "gennstack-gateway-resume", 8080) for pod in ("other-workload", "bench", "gen3-g6e", "envoy-proxy-routing")],
    ("gennstack-gateway-resume", "gen3-g6e", 8000), ("gennstack-gateway-resume", "internet", 443),
    ("gennstack-gateway-resume", "envoy-proxy", 443), ("gennstack-gateway-resume", "gennstack-gateway-redis", 6379),
]


def _endpoint(pods: dict[str, Endpoint], name: str) -> Endpoint:
    if name.startswith(("stage:", "compile:")):
        role, pool = name.split(":")
        prefix = f"{pool}-{role}-"
        return next(p for n, p in pods.items() if n.startswith(prefix) and not n.startswith(f"{pool}-multinode"))
    if name == "bench":
        return next(p for p in pods.values() if p.labels.get("app.kubernetes.io/component") == "benchmark")
    return pods[name]


@pytest.mark.parametrize(("source", "destination", "port"), ALLOWED, ids=lambda v: str(v))
def test_the_system_s_flows_are_allowed(system, source, destination, port) -> None:
    policies, pods = system
    assert allowed(policies, _endpoint(pods, source), _endpoint(pods, destination), port)


@pytest.mark.parametrize(("source", "destination", "port"), DENIED, ids=lambda v: str(v))
def test_everything_else_is_denied(system, source, destination, port) -> None:
    policies, pods = system
    assert not allowed(policies, _endpoint(pods, source), _endpoint(pods, destination), port)


def test_every_pod_of_gennstack_s_namespaces_resolves_names_but_the_idle_and_the_redis_ones(system) -> None:
    policies, pods = system
    dns = pods["coredns"]
    for pod in pods.values():
        if pod.namespace not in (SERVING, SPARES, "gennstack-gateway"):
            continue
        # the relay resolves the routing proxies' Service
        expected = pod.namespace == SERVING or pod.labels.get("app.kubernetes.io/component") in ("benchmark", "resume-relay")
        for protocol in ("UDP", "TCP"):
            assert allowed(policies, pod, dns, 53, protocol) is expected, (pod.name, protocol)


def test_every_pod_of_gennstack_s_namespaces_is_selected_by_a_default_deny(system) -> None:
    """A pod no policy selects is open both ways: every pod GenNStack runs is isolated in both directions."""
    policies, pods = system
    for pod in pods.values():
        if pod.namespace in (SERVING, SPARES, "gennstack-gateway"):
            for direction in ("Ingress", "Egress"):
                assert any(p["metadata"]["namespace"] == pod.namespace and direction in p["spec"]["policyTypes"]
                           and selects(p["spec"]["podSelector"], pod.labels) for p in policies), (pod.name, direction)
    assert {pod.namespace for pod in pods.values()} >= {SERVING, SPARES, "gennstack-gateway", MONITORING_NAMESPACE}


def test_a_server_reaches_the_internet_on_443_as_it_reaches_s3(system) -> None:
    """The documented trade-off (docs/security.md): NetworkPolicy cannot name S3, whose addresses
    are public ones; egress on 443 to every address outside the VPC lets a server reach S3, and
    through NAT any other HTTPS host. networkPolicy.s3Cidrs narrows it to S3's ranges."""
    policies, pods = system
    for server in SERVERS:
        assert allowed(policies, pods[server], pods["internet"], 443)
    serving, _, _ = _rendered_with({"networkPolicy": {"s3Cidrs": ["52.216.0.0/15"]}})
    narrowed = network_policies(serving, SERVING)
    for server in SERVERS:
        assert allowed(narrowed, pods[server], pods["s3"], 443)
        assert not allowed(narrowed, pods[server], pods["internet"], 443)


def _rendered_with(overrides: dict) -> tuple[list[dict], None, None]:
    from tests.serving.conftest import merged
    config = load_config(CONTEXT)
    values = merged(cdk_values(CONTEXT, config.serving), overrides)
    return helm.render(SERVING_CHART, values, namespace=SERVING, release="gennstack-serving"), None, None


def test_no_pod_gets_one_cidr_with_two_different_excepts(system) -> None:
    """The VPC CNI's agent merges the entries of every policy that selects a pod into one map keyed by
    CIDR, appending the `except` lists (aws/aws-network-policy-agent v1.4.1
    pkg/fwruleprocessor/fw_rule_processor.go ComputeMapEntriesFromEndpointRules: "firewallRule.Except =
    append(firewallRule.Except, existingFirewallRuleInfo.Except...)"), where the specification takes the
    union of the rules: one rule's `except` would then cut into another's allow. So no pod may be
    selected by two rules with the same CIDR and different excepts."""
    policies, pods = system
    for pod in pods.values():
        if pod.namespace is None:
            continue
        for direction, key, peers_key in (("Ingress", "ingress", "from"), ("Egress", "egress", "to")):
            excepts: dict[str, set[tuple[str, ...]]] = {}
            for policy in policies:
                if policy["metadata"]["namespace"] != pod.namespace or not selects(policy["spec"]["podSelector"], pod.labels):
                    continue
                for rule in policy["spec"].get(key) or []:
                    for peer in rule.get(peers_key) or []:
                        if "ipBlock" in peer:
                            block = peer["ipBlock"]
                            excepts.setdefault(block["cidr"], set()).add(tuple(sorted(block.get("except") or [])))
            assert all(len(v) == 1 for v in excepts.values()), (pod.name, direction, excepts)


def test_every_policy_validates_and_names_ports_by_number(system) -> None:
    """Named ports: aws/amazon-network-policy-controller-k8s v1.1.7 pkg/resolvers/endpoints.go skips
    them for ipBlock peers (convertToPolicyInfoPortForCIDRs) and resolves them per pod otherwise. The
    EKS user guide (eks-networking-add-ons.adoc, cni-network-policy-considerations): "The maximum
    number of unique combinations of ports for each protocol in each ingress: or egress: selector in
    a network policy is 24"."""
    policies, _ = system
    assert len(policies) >= 15
    for policy in policies:
        validate({k: v for k, v in policy.items()})
        for direction in ("ingress", "egress"):
            for rule in policy["spec"].get(direction) or []:
                ports = rule.get("ports") or []
                assert all(isinstance(p["port"], int) for p in ports), policy["metadata"]["name"]
                assert len({(p.get("protocol", "TCP"), p["port"]) for p in ports}) <= 24


def test_the_api_server_address_is_the_clusters_own_when_helm_can_look_it_up() -> None:
    """helm `lookup` returns nothing under `helm template`: the fallback is EKS's two default service
    ranges' first address (gennstack/network_policy.py). The template reads the live
    `kubernetes` Service when it can (a CIDR of one address, /32 or /128)."""
    text = (SERVING_CHART / "templates" / "networkpolicies.yaml").read_text()
    assert 'lookup "v1" "Service" "default" "kubernetes"' in text
    serving, _, _ = _rendered_with({})
    api = next(p for p in serving if p["metadata"]["name"] == "gennstack-serving-api-server")
    assert [peer["ipBlock"]["cidr"] for peer in api["spec"]["egress"][0]["to"]] == list(network_policy.API_SERVER_FALLBACK_CIDRS)


def test_off_renders_no_policy_but_the_redis_one() -> None:
    """cluster.network_policies false: no default-deny anywhere (gen1's Redis keeps its own policy)."""
    context = {**CONTEXT, "cluster": {"network_policies": False}}
    config = load_config(context)
    values = cdk_values(context, config.serving)
    assert values["networkPolicy"]["enabled"] is False
    names = {p["metadata"]["name"] for p in network_policies(
        helm.render(SERVING_CHART, values, namespace=SERVING), SERVING)}
    assert names == {"gen1-inf2-redis"}
    gateway = config.gateway
    gateway_values = gateway_chart_values(gateway, routing_table(gateway, set(config.generations.enabled())),
                                          region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name="k", redis_secret_name="r",
                                          network_policies=False)
    names = {p["metadata"]["name"] for p in network_policies(helm.render(GATEWAY_CHART, gateway_values,
                                                                         namespace=gateway.namespace, release="gennstack-gateway"),
                                                             gateway.namespace)}
    assert names == {"gennstack-gateway-redis"}


def test_the_bench_job_may_use_its_target_s_own_port() -> None:
    objects = helm.render(BENCH_CHART, {
        "image": {"repository": "r"}, "target": {"baseUrl": "http://gateway.gennstack.svc.cluster.local/v1", "model": "m"},
        "results": {"s3Uri": "s3://gennstack-results/bench"}}, namespace="bench")
    [policy] = network_policies(objects, "bench")
    ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule.get("ports", [])}
    assert ports == {53, 443, 80}
    pod = Endpoint("bench", "10.0.200.1", "bench", policy["spec"]["podSelector"]["matchLabels"])
    assert allowed([policy], pod, Endpoint("gateway", "10.0.201.1"), 80)
    assert not allowed([policy], pod, Endpoint("gateway", "10.0.201.1"), 8080)


# --- the evaluator itself, on the specification's own examples ---------------------------------


def _np(namespace: str, spec: dict) -> dict:
    return {"kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": namespace}, "spec": spec}


def test_evaluator_semantics() -> None:
    a = Endpoint("a", "10.1.0.1", "ns", {"app": "a"})
    b = Endpoint("b", "10.1.0.2", "ns", {"app": "b"})
    other = Endpoint("o", "10.1.0.3", "other", {"app": "a"})
    outside = Endpoint("x", "8.8.8.8")
    # no policy: open
    assert allowed([], a, b, 80)
    # an ingress-only policy isolates ingress, never egress (policyTypes defaults to Ingress)
    deny_in = _np("ns", {"podSelector": {"matchLabels": {"app": "b"}}})
    assert not allowed([deny_in], a, b, 80) and allowed([deny_in], b, a, 80)
    # allow rules are a union; a podSelector peer is the policy's namespace only
    from_a = _np("ns", {"podSelector": {"matchLabels": {"app": "b"}}, "ingress": [
        {"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": 80}]}]})
    assert allowed([deny_in, from_a], a, b, 80) and not allowed([deny_in, from_a], a, b, 81)
    assert not allowed([deny_in, from_a], other, b, 80)
    assert not allowed([deny_in, from_a], a, b, 80, "UDP")
    # egress: ipBlock with except; endPort ranges
    out = _np("ns", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}], "ports": [{"port": 443, "endPort": 445}]}]})
    assert allowed([out], a, outside, 444) and not allowed([out], a, outside, 446) and not allowed([out], a, b, 443)
    # a namespaceSelector with a podSelector: both must match
    cross = _np("ns", {"podSelector": {}, "ingress": [{"from": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}},
        "podSelector": {"matchLabels": {"app": "z"}}}]}]})
    assert not allowed([cross], other, a, 80)
    # a named port is refused (the VPC CNI would skip it for an ipBlock peer)
    named = _np("ns", {"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]})
    with pytest.raises(UnsupportedPolicy):
        allowed([named], other, a, 80)
    assert json.dumps(named)  # plain data
