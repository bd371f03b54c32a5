"""`gennstack cost` on the command line: hourly text, $/1M tokens of bench results, layouts and every error."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gennstack.cli import build_parser
from tests.bench.bench_results_factory import write_result

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def run(argv: list[str]) -> tuple[int, str, str]:
    args = build_parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    return args.func(args, now=NOW, stdout=out, stderr=err), out.getvalue(), err.getvalue()


def test_cost_is_registered() -> None:
    from gennstack import cli

    assert cli._SUBCOMMANDS["cost"] == "gennstack.cost.cli"


def test_hourly_text_flags_stale_prices_and_labels_spot_as_an_estimate() -> None:
    code, out, _ = run(["cost"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "GenNStack cost per hour in us-east-1 (the config names no region: priced at us-east-1): what runs all the time"
    # Two more system nodes than before (2 -> 4): + 2 x 0.1029918 = 0.2059836 $/h, + 150.37 $/month at both ends.
    assert "TOTAL $8.00-$18.02 per hour (spot (estimate: 60% off on-demand) to on-demand), $5,839.33-$13,155.37 per month of 730 h" in lines
    assert "prices as of 2026-07-06, 2026-11-30; the oldest is 147 days old: STALE, older than 90 days; check them or run with --live" in lines
    assert any(line.startswith("WARNING: generation trn2 (trn2.48xlarge) is not in the totals") for line in lines)


def test_hourly_json_and_price_override() -> None:
    code, out, _ = run(["cost", "--json", "--price", "trn2.48xlarge=40", "--spot-discount", "0.5"])
    data = json.loads(out)
    assert code == 0 and data["unpriced"] == []
    assert data["spot_basis"] == {"estimate": True, "discount": 0.5, "basis": "--spot-discount 0.5 (your assumption)"}
    assert data["groups"]["trn2"]["items"][0]["spot_usd_per_hour"] == 20.0
    assert data["layouts"]["g6e"] == {"instance_type": "g6e.xlarge", "nodes": 2, "replicas": 2, "warm_spares": 0,
                                      "replicas_per_node": 1, "idle_slots": 0}


@pytest.mark.parametrize(("argv", "message"), [
    (["cost", "--region", "eu-west-1"], "gennstack cost: region: got 'eu-west-1'; allowed: a region the bundled price table has"),
    (["cost", "--spot-discount", "0.95"], "gennstack cost: --spot-discount: got 0.95; allowed: 0 to 0.9"),
    (["cost", "--cdk-json", "/nonexistent/cdk.json"], "gennstack cost: config: /nonexistent/cdk.json not found"),
])
def test_hourly_errors(argv, message) -> None:
    code, _, err = run(argv)
    assert code == 2 and err.startswith(message)


def test_a_bad_price_flag_is_rejected_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cost", "--price", "trn2.48xlarge"])
    assert "expected INSTANCE_TYPE=USD_PER_HOUR" in capsys.readouterr().err


def test_tokens_from_flags_spot_and_on_demand(tmp_path: Path) -> None:
    """The factory's run at c=8: 30 requests of 20 tokens, each 0.1 + 19 x 0.02 = 0.48 s, in waves of 8 started 1 ms
    apart: the last ends at 3 x 0.48 + 5 x 0.001 + 0.48 = 1.925 s, so 600 / 1.925 = 311.688 tok/s; 8 x g6e.12xlarge =
    83.94112 $/h on demand -> 83.94112 / (311.688 x 3600) x 1e6 = $74.81; total tokens add 64 prompt tokens per 20
    output: x (1 + 64/20) = 4.2 -> $17.81; spot estimate 40% of on-demand -> $29.92."""
    path = write_result(tmp_path / "run", ttft=0.1, itl=0.02, levels=(8,))
    code, out, _ = run(["cost", "tokens", str(path), "--instance-type", "g6e.12xlarge", "--replicas", "8",
                        "--capacity-type", "on-demand", "--region", "us-east-1", "--json"])
    assert code == 0
    level = json.loads(out)[0]["levels"][0]
    assert level["aggregate_output_tokens_per_s"] == pytest.approx(311.688, rel=1e-5)
    assert level["usd_per_hour_on_demand"] == pytest.approx(83.94112)
    assert level["usd_per_m_output_on_demand"] == pytest.approx(74.81, abs=0.005)
    assert level["usd_per_m_total_on_demand"] == pytest.approx(17.81, abs=0.005)
    assert level["usd_per_m_output_spot"] == pytest.approx(29.92, abs=0.005)


def test_tokens_reads_the_recorded_layout_and_the_recorded_price_wins(tmp_path: Path) -> None:
    path = write_result(tmp_path / "run", ttft=0.1, itl=0.02, levels=(8, 32))
    data = json.loads(path.read_text())
    data["layout"] = {"instance_type": "g6e.xlarge", "replicas": 4, "replicas_per_node": 1, "capacity_type": "spot",
                      "hourly_price": 0.7, "region": None}
    path.write_text(json.dumps(data))
    code, out, _ = run(["cost", "tokens", str(path)])
    assert code == 0
    assert "4 replica(s) on 4 x g6e.xlarge, spot, $0.7/node-hour as recorded" in out
    assert "recorded $/h, $/1M out, $/1M total" in out and "$2.80" in out
    # g6e.xlarge priced from no table here (no region): only the recorded price, so no table date either
    assert "us-east-1 prices as of" not in out


def test_tokens_text_flags_the_table_price_age(tmp_path: Path) -> None:
    path = write_result(tmp_path / "run", ttft=0.1, itl=0.02, levels=(8,))
    code, out, _ = run(["cost", "tokens", str(path), "--instance-type", "g6e.12xlarge", "--replicas", "8", "--region", "us-east-1"])
    assert code == 0
    assert out.splitlines()[0].endswith("; us-east-1 prices as of 2026-07-06 (147 days old: STALE, older than 90 days; "
                                        "check them or run gennstack cost --live)")
    assert "spot (estimate: 60% off on-demand) $/h, $/1M out, $/1M total" in out


@pytest.mark.parametrize(("layout", "flags", "message"), [
    (None, [], "records no layout; give --instance-type, --replicas, --capacity-type and --region (or --hourly-price)"),
    (None, ["--instance-type", "p5.48xlarge", "--region", "us-east-1"], "instance type 'p5.48xlarge': no on-demand price"),
    (None, ["--instance-type", "g6e.xlarge", "--capacity-type", "dedicated"], "--capacity-type: got 'dedicated'"),
    (None, ["--instance-type", "g6e.xlarge"], "no region to price it in; give --region or --hourly-price"),
])
def test_tokens_errors(tmp_path: Path, layout, flags, message) -> None:
    path = write_result(tmp_path / "run", ttft=0.1, itl=0.02, levels=(8,))
    code, _, err = run(["cost", "tokens", str(path), *flags])
    assert code == 2 and message in err


def test_tokens_without_measured_tokens_is_an_error(tmp_path: Path) -> None:
    path = write_result(tmp_path / "run", ttft=0.1, itl=0.02, levels=(8,))
    data = json.loads(path.read_text())
    data["levels"][0]["aggregate_output_tokens_per_s"] = 0.0
    path.write_text(json.dumps(data))
    code, _, err = run(["cost", "tokens", str(path), "--hourly-price", "1"])
    assert code == 2 and "concurrency 8: aggregate_output_tokens_per_s is 0.0; no tokens were measured" in err


def test_layouts_compare_packing_and_tensor_parallel_with_a_measured_row(tmp_path: Path) -> None:
    path = write_result(tmp_path / "packed", ttft=0.1, itl=0.02, levels=(8, 32))
    data = json.loads(path.read_text())
    data["layout"] = {"instance_type": "g6e.12xlarge", "replicas": 8, "replicas_per_node": 4, "capacity_type": "on-demand",
                      "hourly_price": None, "region": "us-east-1"}
    path.write_text(json.dumps(data))
    code, out, _ = run(["cost", "layouts", "--generation", "g6e", "--replicas", "8", "--bench", str(path), "--json"])
    assert code == 0
    rows = {(r["instance_type"], r["accelerators_per_replica"]): r for r in json.loads(out)}
    assert rows[("g6e.xlarge", 1)]["nodes"] == 8 and rows[("g6e.xlarge", 1)]["on_demand_usd_per_hour"] == pytest.approx(14.888)
    assert rows[("g6e.12xlarge", 1)]["nodes"] == 2 and rows[("g6e.12xlarge", 1)]["allowed_by_config"]
    assert rows[("g6e.12xlarge", 4)]["nodes"] == 8 and not rows[("g6e.12xlarge", 4)]["allowed_by_config"]
    assert rows[("g6e.12xlarge", 1)]["measured"]["result"] == str(path)
    assert rows[("g6e.xlarge", 1)]["measured"] is None
    code, text, _ = run(["cost", "layouts", "--generation", "g6e", "--replicas", "8", "--bench", str(path)])
    assert "per 1M output tokens at c=" in text


def test_inf2_layouts_leave_out_a_size_too_small_for_the_tp_degree() -> None:
    code, out, _ = run(["cost", "layouts", "--generation", "inf2", "--json"])
    assert code == 0
    assert [(r["instance_type"], r["accelerators_per_replica"], r["nodes"]) for r in json.loads(out)] == [("inf2.48xlarge", 24, 1)]


def test_layouts_without_any_price_is_an_error() -> None:
    code, _, err = run(["cost", "layouts", "--generation", "trn2"])
    assert code == 2
    assert err.strip() == ("gennstack cost layouts: generation trn2: no layout of its family has a price in us-east-1; "
                           "give one with --price TYPE=USD")


def test_readme_lists_the_iam_actions_cost_live_uses() -> None:
    from gennstack.cost import live
    from tests.support import ROOT

    section = (ROOT / "docs" / "cost.md").read_text(encoding="utf-8")
    for action in live.ACTIONS.values():
        assert f"`{action}`" in section, action
