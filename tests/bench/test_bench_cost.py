"""The benchmark records the target's layout and shows $ per 1M tokens; old result files still load and compare."""

from __future__ import annotations

import json

import pytest
from bench_results_factory import write_result

from gennstack.bench import compare, report
from gennstack.bench.results import load_result


def with_layout(path, **layout):
    data = json.loads(path.read_text())
    data["layout"] = {"instance_type": None, "replicas": None, "replicas_per_node": 1, "capacity_type": None,
                      "hourly_price": None, "region": None, **layout}
    path.write_text(json.dumps(data))
    return path


def test_a_result_without_layout_still_loads_and_says_how_to_get_cost(tmp_path) -> None:
    result = load_result(write_result(tmp_path / "old", ttft=0.1, itl=0.02))
    assert "layout" not in result
    result["_label"] = "old"
    page = report.render([result])
    assert "no layout recorded: run gennstack bench with --instance-type/--replicas/--capacity-type/--region or --hourly-price" in page


def test_report_shows_cost_beside_throughput(tmp_path) -> None:
    path = with_layout(write_result(tmp_path / "run", ttft=0.1, itl=0.02, levels=(8,)), instance_type="g6e.12xlarge",
                       replicas=8, capacity_type="spot", region="us-east-1")
    result = load_result(path)
    result["_label"] = "run"
    page = report.render([result])
    assert '<table class="cost">' in page and "spot (estimate: 60% off on-demand) $/h" in page
    assert "us-east-1 prices as of 2026-07-06" in page
    # 8 x 10.49264 on demand at the factory's 311.688 tok/s (tests/cost/test_cost_cli.py) = $74.81 per 1M output tokens
    assert "<td>83.94</td><td>74.81</td>" in page


def test_compare_compares_cost(tmp_path) -> None:
    a = with_layout(write_result(tmp_path / "tp4", ttft=0.1, itl=0.02, levels=(8,)), instance_type="g6e.12xlarge",
                    replicas=8, region="us-east-1")
    b = with_layout(write_result(tmp_path / "packed", ttft=0.1, itl=0.02, levels=(8,)), instance_type="g6e.12xlarge",
                    replicas=8, replicas_per_node=4, region="us-east-1")
    old = write_result(tmp_path / "old", ttft=0.1, itl=0.02, levels=(8,))
    rows = {(r["concurrency"], r["metric"]): r for r in compare.comparison_rows(compare.load_all([str(a), str(b), str(old)]))}
    cost = rows[(8, "$/1M output (on-demand)")]
    assert cost["values"][0] == pytest.approx(74.81, abs=0.005) and cost["values"][1] == pytest.approx(74.81 / 4, abs=0.005)
    assert cost["values"][2] is None and cost["deltas"][1] == "-75.0%" and cost["higher_is_better"] is False


def test_bench_records_the_layout_flags(mock_server, bench_parser, tmp_path, monkeypatch) -> None:
    import sys

    server = mock_server("--ttft", "0.01", "--itl", "0.001")
    out = tmp_path / "run"
    argv = ["bench", "--base-url", server.base_url, "--model", "mock", "--num-requests", "4", "--max-tokens", "8",
            "--output-dir", str(out), "--no-progress", "--instance-type", "g6e.xlarge", "--replicas", "2",
            "--capacity-type", "spot", "--hourly-price", "0.7"]
    monkeypatch.setattr(sys, "argv", ["gennstack", *argv])
    args = bench_parser.parse_args(argv)
    assert args.func(args) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["layout"] == {"instance_type": "g6e.xlarge", "replicas": 2, "replicas_per_node": 1, "capacity_type": "spot",
                                "hourly_price": 0.7, "region": None}
    assert '<table class="cost">' in (out / "report.html").read_text()


def test_bad_layout_flag_exits_2(bench_parser, capsys) -> None:
    args = bench_parser.parse_args(["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--capacity-type", "cheap"])
    assert args.func(args) == 2
    assert "--capacity-type: got 'cheap'; allowed: spot, on-demand, reserved" in capsys.readouterr().err
