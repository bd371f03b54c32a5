"""Where the local gateway matches the cluster (Envoy Gateway v1.8.3 + AI Gateway v1.1.0), and a
test for each difference docs/gateway.md lists ("The local gateway: what differs"). Behaviour runs
through real Envoy with an in-process recording server on 127.0.0.1; the cluster side is pinned to
the upstream file named in each docstring."""

from __future__ import annotations

import json
import urllib.request

import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.local import ACCEPTED_PATHS, LocalGateway, LocalSettings, envoy_bootstrap
from tests.mock_llm import RecordingServer

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def recorded():
    """One model "m" on a recording server behind the local gateway."""
    gateway = GatewayConfig.model_validate(frozen({"models": {"m": {"generation": "g6e", "service": "m"}}, "aliases": {}}))
    with RecordingServer() as server:
        bootstrap = envoy_bootstrap(routing_table(gateway), {"m": server.base_url}, gateway,
                                    LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0))
        with LocalGateway.start(bootstrap) as gw:
            gw.wait_healthy()
            yield gw, server


def _forwarded(recorded, body: bytes, path: str = "/chat/completions") -> dict:
    gw, server = recorded
    server.seen.clear()
    request = urllib.request.Request(gw.base_url + path, data=body, method="POST", headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
    [(headers, raw)] = server.seen
    assert int(headers["content-length"]) == len(raw)
    return json.loads(raw)


@pytest.mark.parametrize("body, options", [
    (b'{"model": "m", "stream": true, "messages": []}', {"include_usage": True}),
    (b'{"model": "m", "stream": true, "stream_options": null}', {"include_usage": True}),
    (b'{"model": "m", "stream": true, "stream_options": {}}', {"include_usage": True}),
    (b'{"model": "m", "stream": true, "stream_options": { }}', {"include_usage": True}),
    (b'{"model": "m", "stream": true, "stream_options": {"include_usage": false, "x": 1}}', {"include_usage": True, "x": 1}),
    (b'{"model": "m", "stream": true, "stream_options": {"include_usage": true}}', {"include_usage": True}),
    (b'{"model": "m", "stream": false}', None),
    (b'{"model": "m"}', None),
])
def test_streaming_chat_completions_get_usage_like_the_ai_gateway(recorded, body, options) -> None:
    """AI Gateway v1.1.0 internal/endpointspec/endpointspec.go ChatCompletionsEndpointSpec.ParseBody:
    when the request streams and token costs are configured (the chart's AIGatewayRoute always sets
    llmRequestCosts) and stream_options.include_usage is not true, it sets it to true in the body
    sent upstream. The local gateway does the same, keeping the rest of the body."""
    forwarded = _forwarded(recorded, body)
    assert forwarded.get("stream_options") == options
    assert forwarded["model"] == "m"


def test_other_paths_are_not_given_usage(recorded) -> None:
    """Only chat completions: endpointspec.go's CompletionsEndpointSpec.ParseBody leaves the body alone."""
    forwarded = _forwarded(recorded, b'{"model": "m", "stream": true, "prompt": "hi"}', "/completions")
    assert "stream_options" not in forwarded


def test_accepted_paths_are_a_subset_of_the_ai_gateways() -> None:
    """AI Gateway v1.1.0 cmd/extproc/mainlib/main.go registers a processor for these paths (OpenAI
    prefix "/"; Anthropic and Cohere under their own prefixes); any other path gets "unsupported
    path: PATH" (internal/extproc/server.go). The local gateway forwards the JSON-body OpenAI ones a
    vLLM server also serves; the others are cluster-only (docs/gateway.md)."""
    ai_gateway = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
                  "/v1/responses/input_tokens", "/v1/audio/speech", "/v1/audio/transcriptions",
                  "/v1/audio/translations", "/v1/images/generations", "/cohere/v2/rerank", "/v1/models",
                  "/anthropic/v1/models", "/anthropic/v1/messages", "/tokenize", "/anthropic/v1/messages/count_tokens"}
    assert set(ACCEPTED_PATHS) < ai_gateway
    assert set(ACCEPTED_PATHS) == {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}


def test_load_balancing_matches_envoy_gateways_default() -> None:
    """Envoy Gateway v1.8.3 internal/xds/translator/cluster.go buildXdsCluster: with no loadBalancer
    in the BackendTrafficPolicy (the chart sets none) the cluster's load_balancing_policy is
    envoy.load_balancing_policies.least_request with locality_weighted_lb_config
    (buildLocalityLbConfig), and the circuit breaker allows 1024 retries in flight
    (buildXdsClusterCircuitBreaker). A rule with prefix routing has loadBalancer ConsistentHash, which
    the same function makes envoy.load_balancing_policies.maglev (Maglev{} with the table size only),
    plus the hash_balance_factor the chart's EnvoyPatchPolicy adds."""
    gateway = GatewayConfig()
    table = routing_table(gateway)
    bootstrap = envoy_bootstrap(table, {"gpt-oss-20b": "http://127.0.0.1:1"}, gateway)
    routed = {r.model: r.routing for r in table.routes if any(b.backend == "gpt-oss-20b" for b in r.backends)}
    assert routed == {"gpt-oss-20b": "prefix", "gennstack-default": "least_request"}
    for cluster, routing in zip(bootstrap["static_resources"]["clusters"], routed.values(), strict=True):
        (policy,) = cluster["load_balancing_policy"]["policies"]
        if routing == "prefix":
            assert policy["typed_extension_config"]["name"] == "envoy.load_balancing_policies.maglev"
            assert policy["typed_extension_config"]["typed_config"]["consistent_hashing_lb_config"] == {
                "hash_balance_factor": gateway.routing.hash_balance_factor}
            assert set(policy["typed_extension_config"]["typed_config"]) == {"@type", "consistent_hashing_lb_config"}
            continue
        assert policy["typed_extension_config"]["name"] == "envoy.load_balancing_policies.least_request"
        assert policy["typed_extension_config"]["typed_config"]["locality_lb_config"] == {"locality_weighted_lb_config": {}}
        assert "lb_policy" not in cluster
        assert cluster["circuit_breakers"] == {"thresholds": [{"priority": "DEFAULT", "max_retries": 1024}]}


def test_local_endpoints_are_resolved_once_at_start() -> None:
    """Difference: the cluster's Backends are FQDNs, so Envoy Gateway v1.8.3 makes STRICT_DNS
    clusters that re-resolve the (headless) Service every 30 s, honouring the DNS TTL
    (cluster.go: DnsRefreshRate 30s, RespectDnsTtl true): new pods join by themselves. Locally the
    servers are the URLs given at start, resolved once to IPv4 addresses of a STATIC cluster."""
    gateway = GatewayConfig()
    bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": ["http://localhost:8001", "http://127.0.0.1:8002"]}, gateway)
    (cluster,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "route-0"]
    assert cluster["type"] == "STATIC"
    addresses = [e["endpoint"]["address"]["socket_address"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert addresses == [{"address": "127.0.0.1", "port_value": 8001}, {"address": "127.0.0.1", "port_value": 8002}]


def _bootstrap_json(gateway: GatewayConfig) -> str:
    endpoints = {model: "http://127.0.0.1:9" for model in gateway.models}
    return json.dumps(envoy_bootstrap(routing_table(gateway), endpoints, gateway, LocalSettings()))


def test_fallback_on_is_read_only_in_the_cluster() -> None:
    """docs/gateway.md lists it: the local gateway retries only connect failures, resets and
    retry_on_status; in the cluster, fallback_on adds 429/400 to that rule's own BackendTrafficPolicy
    (gennstack.gateway.values.fallback_statuses, rendered in test_gateway_fallback.py)."""
    import re

    from gennstack.gateway.values import fallback_statuses

    gateway = GatewayConfig.model_validate(frozen({"fallback_on": {"gennstack-default": ["rate_limited", "context_length"]}}))
    assert fallback_statuses(gateway, routing_table(gateway)) == {"gennstack-default": [400, 429]}
    local = set(re.findall(r'"retriable_status_codes": \[([^\]]*)\]', _bootstrap_json(gateway)))
    assert local == {"502, 503, 504"}


def test_no_tls_traces_or_genai_metrics_locally() -> None:
    """docs/gateway.md lists it: the local listener is plain HTTP on 127.0.0.1 (no transport socket),
    with no tracing and no external processor (the AI Gateway's sidecar, which exports GenAI metrics
    and Langfuse traces in the cluster), whatever the gateway section says about Langfuse."""
    gateway = GatewayConfig.model_validate(frozen({"langfuse": {"enabled": True, "secret_name": "prod/langfuse"}}))
    bootstrap = _bootstrap_json(gateway)
    for absent in ("transport_socket", "tracing", "ext_proc", "opentelemetry"):
        assert absent not in bootstrap, absent
