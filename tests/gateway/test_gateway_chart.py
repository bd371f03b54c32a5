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

from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.values import backend_object_name, gateway_chart_values, redis_url
from gennstack.config_base import frozen
from tests.helm import undocumented_values
from tests.k8s_schema import crd_dir, validate

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway"
API_KEYS = "gennstack/gateway-api-keys"
LANGFUSE = "gennstack/langfuse"


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
                                  api_keys_secret_name=API_KEYS)
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--namespace", gateway.namespace,
                           "--values", "-", *extra], input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _validate_all(docs: list[dict]) -> None:
    """Every object, External Secrets' too (v2.9.0 CRDs in ../shared/crds), against its schema and CEL rules."""
    crd_dir()
    for doc in docs:
        validate(doc)


def _by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for doc in docs:
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
            "Deployment", "Service", "NetworkPolicy", "Secret", "ConfigMap"} == kinds
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
    assert rule["streamIdleTimeout"] == "30s" and rule["timeouts"] == {"request": "900s"}
    names = [r["name"] for r in route["spec"]["rules"]]
    assert len(names) == len(set(names))  # the CRD's CEL rule: unique rule names
    assert {c["type"] for c in route["spec"]["llmRequestCosts"]} == {"InputToken", "OutputToken", "TotalToken"}


def test_failover_health_checks_and_rate_limit_policy(default_docs) -> None:
    docs = _by_kind(default_docs)
    (btp,) = docs["BackendTrafficPolicy"]
    (route,) = docs["AIGatewayRoute"]
    # targets the HTTPRoute the AI Gateway generates, which carries the AIGatewayRoute's name
    assert btp["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": route["metadata"]["name"]}]
    retry = btp["spec"]["retry"]
    assert retry["numAttemptsPerPriority"] == 1 and retry["numRetries"] == 3
    assert set(retry["retryOn"]["triggers"]) == {"connect-failure", "reset", "retriable-status-codes"}
    assert retry["perRetry"]["timeout"] == "900s"  # never cuts a long stream
    active, passive = btp["spec"]["healthCheck"]["active"], btp["spec"]["healthCheck"]["passive"]
    assert active["type"] == "HTTP" and active["http"]["path"] == "/health"
    assert passive["consecutiveGatewayErrors"] == 3 and passive["maxEjectionPercent"] == 100
    token_rule, request_rule = btp["spec"]["rateLimit"]["global"]["rules"]
    assert token_rule["clientSelectors"] == [{"headers": [{"name": "x-gennstack-client", "type": "Distinct"}]}]
    assert token_rule["cost"] == {"request": {"from": "Number", "number": 0}, "response": {
        "from": "Metadata", "metadata": {"namespace": "io.envoy.ai_gateway", "key": "llm_total_token"}}}
    assert token_rule["limit"] == {"requests": 2_000_000, "unit": "Hour"}
    assert request_rule["limit"] == {"requests": 600, "unit": "Minute"}
    (ctp,) = docs["ClientTrafficPolicy"]
    assert ctp["spec"]["connection"]["bufferLimit"] == "50Mi"
    (sp,) = docs["SecurityPolicy"]
    auth = sp["spec"]["apiKeyAuth"]
    assert auth["extractFrom"] == [{"headers": ["Authorization"]}] and auth["sanitize"] is True
    assert auth["forwardClientIDHeader"] == "x-gennstack-client"


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
    assert store["spec"]["conditions"] == [{"namespaces": ["gennstack-gateway"]}]
    (keys,) = docs["ExternalSecret"]
    assert keys["spec"]["dataFrom"] == [{"extract": {"key": API_KEYS}}]
    assert keys["spec"]["secretStoreRef"] == {"kind": "ClusterSecretStore", "name": store["metadata"]["name"]}
    (sp,) = docs["SecurityPolicy"]
    assert sp["spec"]["apiKeyAuth"]["credentialRefs"][0]["name"] == keys["spec"]["target"]["name"]
    # Langfuse: off by default; when on, keys from Secrets Manager into the proxies' namespace
    assert "GatewayConfig" not in docs
    variant = _by_kind(variant_docs)
    langfuse = next(e for e in variant["ExternalSecret"] if e["metadata"]["namespace"] == "envoy-gateway-system")
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
    (btp,) = variant["BackendTrafficPolicy"]
    assert [r["limit"]["unit"] for r in btp["spec"]["rateLimit"]["global"]["rules"]] == ["Minute"]


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
    proc = subprocess.run([str(helm), "template", "x", str(CHART), "--set", "secrets.region=us-east-1",
                           "--set", "apiKeys.remoteSecretName=k", flag, wrong], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "additional properties" in proc.stderr


@pytest.mark.parametrize("missing", ["secrets.region", "apiKeys.remoteSecretName"])
def test_required_values(helm, missing) -> None:
    given = {"secrets.region": "us-east-1", "apiKeys.remoteSecretName": "k"}
    args = [a for k, v in given.items() if k != missing for a in ("--set", f"{k}={v}")]
    proc = subprocess.run([str(helm), "template", "x", str(CHART), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and f"{missing} is required" in proc.stderr


def test_route_naming_an_unknown_backend_fails(helm) -> None:
    routes = {"routes": [{"model": "m", "backends": [{"name": "nope", "weight": 1, "priority": 0}]}]}
    proc = subprocess.run([str(helm), "template", "x", str(CHART), "--set", "secrets.region=us-east-1",
                           "--set", "apiKeys.remoteSecretName=k", "--values", "-"],
                          input=json.dumps(routes), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and 'backend "nope" is not in backends' in proc.stderr


def test_helm_lint(helm) -> None:
    proc = subprocess.run([str(helm), "lint", "--strict", str(CHART), "--set", "secrets.region=us-east-1",
                           "--set", "apiKeys.remoteSecretName=k"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_values_yaml_is_the_default_config_and_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(values, schema)
    gateway = GatewayConfig()
    built = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", api_keys_secret_name="")
    for key in ("backends", "routes", "resilience", "rateLimit", "bufferLimit", "langfuse", "redis"):
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
