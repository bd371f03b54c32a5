"""`gennstack gateway local`: its flags, its file, and its errors (no Envoy started here)."""

from __future__ import annotations

import json

from gennstack.cli import main


def test_print_config_from_flags_and_file(tmp_path, capsys) -> None:
    file = tmp_path / "local.yaml"
    file.write_text("endpoints:\n  gpt-oss-20b: http://127.0.0.1:8001/v1\n"
                    "gateway:\n  aliases:\n    chat:\n      - {model: gpt-oss-20b, weight: 1}\n")
    assert main(["gateway", "local", "--file", str(file), "--endpoint", "llama-4-maverick=http://localhost:8002",
                 "--port", "9000", "--rate-limit", "0", "--no-resume", "--print-config"]) == 0
    bootstrap = json.loads(capsys.readouterr().out)
    listener = bootstrap["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9000}
    filters = [f["name"] for f in listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]]
    assert filters == ["envoy.filters.http.buffer", "model-router", "prefix-key", "envoy.filters.http.router"]  # no rate limit
    routes = listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    matched = [r["match"]["headers"][0]["string_match"]["exact"] for r in routes if "route" in r]
    assert matched == ["llama-4-maverick", "gpt-oss-20b", "chat"]  # llama-3 has no endpoint: no route
    endpoints = {c["name"]: [e["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"]
                             for e in c["load_assignment"]["endpoints"]] for c in bootstrap["static_resources"]["clusters"]}
    assert endpoints == {"route-0": [8002], "route-1": [8001], "route-2": [8001]}


def test_errors_are_one_clear_line(capsys) -> None:
    assert main(["gateway", "local", "--endpoint", "gpt-5=http://127.0.0.1:1"]) == 2
    assert "no model named ['gpt-5'] in the routing table" in capsys.readouterr().err
    assert main(["gateway", "local", "--endpoint", "gpt-oss-20b=https://api.example.com/v1"]) == 2
    assert "use http://HOST:PORT[/v1]" in capsys.readouterr().err
    assert main(["gateway", "local", "--endpoint", "gpt-oss-20b"]) == 2
    assert "expected MODEL=URL" in capsys.readouterr().err
    assert main(["gateway", "local"]) == 2
    assert "give at least one MODEL=URL" in capsys.readouterr().err


def _hcm(bootstrap: dict) -> dict:
    return bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def test_api_keys_from_flags_and_file_give_per_client_buckets(tmp_path, capsys) -> None:
    file = tmp_path / "local.yaml"
    file.write_text("endpoints:\n  gpt-oss-20b: [http://127.0.0.1:8001/v1, http://127.0.0.1:8002/v1]\n"
                    "api_keys:\n  app-1: sk-local-0001\n"
                    "gateway:\n  rate_limit: {requests_per_minute: 30}\n")
    assert main(["gateway", "local", "--file", str(file), "--api-key", "app-2=sk-local-0002",
                 "--endpoint", "gpt-oss-20b=http://127.0.0.1:8003", "--no-resume", "--print-config"]) == 0
    bootstrap = json.loads(capsys.readouterr().out)
    hcm = _hcm(bootstrap)
    filters = {f["name"]: f["typed_config"] for f in hcm["http_filters"]}
    # the cluster's order: API keys, the body (the AI Gateway's processor's part), the prefix key, the rate limit
    assert list(filters) == ["envoy.filters.http.api_key_auth", "envoy.filters.http.buffer", "model-router",
                             "prefix-key", "envoy.filters.http.local_ratelimit", "envoy.filters.http.router"]
    auth = filters["envoy.filters.http.api_key_auth"]
    assert auth["credentials"] == [{"key": "sk-local-0001", "client": "app-1"}, {"key": "sk-local-0002", "client": "app-2"}]
    assert auth["forwarding"] == {"header": "x-gennstack-client", "hide_credentials": True}
    limit = filters["envoy.filters.http.local_ratelimit"]
    # the config's requests_per_minute, per client, shared by every route of the listener
    assert [d["entries"] for d in limit["descriptors"]] == [[{"key": "client", "value": "app-1"}], [{"key": "client", "value": "app-2"}]]
    assert {d["token_bucket"]["max_tokens"] for d in limit["descriptors"]} == {30}
    assert limit["token_bucket"]["fill_interval"] == "60s" and limit["always_consume_default_token_bucket"] is False
    [mapper_429] = [m for m in hcm["local_reply_config"]["mappers"]
                    if m["filter"]["status_code_filter"]["comparison"]["value"]["default_value"] == 429]
    assert mapper_429["headers_to_add"][0]["header"] == {"key": "retry-after", "value": "2"}  # 60 s / 30
    # three servers for gpt-oss-20b: the file's two, then the flag's
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in bootstrap["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [8001, 8002, 8003]


def test_bad_api_keys_and_endpoints_are_one_clear_line(tmp_path, capsys) -> None:
    cases = [
        (["--api-key", "app-1"], "--api-key 'app-1'...: expected CLIENT=KEY"),
        (["--api-key", "app-1=sk-local-0001", "--api-key", "app-1=sk-local-0002"], "api key client 'app-1' given twice"),
        (["--api-key", "app-1=sk-local-0001", "--api-key", "app-2=sk-local-0001"], "api key of client 'app-2' is also another client's key"),
        (["--api-key", "app 1=sk-local-0001"], "api key client 'app 1': use 1-128 of letters, digits and ._-"),
        (["--api-key", "app-1=short"], "api key of client 'app-1': at least 8 characters"),
        (["--endpoint", "gpt-oss-20b=http://127.0.0.1:1", "--endpoint", "gpt-oss-20b=http://127.0.0.1:1"],
         "endpoints.gpt-oss-20b: ['http://127.0.0.1:1', 'http://127.0.0.1:1'] lists one address twice"),
    ]
    for flags, message in cases:
        argv = ["gateway", "local", "--print-config", *flags]
        if not any(f.startswith("gpt-oss-20b=") for f in flags):
            argv += ["--endpoint", "gpt-oss-20b=http://127.0.0.1:1"]
        assert main(argv) == 2, flags
        assert message in capsys.readouterr().err, flags
    too_many = [f"gpt-oss-20b=http://127.0.0.1:{port}" for port in range(1000, 1101)]
    assert main(["gateway", "local", "--print-config", *[a for e in too_many for a in ("--endpoint", e)]]) == 2
    assert "endpoints.gpt-oss-20b: 101 URLs; at most 100" in capsys.readouterr().err
    file = tmp_path / "bad.yaml"
    file.write_text("endpoints: {gpt-oss-20b: http://127.0.0.1:1}\napi_keys: [sk-1]\n")
    assert main(["gateway", "local", "--file", str(file), "--print-config"]) == 2
    assert "api_keys: expected {CLIENT: KEY}" in capsys.readouterr().err


def test_start_says_whether_the_gateway_is_open() -> None:
    from gennstack.gateway.config import GatewayConfig
    from gennstack.gateway.local import LocalSettings, access_summary

    gateway = GatewayConfig()
    assert access_summary(LocalSettings(), gateway) == (
        "OPEN: no API keys (--api-key CLIENT=KEY), anybody on this machine may call; 600 requests per 60 s for all callers together")
    assert access_summary(LocalSettings(api_keys=(("a", "sk-local-0001"),), rate_limit_requests=5, rate_limit_interval_s=10), gateway) == (
        "API keys required (Authorization: Bearer <key>) for clients a; 5 requests per 10 s per client, all models together")


def _policies_by_model(bootstrap: dict) -> dict[str, str]:
    """By model: the load balancer of its route (on the routing listener: the last one, with resume on or off)."""
    listener = bootstrap["static_resources"]["listeners"][-1]
    routes = listener["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    by_cluster = {c["name"]: c["load_balancing_policy"]["policies"][0]["typed_extension_config"]["name"].rsplit(".", 1)[1]
                  for c in bootstrap["static_resources"]["clusters"] if c["name"] != "resume-relay"}
    return {r["match"]["headers"][0]["string_match"]["exact"]: by_cluster[r["route"]["cluster"]] for r in routes if "route" in r}


def test_demo_replicas_and_routing_flags(capsys) -> None:
    """--demo --demo-replicas N: N servers (ports --demo-port + i) for every model; --routing MODE for
    every generation that can take it (gen1 keeps least request), MODEL=MODE for that model's
    generation; a split alias keeps least request either way. --print-config starts no server."""
    assert main(["gateway", "local", "--demo", "--demo-replicas", "3", "--demo-port", "9100", "--routing", "prefix",
                 "--print-config"]) == 0
    bootstrap = json.loads(capsys.readouterr().out)
    for cluster in [c for c in bootstrap["static_resources"]["clusters"] if c["name"] != "resume-relay"]:
        ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
                 for locality in cluster["load_assignment"]["endpoints"] for e in locality["lb_endpoints"]]
        assert sorted(set(ports)) == [9100, 9101, 9102]
    assert _policies_by_model(bootstrap) == {"llama-3-70b-instruct": "least_request", "llama-4-maverick": "maglev",
                                             "gpt-oss-20b": "maglev", "gennstack-default": "least_request"}
    assert main(["gateway", "local", "--demo", "--routing", "least-request", "--print-config"]) == 0
    assert set(_policies_by_model(json.loads(capsys.readouterr().out)).values()) == {"least_request"}
    assert main(["gateway", "local", "--demo", "--routing", "least-request", "--routing", "llama-4-maverick=prefix",
                 "--print-config"]) == 0
    assert _policies_by_model(json.loads(capsys.readouterr().out))["llama-4-maverick"] == "maglev"


def test_routing_flag_errors_are_one_clear_line(capsys) -> None:
    assert main(["gateway", "local", "--demo", "--routing", "fastest", "--print-config"]) == 2
    assert "--routing 'fastest': the mode must be one of prefix, least-request" in capsys.readouterr().err
    assert main(["gateway", "local", "--demo", "--routing", "gpt-5=prefix", "--print-config"]) == 2
    assert "no model 'gpt-5'" in capsys.readouterr().err
    assert main(["gateway", "local", "--demo", "--routing", "llama-3-70b-instruct=prefix", "--print-config"]) == 2
    assert "Ray Serve behind one Service" in capsys.readouterr().err
    assert main(["gateway", "local", "--endpoint", "gpt-oss-20b=http://127.0.0.1:1", "--demo-replicas", "2"]) == 2
    assert "--demo-replicas needs --demo" in capsys.readouterr().err


def test_resume_splits_envoy_in_two_halves_around_the_relay(tmp_path, capsys) -> None:
    """Resume on (the default): the client's listener keeps API keys, the body limit and the per-client limit
    and sends everything to the relay; the routing listener (the relay's upstream, its continuations' too)
    has the model router and the prefix key and no client limit, so a continuation is never charged."""
    file = tmp_path / "local.yaml"
    file.write_text("endpoints:\n  gpt-oss-20b: http://127.0.0.1:8001/v1\napi_keys:\n  app-1: sk-local-0001\n"
                    "resume:\n  max_attempts: 5\n")
    assert main(["gateway", "local", "--file", str(file), "--resume-port", "9300", "--print-config"]) == 0
    bootstrap = json.loads(capsys.readouterr().out)
    front, routing = bootstrap["static_resources"]["listeners"]
    names = [[f["name"] for f in listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]]
             for listener in (front, routing)]
    assert names == [["envoy.filters.http.api_key_auth", "envoy.filters.http.buffer", "envoy.filters.http.local_ratelimit",
                      "envoy.filters.http.router"],
                     ["envoy.filters.http.buffer", "model-router", "prefix-key", "envoy.filters.http.router"]]
    assert routing["address"]["socket_address"]["port_value"] == 9301
    [front_route] = front["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    assert front_route["route"]["cluster"] == "resume-relay"
    relay = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}["resume-relay"]
    assert relay["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] == {
        "address": "127.0.0.1", "port_value": 9300}
    assert relay["health_checks"][0]["http_health_check"]["path"] == "/healthz"
    file.write_text("endpoints:\n  gpt-oss-20b: http://127.0.0.1:8001/v1\nresume:\n  enabled: false\n")
    assert main(["gateway", "local", "--file", str(file), "--print-config"]) == 0
    assert len(json.loads(capsys.readouterr().out)["static_resources"]["listeners"]) == 1
    file.write_text("endpoints:\n  gpt-oss-20b: http://127.0.0.1:8001/v1\nresume:\n  max_attempts: many\n")
    assert main(["gateway", "local", "--file", str(file), "--print-config"]) == 2
    assert "max_attempts" in capsys.readouterr().err


def test_demo_health_path_follows_the_server_resume_picks(capsys) -> None:
    """--demo with resume on runs the demo token server (its /health answers while it generates); with
    --no-resume llama.cpp's own server, which has no /health (gennstack.gateway.demo.LLAMA_HEALTH_PATH)."""
    from gennstack.gateway.demo import LLAMA_HEALTH_PATH, TOKEN_HEALTH_PATH

    paths = {}
    for flags in ([], ["--no-resume"]):
        assert main(["gateway", "local", "--demo", "--print-config", *flags]) == 0
        clusters = json.loads(capsys.readouterr().out)["static_resources"]["clusters"]
        paths[bool(flags)] = {c["health_checks"][0]["http_health_check"]["path"] for c in clusters if c["name"] != "resume-relay"}
    assert paths == {False: {TOKEN_HEALTH_PATH}, True: {LLAMA_HEALTH_PATH}}
