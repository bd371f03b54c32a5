"""The vLLM series names the dashboards and alerts read, as prometheus_client really exposes them.

vLLM's PrometheusStatLogger declares its metrics with prometheus_client (``_gauge_cls``,
``_counter_cls``, ``_histogram_cls``) in vllm/v1/metrics/loggers.py; the declarations below are
copied by name and type from that file at v0.29.0 (the g6e image) and v0.13.0 (the Neuron 2.28.0 DLC,
inf2 and trn2; read in the vllm 0.13.0 wheel from PyPI),
with the labels both versions give them (model_name, engine; finished_reason on request_success).
Registering them with the real prometheus_client and reading its exposition output shows the names
Prometheus stores (a Counter gains _total, a Histogram _bucket/_sum/_count), which must be the names
in gennstack.observability.metrics.

Ray Serve's names are pinned the same way to Ray 2.60.0's own Grafana panels
(ray/dashboard/modules/metrics/dashboards/serve_dashboard_panels.py and
serve_deployment_dashboard_panels.py, which query exactly these series).
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families

from gennstack.observability.metrics import METRICS

# name -> (type, line in loggers.py at v0.29.0, line of its name= at v0.13.0)
VLLM_DECLARATIONS = {
    "vllm:num_requests_running": (Gauge, 494, 415),
    "vllm:num_requests_waiting": (Gauge, 504, 425),
    "vllm:kv_cache_usage_perc": (Gauge, 562, 461),
    "vllm:prefix_cache_queries": (Counter, 585, 484),
    "vllm:prefix_cache_hits": (Counter, 596, 495),
    "vllm:num_preemptions": (Counter, 662, 561),
    "vllm:prompt_tokens": (Counter, 671, 570),
    "vllm:generation_tokens": (Counter, 705, 579),
    "vllm:request_success": (Counter, 715, 589),
    "vllm:time_to_first_token_seconds": (Histogram, 797, 671),
    "vllm:inter_token_latency_seconds": (Histogram, 830, 741),
    "vllm:e2e_request_latency_seconds": (Histogram, 913, 824),
}
# The Ray Serve series Ray 2.60.0's own dashboards query.
RAY_SERVE_PANEL_SERIES = {
    "ray_serve_num_http_requests_total", "ray_serve_num_http_error_requests_total",
    "ray_serve_http_request_latency_ms_bucket", "ray_serve_deployment_replica_healthy",
    "ray_serve_replica_processing_queries",
}


def _vllm_registry() -> CollectorRegistry:
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
    return registry


def _exposed_vllm_names() -> set[str]:
    text = generate_latest(_vllm_registry()).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


# The Accept header Prometheus v3.13.2 (kube-prometheus-stack 88.3.0's) sends by default:
# scrape/scrape.go acceptHeader over config.DefaultScrapeProtocols (OpenMetrics 1.0.0, 0.0.1, text
# 1.0.0, 0.0.4; q from len(ScrapeProtocolsHeaders) + 1 = 6 down), with the escaping scheme of the
# default UTF-8 validation (config.go DefaultGlobalConfig, ToEscapingScheme: allow-utf-8) on the
# 1.0.0 formats. Prometheus Operator v0.93.0 writes scrape_protocols and metric_name_escaping_scheme
# only when the Prometheus resource sets them (pkg/prometheus/promcfg.go); GenNStack sets neither.
PROMETHEUS_3_13_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                          "application/openmetrics-text;version=0.0.1;q=0.5,"
                          "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


# Prometheus v2.42.0 (Debian 12's, which the end-to-end tests run): scrape/scrape.go scrapeAcceptHeader,
# OpenMetrics 1.0.0 first and no escaping parameter (escaping came with Prometheus 3).
PROMETHEUS_2_42_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.mark.parametrize("accept, colons", [
    (PROMETHEUS_3_13_ACCEPT, True),
    ("text/plain;version=1.0.0", True),
    ("text/plain;version=0.0.4", True),
    ("", True),
    (PROMETHEUS_2_42_ACCEPT, False),
], ids=["prometheus-3.13.2", "text-1.0.0", "text-0.0.4", "no-accept", "prometheus-2.42.0"])
def test_colon_names_reach_the_cluster_prometheus_unescaped(accept: str, colons: bool) -> None:
    """prometheus_client (0.26.0; exposition.py choose_encoder) picks format and escaping from the
    Accept header, "underscores" when the header names none. Its text format leaves a classic name
    ([a-zA-Z_:][a-zA-Z0-9_:]*, validation.py METRIC_NAME_RE) as it is, colons included; its
    OpenMetrics writer, unless allowed UTF-8, writes each sample's name through the *label* name
    character set (openmetrics/exposition.py generate_latest: _escape(s.name, escaping,
    _is_legacy_labelname_rune)), so ':' becomes '_'. The cluster's Prometheus v3.13.2 asks for
    OpenMetrics with escaping=allow-utf-8 and stores vllm:kv_cache_usage_perc as vLLM names it; a
    Prometheus 2 (no escaping parameter) would store vllm_kv_cache_usage_perc, which is why
    test_alert_delivery.py serves the text format to Debian's Prometheus 2.42."""
    encoder, content_type = choose_encoder(accept)
    text = encoder(_vllm_registry()).decode()
    parse = om_text_string_to_metric_families if content_type.startswith("application/openmetrics-text") \
        else text_string_to_metric_families
    exposed = {sample.name for family in parse(text) for sample in family.samples}
    catalogued = {name for name in METRICS if name.startswith("vllm:")}
    if colons:
        assert catalogued <= exposed and not any(name.startswith("vllm_") for name in exposed)
    else:
        assert not catalogued & exposed and "vllm_kv_cache_usage_perc" in exposed
    if accept == PROMETHEUS_3_13_ACCEPT:
        assert content_type.startswith("application/openmetrics-text; version=1.0.0") and "escaping=allow-utf-8" in content_type


def test_catalogued_vllm_names_are_what_prometheus_client_exposes() -> None:
    exposed = _exposed_vllm_names()
    catalogued = {name for name in METRICS if name.startswith("vllm:")}
    assert catalogued <= exposed, sorted(catalogued - exposed)
    assert "vllm:prompt_tokens_total" in exposed and "vllm:prompt_tokens" not in exposed
    assert "vllm:time_to_first_token_seconds_bucket" in exposed


def test_catalogued_ray_serve_names_are_rays_own_panel_series() -> None:
    assert {name for name in METRICS if name.startswith("ray_")} == RAY_SERVE_PANEL_SERIES
