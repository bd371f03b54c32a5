"""The gateway's route to the multi-node model (``serving.multi_node``, issue 25): with it on, the config's
gateway gets the model ``llama-4-scout`` whose backend is the groups' leaders' headless Service
``gen3-g6e-multinode-serve`` (the serving chart's templates/multinode-lws.yaml: leaders only, one host
per group), prefix-routed as g6e's; off (the default), the gateway is as before. The gateway chart is
rendered by the real helm and every object validated against the pinned CRDs; ``gennstack gateway
local --config`` shows the same route on a local Envoy's bootstrap. A failover to another model only
when ``gateway.fallbacks`` names one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.gateway.conftest import RELAY_IMAGE, without_resume
from gennstack.cli import main
from gennstack.config import ConfigError, load_config
from gennstack.gateway.config import PREFIX_KEY_HEADER, GatewayConfig, routing_table
from gennstack.gateway.names import backend_object_name
from gennstack.gateway.values import gateway_chart_values
from tests.gateway.conftest import validate_chart_objects
from tests.support import ROOT

pytestmark = pytest.mark.slow

CHART = ROOT / "assets" / "charts" / "gennstack-gateway"
OVERLAY = ROOT / "examples" / "multinode-scout.yaml"
SCOUT = "llama-4-scout"
SERVICE = "gen3-g6e-multinode-serve"
ON = {"serving": {"multi_node": {"enabled": True}}}


def render(helm: Path, config) -> list[dict]:
    table = routing_table(config.gateway, set(config.generations.enabled()))
    values = gateway_chart_values(config.gateway, table, region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name="k", redis_secret_name="r")
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--namespace", config.gateway.namespace,
                           "--values", "-"], input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return without_resume([d for d in yaml.safe_load_all(proc.stdout) if d])


def rules(docs: list[dict]) -> dict[str, dict]:
    (route,) = [d for d in docs if d["kind"] == "AIGatewayRoute"]
    return {r["matches"][0]["headers"][0]["value"]: r for r in route["spec"]["rules"]}


def test_on_the_config_routes_the_model_to_the_leaders_off_nothing_changes() -> None:
    config = load_config(ON)
    assert config.gateway.models[SCOUT].model_dump() == {"generation": "g6e", "service": SERVICE, "port": 8000}
    route = routing_table(config.gateway, set(config.generations.enabled())).route(SCOUT)
    assert [(b.backend, b.priority) for b in route.backends] == [(SCOUT, 0)] and route.routing == "prefix"
    # Off, and by default: the gateway's own defaults, no such model.
    assert load_config({}).gateway == GatewayConfig() and SCOUT not in load_config({}).gateway.models
    # The served name follows the section; a model of that name the config already has stays as configured.
    renamed = load_config({"serving": {"multi_node": {"enabled": True, "served_model_name": "scout"}}})
    assert renamed.gateway.models["scout"].service == SERVICE and SCOUT not in renamed.gateway.models
    own = load_config({**ON, "gateway": {"models": {SCOUT: {"generation": "g6e", "service": "my-scout"}}, "aliases": {}}})
    assert list(own.gateway.models) == [SCOUT] and own.gateway.models[SCOUT].service == "my-scout"
    # g6e's routing mode is the group's: least request when g6e's is.
    least = load_config({**ON, "gateway": {"routing": {"generations": {"g6e": "least_request"}}}})
    assert routing_table(least.gateway, set(least.generations.enabled())).route(SCOUT).routing == "least_request"


def test_failover_to_another_model_only_when_configured() -> None:
    plain = load_config(ON)
    assert SCOUT not in plain.gateway.fallbacks
    with_fallback = load_config({**ON, "gateway": {"fallbacks": {SCOUT: ["gpt-oss-20b"]}}})
    route = routing_table(with_fallback.gateway, set(with_fallback.generations.enabled())).route(SCOUT)
    assert [(b.backend, b.priority) for b in route.backends] == [(SCOUT, 0), ("gpt-oss-20b", 1)]
    # Off, the model does not exist: a fallback naming it is refused with the key.
    with pytest.raises(ConfigError) as info:
        load_config({"gateway": {"fallbacks": {SCOUT: ["gpt-oss-20b"]}}})
    assert "gateway.fallbacks.llama-4-scout" in str(info.value) and "a model from models" in str(info.value)


def test_the_chart_renders_a_backend_on_the_leaders_service_prefix_routed(helm) -> None:
    """Envoy Gateway v1.8.3 Backend ``fqdn`` endpoints, resolved by DNS: the headless Service answers
    with every ready leader's pod IP, so each group is one host of the rule's cluster (as each
    gen3-g6e pod is); the rule hashes on the prefix key (BackendTrafficPolicy ConsistentHash Headers)."""
    config = load_config(ON)
    docs = render(helm, config)
    validate_chart_objects(docs)
    name = backend_object_name(SCOUT)
    (backend,) = [d for d in docs if d["kind"] == "Backend" and d["metadata"]["name"] == name]
    assert backend["spec"]["endpoints"] == [{"fqdn": {"hostname": f"{SERVICE}.gennstack-serving.svc.cluster.local", "port": 8000}}]
    (ai,) = [d for d in docs if d["kind"] == "AIServiceBackend" and d["metadata"]["name"] == name]
    assert ai["spec"]["backendRef"] == {"group": "gateway.envoyproxy.io", "kind": "Backend", "name": name}
    rule = rules(docs)[SCOUT]
    assert [r["name"] for r in rule["backendRefs"]] == [name]
    (btp,) = [d for d in docs if d["kind"] == "BackendTrafficPolicy" and d["spec"]["targetRefs"][0].get("sectionName") == rule["name"]]
    assert btp["spec"]["loadBalancer"] == {"type": "ConsistentHash", "consistentHash": {"type": "Headers", "headers": [{"name": PREFIX_KEY_HEADER}]}}
    # The default alias is unchanged: the multi-node model joins it only if configured.
    assert name not in [r["name"] for r in rules(docs)["gennstack-default"]["backendRefs"]]
    # Off: no such Backend, the same rules as the default config's.
    off = render(helm, load_config({}))
    assert not [d for d in off if d["metadata"]["name"] == name] and SCOUT not in rules(off)


def test_local_gateway_with_the_overlay_prints_the_route(capsys) -> None:
    endpoints = ["--endpoint", f"{SCOUT}=http://127.0.0.1:8004/v1", "--endpoint", f"{SCOUT}=http://127.0.0.1:8005/v1"]
    assert main(["gateway", "local", "--config", str(OVERLAY), *endpoints, "--print-config"]) == 0
    bootstrap = json.loads(capsys.readouterr().out)
    # resume on (the default): the model routes are on the routing half, behind the relay
    listener = next(item for item in bootstrap["static_resources"]["listeners"] if item["name"] == "routing")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = [r for r in hcm["route_config"]["virtual_hosts"][0]["routes"] if "route" in r]
    assert [r["match"]["headers"][0]["string_match"]["exact"] for r in routes] == [SCOUT]
    assert routes[0]["route"]["hash_policy"] == [{"header": {"header_name": PREFIX_KEY_HEADER}}]
    (cluster,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == routes[0]["route"]["cluster"]]
    ports = sorted(e["endpoint"]["address"]["socket_address"]["port_value"]
                   for group in cluster["load_assignment"]["endpoints"] for e in group["lb_endpoints"])
    assert ports == [8004, 8005]  # two groups, two leaders
    # Without the overlay the model is unknown; --config with a gateway in --file is refused.
    assert main(["gateway", "local", *endpoints, "--print-config"]) == 2
    assert f"no model named ['{SCOUT}'] in the routing table" in capsys.readouterr().err


def test_config_and_a_file_gateway_are_one_too_many(tmp_path, capsys) -> None:
    file = tmp_path / "local.yaml"
    file.write_text("endpoints:\n  gpt-oss-20b: http://127.0.0.1:8001/v1\ngateway:\n  envoy_replicas: 3\n")
    assert main(["gateway", "local", "--config", str(OVERLAY), "--file", str(file), "--print-config"]) == 2
    assert "give the gateway section in one of them" in capsys.readouterr().err
