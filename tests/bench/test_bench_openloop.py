"""Open-loop levels: the seeded arrival schedule, sending on it whatever is in flight, the in-flight cap and the lag it
causes, every workload, and that closed-loop results stay as they were.

What is asserted is what the program did (the due times it used, how many requests it sent and when each became due,
the most it had in flight, counts against the mock server's programmed lengths), never an upper bound on how late a
busy machine woke up; the one check of the send error against the schedule is marked ``timing``.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from gennstack.bench.arrivals import schedule
from gennstack.bench.config import BenchConfig, ConfigError, Distribution, Workload
from gennstack.bench.metrics import summarize_level
from gennstack.bench.runner import COMPLETED, run_rate_level


def _config(server, **kw) -> BenchConfig:
    base = dict(base_url=server.base_url, model="mock", concurrency=(1,), prompt_tokens=Distribution("fixed", 16),
                max_tokens=Distribution("fixed", 4), stall_timeout_s=30)
    base.update(kw)
    return BenchConfig(**base)


# ---- the schedule (pure) ------------------------------------------------------------------------------------------

def test_constant_arrivals_are_one_over_the_rate_apart() -> None:
    assert schedule(4.0, arrival="constant", count=5) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25])
    assert schedule(4.0, arrival="constant", until=1.0) == pytest.approx([0.25, 0.5, 0.75])
    assert schedule(4.0, arrival="constant", count=0) == []


def test_schedule_is_seeded_and_deterministic() -> None:
    a = schedule(3.0, seed=11, count=50)
    assert a == schedule(3.0, seed=11, count=50)
    assert a != schedule(3.0, seed=12, count=50)
    assert a == sorted(a) and a[0] > 0
    assert schedule(3.0, seed=11, until=a[20]) == a[:20]  # the same draws, cut at a time instead of a count


def _ks_exponential(gaps: list[float], rate: float) -> float:
    """Kolmogorov-Smirnov distance of the gaps' empirical CDF from the exponential CDF 1 - exp(-rate x)."""
    data = sorted(gaps)
    n = len(data)
    return max(max(abs((i + 1) / n - (1 - math.exp(-rate * x))), abs(i / n - (1 - math.exp(-rate * x))))
               for i, x in enumerate(data))


def test_poisson_gaps_are_exponential_with_mean_one_over_the_rate() -> None:
    """Seeded, so deterministic: 20,000 gaps at 5/s. Mean 0.2 s (standard error 0.7 %), coefficient of variation 1,
    the KS distance from the exponential below its 5 % critical value 1.36/sqrt(n), and counts per second with
    variance equal to their mean (a Poisson count's index of dispersion is 1)."""
    rate, n = 5.0, 20000
    times = schedule(rate, arrival="poisson", seed=7, count=n)
    gaps = [times[0]] + [b - a for a, b in zip(times, times[1:])]
    mean = sum(gaps) / n
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (n - 1))
    assert mean == pytest.approx(1 / rate, rel=0.02)
    assert sd / mean == pytest.approx(1.0, abs=0.03)
    assert _ks_exponential(gaps, rate) < 1.36 / math.sqrt(n)
    seconds = int(times[-1])
    counts = [0] * seconds
    for t in times:
        if t < seconds:
            counts[int(t)] += 1
    m = sum(counts) / seconds
    var = sum((c - m) ** 2 for c in counts) / (seconds - 1)
    assert m == pytest.approx(rate, rel=0.03)
    assert var / m == pytest.approx(1.0, abs=0.15)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_burstiness_is_the_gamma_shape_as_in_vllm(burstiness) -> None:
    """vllm 0.29.0 vllm/benchmarks/serve.py get_request: theta = 1 / (rate * burstiness), gaps
    np.random.gamma(shape=burstiness, scale=theta): mean 1/rate whatever the burstiness, CV 1/sqrt(burstiness)."""
    rate, n = 2.0, 20000
    times = schedule(rate, burstiness=burstiness, seed=3, count=n)
    gaps = [times[0]] + [b - a for a, b in zip(times, times[1:])]
    mean = sum(gaps) / n
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (n - 1))
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert sd / mean == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


@pytest.mark.parametrize("kw, flag", [
    (dict(rates=(0.0,)), "--rate"),
    (dict(rates=(1.0,), arrival="uniform"), "--arrival"),
    (dict(rates=(1.0,), arrival="constant", burstiness=2.0), "--burstiness"),
    (dict(rates=(1.0,), burstiness=0.0), "--burstiness"),
    (dict(rates=(1.0,), max_in_flight=0), "--max-in-flight"),
    (dict(rates=(1.0,), ramp_up_s=2.0), "--ramp-up"),
    (dict(sweep=True), "--slo"),
    (dict(slo_target=1.5), "--slo-target"),
])
def test_bad_open_loop_settings_name_the_flag(kw, flag) -> None:
    with pytest.raises(ConfigError, match=flag):
        BenchConfig(base_url="http://h/v1", model="m", concurrency=(1,), prompt_tokens=Distribution("fixed", 8),
                    max_tokens=Distribution("fixed", 8), num_requests=1, **kw)


# ---- over HTTP, against the mock server's programmed lengths -----------------------------------------------------

def test_requests_go_out_when_due_whatever_is_in_flight(mock_server) -> None:
    """20 requests at a constant 20/s, each 0.5 s long on the server: a closed loop would have one in flight; on the
    schedule about ten overlap. The due times are the schedule's, in order, and no request is sent before it is due."""
    server = mock_server("--ttft", "0.5", "--itl", "0.01")
    config = _config(server, rates=(20.0,), arrival="constant", num_requests=20)
    run = asyncio.run(run_rate_level(config, 20.0))
    assert len(run.records) == 20 and all(r.status == COMPLETED for r in run.records)
    assert sorted(r.t_due for r in run.records) == pytest.approx(schedule(20.0, arrival="constant", count=20))
    assert all(r.t_send >= r.t_due - 0.002 for r in run.records)  # asyncio may wake up to a clock tick early
    assert run.peak_in_flight >= 5
    level = summarize_level(run, tolerance_s=config.schedule_tolerance_s)
    assert level["rate_rps"] == 20.0
    s = level["schedule"]
    assert (s["due"], s["sent"], s["not_sent"], s["max_in_flight"]) == (20, 20, 0, 256)
    assert s["offered_rps"] == pytest.approx(20.0)  # 19 gaps of 50 ms between the first and the last due time
    assert level["requests"]["warmup"] == 0


def test_a_full_in_flight_cap_makes_requests_late_and_says_so(mock_server) -> None:
    """Cap 2, 10 requests due every 50 ms, each 0.5 s long: from the third on a request waits for a slot, at least
    0.3 s (request 3 is due at 0.15 s, the first slot frees at 0.5 s or later), so at least 8 are late and the level
    is not on schedule; no more than 2 were ever in flight."""
    server = mock_server("--ttft", "0.5", "--itl", "0.001")
    config = _config(server, rates=(20.0,), arrival="constant", num_requests=10, max_in_flight=2, max_tokens=Distribution("fixed", 2))
    run = asyncio.run(run_rate_level(config, 20.0))
    level = summarize_level(run, tolerance_s=config.schedule_tolerance_s)
    s = level["schedule"]
    assert run.peak_in_flight == 2 and s["peak_in_flight"] == 2
    assert s["late"] >= 8 and s["on_schedule"] is False
    assert s["lag_s"]["max"] >= 0.3
    assert level["requests"]["completed"] == 10


def test_duration_level_drains_what_is_in_flight_and_excludes_warmup_by_due_time(mock_server) -> None:
    """10/s constant for a 0.2 s warm-up plus a 1 s window: arrivals at 0.1 .. 1.1 s (11); the one due before 0.2 s
    is warm-up. Requests still streaming at the end run to it (each takes 0.3 s), so none is incomplete."""
    server = mock_server("--ttft", "0.3", "--itl", "0.001")
    config = _config(server, rates=(10.0,), arrival="constant", duration_s=1.0, warmup_s=0.2, max_tokens=Distribution("fixed", 2))
    run = asyncio.run(run_rate_level(config, 10.0))
    assert len(run.records) == 11
    assert [r.warmup for r in sorted(run.records, key=lambda r: r.t_due)] == [True] + [False] * 10
    assert all(r.status == COMPLETED for r in run.records)
    level = summarize_level(run)
    assert level["requests"]["incomplete"] == 0 and level["requests"]["measured"] == 10
    assert (run.window_start, run.window_end) == (0.2, 1.2)


def test_requests_due_while_the_cap_is_full_when_the_window_closes_count_as_not_sent(mock_server) -> None:
    """Cap 1, 20/s for 0.5 s, each request 2 s long: 9 arrivals (0.05 .. 0.45 s); the first is sent, the other 8
    still wait for the slot when the window closes: not sent, and no record of them."""
    server = mock_server("--ttft", "2", "--itl", "0.001")
    config = _config(server, rates=(20.0,), arrival="constant", duration_s=0.5, max_in_flight=1,
                     max_tokens=Distribution("fixed", 2))
    run = asyncio.run(run_rate_level(config, 20.0))
    s = summarize_level(run)["schedule"]
    assert (s["due"], s["sent"], s["not_sent"], s["on_schedule"]) == (9, 1, 8, False)
    assert len(run.records) == 1 and run.records[0].status == COMPLETED  # the one sent ran to its end
    assert s["offered_rps"] == pytest.approx(9 / 0.5)


def test_multi_turn_conversations_arrive_at_the_rate_and_each_turn_follows_its_think_time(mock_server) -> None:
    """3 conversations of 3 turns at 5 conversations/s: turn 1 is due on the schedule; turn k+1 is due think time
    after the answer to turn k, never before it."""
    server = mock_server("--ttft", "0.05", "--itl", "0.001")
    think = 0.2
    config = _config(server, rates=(5.0,), arrival="constant", num_requests=9, workload=Workload(kind="multi-turn", turns=3, think_time_s=think))
    run = asyncio.run(run_rate_level(config, 5.0))
    assert len(run.records) == 9 and all(r.status == COMPLETED for r in run.records)
    by_conv: dict[int, list] = {}
    for r in run.records:
        by_conv.setdefault(r.conversation, []).append(r)
    assert sorted(by_conv) == [0, 1, 2]
    firsts = sorted(min(rs, key=lambda r: r.turn).t_due for rs in by_conv.values())
    assert firsts == pytest.approx(schedule(5.0, arrival="constant", count=3))
    for rs in by_conv.values():
        rs.sort(key=lambda r: r.turn)
        assert [r.turn for r in rs] == [1, 2, 3]
        for prev, nxt in zip(rs, rs[1:]):
            assert nxt.t_due >= prev.t_end + think
            assert nxt.t_send >= nxt.t_due - 0.002
            assert nxt.prompt_tokens_requested > prev.prompt_tokens_requested  # it resent the history


def test_shared_prefix_requests_arrive_on_the_schedule(mock_server) -> None:
    server = mock_server("--ttft", "0.05", "--itl", "0.001")
    config = _config(server, rates=(10.0,), num_requests=12, seed=5,
                     workload=Workload(kind="shared-prefix", num_prefixes=3, prefix_tokens=20, prefix_zipf=1.0))
    run = asyncio.run(run_rate_level(config, 10.0))
    assert sorted(r.t_due for r in run.records) == pytest.approx(schedule(10.0, seed=5, count=12))
    assert {r.prefix for r in run.records} <= {0, 1, 2} and all(r.turn == 1 for r in run.records)
    assert summarize_level(run)["workload"]["requests_by_prefix"]


@pytest.mark.timing
def test_send_times_stay_within_the_stated_error_of_the_schedule(mock_server) -> None:
    """Poisson at 50/s for 200 requests (a few in flight at a time): at least 95 % of sends within 20 ms of their due
    time and the median within 5 ms (docs/benchmark.md, "How accurate is it"; the margin over the default 10 ms
    --schedule-tolerance is for a loaded 2-core CI machine, where a single stall of the event loop delays every
    request due during it)."""
    server = mock_server("--ttft", "0.05", "--itl", "0.005", "--tokens-per-chunk", "2")
    config = _config(server, rates=(50.0,), num_requests=200, max_tokens=Distribution("fixed", 8), schedule_tolerance_s=0.020)
    level = summarize_level(asyncio.run(run_rate_level(config, 50.0)), tolerance_s=0.020)
    s = level["schedule"]
    print(s)
    assert s["sent"] == 200 and s["not_sent"] == 0, s
    assert s["late_share"] <= 0.05, s
    assert s["lag_s"]["p50"] <= 0.005, s


# ---- the command line and the result file -----------------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--rate", "2", "--concurrency", "4"], "give one"),
    (["--rate", "0"], "--rate"),
    (["--rate", "fast"], "--rate"),
    (["--rate", "sweep"], "--slo"),
    (["--rate", "1", "--slo", "ttft=fast"], "--slo"),
    (["--rate", "1", "--slo", "latency_p90=1"], "unknown metric"),
    (["--rate", "1", "--arrival", "constant", "--burstiness", "0.5"], "--burstiness"),
])
def test_bad_open_loop_flags_exit_2(bench_parser, extra, message, capsys) -> None:
    args = bench_parser.parse_args(["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *extra])
    assert args.func(args) == 2
    assert message in capsys.readouterr().err


def test_open_loop_run_writes_schedule_and_slo_and_no_llmperf_files(mock_server, bench_parser, tmp_path) -> None:
    server = mock_server("--ttft", "0.02", "--itl", "0.002")
    out = tmp_path / "o"
    args = bench_parser.parse_args(["bench", "--base-url", server.base_url, "--model", "m", "--rate", "20,40",
                                    "--num-requests", "10", "--max-tokens", "4", "--slo", "ttft_p90=2s,e2e=5s",
                                    "--output-dir", str(out), "--no-progress"])
    assert args.func(args) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["settings"]["open_loop"]["rates"] == [20.0, 40.0]
    assert result["settings"]["slo"] == {"ttft_p90": 2.0, "e2e_p90": 5.0, "target": 0.9}
    assert [lvl["rate_rps"] for lvl in result["levels"]] == [20.0, 40.0]
    for lvl in result["levels"]:
        assert lvl["schedule"]["sent"] == 10 and lvl["slo"]["measured"] == 10
    assert not (out / "llmperf").exists()  # LLMPerf has no open loop
    assert (out / "requests.csv").read_text().splitlines()[0].endswith(",upstream,due_s")


def test_closed_loop_results_are_unchanged(mock_server, bench_parser, tmp_path) -> None:
    server = mock_server("--ttft", "0.02", "--itl", "0.002")
    out = tmp_path / "c"
    args = bench_parser.parse_args(["bench", "--base-url", server.base_url, "--model", "m", "--concurrency", "2",
                                    "--num-requests", "4", "--max-tokens", "4", "--output-dir", str(out), "--no-progress"])
    assert args.func(args) == 0
    result = json.loads((out / "result.json").read_text())
    assert "open_loop" not in result["settings"] and "slo" not in result["settings"] and "sweep" not in result
    level = result["levels"][0]
    assert not {"rate_rps", "schedule", "slo"} & set(level)
    assert (out / "llmperf" / "concurrency-2").is_dir()
    assert (out / "requests.csv").read_text().splitlines()[0].endswith(",prefix,upstream")


def test_sweep_runs_synchronous_throughput_then_rates_between_and_picks_the_rate_at_the_slo(mock_server, bench_parser,
                                                                                           tmp_path, capsys) -> None:
    """A mock that slows down with its load (TTFT and ITL x (1 + 0.2 x streams in flight)): the sweep's rates are
    GuideLLM's between the rates its two closed-loop runs measured, and the answer is the highest rate level whose
    attainment met the target, priced at --hourly-price."""
    from gennstack.bench.slo import pick_rate_at_slo, request_rate, sweep_rates

    server = mock_server("--ttft", "0.02", "--itl", "0.004", "--slowdown-per-stream", "0.2")
    out = tmp_path / "s"
    args = bench_parser.parse_args(["bench", "--base-url", server.base_url, "--model", "m", "--rate", "sweep",
                                    "--sweep-levels", "3", "--max-in-flight", "8", "--num-requests", "16",
                                    "--max-tokens", "8", "--slo", "itl_p90=8ms", "--hourly-price", "3.6",
                                    "--output-dir", str(out), "--no-progress"])
    assert args.func(args) == 0
    result = json.loads((out / "result.json").read_text())
    levels = result["levels"]
    assert [lvl.get("sweep_role") for lvl in levels] == ["synchronous", "throughput", "rate", "rate", "rate"]
    assert [lvl["concurrency"] for lvl in levels[:2]] == [1, 8]
    sweep = result["sweep"]
    assert sweep["synchronous_rps"] == pytest.approx(request_rate(levels[0]))
    assert sweep["saturated_rps"] == pytest.approx(request_rate(levels[1]))
    assert [lvl["rate_rps"] for lvl in levels[2:]] == pytest.approx(sweep_rates(sweep["synchronous_rps"], sweep["saturated_rps"], 3))
    picked = pick_rate_at_slo(levels, 0.9)
    if picked is None:
        assert sweep["at_slo"] is None
    else:
        at = sweep["at_slo"]
        assert at["rate_rps"] == picked["rate_rps"]
        assert at["usd_per_m_output_recorded"] == pytest.approx(3.6 / (picked["aggregate_output_tokens_per_s"] * 3600) * 1e6)
    assert "sweep: synchronous" in capsys.readouterr().out
    # the closed-loop runs of a sweep still write their LLMPerf files; the rate levels do not
    assert sorted(p.name for p in (out / "llmperf").iterdir()) == ["concurrency-1", "concurrency-8"]


def test_demo_defaults_to_a_sweep_against_a_mock_that_saturates(bench_parser, tmp_path, capsys) -> None:
    out = tmp_path / "demo"
    args = bench_parser.parse_args(["bench", "demo", "--duration", "2", "--sweep-levels", "1", "--max-tokens", "4",
                                    "--output-dir", str(out), "--no-progress"])
    assert args.func(args) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["settings"]["open_loop"]["rates"] == "sweep"
    assert result["settings"]["slo"] == {"ttft_p90": 0.4, "itl_p90": 0.04, "target": 0.9}
    assert [lvl.get("sweep_role") for lvl in result["levels"]] == ["synchronous", "throughput", "rate"]
    assert "sweep: synchronous" in capsys.readouterr().out


def test_a_multi_turn_sweep_runs_its_request_rates_as_conversations_per_second(mock_server, bench_parser, tmp_path) -> None:
    """The closed-loop runs measure requests/s; a multi-turn level's rate is conversations/s, each --turns requests,
    so the sweep divides: 2 turns, rate levels at half the sweep's request rates."""
    server = mock_server("--ttft", "0.02", "--itl", "0.004", "--slowdown-per-stream", "0.2")
    out = tmp_path / "mt"
    args = bench_parser.parse_args(["bench", "--base-url", server.base_url, "--model", "m", "--rate", "sweep",
                                    "--sweep-levels", "2", "--max-in-flight", "4", "--num-requests", "8",
                                    "--workload", "multi-turn", "--turns", "2", "--max-tokens", "4", "--prompt-tokens", "8",
                                    "--slo", "e2e=1s", "--output-dir", str(out), "--no-progress"])
    assert args.func(args) == 0
    result = json.loads((out / "result.json").read_text())
    sweep = result["sweep"]
    assert [lvl["rate_rps"] for lvl in result["levels"][2:]] == pytest.approx([r / 2 for r in sweep["rates"]])
    assert sweep["conversation_rates"] == pytest.approx([r / 2 for r in sweep["rates"]])
    for lvl in result["levels"][2:]:
        assert lvl["requests"]["measured"] == 8 and lvl["workload"]["conversations"] == 4
