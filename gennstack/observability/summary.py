"""`gennstack summary` lines for monitoring: what is scraped, the dashboards and the alerts.

Read from the synthesized template only (the manifests the stack applies and the recorded config),
like the rest of ``gennstack summary``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from gennstack.observability import names

_TARGETS = {
    ("PodMonitor", "gennstack-vllm"): "vLLM /metrics ({pools})",
    ("PodMonitor", "gennstack-vllm-multinode"): "vLLM /metrics of the multi-node groups' leaders ({pools})",
    ("PodMonitor", "gennstack-ray"): "Ray Serve ({pools})",
    ("PodMonitor", "gennstack-gateway"): "Envoy proxies and AI Gateway GenAI metrics",
    ("ServiceMonitor", "karpenter"): "Karpenter",
    ("PodMonitor", "neuron-monitor"): "neuron-monitor",
}


_PLACES = {"system": "the system node group", "on-demand": "on-demand general-pool nodes"}


def _manifest_objects(template: dict[str, Any]) -> list[dict[str, Any]]:
    objects = []
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "Custom::AWSCDK-EKS-KubernetesResource":
            manifest = resource["Properties"].get("Manifest")
            if isinstance(manifest, str):
                objects.extend(json.loads(manifest))
    return objects


def _pools(monitor: dict[str, Any]) -> str:
    selector = monitor["spec"]["selector"]
    pools = selector.get("matchLabels", {}).get("app.kubernetes.io/name")
    if pools:
        return pools
    return ", ".join(next(e["values"] for e in selector["matchExpressions"] if e["key"] == "app.kubernetes.io/name"))


def monitoring_lines(template: dict[str, Any], config: dict[str, Any], chart_versions: dict[str, str]) -> list[str]:
    """Lines for the monitoring stack, or none when the stack has no kube-prometheus-stack."""
    if "kube-prometheus-stack" not in chart_versions:
        return []
    monitoring = config.get("monitoring", {})
    objects = _manifest_objects(template)
    remote = monitoring.get("managed_prometheus", {})
    lines = [
        f"  Monitoring: kube-prometheus-stack {chart_versions['kube-prometheus-stack']} in {names.MONITORING_NAMESPACE} "
        f"(Prometheus {monitoring.get('prometheus_storage_gib', '?')} GiB, {monitoring.get('retention_days', '?')} d retention, "
        f"on {_PLACES.get(monitoring.get('placement', ''), '?')}; remote write to Amazon Managed Service for Prometheus "
        f"{'on' if remote.get('enabled') else 'off'})"
    ]
    scraped = []
    for obj in objects:
        label = _TARGETS.get((obj["kind"], obj["metadata"]["name"]))
        if label:
            scraped.append(label.format(pools=_pools(obj)) if "{pools}" in label else label)
    if "dcgm-exporter" in chart_versions:
        scraped.append("DCGM exporter (GPU nodes)")
    if "prometheus-yet-another-cloudwatch-exporter" in chart_versions:
        scraped.append("CloudWatch via YACE (interruption handler, its dead-letter queue)")
    scraped.append("Kubernetes (kube-state-metrics, node-exporter, kubelet)")
    lines.append(f"    Scraped: {'; '.join(scraped)}")
    titles = sorted(
        json.loads(next(iter(obj["data"].values())))["title"].removeprefix("GenNStack / ")
        for obj in objects if obj["kind"] == "ConfigMap" and obj["metadata"].get("labels", {}).get("grafana_dashboard")
    )
    lines.append(f"    Dashboards (Grafana folder GenNStack): {', '.join(titles)}")
    alerts = Counter(rule["alert"] for obj in objects if obj["kind"] == "PrometheusRule"
                     for group in obj["spec"]["groups"] for rule in group["rules"] if "alert" in rule)
    lines.append("    Alerts: " + ", ".join(f"{name} x{count}" if count > 1 else name for name, count in alerts.items()))
    alerts_config = monitoring.get("alerts", {})
    if alerts_config:
        lines.append(
            f"    Alert thresholds: TTFT p95 > {alerts_config.get('ttft_p95_slo_seconds')} s for 10 min, errors > "
            f"{float(alerts_config.get('error_rate', 0)) * 100:g} %, KV cache >= "
            f"{float(alerts_config.get('kv_cache_full', 0)) * 100:g} %, accelerator pods Pending > "
            f"{alerts_config.get('pending_pod_minutes')} min"
        )
    return lines
