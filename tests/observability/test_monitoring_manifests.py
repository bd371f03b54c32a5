"""What Prometheus scrapes: every monitoring object validates against its upstream schema, and every
PodMonitor selects the pods it is meant to, on a port those pods have.

The serving chart is rendered with helm, so the vLLM and Ray selectors are checked against the
real pod templates. Pods made by upstream software are pinned to the files that define them:

* KubeRay v1.7.0 adds the container port "metrics" (8080) to every Ray head and worker
  (ray-operator/controllers/ray/common/pod.go, DefaultMetricsPort / MetricsPortName in utils/constant.go).
* Envoy Gateway v1.8.3 labels its proxy pods app.kubernetes.io/name=envoy, component=proxy,
  managed-by=envoy-gateway (internal/infrastructure/kubernetes/proxy/resource.go EnvoyAppLabel) and
  names the stats port "metrics" (19001); the Envoy AI Gateway v1.1.0 sidecar's admin port is
  "aigw-admin" (1064) (internal/controller/extproc_builder.go).
* Karpenter v1.14.1's Service is named after the release, labelled app.kubernetes.io/name=karpenter
  and app.kubernetes.io/instance=<release>, port "http-metrics" (charts/karpenter/templates/service.yaml, _helpers.tpl).
"""

from __future__ import annotations

from typing import Any

import pytest

from gennstack.controller_values import KARPENTER_NAMESPACE
from gennstack import versions
from gennstack.gateway.values import ENVOY_GATEWAY_NAMESPACE
from gennstack.observability import manifests, names
from gennstack.observability.config import MonitoringConfig
from gennstack.observability.rules import prometheus_rule
from tests import helm
from tests.k8s_schema import validate
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, STAGING, merged

ALL = ["inf2", "trn2", "g6e"]


def _objects(generations: list[str]) -> list[dict[str, Any]]:
    return [
        *manifests.pod_monitors(generations=generations, serving_namespace=NAMESPACE),
        manifests.karpenter_service_monitor(),
        *manifests.neuron_monitor(generations=generations),
        prometheus_rule(MonitoringConfig.model_validate({"hourly_prices": {"g6e.2xlarge": {"spot": 0.9}}}),
                        generations=generations, serving_namespace=NAMESPACE,
                        max_num_seqs={"inf2": 20, "trn2": 16, "g6e": 64}),
        *manifests.dashboard_config_maps(),
    ]


@pytest.mark.parametrize("generations", [ALL, ["g6e"], ["inf2"], ["trn2", "g6e"]], ids=lambda g: "+".join(g))
def test_every_object_validates(generations: list[str]) -> None:
    objects = _objects(generations)
    for obj in objects:
        validate(obj)
    monitoring = [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert all(o["metadata"]["labels"] == names.MONITORING_LABEL and o["metadata"]["namespace"] == names.MONITORING_NAMESPACE
               for o in monitoring)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(owner, pod template) of every workload the serving chart renders, Ray head and workers included."""
    templates = []
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            templates.append((name, obj["spec"]["template"]))
        elif obj["kind"] == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            templates.append((f"{name}/head", cluster["headGroupSpec"]["template"]))
            templates += [(f"{name}/{g['groupName']}", g["template"]) for g in cluster["workerGroupSpecs"]]
    return templates


def _ports(template: dict[str, Any]) -> set[str]:
    return {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", []) if "name" in p}


@pytest.fixture(scope="module")
def serving_pods() -> list[tuple[str, dict[str, Any]]]:
    return _pod_templates(helm.render(CHART, merged(REQUIRED, STAGING), namespace=NAMESPACE))


def _selected(monitor: dict[str, Any], pods: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    return {name: t for name, t in pods if _matches(monitor["spec"]["selector"], t["metadata"]["labels"])}


def test_vllm_monitor_selects_the_trn2_and_g6e_servers_on_their_http_port(serving_pods) -> None:
    monitor = next(m for m in manifests.pod_monitors(generations=ALL, serving_namespace=NAMESPACE)
                   if m["metadata"]["name"] == "gennstack-vllm")
    selected = _selected(monitor, serving_pods)
    assert sorted(selected) == ["Deployment/gen2-trn2", "Deployment/gen3-g6e"]  # not warm spares, jobs or Ray
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert all(endpoint["port"] in _ports(t) for t in selected.values())
    assert endpoint["path"] == "/metrics"


def test_ray_monitor_selects_gen1_head_and_workers(serving_pods) -> None:
    """The port itself ("metrics") is KubeRay's (v1.7.0 pod.go adds it to every Ray container)."""
    monitor = next(m for m in manifests.pod_monitors(generations=ALL, serving_namespace=NAMESPACE)
                   if m["metadata"]["name"] == "gennstack-ray")
    selected = _selected(monitor, serving_pods)
    assert sorted(selected) == ["RayService/gen1-inf2/head", "RayService/gen1-inf2/inf2"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert all("metrics" not in _ports(t) for t in selected.values()), "the chart must leave the metrics port to KubeRay"


def test_generation_label_comes_from_the_pool_name() -> None:
    for monitor in manifests.pod_monitors(generations=ALL, serving_namespace=NAMESPACE)[:2]:
        relabel = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
        assert relabel == {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                           "targetLabel": names.GENERATION_LABEL}


@pytest.mark.parametrize("generations, expected", [
    (["g6e"], ["gennstack-vllm", "gennstack-gateway"]),
    (["inf2"], ["gennstack-ray", "gennstack-gateway"]),
    (ALL, ["gennstack-vllm", "gennstack-ray", "gennstack-gateway"]),
])
def test_monitors_follow_enabled_generations(generations: list[str], expected: list[str]) -> None:
    assert [m["metadata"]["name"] for m in manifests.pod_monitors(generations=generations, serving_namespace=NAMESPACE)] == expected


def test_gateway_monitor_scrapes_envoy_and_the_ai_gateway_sidecar() -> None:
    monitor = manifests.pod_monitors(generations=["g6e"], serving_namespace=NAMESPACE)[-1]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [ENVOY_GATEWAY_NAMESPACE]}
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/component": "proxy",
                                                          "app.kubernetes.io/managed-by": "envoy-gateway"}
    assert [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]] == [
        ("metrics", "/stats/prometheus"), ("aigw-admin", "/metrics")]


def test_karpenter_monitor_selects_its_charts_service() -> None:
    monitor = manifests.karpenter_service_monitor()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [KARPENTER_NAMESPACE]}
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "karpenter", "app.kubernetes.io/instance": versions.KARPENTER.name}
    assert monitor["spec"]["endpoints"][0]["port"] == "http-metrics"


def test_neuron_monitor_runs_only_on_neuron_generations() -> None:
    assert manifests.neuron_monitor(generations=["g6e"]) == []
    daemonset, monitor = manifests.neuron_monitor(generations=["trn2", "g6e"])
    term = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert term == {"key": "gennstack.io/generation", "operator": "In", "values": ["trn2"]}
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in \
        daemonset["spec"]["template"]["spec"]["tolerations"]
    assert _matches(monitor["spec"]["selector"], daemonset["spec"]["template"]["metadata"]["labels"])
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in _ports(daemonset["spec"]["template"])


def test_ray_monitor_keeps_only_the_series_the_dashboards_read() -> None:
    """Prometheus anchors a relabel regex (^(?:regex)$); keep drops every series it does not match."""
    import re

    from tests.observability.test_promql import dashboard_expressions, metric_names, rule_expressions

    monitor = next(m for m in manifests.pod_monitors(generations=ALL, serving_namespace=NAMESPACE)
                   if m["metadata"]["name"] == "gennstack-ray")
    (keep,) = monitor["spec"]["podMetricsEndpoints"][0]["metricRelabelings"]
    assert (keep["sourceLabels"], keep["action"]) == (["__name__"], "keep")
    read = {n for _, e in dashboard_expressions() + rule_expressions() for n in metric_names(e) if n.startswith("ray_")}
    assert read and all(re.fullmatch(keep["regex"], n) for n in read)
    for dropped in ("ray_node_cpu_utilization", "ray_tasks", "ray_serve_http_request_latency_ms_sum",
                    "ray_serve_num_http_requests_total_created", "ray_object_store_memory"):
        assert re.fullmatch(keep["regex"], dropped) is None, dropped
