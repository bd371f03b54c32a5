"""The gateway's config section: defaults (the serving chart's contract), the routing table, and
every bad input with the key, value and what is allowed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig, RouteBackend, routing_table


def _config(**data) -> GatewayConfig:
    return GatewayConfig.model_validate(frozen(data))


def test_defaults_follow_the_serving_contract() -> None:
    gateway = GatewayConfig()
    assert {m: (b.generation, b.service, b.port) for m, b in gateway.models.items()} == {
        "llama-3-70b-instruct": ("inf2", "gen1-inf2-serve-svc", 8000),
        "llama-4-maverick": ("trn2", "gen2-trn2", 8000),
        "gpt-oss-20b": ("g6e", "gen3-g6e", 8000),
    }
    assert gateway.serving_namespace == "gennstack-serving" and gateway.resilience.health_path == "/health"
    assert gateway.load_balancer.scheme == "internal" and gateway.langfuse.enabled is False
    route = routing_table(gateway).route("gennstack-default")
    assert route.backends == (
        RouteBackend("gpt-oss-20b", 80, 0, "gpt-oss-20b"),
        RouteBackend("llama-4-maverick", 20, 0, "llama-4-maverick"),
        RouteBackend("llama-3-70b-instruct", 1, 1, "llama-3-70b-instruct"),
    )


def test_only_enabled_generations_get_routes() -> None:
    table = routing_table(GatewayConfig(), {"inf2", "trn2"})
    assert [r.model for r in table.routes] == ["llama-3-70b-instruct", "llama-4-maverick", "gennstack-default"]
    assert set(table.backends) == {"llama-3-70b-instruct", "llama-4-maverick"}
    # priorities renumbered: maverick serves, llama 3 behind it
    assert [(b.backend, b.priority) for b in table.route("gennstack-default").backends] == [
        ("llama-4-maverick", 0), ("llama-3-70b-instruct", 1)]
    table = routing_table(GatewayConfig(), {"g6e"})
    assert [r.model for r in table.routes] == ["gpt-oss-20b", "gennstack-default"]


def test_fallbacks_become_priorities() -> None:
    table = routing_table(_config(fallbacks={"gpt-oss-20b": ["llama-4-maverick", "llama-3-70b-instruct"]}))
    assert [(b.backend, b.priority, b.served_model) for b in table.route("gpt-oss-20b").backends] == [
        ("gpt-oss-20b", 0, "gpt-oss-20b"), ("llama-4-maverick", 1, "llama-4-maverick"),
        ("llama-3-70b-instruct", 2, "llama-3-70b-instruct")]


def test_split_is_configurable() -> None:
    gateway = _config(aliases={"gennstack-default": [{"model": "gpt-oss-20b", "weight": 50}, {"model": "llama-4-maverick", "weight": 50}]})
    assert [b.weight for b in routing_table(gateway).route("gennstack-default").backends] == [50, 50]


@pytest.mark.parametrize("data, message", [
    ({"aliases": {"a": [{"model": "nope"}]}}, "aliases.a: got 'nope'; allowed: a model from models"),
    ({"aliases": {"gpt-oss-20b": [{"model": "gpt-oss-20b"}]}}, "a name that is not also in models"),
    ({"aliases": {"a": [{"model": "gpt-oss-20b", "weight": 0}]}}, "a target with weight > 0 at the lowest priority"),
    ({"aliases": {"a": [{"model": "gpt-oss-20b"}, {"model": "gpt-oss-20b"}]}}, "each model at most once"),
    ({"aliases": {"a": []}}, "at least one target"),
    ({"fallbacks": {"gpt-oss-20b": ["gpt-oss-20b"]}}, "another model from models"),
    ({"fallbacks": {"nope": ["gpt-oss-20b"]}}, "fallbacks.nope: got 'nope'"),
    ({"models": {}}, "must name at least one model"),
    ({"models": {"bad name": {"generation": "g6e", "service": "x"}}}, "model name 'bad name'"),
    ({"models": {"m": {"generation": "p5", "service": "x"}}}, "generation"),
    ({"models": {"m": {"generation": "g6e", "service": "Bad_Svc"}}}, "Kubernetes Service name"),
    ({"load_balancer": {"scheme": "internet-facing"}}, "allowed_cidrs: got []; allowed: the client CIDRs"),
    ({"load_balancer": {"certificate_arn": "arn:aws:iam::1:cert"}}, "must be an ACM certificate ARN"),
    ({"load_balancer": {"scheme": "internet-facing", "allowed_cidrs": [],
                        "certificate_arn": "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"}},
     "allowed_cidrs: got []"),
    ({"langfuse": {"enabled": True}}, "secret_name: got None; allowed: the Secrets Manager secret"),
    ({"langfuse": {"endpoint": "http://insecure"}}, "must be an https:// URL"),
    ({"resilience": {"retry_on_status": [429]}}, "are not 5xx status codes"),
    ({"resilience": {"stream_idle_timeout_s": 1000, "request_timeout_s": 100}}, "stream_idle_timeout_s: got 1000"),
    ({"resilience": {"health_path": "health"}}, "absolute URL path"),
    # the NLB's idle timeout, 350 s, fixed for a TLS listener (AWS Network Load Balancers guide, "Update
    # the TCP idle timeout"): one silent attempt must end before the NLB drops the client's connection
    ({"resilience": {"stream_idle_timeout_s": 341}},
     "stream_idle_timeout_s: got 341; allowed: at most 340: the NLB closes a connection idle for 350 s"),
    ({"resilience": {"consecutive_local_origin_failures": 1}}, "1: at least 2; one reset"),
    ({"max_request_mib": 0}, "greater than or equal to 1"),
    ({"rate_limit": {"tokens_per_hour": -1}}, "greater than or equal to 0"),
    ({"namespace": "Gateway"}, "Kubernetes namespace name"),
    ({"modles": {}}, "Extra inputs are not permitted"),
])
def test_bad_config_names_key_value_and_allowed(data, message) -> None:
    with pytest.raises(ValidationError) as excinfo:
        _config(**data)
    assert message in str(excinfo.value)


def test_too_many_routes_for_one_ai_gateway_route() -> None:
    models = {f"m{i}": {"generation": "g6e", "service": f"s{i}"} for i in range(16)}
    with pytest.raises(ValidationError, match="at most 15 model names and aliases together"):
        _config(models=models, aliases={})


def test_unknown_generation_in_routing_table() -> None:
    with pytest.raises(ValueError, match="unknown generation"):
        routing_table(GatewayConfig(), {"p5"})


def _models(*names: str) -> dict:
    return {name: {"generation": "g6e", "service": f"s{i}"} for i, name in enumerate(names)}


@pytest.mark.parametrize(("data", "message"), [
    # differ only in case: one Backend name
    ({"models": _models("Llama-3", "llama-3"), "aliases": {}},
     "models: got ['Llama-3', 'llama-3']; allowed: names that give distinct Kubernetes names; "
     "these all give the Backend/AIServiceBackend name 'gennstack-gateway-llama-3'"),
    # '.', ':', '/' and '_' all become '-'
    ({"models": _models("org/m:1", "org-m_1"), "aliases": {}}, "'gennstack-gateway-org-m-1'"),
    # a common 45-character prefix: the Backend names are cut at 63 characters and meet
    ({"models": _models("p" * 45 + "-a", "p" * 45 + "-b"), "aliases": {}}, "gennstack-gateway-" + "p" * 45 + "'"),
    # an alias and a model give one rule name
    ({"models": _models("gpt.oss"), "aliases": {"gpt-oss": [{"model": "gpt.oss"}]}},
     "aliases: got ['gpt-oss', 'gpt.oss']; allowed: names that give distinct Kubernetes names; "
     "these all give the AIGatewayRoute rule name 'model-gpt-oss'"),
])
def test_names_that_collide_in_kubernetes_are_refused(data, message) -> None:
    with pytest.raises(ValidationError) as excinfo:
        _config(**data)
    assert message in str(excinfo.value)


def test_names_that_stay_distinct_are_kept() -> None:
    """57 characters after 'model-' keep rule names apart; 45 after 'gennstack-gateway-' keep Backends apart."""
    from gennstack.gateway.names import backend_object_name, rule_name

    a, b = "q" * 43 + "-a", "q" * 43 + "-b"
    gateway = _config(models=_models(a, b), aliases={})
    assert {backend_object_name(m) for m in gateway.models} == {"gennstack-gateway-" + a, "gennstack-gateway-" + b}
    assert len(backend_object_name(a)) == 63 and rule_name(a) == "model-" + a
    assert rule_name("Meta-Llama/Llama-3.1-8B:fp8") == "model-meta-llama-llama-3-1-8b-fp8"
    assert rule_name("x" * 57 + "-y") == "model-" + "x" * 57  # cut at 63, no trailing '-'
