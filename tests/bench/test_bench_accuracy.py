"""The tool's numbers against the mock server's programmed truth, at concurrency 1, 32 and 200.

Tolerances (stated in docs/benchmark.md, "How accurate is it"):

* TTFT mean and p50: within 10 ms + 10 % of the programmed TTFT (the client sends a request
  and the server parses it before its clock starts) above the TTFT the server served (its
  ``/stats`` ``mean_ttft_s``: the programmed one plus how late a busy machine woke it), and never
  under the programmed TTFT (the server sends no content chunk sooner);
* ITL mean, chunk-gap mean, per-user tokens/s mean and aggregate tokens/s: within 5 %.

The tool usually lands within 1 %; the margin is for a loaded 2-core CI machine. Exact
definitions (n - 1, which chunks count) are checked to the microsecond on constructed
requests in test_bench_metrics.py; these tests prove the measurement, end to end, over HTTP.

Each level runs in --duration mode with workers ramped up over one request's length, so the
window sees a steady state: aggregate truth is then ``concurrency * n / T`` with
``T = ttft + (C - 1) * itl`` the programmed length of one request.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest

from gennstack.bench.config import BenchConfig, Distribution
from gennstack.bench.metrics import summarize_level
from gennstack.bench.runner import run_level

# Timing-sensitive: `make test` runs these alone, after the parallel phase, so no other test
# competes for the two cores while latencies are measured.
pytestmark = pytest.mark.timing

TTFT_ABS_S, TTFT_REL = 0.010, 0.10
REL = 0.05


@dataclass(frozen=True)
class Case:
    concurrency: int
    ttft: float
    itl: float
    n: int
    tokens_per_chunk: int
    usage: bool
    reasoning_tokens: int
    periods: float  # measured window, in request lengths

    @property
    def chunks(self) -> int:
        return math.ceil(self.n / self.tokens_per_chunk)

    @property
    def request_s(self) -> float:
        return self.ttft + (self.chunks - 1) * self.itl

    @property
    def expected_n(self) -> int:
        """With usage, n is the token count; without it, the chunk count (the report says so)."""
        return self.n if self.usage else self.chunks


CASES = [
    # one stream; the first 4 tokens are reasoning_content; no usage report: n from chunks
    Case(concurrency=1, ttft=0.30, itl=0.02, n=40, tokens_per_chunk=1, usage=False, reasoning_tokens=4, periods=5),
    # 4 tokens per chunk with usage: ITL per token differs from the gap between chunks
    Case(concurrency=32, ttft=0.25, itl=0.025, n=64, tokens_per_chunk=4, usage=True, reasoning_tokens=0, periods=4),
    # seed scale: 200 streams at 18 tokens/s each, 4 tokens a chunk: 1,000 chunks a second in all, which both
    # processes keep up with on a busy 2-core machine (at one token a chunk, 4,000 a second, the client and
    # the server fall behind their schedule there; where one core's limit lies is benchmarks/bench_client.py's
    # question, not an assertion)
    Case(concurrency=200, ttft=0.40, itl=0.20, n=40, tokens_per_chunk=4, usage=True, reasoning_tokens=0, periods=3),
]


def _close(measured: float, truth: float, rel: float, abs_: float = 0.0) -> bool:
    return abs(measured - truth) <= abs_ + rel * truth


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"c{c.concurrency}")
def test_metrics_match_programmed_truth(mock_server, case: Case) -> None:
    flags = ["--ttft", str(case.ttft), "--itl", str(case.itl), "--tokens-per-chunk", str(case.tokens_per_chunk),
             "--reasoning-tokens", str(case.reasoning_tokens)]
    server = mock_server(*flags, *([] if case.usage else ["--no-usage"]))
    config = BenchConfig(
        base_url=server.base_url, model="mock", concurrency=(case.concurrency,),
        prompt_tokens=Distribution("fixed", 32), max_tokens=Distribution("fixed", case.n),
        duration_s=case.periods * case.request_s, ramp_up_s=case.request_s, warmup_s=0.2,
        stall_timeout_s=30,
    )
    level = summarize_level(asyncio.run(run_level(config, case.concurrency)))
    served = server.stats()
    m = level["metrics"]
    report = (f"c={case.concurrency}: ttft={m['ttft_s']['mean']:.4f} itl={m['itl_s']['mean']:.5f} "
              f"gap={m['chunk_gap_s']['mean']:.5f} user={m['user_output_tokens_per_s']['mean']:.2f} "
              f"agg={level['aggregate_output_tokens_per_s']:.1f} requests={level['requests']} "
              f"server: ttft={served['mean_ttft_s']:.4f} lateness mean={served['mean_lateness_s']:.4f} "
              f"max={served['max_lateness_s']:.4f}")

    print(report)
    assert level["requests"]["failed"] == 0, report
    assert level["requests"]["completed"] >= case.concurrency, report
    assert level["token_source"] == ("usage" if case.usage else "chunks"), report
    assert set(level["samples"]["output_tokens"]) == {case.expected_n}, report

    for stat in ("mean", "p50"):
        assert case.ttft - 0.001 <= m["ttft_s"][stat] <= served["mean_ttft_s"] + TTFT_ABS_S + TTFT_REL * case.ttft, report
    itl_truth = (case.chunks - 1) * case.itl / (case.expected_n - 1)
    assert _close(m["itl_s"]["mean"], itl_truth, REL), report
    assert _close(m["chunk_gap_s"]["mean"], case.itl, REL), report
    user_truth = case.expected_n / case.request_s
    assert _close(m["user_output_tokens_per_s"]["mean"], user_truth, REL), report
    aggregate_truth = case.concurrency * case.n / case.request_s  # tokens, whatever n counts
    if not case.usage:
        aggregate_truth = case.concurrency * case.chunks / case.request_s
    assert _close(level["aggregate_output_tokens_per_s"], aggregate_truth, REL), report
