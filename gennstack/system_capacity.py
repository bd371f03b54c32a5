"""CPU and memory the pods pinned to the EKS managed system node group request, against what its nodes allocate.

Nothing autoscales the system node group, so every pod GenNStack pins there (nodeSelector
``gennstack.io/pool: system`` plus the CriticalAddonsOnly toleration) must fit in
``cluster.system_nodes_min`` nodes of the smallest allowed instance type, and still fit with one of
them down (a rolling update or a replacement must not strand Pending pods: a chart's ``wait``
times out after 10 minutes and the first deploy rolls back).

Requests come from (a) the values GenNStack passes (read from the same values functions the
constructs use) and (b) each upstream chart's default where GenNStack sets none, at the version
pinned in gennstack.versions; each figure names its source in ``CHART_DEFAULTS``. A chart that
requests nothing counts 0 and says so.

Allocatable per node follows EKS AL2023's nodeadm at the AMI release of versions.AL2023_AMI_ALIAS
(awslabs/amazon-eks-ami v20260714, nodeadm/internal/kubelet/config.go and eni_max_pods.go).

Not modelled: the kube-proxy add-on's request (its EKS manifest is not public: counted as 100m,
marked not pinned), the config-reloader sidecars Prometheus Operator adds (0), Helm hook Jobs
(kube-prometheus-stack's admission-webhook patch: short-lived, no requests), and the gap between
EC2's nominal memory and the kernel's MemTotal (capacity is a little lower than counted here).
The values functions are plain modules (``gennstack/controller_values.py``, the gateway's and
monitoring's ``values.py``) that the constructs call too, so this check never loads CDK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gennstack import versions
from gennstack.config import ConfigError, GenNStackConfig
from gennstack.controller_values import karpenter_values, load_balancer_controller_values, lws_values, operator_values
from gennstack.gateway import values as gw
from gennstack.gateway.config import routing_table
from gennstack.observability import values as obs
from gennstack.system_nodes import SYSTEM_NODE_SELECTOR, SYSTEM_TOLERATIONS

MIB_PER_GIB = 1024


@dataclass(frozen=True)
class Requests:
    cpu_m: int
    memory_mi: int

    def __add__(self, other: Requests) -> Requests:
        return Requests(self.cpu_m + other.cpu_m, self.memory_mi + other.memory_mi)

    def times(self, n: int) -> Requests:
        return Requests(self.cpu_m * n, self.memory_mi * n)


ZERO = Requests(0, 0)


@dataclass(frozen=True)
class Default:
    """An upstream default request, where GenNStack sets none."""

    requests: Requests
    source: str


# Upstream defaults, each read at the pinned tag (versions.py). "no requests" means the chart's
# values leave ``resources: {}``: the pod requests nothing and counts 0.
CHART_DEFAULTS: dict[str, Default] = {
    "aws-load-balancer-controller": Default(ZERO, "kubernetes-sigs/aws-load-balancer-controller v3.5.0 "
                                                  "helm/aws-load-balancer-controller/values.yaml: resources {} (no requests)"),
    "envoy-gateway": Default(Requests(100, 256), "envoyproxy/gateway v1.8.3 charts/gateway-helm/values.tmpl.yaml "
                                                 "deployment.envoyGateway.resources.requests 100m/256Mi"),
    "envoy-shutdown-manager": Default(Requests(10, 32), "envoyproxy/gateway v1.8.3 api/v1alpha1/shared_types.go "
                                                       "DefaultShutdownManager{CPU,Memory}ResourceRequests 10m/32Mi"),
    "envoy-ratelimit": Default(Requests(100, 512), "envoyproxy/gateway v1.8.3 api/v1alpha1/kubernetes_helpers.go "
                                                   "DefaultResourceRequirements (shared_types.go 100m/512Mi)"),
    "ai-gateway-controller": Default(ZERO, "envoyproxy/ai-gateway v1.1.0 manifests/charts/ai-gateway-helm/values.yaml "
                                           "controller.resources {} (no requests)"),
    "external-secrets": Default(ZERO, "external-secrets/external-secrets helm-chart-2.9.0 deploy/charts/external-secrets/"
                                      "values.yaml: resources {}, webhook.resources {}, certController.resources {} "
                                      "(no requests); replicaCount 1 each"),
    "keda": Default(Requests(100, 100), "kedacore/charts v2.20.2 keda/values.yaml resources.{operator,metricServer,"
                                        "webhooks}.requests 100m/100Mi each; replicaCount 1 each"),
    "metrics-server": Default(Requests(100, 200), "kubernetes-sigs/metrics-server commit 4ffd45aa (chart 3.14.0) "
                                                  "charts/metrics-server/values.yaml resources.requests 100m/200Mi"),
    # Controller pod: ebs-plugin, csi-provisioner, csi-attacher, csi-resizer take controller.resources
    # (templates/controller.yaml ``default .Values.controller.resources``), liveness-probe its own
    # 10m/32Mi; csi-snapshotter only when the snapshot.storage.k8s.io API exists (GenNStack installs
    # none), volumemodifier and metadataLabeler are off by default.
    "ebs-csi-controller": Default(Requests(4 * 10 + 10, 4 * 40 + 32),
                                  "kubernetes-sigs/aws-ebs-csi-driver helm-chart-aws-ebs-csi-driver-2.64.0 values.yaml "
                                  "controller.resources.requests 10m/40Mi x4 containers + templates/controller.yaml "
                                  "livenessProbe 10m/32Mi; replicaCount 2"),
    "ebs-csi-node": Default(Requests(10 + 10 + 10, 40 + 32 + 32),
                            "kubernetes-sigs/aws-ebs-csi-driver helm-chart-aws-ebs-csi-driver-2.64.0 values.yaml "
                            "node.resources.requests 10m/40Mi + templates/_node.tpl node-driver-registrar and "
                            "liveness-probe 10m/32Mi each"),
    # The aws-node pod: the aws-node container and, with network policy on (gennstack_infra/components/cluster.py
    # ADDON_CONFIGURATION), the aws-eks-nodeagent container, which takes .Values.resources too
    # (templates/daemonset.yaml ``default .Values.resources .Values.nodeAgent.resources``). The
    # add-on is v1.23.2-eksbuild.1; the newest tag in the repository is v1.23.0.
    "vpc-cni": Default(Requests(2 * 25, 0), "aws/amazon-vpc-cni-k8s v1.23.0 charts/aws-vpc-cni/values.yaml "
                                            "resources.requests cpu 25m (no memory request), aws-node + nodeagent"),
    "pod-identity-agent": Default(ZERO, "aws/eks-pod-identity-agent commit 00bc0581 charts/eks-pod-identity-agent/"
                                        "values.yaml resources {} (no requests); the add-on's v1.4.0 build is not tagged"),
    # NOT PINNED: the EKS kube-proxy add-on's manifest is not public; 100m CPU is what EKS's
    # kube-proxy DaemonSet has requested, counted so the sum does not leave it out.
    "kube-proxy": Default(Requests(100, 0), "not pinned: EKS kube-proxy add-on manifest is not public"),
    # The EKS CoreDNS build's manifest is not public; upstream's deployment manifest, from which it
    # derives, requests 100m/70Mi; EKS runs 2 replicas (EKS User Guide, coredns-autoscaling).
    "coredns": Default(Requests(100, 70), "coredns/deployment commit 000c366e kubernetes/coredns.yaml.sed "
                                          "requests 100m/70Mi (EKS build's own manifest not public)"),
    "grafana": Default(ZERO, "grafana-community/helm-charts grafana-12.10.4 charts/grafana/values.yaml resources {} "
                             "and sidecar.resources {} (no requests)"),
    # NOT PINNED: the config-reloader sidecar Prometheus Operator adds to Prometheus and Alertmanager;
    # kube-prometheus-stack 88.3.0 leaves prometheusConfigReloader.resources {}, and the operator's own
    # flag defaults (prometheus-operator v0.93.0) were not read here.
    "prometheus-operator": Default(ZERO, "prometheus-community/helm-charts kube-prometheus-stack-88.3.0 values.yaml "
                                         "prometheusOperator.resources {} (no requests)"),
    "alertmanager": Default(ZERO, "prometheus-community/helm-charts kube-prometheus-stack-88.3.0 values.yaml "
                                  "alertmanager.alertmanagerSpec.resources {} (no requests)"),
    "kube-state-metrics": Default(ZERO, "prometheus-community/helm-charts kube-state-metrics-8.2.0 values.yaml "
                                        "resources {} (no requests)"),
    "node-exporter": Default(ZERO, "prometheus-community/helm-charts prometheus-node-exporter-4.56.1 values.yaml "
                                   "resources {} (no requests)"),
    "yace": Default(ZERO, "prometheus-community/helm-charts prometheus-yet-another-cloudwatch-exporter-0.47.0 "
                          "values.yaml resources {} (no requests)"),
}


@dataclass(frozen=True)
class SystemInstance:
    """EC2's published vCPU and memory; ENIs and IPv4 addresses per ENI from nodeadm's
    instance-info.jsonl at v20260714 (awslabs/amazon-eks-ami nodeadm/internal/kubelet)."""

    vcpu: int
    memory_gib: int
    enis: int
    ipv4_per_eni: int


# General-purpose m families, 4 GiB per vCPU; ENIs x IPv4 per ENI by size (identical across these
# families in instance-info.jsonl).
_SIZES = {"large": SystemInstance(2, 8, 3, 10), "xlarge": SystemInstance(4, 16, 4, 15),
          "2xlarge": SystemInstance(8, 32, 4, 15), "4xlarge": SystemInstance(16, 64, 8, 30)}
SYSTEM_INSTANCES: dict[str, SystemInstance] = {
    f"{family}.{size}": spec for family in ("m5", "m6a", "m6i", "m7a", "m7i") for size, spec in _SIZES.items()
}


# nodeadm/internal/kubelet/config.go (v20260714): evictionHard memory.available.
EVICTION_HARD_MEMORY_MI = 100


def max_pods(instance: SystemInstance) -> int:
    """nodeadm eni_max_pods.go calculateStandardMaxPods: ENIs x (IPv4 per ENI - 1) + 2."""
    return instance.enis * (instance.ipv4_per_eni - 1) + 2


def kube_reserved_cpu_m(vcpu: int) -> int:
    """nodeadm config.go getCPUMillicoresToReserve: 6% of the first core, 1% of the second, 0.5% of
    cores 3-4, 0.25% above (integer millicores, each range truncated as Go does)."""
    total = vcpu * 1000
    bounds = (0, 1000, 2000, 4000, total)
    basis_points = (600, 100, 50, 25)
    reserved = 0
    for i, bp in enumerate(basis_points):
        start, end = bounds[i], bounds[i + 1]
        if total > start:
            reserved += (min(total, end) - start) * bp // 10000
    return reserved


def kube_reserved_memory_mi(pods: int) -> int:
    """nodeadm config.go getMemoryMebibytesToReserve: 11 MiB per pod + 255 MiB."""
    return 11 * pods + 255


def allocatable(instance_type: str) -> Requests:
    """Node allocatable: capacity - kube-reserved - eviction threshold (nodeadm sets no system-reserved
    figures, only its cgroup). Capacity from EC2's nominal memory: the kernel's own reservation makes
    the real figure a little lower, which this does not model."""
    if instance_type not in SYSTEM_INSTANCES:
        raise KeyError(f"no capacity figures for system instance type {instance_type!r}; known: {sorted(SYSTEM_INSTANCES)}")
    spec = SYSTEM_INSTANCES[instance_type]
    return Requests(spec.vcpu * 1000 - kube_reserved_cpu_m(spec.vcpu),
                    spec.memory_gib * MIB_PER_GIB - kube_reserved_memory_mi(max_pods(spec)) - EVICTION_HARD_MEMORY_MI)


def parse_cpu(value: str | int) -> int:
    text = str(value)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def parse_memory(value: str) -> int:
    for suffix, factor in (("Gi", 1024), ("Mi", 1)):
        if value.endswith(suffix):
            return int(value[:-len(suffix)]) * factor
    raise ValueError(f"memory {value!r}: only Mi and Gi are used by GenNStack's values")


def _requests(resources: dict[str, Any]) -> Requests:
    req = resources["requests"]
    return Requests(parse_cpu(req.get("cpu", "0m")), parse_memory(req["memory"]) if "memory" in req else 0)


@dataclass(frozen=True)
class Line:
    component: str
    replicas: int
    per_pod: Requests
    source: str

    @property
    def total(self) -> Requests:
        return self.per_pod.times(self.replicas)


def worst_case(config: GenNStackConfig) -> GenNStackConfig:
    """The config with every optional system-node component on: rate limit (its Redis and
    rate-limit service) and monitoring on the system nodes."""
    gateway = config.gateway.model_copy(update={"rate_limit": config.gateway.rate_limit.model_copy(update={"enabled": True})})
    monitoring = config.monitoring.model_copy(update={"placement": "system"})
    return config.model_copy(update={"gateway": gateway, "monitoring": monitoring})


def deployments(config: GenNStackConfig) -> list[Line]:
    """Every Deployment/StatefulSet pod pinned to the system nodes, with its replicas, for ``config``."""
    sel, tol = SYSTEM_NODE_SELECTOR, SYSTEM_TOLERATIONS
    karpenter = karpenter_values(cluster_name="c", queue_name="q", region="us-east-1")
    lbc = load_balancer_controller_values(cluster_name="c", region="us-east-1", vpc_id="vpc-0")
    ops = operator_values(serving_namespace=config.serving.namespace)
    eg = gw.envoy_gateway_values(config.gateway, system_node_selector=sel, system_tolerations=tol)
    ai = gw.ai_gateway_values(system_node_selector=sel, system_tolerations=tol)
    table = routing_table(config.gateway, set(config.generations.enabled()))
    chart = gw.gateway_chart_values(config.gateway, table, region="us-east-1", api_keys_secret_name="k",
                                    redis_secret_name="r")
    proxy_resources, redis_resources = chart["gateway"]["resources"], chart["redis"]["resources"]
    d = CHART_DEFAULTS
    keda = ops[versions.KEDA.name]
    lines = [
        Line("karpenter", karpenter["replicas"], _requests(karpenter["controller"]["resources"]),
             "gennstack/controller_values.py karpenter_values"),
        Line("aws-load-balancer-controller", lbc["replicaCount"], d["aws-load-balancer-controller"].requests,
             d["aws-load-balancer-controller"].source),
        Line("envoy-gateway", eg["deployment"]["replicas"], d["envoy-gateway"].requests, d["envoy-gateway"].source),
        Line("envoy-proxy", config.gateway.envoy_replicas,
             _requests(proxy_resources) + d["envoy-shutdown-manager"].requests,
             "gennstack/gateway/values.py gateway_chart_values + " + d["envoy-shutdown-manager"].source),
        Line("ai-gateway-controller", ai["controller"]["replicaCount"], d["ai-gateway-controller"].requests,
             d["ai-gateway-controller"].source),
        Line("external-secrets (controller, webhook, cert-controller)", 3, d["external-secrets"].requests,
             d["external-secrets"].source),
        Line("keda-operator", keda["operator"]["replicaCount"], d["keda"].requests, d["keda"].source),
        Line("keda-metrics-apiserver + admission-webhooks", 2, d["keda"].requests, d["keda"].source),
        Line("kuberay-operator", 1, _requests(ops[versions.KUBERAY_OPERATOR.name]["resources"]),
             "gennstack/controller_values.py operator_values"),
        Line("metrics-server", ops[versions.METRICS_SERVER.name]["replicas"], d["metrics-server"].requests,
             d["metrics-server"].source),
        Line("ebs-csi-controller", 2, d["ebs-csi-controller"].requests, d["ebs-csi-controller"].source),
        Line("coredns", 2, d["coredns"].requests, d["coredns"].source),
    ]
    if config.gateway.resume.enabled:
        # stream resume: the routing Gateway's proxies (as many, sized as the public ones) and the relay
        lines += [
            Line("envoy-proxy (routing Gateway)", chart["resume"]["routing"]["replicas"],
                 _requests(chart["resume"]["routing"]["resources"]) + d["envoy-shutdown-manager"].requests,
                 "gennstack/gateway/values.py resume_values + " + d["envoy-shutdown-manager"].source),
            Line("resume-relay", chart["resume"]["replicas"], _requests(chart["resume"]["resources"]),
                 "gennstack/gateway/values.py resume_values"),
        ]
    if config.serving.multi_node.enabled:
        lines.append(Line("lws-controller-manager", lws_values()["replicaCount"], _requests(lws_values()["resources"]),
                          "gennstack/controller_values.py lws_values"))
    if config.gateway.rate_limit.enabled:
        lines += [
            Line("gateway-redis", 1, _requests(redis_resources), "gennstack/gateway/values.py gateway_chart_values"),
            Line("envoy-ratelimit", eg["config"]["envoyGateway"]["provider"]["kubernetes"]["rateLimitDeployment"]["replicas"],
                 d["envoy-ratelimit"].requests, d["envoy-ratelimit"].source),
        ]
    if config.monitoring.placement == "system":
        kps = obs.kube_prometheus_stack_values(config.monitoring, region="us-east-1", remote_write=None,
                                               system_node_selector=sel, system_tolerations=tol)
        lines += [
            Line("prometheus", 1, _requests(kps["prometheus"]["prometheusSpec"]["resources"]),
                 "gennstack/observability/values.py kube_prometheus_stack_values"),
            Line("prometheus-operator", 1, d["prometheus-operator"].requests, d["prometheus-operator"].source),
            Line("alertmanager", 1, d["alertmanager"].requests, d["alertmanager"].source),
            Line("kube-state-metrics", 1, d["kube-state-metrics"].requests, d["kube-state-metrics"].source),
            Line("grafana", 1, d["grafana"].requests, d["grafana"].source),
            Line("yace", 1, d["yace"].requests, d["yace"].source),
        ]
    return lines


def daemonsets_per_node() -> list[Line]:
    """DaemonSet pods on every system node (one each)."""
    d = CHART_DEFAULTS
    return [
        Line("aws-node (vpc-cni)", 1, d["vpc-cni"].requests, d["vpc-cni"].source),
        Line("kube-proxy", 1, d["kube-proxy"].requests, d["kube-proxy"].source),
        Line("eks-pod-identity-agent", 1, d["pod-identity-agent"].requests, d["pod-identity-agent"].source),
        Line("ebs-csi-node", 1, d["ebs-csi-node"].requests, d["ebs-csi-node"].source),
        Line("node-exporter", 1, d["node-exporter"].requests, d["node-exporter"].source),
    ]


def total(lines: list[Line]) -> Requests:
    out = ZERO
    for line in lines:
        out = out + line.total
    return out


def pods(lines: list[Line]) -> int:
    return sum(line.replicas for line in lines)


@dataclass(frozen=True)
class Fit:
    """The system pods of a config against ``nodes`` nodes of ``instance_type`` (its smallest type)."""

    requested: Requests  # the Deployments' pods, over the whole group
    requested_pods: int
    per_node_daemonsets: Requests
    daemonset_pods: int
    per_node_allocatable: Requests
    per_node_max_pods: int
    instance_type: str
    nodes: int

    def room(self, nodes: int) -> Requests:
        """What ``nodes`` nodes leave for the Deployments' pods once each runs its DaemonSets."""
        return Requests((self.per_node_allocatable.cpu_m - self.per_node_daemonsets.cpu_m) * nodes,
                        (self.per_node_allocatable.memory_mi - self.per_node_daemonsets.memory_mi) * nodes)

    def pod_room(self, nodes: int) -> int:
        return (self.per_node_max_pods - self.daemonset_pods) * nodes

    def fits(self, nodes: int) -> bool:
        room = self.room(nodes)
        return (self.requested.cpu_m <= room.cpu_m and self.requested.memory_mi <= room.memory_mi
                and self.requested_pods <= self.pod_room(nodes))


def system_fit(config: GenNStackConfig) -> Fit:
    """Requests for ``config`` against system_nodes_min nodes of its smallest system instance type."""
    cluster = config.cluster
    smallest = min(cluster.system_node_instance_types, key=lambda t: (allocatable(t).cpu_m, allocatable(t).memory_mi))
    lines, per_node = deployments(config), daemonsets_per_node()
    return Fit(total(lines), pods(lines), total(per_node), pods(per_node), allocatable(smallest),
               max_pods(SYSTEM_INSTANCES[smallest]), smallest, cluster.system_nodes_min)


def summary_line(fit: Fit) -> str:
    """One line: what the system pods request against what the group allocates, all nodes and one down."""
    room, down = fit.room(fit.nodes), fit.room(fit.nodes - 1)
    return (f"system nodes: {fit.nodes} x {fit.instance_type}; pods request {fit.requested.cpu_m}m CPU / "
            f"{fit.requested.memory_mi}Mi of {room.cpu_m}m / {room.memory_mi}Mi left after DaemonSets "
            f"({down.cpu_m}m / {down.memory_mi}Mi with one node down)")


def check_system_fit(config: GenNStackConfig) -> None:
    """Raise ConfigError unless the system pods fit in system_nodes_min - 1 nodes of the smallest type.

    One node down is a rolling update of the node group or a replaced node: the pods it ran must
    find room on the others, or they stay Pending and a chart's ``wait`` rolls the deploy back.
    """
    for instance_type in config.cluster.system_node_instance_types:
        if instance_type not in SYSTEM_INSTANCES:
            raise ConfigError(
                f"cluster.system_node_instance_types: {instance_type!r} has no capacity figures in "
                f"gennstack/system_capacity.py; allowed: {', '.join(sorted(SYSTEM_INSTANCES))}")
    fit = system_fit(config)
    if fit.fits(fit.nodes - 1):
        return
    down, pods_down = fit.room(fit.nodes - 1), fit.pod_room(fit.nodes - 1)
    raise ConfigError(
        f"cluster.system_nodes_min: {fit.nodes} nodes of {fit.instance_type} (the smallest of "
        f"cluster.system_node_instance_types) do not hold the system pods with one node down: they request "
        f"{fit.requested.cpu_m}m CPU, {fit.requested.memory_mi}Mi memory and {fit.requested_pods} pods, "
        f"{fit.nodes - 1} node(s) leave {down.cpu_m}m, {down.memory_mi}Mi and {pods_down} pods after DaemonSets "
        f"(gateway.envoy_replicas={config.gateway.envoy_replicas}, gateway.rate_limit.enabled="
        f"{config.gateway.rate_limit.enabled}, monitoring.placement={config.monitoring.placement!r}); "
        "raise cluster.system_nodes_min or choose larger cluster.system_node_instance_types")
