"""The project's gateway chart, rendered by the real helm with the values the construct passes,
every object validated against the upstream CRDs (unknown fields rejected)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.gateway.conftest import RELAY_IMAGE
from gennstack import versions
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.system_nodes import SYSTEM_NODE_SELECTOR, SYSTEM_TOLERATIONS
from gennstack.observability.names import CLIENT_LABEL
from gennstack.gateway.values import (CLIENT_HEADER, MIN_DRAIN_S, RATE_LIMIT_POD_LABELS, SECRETS_REFRESH_INTERVAL,
                                      REDIS_AUTH_SECRET, ai_gateway_values, backend_object_name, drain_timeout_s,
                                      envoy_gateway_values, gateway_chart_values, redis_url)
from gennstack.config_base import frozen
from gennstack.gateway.names import GATEWAY_RELEASE
from tests.gateway.conftest import validate_chart_objects
from tests.helm import undocumented_values
from tests.k8s_schema import validate

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway"
API_KEYS = "gennstack/gateway-api-keys"
LANGFUSE = "gennstack/langfuse"
REDIS = "gennstack/gateway-redis"
# What a bare `helm template` needs besides the schema's defaults.
REQUIRED = {"secrets.region": "us-east-1", "apiKeys.remoteSecretName": "k", "redis.remoteSecretName": "r"}
REQUIRED_ARGS = [a for k, v in REQUIRED.items() for a in ("--set", f"{k}={v}")]


VARIANT = {
    "langfuse": {"enabled": True, "secret_name": LANGFUSE, "sample_ratio": 0.25},
    "load_balancer": {"scheme": "internet-facing",
                      "certificate_arn": "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012",
                      "allowed_cidrs": ["203.0.113.0/24"]},
    "rate_limit": {"tokens_per_hour": 0},
    "fallbacks": {"gpt-oss-20b": ["llama-4-maverick"]},
}


def render(helm: Path, gateway: GatewayConfig, enabled=("inf2", "trn2", "g6e"), *extra: str) -> list[dict]:
    values = gateway_chart_values(gateway, routing_table(gateway, set(enabled)), region="us-east-1",
                                  resume_image=RELAY_IMAGE, api_keys_secret_name=API_KEYS, redis_secret_name=REDIS)
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--namespace", gateway.namespace,
                           "--values", "-", *extra], input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _validate_all(docs: list[dict]) -> None:
    validate_chart_objects(docs)


# The objects of the stream-resume relay and the routing Gateway (templates/resume*.yaml), which
# tests/gateway/test_gateway_resume_chart.py checks; the tests here are about the public Gateway and the
# model routes, which stay what they were (the model routes move to the routing Gateway).
RESUME_OBJECTS = {f"{GATEWAY_RELEASE}-resume", f"{GATEWAY_RELEASE}-front", f"{GATEWAY_RELEASE}-routing"}


def _by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in docs:
        if doc["metadata"]["name"] not in RESUME_OBJECTS:
            out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.fixture(scope="module")
def default_docs(helm) -> list[dict]:
    return render(helm, GatewayConfig())


@pytest.fixture(scope="module")
def variant_docs(helm) -> list[dict]:
    return render(helm, GatewayConfig.model_validate(frozen(VARIANT)))


def test_every_object_validates(default_docs, variant_docs) -> None:
    _validate_all(default_docs)
    _validate_all(variant_docs)
    kinds = {d["kind"] for d in default_docs}
    assert {"GatewayClass", "Gateway", "EnvoyProxy", "ClientTrafficPolicy", "AIGatewayRoute", "AIServiceBackend",
            "Backend", "BackendTrafficPolicy", "SecurityPolicy", "ClusterSecretStore", "ExternalSecret",
            "Deployment", "Service", "NetworkPolicy", "EnvoyPatchPolicy", "Secret", "ConfigMap",
            "EnvoyExtensionPolicy", "PodDisruptionBudget"} == kinds
    assert "GatewayConfig" in {d["kind"] for d in variant_docs}


def test_each_enabled_model_has_a_route_and_a_backend(helm) -> None:
    for enabled in (("inf2", "trn2", "g6e"), ("g6e",), ("inf2", "trn2")):
        docs = _by_kind(render(helm, GatewayConfig(), enabled))
        (route,) = docs["AIGatewayRoute"]
        assert route["apiVersion"] == "aigateway.envoyproxy.io/v1beta1"
        rules = {r["matches"][0]["headers"][0]["value"]: r for r in route["spec"]["rules"]}
        models = {m for m, b in GatewayConfig().models.items() if b.generation in enabled}
        ai_backends = {d["metadata"]["name"]: d for d in docs["AIServiceBackend"]}
        backends = {d["metadata"]["name"]: d for d in docs["Backend"]}
        assert set(ai_backends) == set(backends) == {backend_object_name(m) for m in models}
        for model in models:
            assert rules[model]["matches"][0]["headers"][0]["name"] == "x-ai-eg-model"
            (ref,) = rules[model]["backendRefs"]
            assert ref["name"] == backend_object_name(model) and "modelNameOverride" not in ref
        for name, ai in ai_backends.items():
            # an AIServiceBackend points at an Envoy Gateway Backend, never at a Service
            assert ai["spec"]["backendRef"] == {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": name}
            assert ai["spec"]["schema"]["name"] == "OpenAI"
        service = {m: GatewayConfig().models[m].service for m in models}
        for model in models:
            (endpoint,) = backends[backend_object_name(model)]["spec"]["endpoints"]
            assert endpoint["fqdn"] == {"hostname": f"{service[model]}.gennstack-serving.svc.cluster.local", "port": 8000}
        alias = rules.get("gennstack-default")
        if enabled == ("inf2", "trn2"):
            # gpt-oss-20b (g6e) is gone: maverick takes its place at priority 0, llama 3 stays behind it
            assert [(r["name"], r["priority"]) for r in alias["backendRefs"]] == [
                (backend_object_name("llama-4-maverick"), 0), (backend_object_name("llama-3-70b-instruct"), 1)]
        elif enabled == ("g6e",):
            assert [r["name"] for r in alias["backendRefs"]] == [backend_object_name("gpt-oss-20b")]


def test_alias_split_failover_and_model_override(default_docs) -> None:
    (route,) = _by_kind(default_docs)["AIGatewayRoute"]
    rule = next(r for r in route["spec"]["rules"] if r["matches"][0]["headers"][0]["value"] == "gennstack-default")
    refs = {r["name"]: r for r in rule["backendRefs"]}
    gpt, maverick, llama = (backend_object_name(m) for m in ("gpt-oss-20b", "llama-4-maverick", "llama-3-70b-instruct"))
    assert (refs[gpt]["weight"], refs[gpt]["priority"], refs[gpt]["modelNameOverride"]) == (80, 0, "gpt-oss-20b")
    assert (refs[maverick]["weight"], refs[maverick]["priority"]) == (20, 0)
    assert refs[llama]["priority"] == 1 and refs[llama]["modelNameOverride"] == "llama-3-70b-instruct"
    assert rule["streamIdleTimeout"] == "300s" and rule["timeouts"] == {"request": "900s"}
    names = [r["name"] for r in route["spec"]["rules"]]
    assert len(names) == len(set(names))  # the CRD's CEL rule: unique rule names
    assert {c["type"] for c in route["spec"]["llmRequestCosts"]} == {"InputToken", "OutputToken", "TotalToken"}


def _policies(docs: list[dict]) -> tuple[dict, dict | None, list[dict]]:
    """The route's BackendTrafficPolicy, the Gateway's (rate limits) and the per-rule ones."""
    btps = _by_kind(docs)["BackendTrafficPolicy"]
    route = [b for b in btps if b["spec"]["targetRefs"][0]["kind"] == "HTTPRoute" and "sectionName" not in b["spec"]["targetRefs"][0]]
    gateway = [b for b in btps if b["spec"]["targetRefs"][0]["kind"] == "Gateway"]
    rules = [b for b in btps if "sectionName" in b["spec"]["targetRefs"][0]]
    assert len(route) == 1 and len(gateway) <= 1 and len(route) + len(gateway) + len(rules) == len(btps)
    return route[0], (gateway[0] if gateway else None), rules


def test_failover_health_checks_and_rate_limit_policy(default_docs) -> None:
    docs = _by_kind(default_docs)
    btp, limits, per_rule = _policies(default_docs)
    (route,) = docs["AIGatewayRoute"]
    # targets the HTTPRoute the AI Gateway generates, which carries the AIGatewayRoute's name
    assert btp["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route["metadata"]["name"]}]
    # no fallback_on in the default config: the one per-rule policy is gpt-oss-20b's prefix routing
    assert [(p["spec"]["targetRefs"][0]["sectionName"], p["spec"]["loadBalancer"]["type"]) for p in per_rule] == [
        ("model-gpt-oss-20b", "ConsistentHash")]
    # the rule's policy is the most specific one (it replaces the route's): the same retries and health checks
    same = ("loadBalancer", "targetRefs")
    assert {k: v for k, v in per_rule[0]["spec"].items() if k not in same} == {k: v for k, v in btp["spec"].items() if k not in same}
    retry = btp["spec"]["retry"]
    assert retry["numAttemptsPerPriority"] == 2 and retry["numRetries"] == 3
    assert set(retry["retryOn"]["triggers"]) == {"connect-failure", "reset", "retriable-status-codes"}
    assert retry["retryOn"]["httpStatusCodes"] == [502, 503, 504]  # never a 4xx without fallback_on
    assert retry["perRetry"]["timeout"] == "900s"  # never cuts a long stream
    active, passive = btp["spec"]["healthCheck"]["active"], btp["spec"]["healthCheck"]["passive"]
    assert active["type"] == "HTTP" and active["http"]["path"] == "/health"
    assert passive["consecutiveGatewayErrors"] == 3 and passive["maxEjectionPercent"] == 50  # never every server
    # the limits live on the Gateway's policy; the route's merges with it
    assert "rateLimit" not in btp["spec"] and btp["spec"]["mergeType"] == "StrategicMerge"
    assert limits["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": route["metadata"]["name"]}]
    token_rule, request_rule = limits["spec"]["rateLimit"]["global"]["rules"]
    assert token_rule["clientSelectors"] == [{"headers": [{"name": "x-gennstack-client", "type": "Distinct"}]}]
    assert token_rule["cost"] == {"request": {"from": "Number", "number": 0}, "response": {
        "from": "Metadata", "metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}}}
    assert token_rule["limit"] == {"requests": 2_000_000, "unit": "Hour"}
    assert request_rule["limit"] == {"requests": 600, "unit": "Minute"} and "cost" not in request_rule
    (ctp,) = docs["ClientTrafficPolicy"]
    assert ctp["spec"]["connection"]["bufferLimit"] == "8Mi"  # max_request_mib: buffered before any rate limit
    (sp,) = docs["SecurityPolicy"]
    auth = sp["spec"]["apiKeyAuth"]
    assert auth["extractFrom"] == [{"headers": ["Authorization"]}] and auth["sanitize"] is True
    assert auth["forwardClientIDHeader"] == "x-gennstack-client"


def test_one_budget_per_client_across_every_model_and_alias(default_docs) -> None:
    """Envoy Gateway v1.8.3 keys a global rate-limit counter by route unless the rule is shared:
    internal/xds/translator/ratelimit.go buildRouteRateLimits makes the first descriptor entry
    ``(rule.Name, rule.Name)`` for a shared rule and ``(route name, route name)`` otherwise, and puts a
    shared rule in the rate-limit domain ``stripRuleIndexSuffix(rule.Name)`` (the listener's otherwise);
    a cost makes it use per-route ``typed_per_filter_config`` for that domain (shared rules with a
    cost are supported). internal/gatewayapi/helpers.go irRuleName names a rule
    ``<policy namespace>/<policy name>/rule/<index>``: nothing of the route. A route policy with a
    ``mergeType`` whose own spec has no rateLimit keeps the Gateway policy's limits with the Gateway
    policy's rule names (internal/gatewayapi/backendtrafficpolicy.go
    translateBackendTrafficPolicyForRouteWithMerge, case 2). So every route, rule-level policies
    included, counts a client in the same two counters: domain ``<ns>/<limits policy>``, descriptor
    ``(<ns>/<limits policy>/rule/<i>, same)`` then ``(rule-<i>-match-0, <client id>)``.

    What docs/gateway.md says is counted rests on: patchRouteWithRateLimit returning early for a
    route without a route action (a direct response such as the AI Gateway's route-not-found 404);
    internal/xds/translator/httpfilters.go ordering api_key_auth (6) before the rate-limit filter
    (303), so a 401 is never counted; the request cost 0 becoming a per-descriptor ``hits_addend`` of 0
    that envoyproxy/ratelimit (image 1e50889b) checks without incrementing
    (src/utils/utilities.go GetHitsAddends) and refuses only when the count exceeds the limit
    (src/limiter/base_limiter.go: ``limitAfterIncrease > overLimitThreshold``), in windows aligned to
    the unit (src/limiter/cache_key.go GenerateCacheKey); the response cost applied on stream done
    (``ApplyOnStreamDone``) with the AI Gateway's ``llm_total_token``, written only at the end of the
    response stream (AI Gateway v1.1.0 internal/extproc/processor_impl.go buildDynamicMetadata)."""
    btp, limits, _ = _policies(default_docs)
    rules = limits["spec"]["rateLimit"]["global"]["rules"]
    assert [r.get("shared") for r in rules] == [True, True]
    assert all(r["clientSelectors"] == [{"headers": [{"name": "x-gennstack-client", "type": "Distinct"}]}] for r in rules)
    # one policy holds every limit, and no route-level policy has limits of its own (they would be
    # counted under that policy's rule names, a second budget)
    assert [d for d in default_docs if d["kind"] == "BackendTrafficPolicy" and "rateLimit" in d["spec"]] == [limits]
    ns, name = limits["metadata"]["namespace"], limits["metadata"]["name"]
    descriptor_keys = [f"{ns}/{name}/rule/{i}" for i in range(len(rules))]
    assert descriptor_keys == ["gennstack-gateway/gennstack-gateway-limits/rule/0",
                               "gennstack-gateway/gennstack-gateway-limits/rule/1"]


def test_no_panic_mode(default_docs, variant_docs) -> None:
    """Envoy Gateway v1.8.3 internal/xds/translator/cluster.go sets the cluster's
    ``common_lb_config.healthy_panic_threshold`` only when ``healthCheck.panicThreshold`` is set and is
    not 50 (Envoy's default); internal/gatewayapi/clustersettings.go copies the policy's value. 0:
    with most of a backend's servers unhealthy Envoy sends only to the healthy ones, never spreads
    over all of them."""
    for docs in (default_docs, variant_docs):
        for btp in _by_kind(docs)["BackendTrafficPolicy"]:
            if "healthCheck" in btp["spec"]:
                assert btp["spec"]["healthCheck"]["panicThreshold"] == 0, btp["metadata"]["name"]
    route, _, rules = _policies(variant_docs)
    assert [route["spec"]["healthCheck"]] + [r["spec"]["healthCheck"] for r in rules] == [route["spec"]["healthCheck"]] * (1 + len(rules))


def test_empty_service_answers_are_asked_again_every_dns_refresh(default_docs, variant_docs) -> None:
    """Envoy Gateway v1.8.3 internal/gatewayapi/clustersettings.go copies a BackendTrafficPolicy's
    ``dns.dnsRefreshRate`` and ``dns.respectDnsTtl`` into the route's cluster settings, and
    internal/xds/translator/cluster.go (buildXdsCluster, STRICT_DNS branch) replaces its 30 s default
    with them. Every policy that carries the route's health checks carries DNS_REFRESH_S too (the
    local gateway uses the same constant)."""
    from gennstack.gateway.envoy_common import DNS_REFRESH_S

    for docs in (default_docs, variant_docs):
        for btp in _by_kind(docs)["BackendTrafficPolicy"]:
            if "healthCheck" in btp["spec"]:
                assert btp["spec"]["dns"] == {"dnsRefreshRate": f"{DNS_REFRESH_S}s", "respectDnsTtl": True}, btp["metadata"]["name"]


def test_load_balancer_internal_by_default_tls_when_configured(default_docs, variant_docs) -> None:
    def service(docs):
        (proxy,) = _by_kind(docs)["EnvoyProxy"]
        return proxy["spec"]["provider"]["kubernetes"]["envoyService"]

    internal = service(default_docs)
    assert internal["loadBalancerClass"] == "service.k8s.aws/nlb"
    assert internal["annotations"]["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    assert "service.beta.kubernetes.io/aws-load-balancer-ssl-cert" not in internal["annotations"]
    public = service(variant_docs)
    assert public["annotations"]["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internet-facing"
    assert public["annotations"]["service.beta.kubernetes.io/aws-load-balancer-ssl-cert"].startswith("arn:aws:acm:")
    assert public["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    # HTTPS on 443 either way (tests/gateway/test_gateway_tls.py)
    for docs in (default_docs, variant_docs):
        (gateway,) = _by_kind(docs)["Gateway"]
        assert [(x["name"], x["protocol"], x["port"]) for x in gateway["spec"]["listeners"]] == [("https", "HTTPS", 443)]


def test_secrets_come_from_secrets_manager(default_docs, variant_docs) -> None:
    docs = _by_kind(default_docs)
    (store,) = docs["ClusterSecretStore"]
    assert store["apiVersion"] == "external-secrets.io/v1"
    assert store["spec"]["provider"] == {"aws": {"service": "SecretsManager", "region": "us-east-1"}}
    # the proxies' namespace gets the Redis password for Envoy Gateway's rate-limit service
    assert store["spec"]["conditions"] == [{"namespaces": ["gennstack-gateway", "envoy-gateway-system"]}]
    (keys,) = [e for e in docs["ExternalSecret"] if e["metadata"]["name"].endswith("-api-keys")]
    assert keys["spec"]["dataFrom"] == [{"extract": {"key": API_KEYS}}]
    assert keys["spec"]["secretStoreRef"] == {"kind": "ClusterSecretStore", "name": store["metadata"]["name"]}
    # Redis, as CDK's values render it: the pinned patched release (tests/test_redis_images.py)
    images = {c["image"] for d in docs.get("Deployment", []) for c in d["spec"]["template"]["spec"]["containers"]
              if "redis" in c["image"]}
    assert images == {versions.REDIS_ALPINE_IMAGE}
    # a revoked key stops working within a minute of its removal from Secrets Manager (docs/gateway.md)
    assert {e["spec"]["refreshInterval"] for e in docs["ExternalSecret"]} == {SECRETS_REFRESH_INTERVAL} == {"1m"}
    (sp,) = docs["SecurityPolicy"]
    assert sp["spec"]["apiKeyAuth"]["credentialRefs"][0]["name"] == keys["spec"]["target"]["name"]
    # Langfuse: off by default; when on, keys from Secrets Manager into the proxies' namespace
    assert "GatewayConfig" not in docs
    variant = _by_kind(variant_docs)
    langfuse = next(e for e in variant["ExternalSecret"] if e["metadata"]["name"].endswith("-langfuse"))
    assert {d["remoteRef"]["key"] for d in langfuse["spec"]["data"]} == {LANGFUSE}
    assert "b64enc" in langfuse["spec"]["target"]["template"]["data"]["otlp-headers"]
    (config,) = variant["GatewayConfig"]
    env = {e["name"]: e for e in config["spec"]["extProc"]["kubernetes"]["env"]}
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]["value"] == "https://cloud.langfuse.com/api/public/otel/v1/traces"
    assert env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"]["valueFrom"]["secretKeyRef"]["name"] == langfuse["spec"]["target"]["name"]
    assert env["OTEL_TRACES_SAMPLER_ARG"]["value"] == "0.25"
    (gateway,) = variant["Gateway"]
    assert gateway["metadata"]["annotations"]["aigateway.envoyproxy.io/gateway-config"] == config["metadata"]["name"]
    (store,) = variant["ClusterSecretStore"]
    assert store["spec"]["conditions"] == [{"namespaces": ["gennstack-gateway", "envoy-gateway-system"]}]
    # token limit off in the variant: only the request rule is left
    _, limits, _ = _policies(variant_docs)
    assert [r["limit"]["unit"] for r in limits["spec"]["rateLimit"]["global"]["rules"]] == ["Minute"]


def test_no_secret_in_any_template_or_value(default_docs, variant_docs) -> None:
    # The only Secrets are the TLS ones whose keys helm generates at render (test_gateway_tls.py);
    # no secret value comes from the values, the templates or CloudFormation.
    secrets = {d["metadata"]["name"] for d in default_docs + variant_docs if d["kind"] == "Secret"}
    assert secrets == {"gennstack-gateway-tls", "gennstack-gateway-ca-key"}
    suspicious = re.compile(r"(sk-lf-|pk-lf-|sk-[A-Za-z0-9]{16,}|AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY|password\s*[:=]\s*\S)", re.I)
    for path in CHART.rglob("*"):
        if path.is_file():
            assert not suspicious.search(path.read_text()), path
    for doc in default_docs + variant_docs:
        text = json.dumps(doc)
        assert not suspicious.search(text), doc["metadata"]["name"]
        if doc["kind"] == "Secret":
            assert "stringData" not in doc and doc["type"] == "kubernetes.io/tls"


def test_redis_is_where_envoy_gateway_looks(default_docs) -> None:
    services = {d["metadata"]["name"]: d for d in _by_kind(default_docs)["Service"]}
    host = redis_url(GatewayConfig()).split(".")[0]
    assert host in services and services[host]["metadata"]["namespace"] == "gennstack-gateway"
    (deployment,) = _by_kind(default_docs)["Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert re.fullmatch(r"docker\.io/library/redis:\d+\.\d+\.\d+-alpine", image)


@pytest.mark.parametrize("flag, wrong", [("--set", "gateway.replica=3"), ("--set", "resilience.retrys=1"),
                                         ("--set", "rateLimit.tokensPerHr=5"), ("--set", "langfuse.enable=true")])
def test_schema_rejects_typos(helm, flag, wrong) -> None:
    proc = subprocess.run([str(helm), "template", "x", str(CHART), *REQUIRED_ARGS, flag, wrong],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "additional properties" in proc.stderr


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_required_values(helm, missing) -> None:
    args = [a for k, v in REQUIRED.items() if k != missing for a in ("--set", f"{k}={v}")]
    proc = subprocess.run([str(helm), "template", "x", str(CHART), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and f"{missing} is required" in proc.stderr


def test_route_naming_an_unknown_backend_fails(helm) -> None:
    routes = {"routes": [{"model": "m", "ruleName": "model-m",
                          "backends": [{"name": "nope", "objectName": "gennstack-gateway-nope", "weight": 1, "priority": 0}]}]}
    proc = subprocess.run([str(helm), "template", "x", str(CHART), *REQUIRED_ARGS, "--values", "-"],
                          input=json.dumps(routes), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and 'backend "nope" is not in backends' in proc.stderr


def test_helm_lint(helm) -> None:
    proc = subprocess.run([str(helm), "lint", "--strict", str(CHART), *REQUIRED_ARGS],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_values_yaml_is_the_default_config_and_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(values, schema)
    gateway = GatewayConfig()
    built = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name="")
    for key in ("backends", "routes", "resilience", "rateLimit", "bufferLimit", "langfuse", "redis", "prefixRouting"):
        assert values[key] == built[key], key
    jsonschema.validate(built, schema)
    assert undocumented_values(CHART / "values.yaml") == []


def test_external_secrets_objects_meet_their_crds(default_docs) -> None:
    """The ExternalSecret and ClusterSecretStore validate against External Secrets v2.9.0's CRDs, which can fail."""
    docs = _by_kind(default_docs)
    for kind in ("ExternalSecret", "ClusterSecretStore"):
        (obj,) = docs[kind] if kind == "ClusterSecretStore" else docs[kind][:1]
        validate(obj)
        broken = json.loads(json.dumps(obj))
        broken["spec"]["refreshIntervall"] = "1h"
        with pytest.raises(AssertionError, match="refreshIntervall"):
            validate(broken)


@pytest.fixture(scope="module")
def system_docs(helm) -> list[dict]:
    """Rendered with the system node placement the construct passes."""
    gateway = GatewayConfig()
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name=API_KEYS,
                                  redis_secret_name=REDIS, system_node_selector=SYSTEM_NODE_SELECTOR,
                                  system_tolerations=SYSTEM_TOLERATIONS)
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--namespace", gateway.namespace,
                           "--values", "-"], input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_proxies_on_system_nodes_spread_and_never_disrupted(system_docs) -> None:
    """The Envoy proxies run on the system node group (on-demand, tainted CriticalAddonsOnly, not a
    Karpenter pool), spread over zones and hosts, with a PDB and Karpenter's do-not-disrupt annotation;
    the EnvoyProxy validates against Envoy Gateway v1.8.3's CRD."""
    _validate_all(system_docs)
    (proxy,) = _by_kind(system_docs)["EnvoyProxy"]
    kubernetes = proxy["spec"]["provider"]["kubernetes"]
    pod = kubernetes["envoyDeployment"]["pod"]
    assert pod["nodeSelector"] == SYSTEM_NODE_SELECTOR == {"gennstack.io/pool": "system"}
    assert pod["tolerations"] == SYSTEM_TOLERATIONS
    assert pod["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert set(spread) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    assert all(c["maxSkew"] == 1 and c["labelSelector"]["matchLabels"] == {
        "gateway.envoyproxy.io/owning-gateway-name": "gennstack-gateway"} for c in spread.values())
    assert kubernetes["envoyPDB"] == {"minAvailable": 1}
    # Redis is on the system nodes too
    (redis,) = _by_kind(system_docs)["Deployment"]
    assert redis["spec"]["template"]["spec"]["nodeSelector"] == SYSTEM_NODE_SELECTOR


@pytest.mark.parametrize("timeout_s", [900, 86400])
def test_drain_outlasts_the_longest_stream(helm, timeout_s) -> None:
    """Envoy Gateway v1.8.3: the shutdown manager (the preStop hook, internal/cmd/envoy/shutdown_manager.go
    Shutdown) fails Envoy's health checks, then waits until ``minDrainDuration`` has passed and no
    connection is left, or ``shutdown.drainTimeout`` has passed
    (api/v1alpha1/envoyproxy_types.go ShutdownConfig; default 60 s), and the pod's
    terminationGracePeriodSeconds is drainTimeout + 300 s
    (internal/infrastructure/kubernetes/proxy/resource_provider.go expectedTerminationGracePeriodSeconds).
    A stream lasts at most ``request_timeout_s`` (the route's request timeout) and may start up to
    minDrainDuration into the drain, so the drain covers both, for the largest timeout config allows."""
    gateway = GatewayConfig.model_validate(frozen({"resilience": {"request_timeout_s": timeout_s}}))
    (proxy,) = _by_kind(render(helm, gateway))["EnvoyProxy"]
    validate(proxy)
    shutdown = proxy["spec"]["shutdown"]
    drain, min_drain = (int(shutdown[k].removesuffix("s")) for k in ("drainTimeout", "minDrainDuration"))
    assert drain == timeout_s + min_drain and min_drain == MIN_DRAIN_S == drain_timeout_s(gateway) - timeout_s
    grace = drain + 300  # what Envoy Gateway sets
    assert grace >= timeout_s + min_drain


def test_langfuse_gets_no_prompt_or_completion_unless_asked(helm, variant_docs) -> None:
    """The AI Gateway v1.1.0 ext_proc reads OPENINFERENCE_HIDE_INPUTS / OPENINFERENCE_HIDE_OUTPUTS
    with strconv.ParseBool, default false (internal/tracing/openinference/config.go
    NewTraceConfigFromEnv; internal/tracing/tracingenv/env.go GetBoolEnv): true replaces input and
    output values and messages with ``__REDACTED__``. The GatewayConfig's extProc env reaches the
    sidecar (internal/controller/extproc_builder.go mergeEnvVars) and validates against its CRD."""
    def env(docs):
        (config,) = _by_kind(docs)["GatewayConfig"]
        validate(config)
        return {e["name"]: e.get("value") for e in config["spec"]["extProc"]["kubernetes"]["env"]}

    hidden = env(variant_docs)
    assert hidden["OPENINFERENCE_HIDE_INPUTS"] == hidden["OPENINFERENCE_HIDE_OUTPUTS"] == "true"
    recorded = env(render(helm, GatewayConfig.model_validate(frozen(
        {**VARIANT, "langfuse": {**VARIANT["langfuse"], "record_content": True}}))))
    assert recorded["OPENINFERENCE_HIDE_INPUTS"] == recorded["OPENINFERENCE_HIDE_OUTPUTS"] == "false"


def test_redis_password_and_network_policy(default_docs) -> None:
    """Redis needs a password from the synced Secret; only Envoy Gateway's rate-limit pods (their
    labels at v1.8.3: internal/infrastructure/kubernetes/ratelimit/resource.go rateLimitLabels) in
    its namespace may connect; Envoy Gateway's rate-limit service gets the same password as REDIS_AUTH
    (envoyproxy/ratelimit src/settings/settings.go at the image tag 1e50889b Envoy Gateway v1.8.3
    pins in api/v1alpha1/shared_types.go; rateLimitDeployment.container.env is appended by
    internal/infrastructure/kubernetes/resource/resource.go ExpectedContainerEnv). The field path
    ``provider.kubernetes.rateLimitDeployment.{container.env,pod.nodeSelector,pod.tolerations}`` is
    EnvoyGatewayKubernetesProvider's and KubernetesDeploymentSpec's JSON names
    (api/v1alpha1/envoygateway_types.go, shared_types.go); a given ``pod`` or ``container`` keeps
    Envoy Gateway's image, resources and security context defaults (api/v1alpha1/kubernetes_helpers.go
    defaultKubernetesDeploymentSpec; ratelimit/resource.go expectedRateLimitContainerSecurityContext);
    the gateway-helm chart merges ``config.envoyGateway`` into its EnvoyGateway config
    (charts/gateway-helm/templates/envoy-gateway-config.yaml)."""
    docs = _by_kind(default_docs)
    (redis,) = docs["Deployment"]
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert "--protected-mode" not in container["args"]
    assert container["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert env["REDIS_PASSWORD"] == env["REDISCLI_AUTH"] == {"name": REDIS_AUTH_SECRET, "key": "password"}
    synced = {(e["metadata"]["namespace"], e["spec"]["target"]["name"]): e for e in docs["ExternalSecret"]}
    for namespace in ("gennstack-gateway", "envoy-gateway-system"):
        secret = synced[(namespace, REDIS_AUTH_SECRET)]
        assert secret["spec"]["data"] == [{"secretKey": "password", "remoteRef": {"key": REDIS, "property": "password"}}]
    # Beside the namespace's default-deny (tests/test_network_policies.py): Redis's own ingress policy.
    (policy,) = [p for p in docs["NetworkPolicy"] if p["spec"]["podSelector"]]
    assert policy["spec"]["podSelector"]["matchLabels"] == redis["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    (peer,) = rule["from"]  # namespace AND pod labels in one peer
    assert peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}},
                    "podSelector": {"matchLabels": RATE_LIMIT_POD_LABELS}}
    eg = envoy_gateway_values(GatewayConfig())["config"]["envoyGateway"]
    rate_limit = eg["provider"]["kubernetes"]["rateLimitDeployment"]
    assert rate_limit["container"]["env"] == [{"name": "REDIS_AUTH", "valueFrom": {
        "secretKeyRef": {"name": REDIS_AUTH_SECRET, "key": "password"}}}]
    assert eg["rateLimit"]["backend"]["redis"] == {"url": redis_url(GatewayConfig())}
    # Two replicas, spread over nodes, and a PDB: Envoy Gateway v1.8.3 sets the Deployment's replicas from
    # rateLimitDeployment.replicas (nil: 1) and its topologySpreadConstraints from pod, and makes a PDB only
    # when rateLimitPDB is set (internal/infrastructure/kubernetes/ratelimit/resource_provider.go Deployment,
    # PodDisruptionBudget; KubernetesPodDisruptionBudgetSpec in api/v1alpha1/shared_types.go: one of
    # minAvailable, maxUnavailable); the spread selects the rate-limit pods' labels.
    assert rate_limit["replicas"] == 2
    assert eg["provider"]["kubernetes"]["rateLimitPDB"] == {"minAvailable": 1}
    (spread,) = rate_limit["pod"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == RATE_LIMIT_POD_LABELS
    assert (spread["topologyKey"], spread["whenUnsatisfiable"]) == ("kubernetes.io/hostname", "ScheduleAnyway")
    off = envoy_gateway_values(GatewayConfig.model_validate(frozen({"rate_limit": {"enabled": False}})))
    assert "rateLimit" not in off["config"]["envoyGateway"] and "kubernetes" not in off["config"]["envoyGateway"]["provider"]


def test_genai_metrics_carry_the_client_id() -> None:
    """AI Gateway v1.1.0: the ai-gateway-helm chart passes ``controller.metricsRequestHeaderAttributes``
    as the controller flag (manifests/charts/ai-gateway-helm/templates/deployment.yaml), which hands it
    to each ext_proc sidecar (internal/controller/extproc_builder.go ``-metricsRequestHeaderAttributes``);
    the sidecar adds the header's value as that attribute to every GenAI metric
    (cmd/extproc/mainlib/main.go NewMetricsFactory) and serves them on its admin port 1064 at /metrics.
    The header is set by the API-key check, which Envoy Gateway orders before the AI Gateway's ext_proc
    (internal/xds/translator/httpfilters.go: api_key_auth 6, ext_proc from 100; the AI Gateway inserts its
    filter before the first ext_proc/wasm/lua/rbac/rate-limit filter, post_translate_modify.go)."""
    controller = ai_gateway_values()["controller"]
    header, attribute = controller["metricsRequestHeaderAttributes"].split(":")
    assert header == "x-gennstack-client" == CLIENT_HEADER and attribute == "gennstack.client_id"
    # OpenTelemetry's Prometheus exporter writes an attribute's dots as underscores: the label the
    # gateway dashboard and alerts read (gennstack/observability/names.py).
    assert CLIENT_LABEL == attribute.replace(".", "_") == "gennstack_client_id"


def test_model_names_kubernetes_cannot_hold_render_valid_objects(helm) -> None:
    """A Hugging Face style name ('org/Name-3.1:tag') becomes valid object and rule names from
    gennstack.gateway.names, and stays whole in an annotation (a label value may not hold '/' or ':')."""
    from gennstack.gateway.names import rule_name

    name = "Meta-Llama/Llama-3.1-8B:fp8"
    gateway = _config_with_models({name: {"generation": "g6e", "service": "gen3-g6e"}})
    docs = render(helm, gateway)
    _validate_all(docs)
    by_kind = _by_kind(docs)
    (route,) = by_kind["AIGatewayRoute"]
    assert [r["name"] for r in route["spec"]["rules"]] == [rule_name(name)]
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == backend_object_name(name)
    for kind in ("Backend", "AIServiceBackend"):
        (obj,) = by_kind[kind]
        assert obj["metadata"]["name"] == backend_object_name(name) == "gennstack-gateway-meta-llama-llama-3-1-8b-fp8"
        assert obj["metadata"]["annotations"]["gennstack.io/model"] == name


def _config_with_models(models: dict) -> GatewayConfig:
    return GatewayConfig.model_validate(frozen({"models": models, "aliases": {}}))


def test_an_internal_nlb_without_allowed_cidrs_lets_in_only_the_vpc(helm) -> None:
    """AWS Load Balancer Controller v3.5.0 pkg/service/model_build_managed_sg.go,
    buildCIDRsFromSourceRanges: with no loadBalancerSourceRanges (and no source-ranges annotation or
    prefix lists) the NLB's managed security group admits 0.0.0.0/0, for an internal NLB too. So an
    internal gateway without allowed_cidrs gets the VPC's CIDR as its source ranges, and an explicit
    list is kept as given."""
    from gennstack.gateway.values import allowed_cidrs, gateway_chart_values

    gateway = GatewayConfig()
    assert gateway.load_balancer.scheme == "internal" and not gateway.load_balancer.allowed_cidrs
    assert allowed_cidrs(gateway, "10.42.0.0/16") == ["10.42.0.0/16"]
    with pytest.raises(ValueError, match="0.0.0.0/0"):
        allowed_cidrs(gateway, "")
    listed = GatewayConfig.model_validate(frozen({"load_balancer": {"allowed_cidrs": ["192.168.0.0/24"]}}))
    assert allowed_cidrs(listed, "10.42.0.0/16") == ["192.168.0.0/24"]
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name="k",
                                  redis_secret_name="r", vpc_cidr="10.42.0.0/16")
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--values", "-"],
                          input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (proxy,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "EnvoyProxy" and d["metadata"]["name"] not in RESUME_OBJECTS]
    service = proxy["spec"]["provider"]["kubernetes"]["envoyService"]
    assert service["loadBalancerSourceRanges"] == ["10.42.0.0/16"]
