"""Metric definitions, exactly, on constructed requests (no network, no timing)."""

from __future__ import annotations

import math

import pytest

from gennstack.bench.metrics import describe, quantile, summarize_level, throughput_series, tokens_in_window
from gennstack.bench.runner import COMPLETED, FAILED, INCOMPLETE, LevelRun, RequestRecord


def rec(index, *, t_send, chunks, t_end, usage=None, status=COMPLETED, warmup=False, error_class=None) -> RequestRecord:
    r = RequestRecord(index=index, worker=0, warmup=warmup, prompt_tokens_requested=10, max_tokens=8)
    r.t_send, r.chunk_times, r.t_end, r.status = t_send, list(chunks), t_end, status
    r.usage_completion_tokens, r.error_class = usage, error_class
    return r


def test_per_request_definitions_with_usage() -> None:
    r = rec(0, t_send=0.5, chunks=[1.0, 1.1, 1.2, 1.3], t_end=1.35, usage=8)
    assert r.output_tokens == 8 and r.token_source == "usage"
    assert r.ttft == pytest.approx(0.5)
    assert r.itl == pytest.approx(0.3 / 7)  # (t_last - t_first) / (n - 1), n from usage
    assert r.chunk_gaps == pytest.approx([0.1, 0.1, 0.1])
    assert r.e2e == pytest.approx(0.85)
    assert r.user_tokens_per_s == pytest.approx(8 / 0.85)


def test_per_request_definitions_without_usage_count_chunks() -> None:
    r = rec(0, t_send=0.0, chunks=[0.2, 0.3, 0.5], t_end=0.5)
    assert r.output_tokens == 3 and r.token_source == "chunks"
    assert r.itl == pytest.approx(0.3 / 2)
    assert r.chunk_gaps == pytest.approx([0.1, 0.2])


def test_single_token_has_no_itl() -> None:
    assert rec(0, t_send=0, chunks=[0.2], t_end=0.25, usage=1).itl is None
    assert rec(0, t_send=0, chunks=[], t_end=0.25).ttft is None


def test_quantiles_interpolate_linearly() -> None:
    data = [1.0, 2.0, 3.0, 4.0]
    assert quantile(data, 0.5) == 2.5
    assert quantile(data, 0.9) == pytest.approx(3.7)
    assert quantile(data, 0.99) == pytest.approx(3.97)
    d = describe(data)
    assert d["count"] == 4 and d["mean"] == 2.5 and d["min"] == 1.0 and d["max"] == 4.0
    assert d["stddev"] == pytest.approx(math.sqrt(5 / 3))  # sample standard deviation
    assert describe([])["mean"] is None and describe([7.0])["stddev"] is None


def test_aggregate_counts_tokens_inside_the_window_from_every_request() -> None:
    records = [
        # completed with usage: 2 tokens per chunk
        rec(0, t_send=0.0, chunks=[0.5, 1.5, 2.5], t_end=2.6, usage=6, warmup=True),
        # cut off by the window, no usage: tokens per chunk estimated from the usage reports (2)
        rec(1, t_send=1.0, chunks=[1.2, 1.9, 3.5], t_end=None, status=INCOMPLETE),
        # failed mid-stream; its chunk inside the window still counts
        rec(2, t_send=1.0, chunks=[1.1], t_end=1.2, status=FAILED, error_class="broken_stream"),
    ]
    # window [1, 3]: request 0 -> 1.5, 2.5 (4 tokens); 1 -> 1.2, 1.9 (4); 2 -> 1.1 (2)
    assert tokens_in_window(records, 1.0, 3.0) == pytest.approx(10.0)
    series = throughput_series(records, 1.0, 3.0, bucket_s=1.0)
    assert series == [[0.5, pytest.approx(8.0)], [1.5, pytest.approx(2.0)]]


def test_level_summary_counts_and_excludes_warmup() -> None:
    records = [
        rec(0, t_send=0.0, chunks=[0.1, 0.2], t_end=0.2, usage=2, warmup=True),
        rec(1, t_send=0.2, chunks=[0.4, 0.5, 0.6], t_end=0.6, usage=3),
        rec(2, t_send=0.2, chunks=[0.3], t_end=0.35, status=FAILED, error_class="http_503"),
        rec(3, t_send=0.35, chunks=[0.6], t_end=0.7, status=FAILED, error_class="timeout"),
        rec(4, t_send=0.6, chunks=[0.8], t_end=None, status=INCOMPLETE),
    ]
    run = LevelRun(concurrency=2, records=records, window_start=0.2, window_end=1.0, started_wall=0.0, mode="duration")
    level = summarize_level(run)
    assert level["requests"] == {"sent": 5, "warmup": 1, "measured": 4, "completed": 1, "incomplete": 1, "failed": 2,
                                 "failures_by_class": {"http_503": 1, "timeout": 1}}
    assert level["metrics"]["ttft_s"]["mean"] == pytest.approx(0.2)  # only the completed, measured one
    assert level["metrics"]["itl_s"]["mean"] == pytest.approx(0.1)
    assert level["token_source"] == "usage"
    assert level["requests_per_s"] == pytest.approx(1 / 0.8)
    # chunks in [0.2, 1.0]: 0.2 (req 0, 1 tok), 0.4 0.5 0.6 (req 1), 0.3, 0.6, 0.8 (1 token each)
    assert level["aggregate_output_tokens_per_s"] == pytest.approx(7 / 0.8)
