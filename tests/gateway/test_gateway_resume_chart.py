"""Stream resume in the cluster (docs/gateway.md, "Stream resume"): the relay between the public Gateway and
the routing Gateway, rendered by the real helm with the values the construct passes, every object validated
against the upstream CRDs and Kubernetes' schemas, the relay's pod against the restricted Pod Security
Standard, the NetworkPolicies through the evaluator of tests/netpol.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig, ResumeSettings, routing_table
from gennstack.gateway.names import ENVOY_GATEWAY_NAMESPACE, GATEWAY_RELEASE
from gennstack.gateway.values import (MIN_DRAIN_S, ROUTING_GATEWAY, ROUTING_PORT, gateway_chart_values, resume_config,
                                      routing_upstream)
from gennstack.network_policy import DNS_PEER, PROMETHEUS_POD_LABELS, PROXY_POD_LABELS
from gennstack.observability.names import MONITORING_NAMESPACE
from gennstack.resume.config import ResumeConfig
from gennstack.system_nodes import SYSTEM_NODE_SELECTOR, SYSTEM_TOLERATIONS
from tests.gateway.conftest import RELAY_IMAGE, validate_chart_objects
from tests.netpol import Endpoint, allowed, network_policies
from tests.pod_security import violations

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway"
NAMESPACE = "gennstack-gateway"
RELAY = f"{GATEWAY_RELEASE}-resume"
FRONT = f"{GATEWAY_RELEASE}-front"


def render(helm: Path, gateway: GatewayConfig, enabled=("inf2", "trn2", "g6e"), **kwargs) -> list[dict]:
    values = gateway_chart_values(gateway, routing_table(gateway, set(enabled)), region="us-east-1", api_keys_secret_name="k",
                                  redis_secret_name="r", resume_image=RELAY_IMAGE, system_node_selector=SYSTEM_NODE_SELECTOR,
                                  system_tolerations=SYSTEM_TOLERATIONS, **kwargs)
    proc = subprocess.run([str(helm), "template", GATEWAY_RELEASE, str(CHART), "--namespace", gateway.namespace,
                           "--values", "-"], input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def one(docs: list[dict], kind: str, name: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


@pytest.fixture(scope="module")
def docs(helm) -> list[dict]:
    return render(helm, GatewayConfig())


@pytest.fixture(scope="module")
def off_docs(helm) -> list[dict]:
    return render(helm, GatewayConfig(resume=ResumeSettings(enabled=False)))


def test_every_object_validates_and_the_relay_pod_is_restricted(helm, docs, off_docs) -> None:
    validate_chart_objects(docs)
    validate_chart_objects(off_docs)
    validate_chart_objects(render(helm, GatewayConfig(), network_policies=False))
    relay = one(docs, "Deployment", RELAY)
    assert violations(relay["spec"]["template"]["spec"], "restricted") == set()


def test_relay_on_system_nodes_two_replicas_pdb_and_a_grace_for_the_longest_stream(helm, docs) -> None:
    relay = one(docs, "Deployment", RELAY)
    pod = relay["spec"]["template"]["spec"]
    assert relay["spec"]["replicas"] >= 2
    # the system nodes are on-demand, outside Karpenter's spot pools (gennstack.system_nodes)
    assert pod["nodeSelector"] == SYSTEM_NODE_SELECTOR and pod["tolerations"] == SYSTEM_TOLERATIONS
    selector = relay["spec"]["selector"]["matchLabels"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert all(c["labelSelector"]["matchLabels"] == selector for c in pod["topologySpreadConstraints"])
    assert relay["spec"]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    pdb = one(docs, "PodDisruptionBudget", RELAY)
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    service = one(docs, "Service", RELAY)
    assert service["spec"]["selector"] == selector
    (container,) = pod["containers"]
    assert container["image"] == RELAY_IMAGE
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # the longest stream the route allows, plus the drain window; and for a longer request timeout too
    for timeout_s in (900, 7200):
        gateway = GatewayConfig.model_validate(frozen({"resilience": {"request_timeout_s": timeout_s}}))
        rendered = one(render(helm, gateway), "Deployment", RELAY)["spec"]["template"]["spec"]
        config = ResumeConfig.model_validate_json(one(render(helm, gateway), "ConfigMap", RELAY)["data"]["config.json"])
        assert rendered["terminationGracePeriodSeconds"] == timeout_s + MIN_DRAIN_S > config.deadline_s == timeout_s


def test_routing_proxies_on_system_nodes_with_a_pdb_and_the_public_drain(docs) -> None:
    routing = one(docs, "EnvoyProxy", ROUTING_GATEWAY)["spec"]
    public = one(docs, "EnvoyProxy", GATEWAY_RELEASE)["spec"]
    deployment = routing["provider"]["kubernetes"]["envoyDeployment"]
    pod = deployment["pod"]
    assert deployment["replicas"] == GatewayConfig().resume.routing_replicas >= 2
    assert pod["nodeSelector"] == SYSTEM_NODE_SELECTOR and pod["tolerations"] == SYSTEM_TOLERATIONS
    assert pod["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert {c["labelSelector"]["matchLabels"]["gateway.envoyproxy.io/owning-gateway-name"]
            for c in pod["topologySpreadConstraints"]} == {ROUTING_GATEWAY}
    assert routing["provider"]["kubernetes"]["envoyPDB"] == {"minAvailable": 1}
    assert routing["shutdown"] == public["shutdown"]  # the longest stream drains on both


def test_relay_runs_the_interface_cli_against_the_routing_gateway(docs) -> None:
    """`gennstack resume serve --listen --upstream --config --metrics-listen` (gennstack/resume/cli.py), its
    upstream the routing proxies' Service that Envoy Gateway names after envoyService.name, on the routing
    Gateway's listener port; the config file is the ConfigMap's, parsed by the relay's own ResumeConfig."""
    from gennstack.cli import build_parser

    relay = one(docs, "Deployment", RELAY)
    (container,) = relay["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.upstream == routing_upstream() == f"http://{ROUTING_GATEWAY}.{ENVOY_GATEWAY_NAMESPACE}.svc.cluster.local:{ROUTING_PORT}"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.listen == ("0.0.0.0", ports["http"]) and args.metrics_listen == ("0.0.0.0", ports["metrics"])
    (mount,) = container["volumeMounts"]
    assert str(args.config).startswith(mount["mountPath"] + "/")
    proxy = one(docs, "EnvoyProxy", ROUTING_GATEWAY)["spec"]["provider"]["kubernetes"]["envoyService"]
    assert proxy == {"name": ROUTING_GATEWAY, "type": "ClusterIP"}
    (listener,) = one(docs, "Gateway", ROUTING_GATEWAY)["spec"]["listeners"]
    assert (listener["protocol"], listener["port"]) == ("HTTP", ROUTING_PORT) and ROUTING_PORT >= 1024
    gateway = GatewayConfig()
    config = ResumeConfig.model_validate_json(one(docs, "ConfigMap", RELAY)["data"]["config.json"])
    assert config == resume_config(gateway, routing_table(gateway))
    assert config.models["gpt-oss-20b"].harmony and not config.models["llama-4-maverick"].harmony
    assert relay["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_tokens_and_requests_are_charged_once_on_the_public_gateway(docs) -> None:
    """The per-client limits stay on the public Gateway (templates/policies.yaml), which now has one model
    route, to the relay, with the AI Gateway's token counts: its external processor writes llm_total_token
    from the answer the client gets (the relay's final usage), where the limit's response cost reads it
    (AI Gateway v1.1.0 internal/extproc/processor_impl.go buildDynamicMetadata; a streaming request gets
    stream_options.include_usage forced on when costs are configured: internal/endpointspec/endpointspec.go
    ChatCompletionsEndpointSpec.ParseBody). The routing Gateway, where continuations go, has no limit and
    no API key check: a continuation is neither charged again nor refused by the client's limit."""
    routes = of_kind(docs, "AIGatewayRoute")
    front = one(docs, "AIGatewayRoute", FRONT)
    models = one(docs, "AIGatewayRoute", GATEWAY_RELEASE)
    assert len(routes) == 2
    assert [p["name"] for p in front["spec"]["parentRefs"]] == [GATEWAY_RELEASE]
    assert [p["name"] for p in models["spec"]["parentRefs"]] == [ROUTING_GATEWAY]
    (rule,) = front["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": RELAY}]
    # exactly the model names the routing Gateway serves: an unknown one gets the AI Gateway's 404 at the front
    front_models = [m["headers"][0]["value"] for m in rule["matches"]]
    assert front_models == [r["matches"][0]["headers"][0]["value"] for r in models["spec"]["rules"]]
    assert rule["timeouts"] == models["spec"]["rules"][0]["timeouts"]
    total = {c["type"]: c["metadataKey"] for c in front["spec"]["llmRequestCosts"]}["TotalToken"]
    limited = [b for b in of_kind(docs, "BackendTrafficPolicy") if "rateLimit" in b["spec"]]
    (limits,) = limited
    assert limits["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": GATEWAY_RELEASE}]
    token_rule = limits["spec"]["rateLimit"]["global"]["rules"][0]
    assert token_rule["cost"]["response"]["metadata"] == {"namespace": "io.envoy.ai_gateway", "key": total}
    for kind in ("SecurityPolicy", "BackendTrafficPolicy"):
        for policy in of_kind(docs, kind):
            refs = policy["spec"]["targetRefs"]
            assert {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": ROUTING_GATEWAY} not in refs
    (security,) = of_kind(docs, "SecurityPolicy")
    assert security["spec"]["targetRefs"][0]["name"] == GATEWAY_RELEASE
    # the front route's policy merges with the Gateway's limits and has none of its own (one budget)
    front_btp = one(docs, "BackendTrafficPolicy", FRONT)
    assert front_btp["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": FRONT}]
    assert front_btp["spec"]["mergeType"] == "StrategicMerge" and "rateLimit" not in front_btp["spec"]
    # only a relay that is gone is tried again: a status from the relay is the routing side's final answer
    assert front_btp["spec"]["retry"]["retryOn"] == {"triggers": ["connect-failure", "reset"]}
    # both Gateways take the same body size
    assert {c["spec"]["connection"]["bufferLimit"] for c in of_kind(docs, "ClientTrafficPolicy")} == {"8Mi"}


def test_model_routing_moves_whole_to_the_routing_gateway(docs, off_docs) -> None:
    """With resume on, the model route's patches (overprovisioning, outlier, Maglev bounds, local replies) and
    the prefix key's Lua go to the routing Gateway, unchanged but for the Gateway and listener they name; the
    public listener keeps the same local replies (its 401, 429, 413)."""
    on = one(docs, "EnvoyPatchPolicy", GATEWAY_RELEASE)
    off = one(off_docs, "EnvoyPatchPolicy", GATEWAY_RELEASE)
    assert on["spec"]["targetRef"]["name"] == ROUTING_GATEWAY and off["spec"]["targetRef"]["name"] == GATEWAY_RELEASE
    on_listener = [p for p in on["spec"]["jsonPatches"] if p["type"].endswith("listener.v3.Listener")]
    (routing_listener,) = one(docs, "Gateway", ROUTING_GATEWAY)["spec"]["listeners"]
    assert [p["name"] for p in on_listener] == [f"{NAMESPACE}/{ROUTING_GATEWAY}/{routing_listener['name']}"]
    strip = [{k: v for k, v in p.items() if k != "name" or "listener" not in p["type"]} for p in on["spec"]["jsonPatches"]]
    assert strip == [{k: v for k, v in p.items() if k != "name" or "listener" not in p["type"]} for p in off["spec"]["jsonPatches"]]
    front = one(docs, "EnvoyPatchPolicy", FRONT)
    (public_listener,) = one(docs, "Gateway", GATEWAY_RELEASE)["spec"]["listeners"]
    (front_patch,) = front["spec"]["jsonPatches"]
    assert front["spec"]["targetRef"]["name"] == GATEWAY_RELEASE
    assert front_patch["name"] == f"{NAMESPACE}/{GATEWAY_RELEASE}/{public_listener['name']}"
    assert front_patch["operation"] == on_listener[0]["operation"]
    (lua,) = of_kind(docs, "EnvoyExtensionPolicy")
    assert lua["spec"]["targetRefs"][0]["name"] == ROUTING_GATEWAY
    # the model route's own policies are the same objects as without resume
    assert ({b["metadata"]["name"]: b["spec"] for b in of_kind(off_docs, "BackendTrafficPolicy")}.items()
            <= {b["metadata"]["name"]: b["spec"] for b in of_kind(docs, "BackendTrafficPolicy")}.items())


def test_resume_off_renders_one_gateway_as_before(off_docs) -> None:
    names = {d["metadata"]["name"] for d in off_docs}
    assert not names & {RELAY, FRONT, ROUTING_GATEWAY}
    (route,) = of_kind(off_docs, "AIGatewayRoute")
    assert route["spec"]["parentRefs"][0]["name"] == GATEWAY_RELEASE


def _pod(name: str, namespace: str, labels: dict[str, str], ip: str) -> Endpoint:
    return Endpoint(name, ip, namespace, labels)


def test_network_policies_let_only_the_relays_flows_through(docs) -> None:
    """The gateway namespace is default-deny: the relay takes its clients from the public proxies and sends
    to the routing proxies only (and CoreDNS); the routing proxies, which check no API key, take requests
    from the relay only, and scrapes from Prometheus. The servers' ingress stays the proxies' (both
    Gateways' proxies carry Envoy Gateway's proxy labels: gennstack.network_policy.PROXY_POD_LABELS)."""
    policies = network_policies(docs, NAMESPACE)
    relay_labels = one(docs, "Deployment", RELAY)["spec"]["template"]["metadata"]["labels"]
    relay = _pod("relay", NAMESPACE, relay_labels, "10.0.1.1")
    owner = "gateway.envoyproxy.io/owning-gateway-name"
    public = _pod("public", ENVOY_GATEWAY_NAMESPACE, {**PROXY_POD_LABELS, owner: GATEWAY_RELEASE}, "10.0.2.1")
    routing = _pod("routing", ENVOY_GATEWAY_NAMESPACE, {**PROXY_POD_LABELS, owner: ROUTING_GATEWAY}, "10.0.2.2")
    prometheus = _pod("prometheus", MONITORING_NAMESPACE, dict(PROMETHEUS_POD_LABELS), "10.0.3.1")
    dns = _pod("dns", DNS_PEER["namespace"], dict(DNS_PEER["podLabels"]), "10.0.4.1")
    other = _pod("other", "default", {"app": "x"}, "10.0.5.1")
    server = _pod("server", "gennstack-serving", {"app.kubernetes.io/name": "gen3-g6e"}, "10.0.6.1")
    ports = {p["name"]: p["containerPort"] for p in one(docs, "Deployment", RELAY)["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert allowed(policies, public, relay, ports["http"])
    assert allowed(policies, prometheus, relay, ports["metrics"])
    assert not allowed(policies, other, relay, ports["http"]) and not allowed(policies, routing, relay, ports["http"])
    assert not allowed(policies, prometheus, relay, ports["http"])
    assert allowed(policies, relay, routing, ROUTING_PORT)
    assert allowed(policies, relay, dns, 53, "UDP") and allowed(policies, relay, dns, 53, "TCP")
    assert not allowed(policies, relay, public, 10443) and not allowed(policies, relay, server, 8000)
    assert not allowed(policies, relay, routing, 19000)
    # the routing proxies: the relay in, Prometheus on the metrics ports, nobody else
    assert not allowed(policies, other, routing, ROUTING_PORT) and not allowed(policies, public, routing, ROUTING_PORT)
    assert allowed(policies, prometheus, routing, 19001) and allowed(policies, prometheus, routing, 1064)
    assert not allowed(policies, prometheus, routing, ROUTING_PORT)
    # the public proxies stay unfiltered by this chart (the NLB's clients come to them)
    assert allowed(policies, other, public, 10443)


def test_per_generation_switch_and_reason_in_the_relay_config(helm) -> None:
    gateway = GatewayConfig.model_validate(frozen({"resume": {"generations": {"inf2": False}}}))
    config = ResumeConfig.model_validate_json(one(render(helm, gateway), "ConfigMap", RELAY)["data"]["config.json"])
    llama = config.models["llama-3-70b-instruct"]
    assert (llama.resume, llama.reason_off) == (False, "gateway.resume.generations.inf2 is false")
    assert config.models["gpt-oss-20b"].resume and config.models["llama-4-maverick"].resume
    # only the enabled generations' models
    config = ResumeConfig.model_validate_json(one(render(helm, GatewayConfig(), ("g6e",)), "ConfigMap", RELAY)["data"]["config.json"])
    assert set(config.models) == {"gpt-oss-20b"}


def test_values_yaml_carries_the_default_resume_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["resume"]
    gateway = GatewayConfig()
    built = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", api_keys_secret_name="")["resume"]
    assert values == built  # image "" in both: the construct sets it


def test_a_relay_without_an_image_fails_to_render(helm) -> None:
    gateway = GatewayConfig()
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", api_keys_secret_name="k",
                                  redis_secret_name="r")
    proc = subprocess.run([str(helm), "template", GATEWAY_RELEASE, str(CHART), "--values", "-"],
                          input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "resume.image is required while resume.enabled" in proc.stderr


def test_the_relays_sizing_comes_from_its_benchmark() -> None:
    """The sizing constants are what benchmarks/bench_resume_relay.py measured, rounded to the safe side,
    and the reserve the comment states follows from them and the rendered request."""
    import json
    from pathlib import Path

    from gennstack.gateway.values import RESUME_CPU_MS_PER_REQUEST, RESUME_RESOURCES, RESUME_TOKENS_PER_CORE_S

    measured = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "resume_relay.json").read_text())
    assert RESUME_TOKENS_PER_CORE_S <= measured["relay_throughput"]["tokens_per_cpu_s"]
    assert RESUME_CPU_MS_PER_REQUEST >= measured["relay_cpu_ms_per_request"]
    cores = int(RESUME_RESOURCES["requests"]["cpu"].removesuffix("m")) / 1000 * 2  # two replicas
    assert cores * RESUME_TOKENS_PER_CORE_S == 40_000  # 800 streams at 50 tokens/s
    assert round(cores * 1000 / RESUME_CPU_MS_PER_REQUEST) == 93  # new requests per second
