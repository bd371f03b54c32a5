"""The command line, end to end against the mock server: flags, files, redaction."""

from __future__ import annotations

import csv
import json
import re
import sys

import pytest

from gennstack.bench.config import ConfigError, Distribution, parse_concurrency


def test_bench_is_registered_with_the_gennstack_command() -> None:
    from gennstack import cli

    assert cli._SUBCOMMANDS["bench"] == "gennstack.bench.cli"


def test_run_writes_every_output_and_never_the_api_key(mock_server, bench_parser, tmp_path, monkeypatch) -> None:
    server = mock_server("--ttft", "0.02", "--itl", "0.002", "--fault", "http:500:5")
    out = tmp_path / "run"
    argv = ["bench", "--base-url", server.base_url, "--model", "mock", "--api-key", "s3cr3t-key",
            "--concurrency", "1,4", "--num-requests", "10", "--max-tokens", "uniform:4,12",
            "--prompt-tokens", "normal:64,8", "--output-dir", str(out), "--no-progress"]
    monkeypatch.setattr(sys, "argv", ["gennstack", *argv])
    args = bench_parser.parse_args(argv)
    assert args.func(args) == 0

    result = json.loads((out / "result.json").read_text())
    assert result["schema"] == "gennstack-bench/1"
    assert result["command"][:2] == ["gennstack", "bench"]
    assert result["command"][result["command"].index("--api-key") + 1] == "***"
    assert result["endpoint"] == server.base_url + "/chat/completions"
    assert result["model"] == "mock" and result["tool"]["version"]
    assert result["started_at"].endswith("+00:00")
    settings = result["settings"]
    assert settings["concurrency"] == [1, 4] and settings["num_requests"] == 10
    assert settings["max_tokens"]["spec"] == "uniform:4,12" and settings["prompt_tokens"]["spec"] == "normal:64,8"
    assert settings["api_key_set"] is True
    assert [lvl["concurrency"] for lvl in result["levels"]] == [1, 4]
    for lvl in result["levels"]:
        assert lvl["requests"]["measured"] == 10
        assert lvl["requests"]["warmup"] == lvl["concurrency"]  # default: one warm-up request per worker
        assert sum(lvl["requests"]["failures_by_class"].values()) == lvl["requests"]["failed"] > 0
        assert all(4 <= n <= 12 for n in lvl["samples"]["output_tokens"])

    with (out / "requests.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == sum(lvl["requests"]["sent"] for lvl in result["levels"])
    assert {row["status"] for row in rows} == {"completed", "failed"}
    assert {row["error_class"] for row in rows if row["status"] == "failed"} == {"http_500"}

    html = (out / "report.html").read_text()
    assert "<svg" in html and 'data-view="aggregate"' in html
    assert not re.search(r'(src|href)="(https?:)?//', html)  # self-contained: nothing to fetch
    for c in (1, 4):
        files = sorted(p.name for p in (out / "llmperf" / f"concurrency-{c}").iterdir())
        assert files == ["mock_64_8_individual_responses.json", "mock_64_8_summary.json"]  # model_meanIn_meanOut
    for path in out.rglob("*"):
        if path.is_file():
            assert "s3cr3t-key" not in path.read_text(), path


def test_demo_runs_the_whole_tool_in_one_command(bench_parser, tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    args = bench_parser.parse_args(["bench", "demo", "--concurrency", "2", "--duration", "1.5", "--max-tokens", "8",
                                    "--ttft", "0.02", "--itl", "0.005", "--output-dir", str(out), "--no-progress"])
    assert args.func(args) == 0
    assert {p.name for p in out.iterdir()} == {"result.json", "requests.csv", "report.html", "llmperf"}
    level = json.loads((out / "result.json").read_text())["levels"][0]
    assert level["requests"]["completed"] > 0
    printed = capsys.readouterr().out
    assert "TTFT p50" in printed and "agg tok/s" in printed and str(out) in printed


def test_all_failed_exits_non_zero(mock_server, bench_parser, tmp_path) -> None:
    server = mock_server("--fault", "http:503:1")
    args = bench_parser.parse_args(["bench", "--base-url", server.base_url, "--model", "m", "--num-requests", "3",
                                    "--output-dir", str(tmp_path / "o"), "--no-progress"])
    assert args.func(args) == 1


@pytest.mark.parametrize("argv, message", [
    (["bench", "--model", "m"], "--base-url"),
    (["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--concurrency", "0"], "--concurrency"),
    (["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--max-tokens", "gauss:1"], "--max-tokens"),
    (["bench", "--base-url", "127.0.0.1:9", "--model", "m"], "--base-url"),
    (["bench", "--base-url", "http://h/v1", "--model", "m", "--duration", "5", "--warmup-requests", "3"], "--warmup-requests"),
    (["bench", "--base-url", "http://h/v1", "--model", "m", "--extra-body", "[1]"], "--extra-body"),
    (["bench", "--base-url", "http://h/v1", "--model", "m", "--upload", "bucket/prefix"], "--upload"),
])
def test_bad_flags_exit_2_naming_the_flag(bench_parser, argv, message, capsys) -> None:
    args = bench_parser.parse_args(argv)
    assert args.func(args) == 2
    assert message in capsys.readouterr().err


def test_duration_and_num_requests_are_exclusive(bench_parser) -> None:
    with pytest.raises(SystemExit):
        bench_parser.parse_args(["bench", "--duration", "5", "--num-requests", "3"])


def test_distributions() -> None:
    import random

    rng = random.Random(1)
    assert Distribution.parse("512", option="x").sample(rng) == 512
    uniform = Distribution.parse("uniform:10,20", option="x")
    assert all(10 <= uniform.sample(rng) <= 20 for _ in range(200)) and (uniform.mean, uniform.stddev) == (15, 3)
    normal = Distribution.parse("normal:5,10", option="x")
    assert all(normal.sample(rng) >= 1 for _ in range(500))
    for bad in ("0", "uniform:5,2", "normal:0,1", "uniform:1.5,3", "pareto:1,2", "abc"):
        with pytest.raises(ConfigError, match="--max-tokens"):
            Distribution.parse(bad, option="--max-tokens")
    assert parse_concurrency("32,160,200") == (32, 160, 200)
