"""`gateway.fallback_on`: per model or alias, backend answers (429, the context-length 400) that move a
request to the next backend, on that route only. Config errors, the rendered per-rule
BackendTrafficPolicy (validated against Envoy Gateway's CRD), and the upstream contracts it rests on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gennstack.config_base import frozen
from gennstack.gateway.config import FALLBACK_STATUS, GatewayConfig, routing_table
from gennstack.gateway.values import fallback_statuses, gateway_chart_values
from gennstack.serving.support import SUPPORT
from tests.gateway.test_gateway_chart import _by_kind, _policies, _validate_all, render

FALLBACK = {"fallbacks": {"gpt-oss-20b": ["llama-4-maverick"]},
            "fallback_on": {"gennstack-default": ["context_length", "rate_limited"], "gpt-oss-20b": ["context_length"]}}


def _config(**data) -> GatewayConfig:
    return GatewayConfig.model_validate(frozen(data))


def test_backend_statuses_are_vllms() -> None:
    """vLLM answers a prompt longer than the model's context with HTTP 400 at both versions GenNStack
    runs: v0.29.0 (the g6e image) raises ``VLLMValidationError`` ("This model's maximum context length
    is ...", vllm/renderers/params.py) and vllm/entrypoints/serve/exception_handling/error_response.py
    maps it to ``HTTPStatus.BAD_REQUEST``; v0.13.0 (the Neuron DLC 2.28.0, read from the vllm-0.13.0
    wheel on PyPI) raises it as a ``ValueError`` in ``_validate_input``
    (vllm/entrypoints/openai/serving_engine.py), which serving_chat.py catches and answers with
    ``create_error_response``, whose status defaults to ``HTTPStatus.BAD_REQUEST``. Every other request
    error is a 400 as well, and Envoy's retry policy sees only the status, so ``context_length`` retries
    every upstream 400 of the route that asks for it. 429 is the HTTP status for rate limiting (RFC
    6585); vllm/entrypoints at neither version sends it. The versions are the images' (a new image
    fails here until its vLLM is read again)."""
    assert FALLBACK_STATUS == {"rate_limited": 429, "context_length": 400}
    assert {row.vllm for row in SUPPORT.values()} == {"0.13.0", "0.29.0"}


@pytest.mark.parametrize("data, key, allowed", [
    ({"fallback_on": {"nope": ["rate_limited"]}}, "fallback_on.nope", "a model or alias"),
    ({"fallback_on": {"gpt-oss-20b": ["rate_limited"]}}, "fallback_on.gpt-oss-20b", "a model with fallbacks"),
    ({"fallback_on": {"gennstack-default": []}}, "fallback_on.gennstack-default", "one or more of"),
    ({"fallback_on": {"gennstack-default": ["rate_limited", "rate_limited"]}}, "fallback_on.gennstack-default", "each at most once"),
    ({"aliases": {"solo": [{"model": "gpt-oss-20b"}]}, "fallback_on": {"solo": ["context_length"]}},
     "fallback_on.solo", "an alias with at least two targets"),
])
def test_bad_fallback_on_names_the_key(data, key, allowed) -> None:
    with pytest.raises(ValidationError) as info:
        _config(**data)
    assert key in str(info.value) and allowed in str(info.value)


def test_unknown_reason_is_refused() -> None:
    with pytest.raises(ValidationError) as info:
        _config(fallback_on={"gennstack-default": ["server_error"]})
    assert "fallback_on.gennstack-default" in str(info.value) and "rate_limited" in str(info.value)


def test_statuses_per_route_and_none_without_a_second_backend() -> None:
    gateway = _config(**FALLBACK)
    assert fallback_statuses(gateway, routing_table(gateway)) == {"gpt-oss-20b": [400], "gennstack-default": [400, 429]}
    # only g6e enabled: gpt-oss-20b has no fallback left and the alias one target: nothing to retry on
    assert fallback_statuses(gateway, routing_table(gateway, {"g6e"})) == {}
    values = gateway_chart_values(gateway, routing_table(gateway), region="r", api_keys_secret_name="k", redis_secret_name="p")
    assert {r["model"]: r.get("fallbackOnStatus") for r in values["routes"]} == {
        "llama-3-70b-instruct": None, "llama-4-maverick": None, "gpt-oss-20b": [400], "gennstack-default": [400, 429]}


@pytest.mark.slow
def test_rule_policies_retry_4xx_only_where_asked(helm) -> None:
    """The AI Gateway v1.1.0 controller names each generated HTTPRoute rule after its AIGatewayRoute
    rule (internal/controller/ai_gateway_route.go newHTTPRoute: ``Name: rule.Name``, plus a last
    ``route-not-found`` rule), so a BackendTrafficPolicy can target one rule by ``sectionName``.
    Envoy Gateway v1.8.3 applies route-rule policies first and skips a route whose traffic features
    are already set by a more specific policy (internal/gatewayapi/backendtrafficpolicy.go
    applyTrafficFeatureToRoute), so that rule gets only its own policy: it must repeat every retry
    and health-check setting, with the extra statuses."""
    docs = render(helm, _config(**FALLBACK))
    _validate_all(docs)
    route_policy, limits, per_rule = _policies(docs)
    (route,) = _by_kind(docs)["AIGatewayRoute"]
    rule_names = {r["matches"][0]["headers"][0]["value"]: r["name"] for r in route["spec"]["rules"]}
    by_section = {p["spec"]["targetRefs"][0]["sectionName"]: p for p in per_rule}
    assert set(by_section) == {rule_names["gpt-oss-20b"], rule_names["gennstack-default"]}
    for model, extra in (("gpt-oss-20b", [400]), ("gennstack-default", [400, 429])):
        policy = by_section[rule_names[model]]["spec"]
        assert policy["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                         "name": route["metadata"]["name"], "sectionName": rule_names[model]}]
        assert policy["retry"]["retryOn"]["httpStatusCodes"] == [502, 503, 504, *extra]
        # the same as the route's policy in everything else, and no limits of its own (shared budget)
        # gpt-oss-20b routes by prefix: its rule's policy also holds the consistent hash
        assert ("loadBalancer" in policy) == (model == "gpt-oss-20b")
        same = {k: v for k, v in policy.items() if k not in ("targetRefs", "loadBalancer")}
        same["retry"] = {**policy["retry"], "retryOn": route_policy["spec"]["retry"]["retryOn"]}
        assert same == {k: v for k, v in route_policy["spec"].items() if k != "targetRefs"}
        assert "rateLimit" not in policy and policy["mergeType"] == "StrategicMerge"
    assert route_policy["spec"]["retry"]["retryOn"]["httpStatusCodes"] == [502, 503, 504]
    assert limits is not None
