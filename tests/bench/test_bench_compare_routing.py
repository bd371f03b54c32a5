"""``gennstack bench compare-routing``: its orchestration on something small (three mock replicas with the
mock's simulated prefix cache behind the real local gateway), its bad input, and the README's table.

What is asserted of a run is what the program did (who served what, what failed, what the servers
counted), never how fast: the latency comparison itself is the command's output, not a test.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from gennstack.bench import routing_compare as rc
from tests.support import ROOT

SMALL = rc.CompareSettings(backend="mock", runs=1, rates=(4.0, 8.0), conversations=3, turns=3, think_time_s=0.05,
                           prompt_tokens=20, max_tokens=6, shared_requests=12, prefix_tokens=60, question_tokens=8,
                           kill_conversations=3, kill_after=0.3, kill_turns=30, health_interval_s=1)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> tuple[dict, Path]:
    work = tmp_path_factory.mktemp("compare-routing")
    return rc.compare(SMALL, work, log=lambda line: None), work


def test_both_policies_run_the_same_load_and_every_request_is_accounted_for(small_run) -> None:
    result, _ = small_run
    assert set(result["policies"]) == {"least_request", "prefix"}
    assert result["settings"]["backend"] == "mock" and result["machine"]["cores"] >= 1
    work = Path(result["work_dir"])
    sent = {}
    for policy, by in result["runs"].items():
        for workload, levels in by.items():
            assert set(levels) == {"4", "8"}
            for key, (run,) in levels.items():
                assert run["rate_rps"] == float(key)
                replicas = run["replicas"]
                names = [r["replica"] for r in replicas]
                assert all(name.startswith("127.0.0.1:") for name in names)
                # every measured request's answer named its replica (x-gennstack-upstream-host), and only these
                assert set(run["upstreams"]) <= set(names)
                assert sum(r["requests"] for r in replicas) == run["completed"] + run["failed"] == sum(run["upstreams"].values())
                assert sum(r["share"] for r in replicas) == pytest.approx(1.0)
                # fresh servers per level: they counted this level's requests and no other (nothing failed, no retries)
                assert sum(r["server_chat_requests"] for r in replicas) == run["completed"] and run["failed"] == 0
                assert all(0 <= (r["cache_hit_rate"] or 0) <= 1 for r in replicas)
                assert 0 <= run["slo_attainment"] <= 1 and run["goodput_rps"] >= 0
                with (work / "runs" / f"{policy}-1" / f"{workload}-{key}" / "bench" / "requests.csv").open() as fh:
                    rows = list(csv.DictReader(fh))
                # open loop: each request carries the time it was due on the level's seeded schedule
                sent[(policy, workload, key)] = sorted((r["conversation"], r["turn"], r["prompt_tokens_requested"]) for r in rows)
                if workload == "shared-prefix":
                    sent[(policy, workload, key, "due")] = sorted(round(float(r["due_s"]), 6) for r in rows)
    # same seed, same load: the same conversations, turns, lengths (and arrival times) under both policies
    for key in ("4", "8"):
        for workload in ("multi-turn", "shared-prefix"):
            assert sent[("least_request", workload, key)] == sent[("prefix", workload, key)]
        assert sent[("least_request", "shared-prefix", key, "due")] == sent[("prefix", "shared-prefix", key, "due")]
        assert len(sent[("prefix", "multi-turn", key)]) == SMALL.conversations * SMALL.turns
        assert len(sent[("prefix", "shared-prefix", key)]) == SMALL.shared_requests
    # the two rates are two schedules
    assert sent[("prefix", "shared-prefix", "4", "due")] != sent[("prefix", "shared-prefix", "8", "due")]


def test_prefix_routing_keeps_a_conversation_on_one_replica(small_run) -> None:
    """What the comparison exists to show, checked on the mock: each conversation's turns land on one replica
    (the gateway's prefix key is its first messages), so that replica's cache holds the history."""
    result, _ = small_run
    work = Path(result["work_dir"])
    with (work / "runs" / "prefix-1" / "multi-turn-4" / "bench" / "requests.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    by_conversation: dict[str, set[str]] = {}
    for row in rows:
        by_conversation.setdefault(row["conversation"], set()).add(row["upstream"])
    assert all(len(hosts) == 1 for hosts in by_conversation.values()), by_conversation
    hit = result["runs"]["prefix"]["multi-turn"]["4"][0]["replicas"]
    cached = sum(r["cached_tokens"] for r in hit)
    assert cached > 0.5 * sum(r["prompt_tokens"] for r in hit)  # later turns resend what the replica holds


def test_the_kill_drill_moves_the_victims_conversations_and_fails_only_what_was_in_flight(small_run) -> None:
    result, _ = small_run
    drill = result["kill"]
    assert drill["victim_conversations"] >= 1
    assert drill["victim_conversations_moved"] == drill["victim_conversations"]
    assert drill["sent_after_one_interval"] > 0 and drill["failed_after_one_interval"] == 0
    assert set(drill["failed_by_class"]) <= {"broken_stream", "connection_error"}
    assert drill["failed"] <= SMALL.kill_conversations  # at most the streams in flight when it died
    assert drill["conversations_all_later_turns_completed"] == drill["conversations_after_kill"]
    assert drill["killed"] not in {k for k, v in (drill["upstreams"] or {}).items() if v == 0}


def test_the_table_is_written_beside_the_result_and_names_the_machine(small_run, tmp_path) -> None:
    result, _ = small_run
    table = rc.write(result, tmp_path / "out.json")
    assert table == tmp_path / "out.md"
    text = table.read_text()
    assert rc.load(tmp_path / "out.json") == json.loads((tmp_path / "out.json").read_text())
    host = result["machine"]
    assert f"Machine: {host['cores']} cores ({host['cpu_model']}), {host['memory_gib']} GiB memory" in text
    # one row per workload, rate and policy; the targets per rate
    for workload in ("multi-turn", "shared-prefix"):
        for rate in ("4", "8"):
            assert text.count(f"\n| {workload} | {rate} | least-request |") == 1
            assert text.count(f"\n| {workload} | {rate} | prefix |") == 1
    assert text.count("(target >= 1.5x: ") == 2 and text.count("(target <= 1.10x: ") == 2
    assert "kill drill (prefix-aware, closed loop of 3 conversations)" in text
    assert "Poisson arrivals at 4, 8 requests/s offered" in text
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{rc.README_START}\nold\n{rc.README_END}\nafter\n")
    rc.update_readme(readme, rc.markdown(result))
    assert readme.read_text() == f"before\n{rc.README_START}\n{rc.markdown(result)}\n{rc.README_END}\nafter\n"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 1}, "--replicas=1: must be 2 to 8"),
    ({"turns": 1}, "--turns=1: must be at least 2 (turn 1 is the cold one)"),
    ({"prefix_zipf": -1.0}, "--prefix-zipf=-1.0: must be a finite number >= 0"),
    ({"backend": "vllm"}, "--backend='vllm': must be llama or mock"),
    ({"think_time_s": -0.5}, "--think-time=-0.5: must be 0 or more seconds"),
    ({"rates": (0.5, 0.25)}, "--rates=(0.5, 0.25): must be one or more rates above 0 requests/s, rising"),
    ({"rates": (0.0,)}, "--rates=(0.0,): must be one or more rates above 0 requests/s, rising"),
    ({"hash_balance_factor": 99}, "--hash-balance-factor=99: must be 100 to 1000"),
    ({"slo": "ttft=fast"}, "--slo='ttft=fast': cannot read"),
])
def test_bad_settings_get_a_clear_message(kwargs, message) -> None:
    with pytest.raises(rc.CompareError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        rc.CompareSettings(**kwargs)


def test_the_command_refuses_a_readme_without_the_block(bench_parser, tmp_path, capsys, monkeypatch) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no block here\n")
    argv = ["bench", "compare-routing", "--backend", "mock", "--update-readme", str(readme), "--work-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["gennstack", *argv])
    args = bench_parser.parse_args(argv)
    assert args.func(args) == 2
    assert "no <!-- prefix-routing:start --> block in it" in capsys.readouterr().err
    args = bench_parser.parse_args(["bench", "compare-routing", "--replicas", "9"])
    assert args.func(args) == 2
    assert "--replicas=9: must be 2 to 8" in capsys.readouterr().err


def test_the_readme_table_is_the_committed_comparison() -> None:
    """README.md shows benchmarks/results/prefix_routing_local.md, which `gennstack bench compare-routing
    --update-readme README.md` generated from the JSON beside it; the markdown is a function of the JSON."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split(rc.README_START + "\n", 1)[1].split("\n" + rc.README_END, 1)[0]
    result = rc.load(ROOT / rc.RESULT_FILE)
    assert block == rc.markdown(result)
    assert (ROOT / rc.RESULT_FILE).with_suffix(".md").read_text(encoding="utf-8") == block + "\n"
    assert result["settings"]["backend"] == "llama" and result["settings"]["replicas"] == 3
    assert set(result["policies"]) == {"least_request", "prefix"}
    assert result["targets"] == rc.targets(result)


def _level(turn1_p90: float, later_p50: float, later_p90: float) -> dict:
    return {"turn1_ttft_p90_s": turn1_p90, "later_turns_ttft_p50_s": later_p50, "later_turns_ttft_p90_s": later_p90}


def test_the_targets_are_checked_at_every_rate_of_the_ladder() -> None:
    """Issue 32's targets, per rate: later-turn TTFT p50 >= 1.5x lower and p90 lower with prefix routing, first-turn
    TTFT p90 at most 10 % higher; one rate that misses one of them misses the ladder."""
    least = {"0.1": _level(2.0, 3.0, 6.0), "0.2": _level(2.0, 3.0, 6.0)}
    prefix = {"0.1": _level(2.2, 2.0, 5.9), "0.2": _level(2.21, 1.0, 2.0)}
    result = {"policies": {"least_request": {"multi-turn": least}, "prefix": {"multi-turn": prefix}}, "kill": None}
    t = rc.targets(result)
    low, high = t["multi_turn"]["0.1"], t["multi_turn"]["0.2"]
    assert low["later_turns_ttft_p50_speedup"] == pytest.approx(1.5) and low["later_turns_ttft_p50_met"]
    assert low["later_turns_ttft_p90_met"] and low["turn1_ttft_p90_ratio"] == pytest.approx(1.1) and low["turn1_ttft_p90_met"]
    assert low["met"]
    assert high["later_turns_ttft_p50_met"] and high["later_turns_ttft_p90_met"] and not high["turn1_ttft_p90_met"]
    assert not high["met"] and not t["multi_turn_met"] and not t["kill_met"]
    prefix["0.2"] = _level(2.0, 1.0, 6.0)  # p90 no better: missed
    assert not rc.targets(result)["multi_turn"]["0.2"]["later_turns_ttft_p90_met"]


def test_from_result_writes_the_table_again_without_running(small_run, bench_parser, tmp_path, monkeypatch) -> None:
    result, _ = small_run
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({**result, "targets": {}}))  # stale targets: the command computes them again
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{rc.README_START}\nold\n{rc.README_END}\nafter\n")
    out = tmp_path / "again.json"
    argv = ["bench", "compare-routing", "--from-result", str(saved), "--update-readme", str(readme), "--result", str(out),
            "--work-dir", str(tmp_path / "nothing-runs-here")]
    monkeypatch.setattr(sys, "argv", ["gennstack", *argv])
    args = bench_parser.parse_args(argv)
    assert args.func(args) == 0
    again = rc.load(out)
    assert again["targets"] == rc.targets(result) and again["runs"] == json.loads(json.dumps(result["runs"]))
    assert readme.read_text() == f"before\n{rc.README_START}\n{rc.markdown(again)}\n{rc.README_END}\nafter\n"
    assert not (tmp_path / "nothing-runs-here").exists()


def test_a_rate_is_saturated_when_a_level_at_it_fell_behind_its_schedule() -> None:
    def level(offered: float, done: float) -> dict:
        return {"offered_rps": offered, "requests_per_s": done}

    result = {"policies": {"least_request": {"multi-turn": {"0.1": level(0.1, 0.1), "0.2": level(0.2, 0.19)},
                                             "shared-prefix": {"0.1": level(0.1, 0.095), "0.2": level(0.2, 0.17)}},
                           "prefix": {"multi-turn": {"0.1": level(0.1, 0.09), "0.2": level(0.2, 0.2)},
                                      "shared-prefix": {"0.1": level(0.1, 0.1), "0.2": level(0.2, 0.2)}}}}
    assert rc.saturated_rates(result) == {"0.2"}  # 0.17 < 0.9 x 0.2; 0.09 is exactly 0.9 x 0.1


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not JSON"),
    ('{"schema": "gennstack-routing-compare/1"}', "not a compare-routing result (expected schema 'gennstack-routing-compare/2')"),
])
def test_from_result_refuses_what_is_not_a_comparison(bench_parser, tmp_path, capsys, monkeypatch, text, message) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    argv = ["bench", "compare-routing", "--from-result", str(bad), "--result", str(tmp_path / "out.json")]
    monkeypatch.setattr(sys, "argv", ["gennstack", *argv])
    args = bench_parser.parse_args(argv)
    assert args.func(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
