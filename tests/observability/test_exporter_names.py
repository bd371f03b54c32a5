"""The vLLM series names the dashboards and alerts read, as prometheus_client really exposes them.

vLLM's PrometheusStatLogger declares its metrics with prometheus_client (``_gauge_cls``,
``_counter_cls``, ``_histogram_cls``) in vllm/v1/metrics/loggers.py; the declarations below are
copied by name and type from that file at v0.29.0 (the g6e image) and v0.16.0 (the Neuron DLC),
with the labels both versions give them (model_name, engine; finished_reason on request_success).
Registering them with the real prometheus_client and reading its exposition output shows the names
Prometheus stores (a Counter gains _total, a Histogram _bucket/_sum/_count), which must be the names
in gennstack.observability.metrics.

Ray Serve's names are pinned the same way to Ray 2.60.0's own Grafana panels
(ray/dashboard/modules/metrics/dashboards/serve_dashboard_panels.py and
serve_deployment_dashboard_panels.py, which query exactly these series).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gennstack.observability.metrics import METRICS

# name -> (type, line in loggers.py at v0.29.0, line at v0.16.0)
VLLM_DECLARATIONS = {
    "vllm:num_requests_running": (Gauge, 494, 432),
    "vllm:num_requests_waiting": (Gauge, 504, 442),
    "vllm:kv_cache_usage_perc": (Gauge, 562, 478),
    "vllm:prefix_cache_queries": (Counter, 585, 501),
    "vllm:prefix_cache_hits": (Counter, 596, 512),
    "vllm:num_preemptions": (Counter, 662, 578),
    "vllm:prompt_tokens": (Counter, 671, 587),
    "vllm:generation_tokens": (Counter, 705, 631),
    "vllm:request_success": (Counter, 715, 641),
    "vllm:time_to_first_token_seconds": (Histogram, 797, 723),
    "vllm:inter_token_latency_seconds": (Histogram, 830, 756),
    "vllm:e2e_request_latency_seconds": (Histogram, 913, 839),
}
# The Ray Serve series Ray 2.60.0's own dashboards query.
RAY_SERVE_PANEL_SERIES = {
    "ray_serve_num_http_requests_total", "ray_serve_num_http_error_requests_total",
    "ray_serve_http_request_latency_ms_bucket", "ray_serve_deployment_replica_healthy",
    "ray_serve_replica_processing_queries",
}


def _exposed_vllm_names() -> set[str]:
    registry = CollectorRegistry()
    for name, (kind, _, _) in VLLM_DECLARATIONS.items():
        labels = ["model_name", "engine"] + (["finished_reason"] if name == "vllm:request_success" else [])
        metric = kind(name, "doc", labelnames=labels, registry=registry)
        child = metric.labels(*(["m", "0", "stop"][: len(labels)]))
        if kind is Histogram:
            child.observe(0.1)
        elif kind is Counter:
            child.inc()
        else:
            child.set(1)
    text = generate_latest(registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_catalogued_vllm_names_are_what_prometheus_client_exposes() -> None:
    exposed = _exposed_vllm_names()
    catalogued = {name for name in METRICS if name.startswith("vllm:")}
    assert catalogued <= exposed, sorted(catalogued - exposed)
    assert "vllm:prompt_tokens_total" in exposed and "vllm:prompt_tokens" not in exposed
    assert "vllm:time_to_first_token_seconds_bucket" in exposed


def test_catalogued_ray_serve_names_are_rays_own_panel_series() -> None:
    assert {name for name in METRICS if name.startswith("ray_")} == RAY_SERVE_PANEL_SERIES
