"""SLO attainment and goodput on hand-computed requests, the sweep's rates and its pick of the rate at the SLO.

The per-request test is vLLM's --goodput (vllm 0.29.0 vllm/benchmarks/serve.py calculate_metrics:
``is_good_req = all([s >= r for s, r in zip(slo_values, req_metric)])``, a one-token answer's TPOT counted as 0);
the sweep's rates are GuideLLM's (guidellm 0.8.1 guidellm/benchmark/profiles/sweep.py SweepProfile.next_strategy:
``np.linspace(synchronous_rate, throughput_rate, sweep_size - 1)[1:]``).
"""

from __future__ import annotations

import json

import pytest

from gennstack.bench.config import ConfigError
from gennstack.bench.runner import COMPLETED, FAILED, INCOMPLETE, RequestRecord
from gennstack.bench.slo import SLO, Objective, at_slo, level_slo, pick_rate_at_slo, request_rate, sweep_rates


def _req(index, *, send, ttft, itl, n, status=COMPLETED, warmup=False, tail=0.0):
    rec = RequestRecord(index=index, worker=0, warmup=warmup, prompt_tokens_requested=8, max_tokens=n)
    rec.t_send = send
    if status == FAILED:
        rec.status, rec.t_end = FAILED, send + 0.05
        return rec
    rec.chunk_times = [send + ttft + k * itl for k in range(n)]
    rec.usage_completion_tokens = n
    if status == COMPLETED:
        rec.status, rec.t_end = COMPLETED, rec.chunk_times[-1] + tail
    else:
        rec.status = status
    return rec


def test_parse_reads_units_and_percentiles() -> None:
    slo = SLO.parse("ttft_p90=500ms,itl_p95=0.05,e2e=10s,tpot_p50=40ms")
    assert slo.objectives == (Objective("ttft", 0.5, 90), Objective("itl", 0.05, 95), Objective("e2e", 10.0, 90),
                              Objective("tpot", 0.04, 50))
    assert slo.to_dict() == {"ttft_p90": 0.5, "itl_p95": 0.05, "e2e_p90": 10.0, "tpot_p50": 0.04}


@pytest.mark.parametrize("spec, message", [
    ("ttft", "cannot read"), ("ttft_p90=", "cannot read"), ("latency=1", "unknown metric"), ("ttft_p0=1", "percentile"),
    ("ttft=0", "above 0"), ("ttft=1,ttft_p99=2", "given twice"), ("ttft=1min", "cannot read"),
])
def test_parse_rejects_bad_specs_naming_the_flag(spec, message) -> None:
    with pytest.raises(ConfigError, match="--slo") as err:
        SLO.parse(spec)
    assert message in str(err.value)


def test_attainment_and_goodput_by_hand() -> None:
    """SLO: TTFT <= 0.5 s, ITL <= 0.05 s. Window [0, 10] s.

    r0 good (ttft 0.2, itl 0.04, 11 tokens, ends at 0.6); r1 misses TTFT (0.6); r2 misses ITL (0.06);
    r3 one token: no ITL, passes as in vLLM; r4 failed: not good, counted; r5 incomplete: no outcome, left out;
    r6 warm-up: left out; r7 good but ends at 10.9, after the window: good, not in the goodput rate.
    Attainment 3 good (r0, r3, r7) of 6 with an outcome (r0-r4, r7) = 0.5; goodput 2 requests (r0, r3) / 10 s,
    tokens 11 + 1 = 12 / 10 s."""
    records = [
        _req(0, send=0.0, ttft=0.2, itl=0.04, n=11),
        _req(1, send=1.0, ttft=0.6, itl=0.01, n=11),
        _req(2, send=2.0, ttft=0.1, itl=0.06, n=11),
        _req(3, send=3.0, ttft=0.3, itl=0.0, n=1),
        _req(4, send=4.0, ttft=0, itl=0, n=0, status=FAILED),
        _req(5, send=9.0, ttft=0.1, itl=0.01, n=200, status=INCOMPLETE),
        _req(6, send=0.0, ttft=0.9, itl=0.9, n=3, warmup=True),
        _req(7, send=10.0, ttft=0.1, itl=0.08 / 10, n=101),
    ]
    block = level_slo(records, SLO.parse("ttft_p90=500ms,itl_p90=50ms"), window_start=0.0, window_end=10.0)
    assert (block["measured"], block["good"]) == (6, 3)
    assert block["attainment"] == pytest.approx(0.5)
    assert block["goodput_rps"] == pytest.approx(0.2)
    assert block["goodput_output_tokens_per_s"] == pytest.approx(1.2)
    # percentiles over the 5 completed measured requests: TTFT 0.1, 0.1, 0.2, 0.3, 0.6 -> p90 = 0.3 + 0.6 * 0.3
    assert block["percentiles"]["ttft_p90"]["value_s"] == pytest.approx(0.48)
    assert block["percentiles"]["ttft_p90"]["met"] is True
    # ITL of the 4 with n >= 2: 0.008, 0.01, 0.04, 0.06 -> p90 = 0.04 + 0.7 * 0.02
    assert block["percentiles"]["itl_p90"]["value_s"] == pytest.approx(0.054)
    assert block["percentiles"]["itl_p90"]["met"] is False


def test_tpot_counts_the_tail_after_the_last_token_and_itl_does_not() -> None:
    """vLLM's TPOT is (latency - ttft) / (n - 1): a stream that ends 0.5 s after its last token (11 tokens, 10 ms
    apart) has ITL 10 ms and TPOT 60 ms."""
    rec = _req(0, send=0.0, ttft=0.1, itl=0.01, n=11, tail=0.5)
    assert level_slo([rec], SLO.parse("itl=20ms"), window_start=0, window_end=5)["good"] == 1
    assert level_slo([rec], SLO.parse("tpot=20ms"), window_start=0, window_end=5)["good"] == 0
    assert level_slo([rec], SLO.parse("tpot=61ms"), window_start=0, window_end=5)["good"] == 1


def _level(rate, attainment):
    return {"rate_rps": rate, "schedule": {"offered_rps": rate}, "aggregate_output_tokens_per_s": 100.0 * rate,
            "slo": {"attainment": attainment, "goodput_rps": rate * attainment, "goodput_output_tokens_per_s": 90.0 * rate},
            "concurrency": 32, "metrics": {"prompt_tokens": {"mean": 100}, "output_tokens": {"mean": 100},
                                           "user_output_tokens_per_s": {"mean": 10.0}}}


def test_pick_is_the_highest_rate_meeting_the_target() -> None:
    closed = {"concurrency": 1, "slo": {"attainment": 1.0}}  # closed-loop levels have no rate: never picked
    levels = [closed, _level(1.0, 0.99), _level(2.0, 0.95), _level(3.0, 0.89), _level(4.0, 0.91), _level(5.0, 0.2)]
    assert pick_rate_at_slo(levels, 0.9)["rate_rps"] == 4.0  # the highest that meets it, even above one that missed
    assert pick_rate_at_slo(levels, 0.95)["rate_rps"] == 2.0
    assert pick_rate_at_slo(levels, 0.999) is None


def test_sweep_rates_are_guidellms_linspace_without_the_synchronous_rate() -> None:
    # GuideLLM with sweep_size 6: synchronous, throughput, then np.linspace(1, 9, 5)[1:] = 3, 5, 7, 9
    assert sweep_rates(1.0, 9.0, 4) == pytest.approx([3.0, 5.0, 7.0, 9.0])
    assert sweep_rates(0.5, 0.5, 2) == pytest.approx([0.5, 0.5])
    with pytest.raises(ValueError, match="did any request complete"):
        sweep_rates(0.0, 3.0, 4)


def test_request_rate_of_a_closed_level_is_its_tokens_over_tokens_per_request() -> None:
    assert request_rate({"aggregate_output_tokens_per_s": 640.0, "metrics": {"output_tokens": {"mean": 64.0}}}) == 10.0
    assert request_rate({"aggregate_output_tokens_per_s": 0.0, "metrics": {"output_tokens": {"mean": None}}}) == 0.0


def test_at_slo_prices_the_picked_level() -> None:
    """$2/h: at 4 req/s the level delivered 400 tok/s: 2 / (400 x 3600) x 1e6 = $1.389 per 1M output tokens; its
    good tokens, 360/s: $1.543 per 1M."""
    result = {"levels": [_level(3.0, 0.5), _level(4.0, 0.95)],
              "layout": {"instance_type": None, "replicas": None, "replicas_per_node": 1, "capacity_type": None,
                         "hourly_price": 2.0, "region": None}}
    out = at_slo(json.loads(json.dumps(result)), 0.9)
    at = out["at_slo"]
    assert at["rate_rps"] == 4.0 and at["output_tokens_per_s"] == 400.0
    assert at["usd_per_m_output_recorded"] == pytest.approx(2 / (400 * 3600) * 1e6)
    assert at["usd_per_m_good_output_recorded"] == pytest.approx(2 / (360 * 3600) * 1e6)
    nothing = at_slo({"levels": [_level(3.0, 0.5)]}, 0.9)
    assert nothing["at_slo"] is None and "no rate level met" in nothing["note"]
    unpriced = at_slo({"levels": [_level(3.0, 0.95)]}, 0.9)["at_slo"]
    assert "no layout recorded" in unpriced["cost"]
