"""Monitoring of stream resume (docs/gateway.md, "Stream resume"): the relay's PodMonitor, the gateway
PodMonitor's per-Gateway label and GenAI counts taken once, the dashboard panels and the alert, under the
real promtool."""

from __future__ import annotations

import json
from pathlib import Path

from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.values import ROUTING_GATEWAY, gateway_chart_values
from gennstack.observability import manifests
from gennstack.observability.dashboards import DASHBOARD_DIR, gateway_dashboard
from gennstack.observability.metrics import METRICS, SERIES_EXPORTER
from tests.gateway.conftest import RELAY_IMAGE
from tests.k8s_schema import validate
from tests.observability import promtool
from tests.observability.test_rules import _alerts, _promtool_test
from tests.pod_security import containers

NS = "gennstack-serving"
INTERFACE = ("gennstack_resume_attempts_total", "gennstack_resume_succeeded_total", "gennstack_resume_refused_total",
             "gennstack_resume_failed_total", "gennstack_resume_replayed_tokens_total", "gennstack_resume_streams_in_flight")


def test_relay_pod_monitor_selects_the_relay_pods_metrics_port() -> None:
    from tests import helm as helm_support

    gateway = GatewayConfig()
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", api_keys_secret_name="k",
                                  redis_secret_name="r", resume_image=RELAY_IMAGE)
    docs = helm_support.render(Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway", values,
                               namespace=gateway.namespace, release="gennstack-gateway")
    (relay,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gennstack-gateway-resume"]
    monitors = manifests.pod_monitors(generations=["g6e"], serving_namespace=NS, resume_namespace=gateway.namespace)
    (monitor,) = [m for m in monitors if m["metadata"]["name"] == "gennstack-resume"]
    validate(monitor)
    labels = relay["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [gateway.namespace]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for c in containers(relay["spec"]["template"]["spec"]) for p in c["ports"]}
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    assert "gennstack-resume" not in {m["metadata"]["name"] for m in manifests.pod_monitors(generations=["g6e"], serving_namespace=NS)}


def test_routing_gateways_genai_series_are_dropped_the_public_ones_kept() -> None:
    """Prometheus' relabel semantics: sourceLabels joined by the separator must match the whole regex."""
    import re

    (monitor,) = [m for m in manifests.pod_monitors(generations=["g6e"], serving_namespace=NS) if m["metadata"]["name"] == "gennstack-gateway"]
    validate(monitor)
    envoy, sidecar = monitor["spec"]["podMetricsEndpoints"]
    for endpoint in (envoy, sidecar):
        (relabel,) = endpoint["relabelings"]
        assert relabel == {"sourceLabels": ["__meta_kubernetes_pod_label_gateway_envoyproxy_io_owning_gateway_name"],
                           "targetLabel": "gateway"}
    (drop,) = sidecar["metricRelabelings"]
    assert manifests.ROUTING_GATEWAY == ROUTING_GATEWAY and drop["action"] == "drop"

    def dropped(name: str, gateway: str) -> bool:
        return re.fullmatch(drop["regex"], drop["separator"].join([name, gateway])) is not None

    assert dropped("gen_ai_client_token_usage_sum", ROUTING_GATEWAY)
    assert not dropped("gen_ai_client_token_usage_sum", "gennstack-gateway")
    assert not dropped("envoy_cluster_upstream_rq_retry", ROUTING_GATEWAY)


def test_dashboard_reads_every_interface_metric_and_is_written() -> None:
    exprs = [t["expr"] for p in gateway_dashboard()["panels"] for t in p["targets"]]
    for name in INTERFACE:
        assert name in METRICS and SERIES_EXPORTER[name] == "resume-relay"
        assert any(name in e for e in exprs), name
    assert any("reason" in e and "gennstack_resume_failed_total" in e for e in exprs)
    assert json.loads((DASHBOARD_DIR / "gennstack-gateway.json").read_text()) == gateway_dashboard()


def test_stream_resume_failing_fires_on_a_failed_resume_only(tmp_path: Path) -> None:
    failed = 'gennstack_resume_failed_total{model="gpt-oss-20b", reason="no_replica", pod="relay-a"}'
    succeeded = 'gennstack_resume_succeeded_total{model="gpt-oss-20b", pod="relay-a"}'
    promtool.binary()
    _promtool_test(tmp_path, [
        {"interval": "1m", "input_series": [{"series": failed, "values": "0x5 1x30"}], "alert_rule_test": [
            _alerts("GenNStackStreamResumeFailing", "3m", []),
            _alerts("GenNStackStreamResumeFailing", "8m", [{"severity": "warning", "model": "gpt-oss-20b", "reason": "no_replica"}]),
            _alerts("GenNStackStreamResumeFailing", "30m", []),
        ]},
        {"interval": "1m", "input_series": [{"series": failed, "values": "0x30"}, {"series": succeeded, "values": "0+1x30"}],
         "alert_rule_test": [_alerts("GenNStackStreamResumeFailing", "20m", [])]},
    ])
