"""The project chart's EnvoyPatchPolicy (templates/patches.yaml): its shape, the xDS names it
patches, and that it carries the same Envoy settings as the local gateway.

The EnvoyPatchPolicy CRD is not among the upstream schemas in ../shared/crds, so its fields are
pinned here to the Go types and their kubebuilder markers, and the names it patches to the code
that makes them, each named in the test's docstring."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.gateway.conftest import RELAY_IMAGE
from gennstack.config_base import frozen
from gennstack.gateway.config import MAX_ROUTES, GatewayConfig, routing_table
from gennstack.gateway.envoy_common import (
    AI_GATEWAY_JSON_STATUSES,
    CLUSTER_RETRY_AFTER_S,
    MAX_HOSTS_PER_BACKEND,
    RATE_LIMIT_RESET_HEADER,
    OVERPROVISIONING_FACTOR,
    local_reply_config,
)
from gennstack.gateway.config import ResumeSettings
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_binary, envoy_bootstrap
from gennstack.gateway.values import GATEWAY_LISTENER, envoy_patch_values, gateway_chart_values

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway"
HCM = "envoy.filters.network.http_connection_manager"
MAGLEV_BALANCE_PATH = "/load_balancing_policy/policies/0/typed_extension_config/typed_config/consistent_hashing_lb_config"


def _render(helm: Path, gateway: GatewayConfig, namespace: str = "gennstack-gateway") -> dict[str, list[dict]]:
    """The chart with stream resume off: one Gateway carries the model routes and their patches. With resume
    on the same patches go to the routing Gateway (tests/gateway/test_gateway_resume_chart.py)."""
    gateway = gateway.model_copy(update={"resume": ResumeSettings(enabled=False)})
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name="k",
                                  redis_secret_name="r")
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--namespace", namespace, "--values", "-"],
                          input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all(proc.stdout):
        if doc:
            out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.fixture(scope="module")
def docs(helm) -> dict[str, list[dict]]:
    return _render(helm, GatewayConfig())


@pytest.fixture(scope="module")
def policy(docs) -> dict:
    (found,) = docs["EnvoyPatchPolicy"]
    return found


def test_fields_match_envoy_gateway_v1_8_3_types(policy) -> None:
    """Envoy Gateway v1.8.3, api/v1alpha1/envoypatchpolicy_types.go (and the CRD generated from it,
    charts/gateway-helm/charts/crds/crds/generated/gateway.envoyproxy.io_envoypatchpolicies.yaml):
    spec {type (Enum=JSONPatch, required), jsonPatches [EnvoyJSONPatchConfig], targetRef
    (gwapiv1.LocalPolicyTargetReference: group, kind, name, all required), priority int32};
    EnvoyJSONPatchConfig {type (Enum of five xDS type URLs), name, operation, all required};
    JSONPatchOperation {op (Enum=add;remove;replace;move;copy;test, required), path, jsonPath, from,
    value (apiextensionsv1.JSON)}. The policy must live in the Gateway's namespace."""
    assert policy["apiVersion"] == "gateway.envoyproxy.io/v1alpha1"
    spec = policy["spec"]
    assert set(spec) <= {"type", "jsonPatches", "targetRef", "priority"} and {"type", "targetRef"} <= set(spec)
    assert spec["type"] == "JSONPatch"
    assert spec["targetRef"] == {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gennstack-gateway"}
    resource_types = {
        "type.googleapis.com/envoy.config.listener.v3.Listener",
        "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
    }
    for patch in spec["jsonPatches"]:
        assert set(patch) == {"type", "name", "operation"}
        assert patch["type"] in resource_types and isinstance(patch["name"], str) and patch["name"]
        operation = patch["operation"]
        assert set(operation) <= {"op", "path", "jsonPath", "from", "value"} and "op" in operation
        assert operation["op"] in {"add", "remove", "replace", "move", "copy", "test"}
    assert policy["metadata"]["namespace"] == "gennstack-gateway"


def _parse_ai_gateway_cluster_name(name: str) -> tuple[str, str, int]:
    """Envoy AI Gateway v1.1.0, internal/extensionserver/post_translate_modify.go
    parseAIGatewayClusterName: "httproute/<namespace>/<route>/rule/<index>" (5 parts; 7 with
    "/backend/<n>" when Envoy Gateway made a cluster per backend)."""
    parts = name.split("/")
    assert len(parts) in (5, 7) and parts[0] == "httproute" and parts[3] == "rule", name
    assert int(parts[4]) >= 0
    return parts[1], parts[2], int(parts[4])


def test_cluster_patches_name_each_ai_gateway_rule_cluster(helm) -> None:
    """One patch per AIGatewayRoute rule, named as Envoy Gateway v1.8.3 names the rule's cluster:
    internal/gatewayapi/helpers.go irRoutePrefix + irRouteDestinationName,
    "<lower-case route kind>/<namespace>/<name>/rule/<index>"; one cluster per rule, not per
    backend (internal/xds/translator/translator.go: a cluster per setting only with zone-aware
    routing, backendRef filters, mixed address types or invalid settings: none of which the AI
    Gateway's HTTPRoute has, since every GenNStack backend is an FQDN Backend). The HTTPRoute is the
    AIGatewayRoute's name and namespace, its rules in the same order with "route-not-found"
    appended last (AI Gateway v1.1.0 internal/controller/ai_gateway_route.go), so rule i of the
    AIGatewayRoute is cluster i; that is also how the AI Gateway's extension server finds the rule
    (parseAIGatewayClusterName, then aigwRoute.Spec.Rules[ruleIndex])."""
    big = GatewayConfig.model_validate(frozen({
        "models": {f"m{i}": {"generation": "g6e", "service": f"m{i}"} for i in range(MAX_ROUTES - 1)},
        "aliases": {"chat": [{"model": "m0"}, {"model": "m1", "priority": 1}]},
    }))
    for gateway, namespace in ((GatewayConfig(), "gennstack-gateway"), (big, "other-ns")):
        docs = _render(helm, gateway, namespace)
        (route,) = docs["AIGatewayRoute"]
        (policy,) = docs["EnvoyPatchPolicy"]
        clusters = [p for p in policy["spec"]["jsonPatches"] if p["type"].endswith("cluster.v3.Cluster")]
        factor = [p for p in clusters if p["operation"]["path"] == "/load_assignment/policy/overprovisioning_factor"]
        uneject = [p for p in clusters
                   if p["operation"]["path"] == "/outlier_detection/successful_active_health_check_uneject_host"]
        assert len(factor) == len(uneject) == len(route["spec"]["rules"]) == len(routing_table(gateway).routes)
        hashed = [i for i, r in enumerate(routing_table(gateway).routes) if r.routing == "prefix"]
        balance = [p for p in clusters if p["operation"]["path"] == MAGLEV_BALANCE_PATH]
        assert [p["name"] for p in balance] == [f"httproute/{namespace}/{route['metadata']['name']}/rule/{i}" for i in hashed]
        per_rule = {"/outlier_detection/max_ejection_time": gateway.resilience.base_ejection_time_s,
                    "/health_checks/0/no_traffic_interval": gateway.resilience.health_interval_s}
        for path, seconds in per_rule.items():
            found = [p for p in clusters if p["operation"]["path"] == path]
            assert [p["name"] for p in found] == [p["name"] for p in factor]
            assert {p["operation"]["value"] for p in found} == {f"{seconds}s"}
        assert hashed and len(clusters) == 4 * len(factor) + len(hashed)
        for index, (patch, uneject_patch) in enumerate(zip(factor, uneject, strict=True)):
            assert patch["name"] == uneject_patch["name"] == f"httproute/{namespace}/{route['metadata']['name']}/rule/{index}"
            assert _parse_ai_gateway_cluster_name(patch["name"]) == (namespace, route["metadata"]["name"], index)
            assert patch["operation"] == {"op": "add", "path": "/load_assignment/policy/overprovisioning_factor",
                                          "value": OVERPROVISIONING_FACTOR}
            assert uneject_patch["operation"]["op"] == "add" and uneject_patch["operation"]["value"] is False


def test_listener_patch_names_the_gateway_listener_and_every_hcm(policy, docs) -> None:
    """Envoy Gateway v1.8.3 names a Gateway listener's xDS listener "<namespace>/<gateway>/<listener>"
    (internal/gatewayapi/helpers.go irListenerName; internal/xds/translator/listener.go
    xdsListenerName keeps that name unless the XDSNameSchemeV2 runtime flag is on, and it is off
    by default: api/v1alpha1/envoygateway_helpers.go). The HTTP connection manager is the network
    filter named envoy.filters.network.http_connection_manager (wellknown.HTTPConnectionManager) in
    each of filter_chains (HTTPS, one per certificate/hostname) or in default_filter_chain (HTTP)
    (listener.go addHCMToXDSListener); JSON patches see the listener as protojson with proto
    (snake_case) names (internal/xds/translator/jsonpatch.go, UseProtoNames), a jsonPath is expanded
    to one pointer per match and "path" appended to each, and "add" creates missing parents
    (internal/utils/jsonpatch/patch.go, EnsurePathExistsOnAdd)."""
    (listener_patch,) = [p for p in policy["spec"]["jsonPatches"] if p["type"].endswith("listener.v3.Listener")]
    (gateway,) = docs["Gateway"]
    assert listener_patch["name"] == f"gennstack-gateway/{gateway['metadata']['name']}/{GATEWAY_LISTENER}"
    operation = listener_patch["operation"]
    assert operation["jsonPath"] == f"..filters[?(@.name=='{HCM}')].typed_config"
    assert operation["path"] == "/local_reply_config" and operation["op"] == "add"
    assert operation["value"] == local_reply_config(CLUSTER_RETRY_AFTER_S, passthrough=AI_GATEWAY_JSON_STATUSES,
                                                    retry_after_from=RATE_LIMIT_RESET_HEADER)


def test_the_gateway_has_the_one_listener_the_patch_names(docs) -> None:
    """The Gateway's one listener is "https" (issue 12's TLS design, by the g-tls change to
    templates/gateway.yaml): the name the listener patch is built with."""
    (gateway,) = docs["Gateway"]
    assert [(listener["name"], listener["port"]) for listener in gateway["spec"]["listeners"]] == [(GATEWAY_LISTENER, 443)]


def test_values_yaml_carries_the_built_patch_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["envoyPatches"] == envoy_patch_values()


def test_cluster_and_local_gateway_share_the_settings(tmp_path) -> None:
    """The same factor and the same local reply mappers (but Retry-After, which follows each one's
    rate limit) in the local bootstrap and the cluster's patch; the cluster's local reply config is
    valid Envoy config (checked by the real Envoy in validate mode inside the local bootstrap)."""
    gateway = GatewayConfig()
    bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": "http://127.0.0.1:1"}, gateway,
                                LocalSettings(listen_port=0, admin_port=0))
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    assert hcm["name"] == HCM
    local = hcm["typed_config"]["local_reply_config"]
    cluster = envoy_patch_values()["localReplyConfig"]

    def without_retry_after(config: dict) -> dict:
        return {"mappers": [{k: v for k, v in m.items() if k != "headers_to_add"} for m in config["mappers"]]}

    passthrough = cluster["mappers"][:len(AI_GATEWAY_JSON_STATUSES)]
    assert passthrough == [{"filter": m["filter"]} for m in passthrough]  # no override: the body stays
    assert without_retry_after(local) == without_retry_after({"mappers": cluster["mappers"][len(passthrough):]})
    (local_429,) = [m["headers_to_add"] for m in local["mappers"] if "headers_to_add" in m]
    (cluster_429,) = [m["headers_to_add"] for m in cluster["mappers"] if "headers_to_add" in m]
    assert [h["header"]["key"] for h in local_429] == ["retry-after"]
    assert [h["header"]["value"] for h in cluster_429] == [str(CLUSTER_RETRY_AFTER_S), "%RESP(x-ratelimit-reset)%"]
    for c in bootstrap["static_resources"]["clusters"]:
        assert c["load_assignment"]["policy"]["overprovisioning_factor"] == envoy_patch_values()["overprovisioningFactor"]
    hcm["typed_config"]["local_reply_config"] = cluster
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(bootstrap))
    proc = subprocess.run([str(envoy_binary()), "--mode", "validate", "--config-path", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_the_factor_bound_follows_the_config_limits() -> None:
    """100 x the most hosts one priority can hold: MAX_ROUTES models (a 16th name is refused) of at
    most MAX_HOSTS_PER_BACKEND replicas each (max_replicas 101 is refused)."""
    from pydantic import ValidationError

    from gennstack.serving.config import G6eServing

    assert OVERPROVISIONING_FACTOR == 100 * MAX_ROUTES * MAX_HOSTS_PER_BACKEND
    with pytest.raises(ValidationError):
        GatewayConfig.model_validate(frozen({"models": {f"m{i}": {"generation": "g6e", "service": f"m{i}"}
                                                        for i in range(MAX_ROUTES + 1)}, "aliases": {}}))
    G6eServing.model_validate({"min_replicas": MAX_HOSTS_PER_BACKEND, "max_replicas": MAX_HOSTS_PER_BACKEND})
    with pytest.raises(ValidationError, match="max_replicas"):
        G6eServing.model_validate({"max_replicas": MAX_HOSTS_PER_BACKEND + 1})


def test_cluster_has_no_panic_mode_either(docs) -> None:
    """Failover rule 5 in the cluster: the BackendTrafficPolicy's healthCheck.panicThreshold is 0
    (set by the g-chart change to templates/policies.yaml), which Envoy Gateway v1.8.3 writes into
    every cluster's common_lb_config.healthy_panic_threshold (internal/xds/translator/cluster.go:
    any value other than 50 is set), as the local bootstrap has it."""
    with_checks = [p for p in docs["BackendTrafficPolicy"] if "healthCheck" in p["spec"]]
    assert with_checks and all(p["spec"]["healthCheck"]["panicThreshold"] == 0 for p in with_checks)


AI_GATEWAY_400 = '{"type":"error","error":{"type":"BadRequest","code":"400","message":"malformed request"}}'


def test_the_ai_gateways_own_json_answers_pass_through_in_the_cluster() -> None:
    """AI Gateway v1.1.0 internal/extproc/processor_impl.go answers a malformed body (400, line 251)
    and an untranslatable request (422, line 369) itself, as an ext_proc immediate response whose
    body is already JSON (formatUserFacingErrorJSON) with content-type application/json
    (createUserFacingErrorResponse); Envoy sends immediate responses as local replies. Real Envoy,
    the cluster's local reply config, direct responses with that content-type standing in for them:
    those bodies reach the client unchanged, while Envoy's own answers (413 here) are still wrapped
    (test_gateway_local_replies_e2e.py: Envoy's own 400 too)."""
    gateway = GatewayConfig()
    bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": "http://127.0.0.1:1"}, gateway,
                                LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0))
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["local_reply_config"] = envoy_patch_values()["localReplyConfig"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"]
    hcm["route_config"] = {"name": "test", "virtual_hosts": [{"name": "test", "domains": ["*"], "routes": [
        {"match": {"path": f"/{status}"}, "direct_response": {"status": status, "body": {"inline_string": body}},
         "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"},
                                      "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}] if status != 413 else []}
        for status, body in ((400, AI_GATEWAY_400), (422, AI_GATEWAY_400.replace("400", "422")), (413, "too large"))]}]}
    bootstrap["static_resources"]["clusters"] = []
    with LocalGateway.start(bootstrap) as gw:
        answers = {}
        for status in (400, 422, 413):
            try:
                urllib.request.urlopen(f"{gw.base_url.removesuffix('/v1')}/{status}", timeout=10)
            except urllib.error.HTTPError as exc:
                answers[status] = json.loads(exc.read())
    assert answers[400] == json.loads(AI_GATEWAY_400)
    assert answers[422]["error"]["code"] == "422" and answers[422]["type"] == "error"
    assert answers[413]["error"]["type"] == "invalid_request_error" and answers[413]["error"]["code"] == "request_too_large"


def test_outlier_semantics_match_the_local_gateway(helm) -> None:
    """The cluster's outlier settings are the local gateway's (tests/gateway/test_gateway_outlier_e2e.py
    measures them on real Envoy): the BackendTrafficPolicy's passive.maxEjectionPercent, which Envoy
    Gateway v1.8.3 writes into the cluster's outlier_detection.max_ejection_percent when > 0
    (internal/xds/translator/cluster.go buildXdsOutlierDetection), and the EnvoyPatchPolicy's
    successful_active_health_check_uneject_host, a field Envoy Gateway never sets (same function)
    and patches with proto field names (internal/xds/translator/jsonpatch.go: UseProtoNames), onto
    the /outlier_detection that the passive health check makes. Every rule's policy (fallback_on
    ones too) carries the cap."""
    gateway = GatewayConfig.model_validate(frozen({"fallback_on": {"gennstack-default": ["rate_limited"]}}))
    bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": "http://127.0.0.1:1"}, gateway,
                                LocalSettings(listen_port=0, admin_port=0))
    local = {c["name"]: c["outlier_detection"] for c in bootstrap["static_resources"]["clusters"]}
    assert local and all(o["max_ejection_percent"] == 50 for o in local.values())
    assert all(o["successful_active_health_check_uneject_host"] is False for o in local.values())
    assert all(o["consecutive_local_origin_failure"] == 3 and o["max_ejection_time"] == o["base_ejection_time"] == "10s"
               for o in local.values())
    docs = _render(helm, gateway)
    passive = [p["spec"]["healthCheck"]["passive"] for p in docs["BackendTrafficPolicy"] if "healthCheck" in p["spec"]]
    assert len(passive) == 3  # the route's, gennstack-default's fallback_on and gpt-oss-20b's prefix routing
    for p in passive:
        assert p["maxEjectionPercent"] == 50
        assert p["consecutiveLocalOriginFailures"] == 3 and p["splitExternalLocalOriginErrors"] is True
        assert p["baseEjectionTime"] == "10s"
    (policy,) = docs["EnvoyPatchPolicy"]
    uneject = {p["name"]: p["operation"]["value"] for p in policy["spec"]["jsonPatches"]
               if p["operation"].get("path") == "/outlier_detection/successful_active_health_check_uneject_host"}
    assert len(uneject) == len(routing_table(gateway).routes) and set(uneject.values()) == {False}


def test_the_clusters_ejection_time_and_idle_health_checks_are_valid_envoy_config(helm, tmp_path) -> None:
    """The chart's per-rule cluster patches that Envoy Gateway v1.8.3 has no field for, applied as it
    applies them (internal/xds/translator/jsonpatch.go: RFC 6902 ops on the proto JSON, proto field
    names) to the local gateway's route clusters, which carry the fields the BackendTrafficPolicy makes
    (outlier_detection, health_checks[0]): real Envoy (validate mode) accepts the result, and it equals
    the local gateway's own settings. max_ejection_time: Envoy makes the Nth ejection last
    min(N x base_ejection_time, max_ejection_time) + jitter, max_ejection_time defaulting to
    max(300 s, base) (source/common/upstream/outlier_detection_impl.cc checkHostForUneject,
    DetectorConfig; DetectorImpl::create refuses a max below the base); no_traffic_interval: Envoy's
    default is 60 s for a cluster that has carried no traffic (envoy/config/core/v3/health_check.proto)."""
    gateway = GatewayConfig()
    bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": ["http://127.0.0.1:1", "http://127.0.0.1:2"]},
                                gateway, LocalSettings(listen_port=0, admin_port=0))
    (policy,) = _render(helm, gateway)["EnvoyPatchPolicy"]
    wanted = {"/outlier_detection/max_ejection_time", "/health_checks/0/no_traffic_interval"}
    patches = [p["operation"] for p in policy["spec"]["jsonPatches"] if p["operation"].get("path") in wanted]
    assert {p["path"] for p in patches} == wanted and {p["op"] for p in patches} == {"add"}
    for cluster in bootstrap["static_resources"]["clusters"]:
        local = json.loads(json.dumps(cluster))
        for op in patches:
            *parents, leaf = op["path"].strip("/").split("/")
            node = cluster
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            node[leaf] = op["value"]
        assert cluster == local  # the same values the local gateway sets itself
        assert cluster["outlier_detection"]["max_ejection_time"] == f"{gateway.resilience.base_ejection_time_s}s"
        assert cluster["health_checks"][0]["no_traffic_interval"] == f"{gateway.resilience.health_interval_s}s"
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(bootstrap))
    proc = subprocess.run([str(envoy_binary()), "--mode", "validate", "--config-path", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_cluster_closes_idle_upstream_connections_as_the_local_gateway_does(docs) -> None:
    """Every rule's BackendTrafficPolicy sets timeout.http.connectionIdleTimeout (Envoy Gateway v1.8.3
    api/v1alpha1/timeout_types.go; written into the cluster's common_http_protocol_options.idle_timeout by
    internal/xds/translator/cluster.go buildTypedExtensionProtocolOptions, and kept by the AI Gateway
    v1.1.0 extension server, which unmarshals the existing HttpProtocolOptions before adding its upstream
    filter: internal/extensionserver/post_translate_modify.go maybeModifyCluster) to the local gateway's
    value, below vLLM's 5 s keep-alive; Envoy Gateway's default is 1 h."""
    from gennstack.gateway.envoy_common import SERVER_KEEP_ALIVE_S, UPSTREAM_IDLE_TIMEOUT_S

    with_checks = [p for p in docs["BackendTrafficPolicy"] if "healthCheck" in p["spec"]]
    assert with_checks
    assert {p["spec"]["timeout"]["http"]["connectionIdleTimeout"] for p in with_checks} == {f"{UPSTREAM_IDLE_TIMEOUT_S}s"}
    gateway = GatewayConfig()
    bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": "http://127.0.0.1:1"}, gateway,
                                LocalSettings(listen_port=0, admin_port=0))
    for cluster in bootstrap["static_resources"]["clusters"]:
        options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        assert options["common_http_protocol_options"]["idle_timeout"] == f"{UPSTREAM_IDLE_TIMEOUT_S}s"
    assert UPSTREAM_IDLE_TIMEOUT_S < SERVER_KEEP_ALIVE_S
