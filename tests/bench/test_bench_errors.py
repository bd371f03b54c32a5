"""Failures are classified and counted exactly, never dropped; cut-off requests are incomplete."""

from __future__ import annotations

import ast
import asyncio
import json
import socket

from gennstack.bench import llmperf
from gennstack.bench.config import BenchConfig, Distribution
from gennstack.bench.metrics import summarize_level
from gennstack.bench.runner import run_level

FAULTS = [("http:503:5", "http_503"), ("broken:7", "broken_stream"), ("stall:11", "timeout"), ("http:429:13", "http_429")]


def expected_failures(requests: int) -> dict[str, int]:
    """The mock server's rule, restated: request k (from 1) gets the first fault whose EVERY divides k."""
    counts: dict[str, int] = {}
    for k in range(1, requests + 1):
        for spec, cls in FAULTS:
            if k % int(spec.rsplit(":", 1)[1]) == 0:
                counts[cls] = counts.get(cls, 0) + 1
                break
    return counts


def _config(base_url: str, **kw) -> BenchConfig:
    base = dict(base_url=base_url, model="mock", concurrency=(4,), prompt_tokens=Distribution("fixed", 16),
                max_tokens=Distribution("fixed", 12), stall_timeout_s=1.0)
    base.update(kw)
    return BenchConfig(**base)


def test_every_failure_class_is_counted(mock_server) -> None:
    server = mock_server("--ttft", "0.01", "--itl", "0.005", *[a for spec, _ in FAULTS for a in ("--fault", spec)])
    total = 80
    config = _config(server.base_url, num_requests=total, warmup_requests=0)
    run = asyncio.run(run_level(config, 4))
    level = summarize_level(run)

    expected = expected_failures(total)
    # worked out by hand: multiples of 5 (16); of 7 but not 5 (9); of 11 but not 5, 7 (5: 11 22 33 44 66);
    # of 13 but none of those (5: 13 26 39 52 78)
    assert expected == {"http_503": 16, "broken_stream": 9, "timeout": 5, "http_429": 5}
    req = level["requests"]
    assert req["failures_by_class"] == expected
    assert req["failed"] == sum(expected.values())
    assert req["completed"] == total - sum(expected.values())
    assert req["incomplete"] == 0
    assert req["measured"] == total == server.stats()["chat_requests"]

    # every request is in the LLMPerf files too, with LLMPerf's error codes (-1: not an HTTP status)
    _, summary, responses = llmperf.summary(run, config, timestamp=0)
    assert len(responses) == total
    assert summary["results_number_errors"] == sum(expected.values())
    assert summary["results_num_completed_requests"] == total - sum(expected.values())
    assert summary["results_error_rate"] == sum(expected.values()) / total
    assert ast.literal_eval(summary["results_error_code_frequency"]) == {503: 16, -1: 14, 429: 5}


def test_broken_stream_detail_and_timing(mock_server) -> None:
    server = mock_server("--ttft", "0.01", "--itl", "0.005", "--fault", "broken:1", "--fault-after-chunks", "3")
    run = asyncio.run(run_level(_config(server.base_url, num_requests=3, warmup_requests=0, concurrency=(1,)), 1))
    for rec in run.records:
        assert rec.status == "failed" and rec.error_class == "broken_stream"
        assert rec.n_chunks == 3  # the chunks that did arrive are kept
        assert rec.e2e is not None


def test_connection_refused_is_a_connection_error() -> None:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = asyncio.run(run_level(_config(f"http://127.0.0.1:{port}/v1", num_requests=3, warmup_requests=0), 4))
    level = summarize_level(run)
    assert level["requests"]["failures_by_class"] == {"connection_error": 3}
    assert level["requests"]["completed"] == 0


def test_requests_cut_by_the_window_are_incomplete_and_their_tokens_count(mock_server) -> None:
    # every request lasts 0.05 + 59 * 0.05 = 3 s; the window closes after 1 s
    server = mock_server("--ttft", "0.05", "--itl", "0.05")
    config = _config(server.base_url, duration_s=1.0, warmup_s=0.0, max_tokens=Distribution("fixed", 60))
    level = summarize_level(asyncio.run(run_level(config, 4)))
    req = level["requests"]
    assert (req["measured"], req["incomplete"], req["completed"], req["failed"]) == (4, 4, 0, 0)
    # 4 streams x ~20 chunks inside [0, 1 s], 1 token each (no completed request to say otherwise)
    assert 60 <= level["aggregate_output_tokens_per_s"] <= 84
    assert level["metrics"]["ttft_s"]["count"] == 0  # per-request metrics only from completed requests


def test_result_json_round_trips(mock_server, tmp_path) -> None:
    """The level summary is plain JSON (no NaN, no objects)."""
    server = mock_server("--ttft", "0.01", "--itl", "0.002", "--fault", "http:500:2")
    level = summarize_level(asyncio.run(run_level(_config(server.base_url, num_requests=6, warmup_requests=0), 2)))
    text = json.dumps(level, allow_nan=False)
    assert json.loads(text)["requests"]["failures_by_class"] == {"http_500": 3}
