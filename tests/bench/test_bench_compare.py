"""``gennstack bench compare``: side by side, with changes against the first run."""

from __future__ import annotations

import json

import pytest
from bench_results_factory import write_result

from gennstack.bench import compare
from gennstack.bench.results import ResultFileError, load_result


@pytest.fixture
def three_generations(tmp_path):
    return [
        write_result(tmp_path / "gen1", ttft=0.40, itl=0.050),
        write_result(tmp_path / "gen2", ttft=0.20, itl=0.025, failures=2),
        write_result(tmp_path / "gen3", ttft=0.10, itl=0.020, levels=(8, 32, 64)),
    ]


def test_rows_put_runs_side_by_side_with_deltas(three_generations) -> None:
    results = compare.load_all([str(p) for p in three_generations])
    assert [r["_label"] for r in results] == ["gen1", "gen2", "gen3"]
    rows = {(r["concurrency"], r["metric"]): r for r in compare.comparison_rows(results)}
    ttft = rows[(8, "TTFT p50")]
    assert ttft["values"] == pytest.approx([0.40, 0.20, 0.10])
    assert ttft["deltas"] == ["", "-50.0%", "-75.0%"]
    itl = rows[(32, "ITL p50")]
    assert itl["values"] == pytest.approx([0.050, 0.025, 0.020])
    # a level that a run lacks shows as missing, not as zero
    assert rows[(1, "TTFT p50")]["values"][2] is None and rows[(1, "TTFT p50")]["deltas"][2] == ""
    assert rows[(64, "TTFT p50")]["values"][:2] == [None, None]
    assert rows[(8, "failed")]["values"] == [0, 2, 0]


def test_cli_writes_table_and_html(three_generations, bench_parser, tmp_path, capsys) -> None:
    html = tmp_path / "cmp.html"
    args = bench_parser.parse_args(["bench", "compare", *map(str, three_generations), "--label", "g5", "--label", "g6",
                                    "--label", "g7", "--html", str(html)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "g5" in out and "g7" in out and "-50.0%" in out
    page = html.read_text()
    for label in ("g5", "g6", "g7"):
        assert f'data-series="{label}"' in page
    assert 'id="agg-tps-vs-concurrency"' in page and 'id="user-ttft_s-c64"' in page


def test_a_run_directory_is_accepted(three_generations) -> None:
    assert load_result(three_generations[0].parent)["model"] == "mock"


def test_bad_inputs(three_generations, bench_parser, tmp_path, capsys) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"results_ttft_s_mean": 1}))
    with pytest.raises(ResultFileError, match="not a gennstack bench result"):
        load_result(other)
    for argv in (["bench", "compare", str(three_generations[0])],
                 ["bench", "compare", str(three_generations[0]), str(other)],
                 ["bench", "compare", *map(str, three_generations[:2]), "--label", "only-one"]):
        args = bench_parser.parse_args(argv)
        assert args.func(args) == 2
    assert "error" in capsys.readouterr().err
