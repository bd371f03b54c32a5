"""`gennstack gateway local`: its flags, its file, and its errors (no Envoy started here)."""

from __future__ import annotations

import json

from gennstack.cli import main


def test_print_config_from_flags_and_file(tmp_path, capsys) -> None:
    file = tmp_path / "local.yaml"
    file.write_text("endpoints:\n  gpt-oss-20b: http://127.0.0.1:8001/v1\n"
                    "gateway:\n  aliases:\n    chat:\n      - {model: gpt-oss-20b, weight: 1}\n")
    assert main(["gateway", "local", "--file", str(file), "--endpoint", "llama-4-maverick=http://localhost:8002",
                 "--port", "9000", "--rate-limit", "0", "--print-config"]) == 0
    bootstrap = json.loads(capsys.readouterr().out)
    listener = bootstrap["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9000}
    filters = [f["name"] for f in listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]]
    assert filters == ["envoy.filters.http.buffer", "model-router", "envoy.filters.http.router"]  # no rate limit
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
