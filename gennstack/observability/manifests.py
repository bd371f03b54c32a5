"""The Kubernetes objects of GenNStack's monitoring, besides the charts: what Prometheus scrapes
(PodMonitors, ServiceMonitors), the Neuron monitor DaemonSet and the dashboards' ConfigMaps.

Each scrape target and the upstream fact it relies on:

* vLLM (gen2-trn2, gen3-g6e): the serving pods' ``http`` port (8000) serves ``/metrics``
  (vllm/entrypoints/serve/instrumentator/metrics.py, vLLM 0.13.0 and 0.29.0).
* Ray (gen1-inf2): KubeRay v1.7.0 adds a ``metrics`` container port (8080) to every Ray head and
  worker and starts Ray with ``--metrics-export-port=8080`` (ray-operator/controllers/ray/common/pod.go);
  Ray Serve's metrics are there. gen1's vLLM listens on the pod's loopback (files/gennstack_serve.py),
  so its own /metrics is not reachable: gen1's latency comes from Ray Serve and the gateway. Only the
  Ray Serve series the dashboards read are kept (``ray_keep``).
* Envoy proxies: container port ``metrics`` (19001, /stats/prometheus; Envoy Gateway v1.8.3
  internal/infrastructure/kubernetes/proxy/resource.go) on pods labelled
  ``app.kubernetes.io/component=proxy``, ``app.kubernetes.io/managed-by=envoy-gateway``; the AI
  Gateway's external-processor sidecar in the same pods: port ``aigw-admin`` (1064, /metrics;
  envoyproxy/ai-gateway v1.1.0 internal/controller/extproc_builder.go).
* Karpenter: its chart's Service ``karpenter`` (port ``http-metrics``; charts/karpenter/templates/service.yaml v1.14.1).
* Neuron monitor: AWS's neuron-monitor image serving Prometheus metrics on port 8000
  (src/k8/k8s-neuron-monitor-daemonset.yml in aws-neuron/aws-neuron-sdk).
* DCGM exporter and the CloudWatch exporter (YACE) bring their own ServiceMonitors (chart values).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from gennstack.controller_values import KARPENTER_NAMESPACE
from gennstack.observability import names
from gennstack.observability.dashboards import DASHBOARD_DIR, MULTI_NODE_DIR
from gennstack.observability.metrics import SERIES_EXPORTER
from gennstack.observability.rules import POOLS
from gennstack.observability.values import DASHBOARD_FOLDER_ANNOTATION, DASHBOARD_LABEL

GATEWAY_PROXY_NAMESPACE = "envoy-gateway-system"  # gennstack.gateway.values.ENVOY_GATEWAY_NAMESPACE

NEURON_MONITOR_IMAGE = "public.ecr.aws/neuron/neuron-monitor:1.3.0"
NEURON_MONITOR_NAME = "neuron-monitor"
NEURON_TAINT = "aws.amazon.com/neuron"
SCRAPE_INTERVAL = "15s"

_GENERATION_FROM_POD = {
    "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
    "targetLabel": names.GENERATION_LABEL,
}
_NODE_FROM_POD = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}


def ray_keep() -> dict[str, Any]:
    """Keep only the Ray series a dashboard or rule reads (metrics.SERIES_EXPORTER's "ray" names).

    Every Ray process of every gen1 pod exports its own ray_* families (the core's gRPC, object
    store, scheduler and task gauges, each with worker and component labels): stored whole they
    would crowd a Prometheus limited to 4 GiB. Nothing else reads them: KEDA scales only gen2 and
    gen3 (on vLLM's gauges), gen1 scales with Ray Serve's own autoscaler. Prometheus' own series
    for the target (up, scrape_*) are written after metric relabelling and stay."""
    kept = sorted(name for name, exporter in SERIES_EXPORTER.items() if exporter == "ray")
    return {"sourceLabels": ["__name__"], "regex": "|".join(re.escape(name) for name in kept), "action": "keep"}


def _metadata(name: str) -> dict[str, Any]:
    return {"name": name, "namespace": names.MONITORING_NAMESPACE, "labels": dict(names.MONITORING_LABEL)}


# LWS v0.10.0's label on every group pod: "0" on the leader (api/leaderworkerset/v1/leaderworkerset_types.go).
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


# The label Envoy Gateway v1.8.3 puts on every proxy pod with its Gateway's name
# (internal/gatewayapi/translator.go OwningGatewayNameLabel), and the routing Gateway behind the stream-resume
# relay (gennstack.gateway.values.ROUTING_GATEWAY; not imported: this module stays below the gateway's).
OWNING_GATEWAY_LABEL = "gateway.envoyproxy.io/owning-gateway-name"
ROUTING_GATEWAY = "gennstack-gateway-routing"
GATEWAY_LABEL = "gateway"
# The relay's pods (the gateway chart's resumeSelectorLabels for release gennstack-gateway).
RESUME_POD_LABELS = {"app.kubernetes.io/name": "gennstack-gateway", "app.kubernetes.io/component": "resume-relay"}


def _label_of_pod(label: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def pod_monitors(*, generations: list[str], serving_namespace: str, multi_node_pool: str | None = None,
                 resume_namespace: str | None = None) -> list[dict[str, Any]]:
    """PodMonitors of the model servers (for the enabled ``generations``; with ``multi_node_pool``, the
    multi-node groups' leaders), the gateway's Envoy pods and, with ``resume_namespace`` (the gateway's
    namespace while stream resume is on), the relay's.

    The Envoy pods' series carry ``gateway`` (the pod's Gateway). With stream resume on, every client
    request passes both Gateways' AI Gateway sidecars; the GenAI series of the routing Gateway's are
    dropped, so token and request counts are the public Gateway's, once per client request (the relay's
    own metrics count what happened behind it)."""
    monitors = []
    vllm_pools = [POOLS[g] for g in generations if g in ("trn2", "g6e")]
    if vllm_pools:
        monitors.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _metadata("gennstack-vllm"),
            "spec": {
                "namespaceSelector": {"matchNames": [serving_namespace]},
                "selector": {"matchExpressions": [
                    {"key": "app.kubernetes.io/name", "operator": "In", "values": vllm_pools},
                    {"key": "app.kubernetes.io/component", "operator": "In", "values": ["server"]},
                ]},
                "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                                         "relabelings": [_GENERATION_FROM_POD, _NODE_FROM_POD]}],
            },
        })
    if multi_node_pool is not None:
        # The groups' leaders only: a leader runs vLLM (port http, /metrics); a worker runs a Ray worker and
        # no HTTP server (files/multinode_bootstrap.py), so it is not selected. Its series carry
        # generation=<pool> (gen3-g6e-multinode), apart from gen3-g6e's.
        monitors.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _metadata("gennstack-vllm-multinode"),
            "spec": {
                "namespaceSelector": {"matchNames": [serving_namespace]},
                "selector": {"matchLabels": {"app.kubernetes.io/name": multi_node_pool,
                                             "app.kubernetes.io/component": "server", LWS_WORKER_INDEX: "0"}},
                "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                                         "relabelings": [_GENERATION_FROM_POD, _NODE_FROM_POD]}],
            },
        })
    if "inf2" in generations:
        monitors.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _metadata("gennstack-ray"),
            "spec": {
                "namespaceSelector": {"matchNames": [serving_namespace]},
                # The Ray head (component ray-head) and workers (server), not Redis, compile Jobs or spares.
                "selector": {"matchLabels": {"app.kubernetes.io/name": POOLS["inf2"]}, "matchExpressions": [
                    {"key": "app.kubernetes.io/component", "operator": "In", "values": ["ray-head", "server"]},
                ]},
                "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                                         "relabelings": [_GENERATION_FROM_POD, _NODE_FROM_POD],
                                         "metricRelabelings": [ray_keep()]}],
            },
        })
    gateway = {"sourceLabels": [_label_of_pod(OWNING_GATEWAY_LABEL)], "targetLabel": GATEWAY_LABEL}
    monitors.append({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _metadata("gennstack-gateway"),
        "spec": {
            "namespaceSelector": {"matchNames": [GATEWAY_PROXY_NAMESPACE]},
            "selector": {"matchLabels": {"app.kubernetes.io/component": "proxy",
                                         "app.kubernetes.io/managed-by": "envoy-gateway"}},
            "podMetricsEndpoints": [
                {"port": "metrics", "path": "/stats/prometheus", "interval": SCRAPE_INTERVAL, "relabelings": [gateway]},
                {"port": "aigw-admin", "path": "/metrics", "interval": SCRAPE_INTERVAL, "relabelings": [gateway],
                 "metricRelabelings": [{"sourceLabels": ["__name__", GATEWAY_LABEL], "separator": ";",
                                        "regex": f"gen_ai_.*;{re.escape(ROUTING_GATEWAY)}", "action": "drop"}]},
            ],
        },
    })
    if resume_namespace is not None:
        monitors.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _metadata("gennstack-resume"),
            "spec": {
                "namespaceSelector": {"matchNames": [resume_namespace]},
                "selector": {"matchLabels": dict(RESUME_POD_LABELS)},
                "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL}],
            },
        })
    return monitors


def karpenter_service_monitor() -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": _metadata("karpenter"),
        "spec": {
            "namespaceSelector": {"matchNames": [KARPENTER_NAMESPACE]},
            "selector": {"matchLabels": {"app.kubernetes.io/name": "karpenter", "app.kubernetes.io/instance": "karpenter"}},
            "endpoints": [{"port": "http-metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL}],
        },
    }


def neuron_monitor(*, generations: list[str]) -> list[dict[str, Any]]:
    """AWS's neuron-monitor on every Neuron node of the enabled generations, and its PodMonitor."""
    neuron = [g for g in generations if g in ("inf2", "trn2")]
    if not neuron:
        return []
    labels = {"app.kubernetes.io/name": NEURON_MONITOR_NAME, "app.kubernetes.io/part-of": "gennstack"}
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": NEURON_MONITOR_NAME, "namespace": names.MONITORING_NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gennstack.io/generation", "operator": "In", "values": neuron}]},
                    ]}}},
                    "tolerations": [{"key": NEURON_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                    "containers": [{
                        "name": NEURON_MONITOR_NAME,
                        "image": NEURON_MONITOR_IMAGE,
                        "command": ["/opt/bin/entrypoint.sh"],
                        "args": ["--port", "8000", "--neuron-monitor-config", "/opt/aws/neuron/bin/neuron-monitor.conf"],
                        "ports": [{"name": "metrics", "containerPort": 8000}],
                        "env": [{"name": "GOMEMLIMIT", "value": "160MiB"}],
                        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                        # neuron-monitor reads the Neuron driver's device files and sysfs.
                        "securityContext": {"privileged": True},
                    }],
                },
            },
        },
    }
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": _metadata(NEURON_MONITOR_NAME),
        "spec": {
            "selector": {"matchLabels": labels},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL,
                                     "relabelings": [_NODE_FROM_POD]}],
        },
    }
    return [daemonset, monitor]


def dashboard_config_maps(*, generations: Iterable[str] = tuple(POOLS), multi_node_pool: str | None = None) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard file, labelled for Grafana's dashboard sidecar: the shared ones
    (gateway, spot, cost), each enabled generation's (``gennstack-<pool>.json``; a disabled one's panels
    would read series nothing exports) and, with ``multi_node_pool``, its dashboard too
    (assets/dashboards/multinode/gennstack-<pool>.json)."""
    enabled = set(generations)
    unknown = enabled - set(POOLS)
    if unknown:
        raise ValueError(f"dashboards for unknown generations {sorted(unknown)}: known are {sorted(POOLS)}")
    left_out = {f"gennstack-{pool}.json" for generation, pool in POOLS.items() if generation not in enabled}
    maps = []
    paths = [path for path in sorted(DASHBOARD_DIR.glob("*.json")) if path.name not in left_out]
    if multi_node_pool is not None:
        paths.append(MULTI_NODE_DIR / f"gennstack-{multi_node_pool}.json")
    for path in paths:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        maps.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": path.stem, "namespace": names.MONITORING_NAMESPACE,
                         "labels": {**DASHBOARD_LABEL, **names.MONITORING_LABEL},
                         "annotations": {DASHBOARD_FOLDER_ANNOTATION: "GenNStack"}},
            "data": {path.name: json.dumps(dashboard, sort_keys=True, separators=(",", ":"))},
        })
    return maps
