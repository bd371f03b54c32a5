"""The LLMPerf-compatible files: LLMPerf's file names, keys and definitions."""

from __future__ import annotations

import json

import pytest

from gennstack.bench import llmperf
from gennstack.bench.config import BenchConfig, Distribution
from gennstack.bench.runner import COMPLETED, FAILED, LevelRun, RequestRecord

# The keys LLMPerf's token_benchmark_ray.py writes (metrics_summary + metadata, flattened with "_").
_METRICS = ("inter_token_latency_s", "ttft_s", "end_to_end_latency_s", "request_output_throughput_token_per_s",
            "number_input_tokens", "number_output_tokens")
LLMPERF_KEYS = {
    "version", "name", "model", "mean_input_tokens", "stddev_input_tokens", "mean_output_tokens",
    "stddev_output_tokens", "num_concurrent_requests", "timestamp",
    "results_num_requests_started", "results_error_rate", "results_number_errors", "results_error_code_frequency",
    "results_mean_output_throughput_token_per_s", "results_num_completed_requests",
    "results_num_completed_requests_per_min",
} | {
    f"results_{m}_{stat}" for m in _METRICS for stat in
    ("quantiles_p25", "quantiles_p50", "quantiles_p75", "quantiles_p90", "quantiles_p95", "quantiles_p99",
     "mean", "min", "max", "stddev")
}


def _config(**kw) -> BenchConfig:
    base = dict(base_url="http://127.0.0.1:1/v1", model="meta-llama/Llama-3.1-8B", concurrency=(2,),
                prompt_tokens=Distribution.parse("normal:550,150", option="p"),
                max_tokens=Distribution.parse("150", option="m"), num_requests=3)
    base.update(kw)
    return BenchConfig(**base)


def _run() -> LevelRun:
    def r(i, t_send, chunks, t_end, usage, status=COMPLETED, http=200, cls=None, warmup=False):
        rec = RequestRecord(index=i, worker=0, warmup=warmup, prompt_tokens_requested=500, max_tokens=150)
        rec.t_send, rec.chunk_times, rec.t_end, rec.status = t_send, chunks, t_end, status
        rec.usage_completion_tokens, rec.usage_prompt_tokens = usage, (520 if usage else None)
        rec.http_status, rec.error_class = http, cls
        return rec

    return LevelRun(concurrency=2, window_start=1.0, window_end=11.0, started_wall=0.0, mode="requests", records=[
        r(0, 0.0, [0.3], 0.4, 1, warmup=True),
        r(1, 1.0, [1.5, 2.0, 3.0], 3.0, 4),        # ttft .5, last chunk 2.0 s after send, e2e 2.0
        r(2, 1.0, [1.2, 2.2], 3.2, 10),            # ttft .2, last chunk 1.2 s after send, e2e 2.2
        r(3, 3.0, [], 3.1, None, FAILED, 503, "http_503"),
        r(4, 3.2, [3.5], 4.0, None, FAILED, 200, "broken_stream"),
    ])


def test_keys_are_llmperfs() -> None:
    stem, summary, responses = llmperf.summary(_run(), _config(), timestamp=1700000000)
    assert stem == "meta-llama-Llama-3-1-8B_550_150"
    assert set(summary) == LLMPERF_KEYS
    assert summary["version"] == "2023-08-31" and summary["name"] == f"{stem}_summary"
    assert (summary["mean_input_tokens"], summary["stddev_input_tokens"]) == (550, 150)
    assert (summary["mean_output_tokens"], summary["stddev_output_tokens"]) == (150, 0)
    assert summary["num_concurrent_requests"] == 2
    assert set(responses[0]) == {"error_code", "error_msg", "inter_token_latency_s", "ttft_s", "end_to_end_latency_s",
                                 "request_output_throughput_token_per_s", "number_total_tokens", "number_output_tokens",
                                 "number_input_tokens", "start_time"}


def test_definitions_are_llmperfs() -> None:
    _, s, responses = llmperf.summary(_run(), _config(), timestamp=0)
    assert len(responses) == 4  # warm-up excluded, failures included
    # ITL includes TTFT: (last chunk - send) / n
    assert responses[0]["inter_token_latency_s"] == pytest.approx(2.0 / 4)
    assert responses[1]["inter_token_latency_s"] == pytest.approx(1.2 / 10)
    assert s["results_inter_token_latency_s_mean"] == pytest.approx((0.5 + 0.12) / 2)
    # per-request throughput divides by e2e, which includes TTFT
    assert responses[0]["request_output_throughput_token_per_s"] == pytest.approx(4 / 2.0)
    assert s["results_request_output_throughput_token_per_s_mean"] == pytest.approx((2.0 + 10 / 2.2) / 2)
    assert s["results_ttft_s_quantiles_p50"] == pytest.approx(0.35)
    assert s["results_ttft_s_quantiles_p25"] == pytest.approx(0.275)
    assert s["results_end_to_end_latency_s_max"] == pytest.approx(2.2)
    assert s["results_number_input_tokens_mean"] == 520
    # overall throughput: output tokens of non-errored requests / test length (the 10 s window)
    assert s["results_mean_output_throughput_token_per_s"] == pytest.approx(14 / 10)
    assert s["results_num_requests_started"] == 4
    assert s["results_number_errors"] == 2 and s["results_error_rate"] == 0.5
    assert s["results_error_code_frequency"] == "{503: 1, -1: 1}"
    assert s["results_num_completed_requests"] == 2
    assert s["results_num_completed_requests_per_min"] == pytest.approx(2 / 10 * 60)
    assert responses[2]["error_code"] == 503 and responses[3]["error_code"] == -1


def test_files_follow_llmperfs_names(tmp_path) -> None:
    summary_path, responses_path = llmperf.write(_run(), _config(), tmp_path)
    assert summary_path.name == "meta-llama-Llama-3-1-8B_550_150_summary.json"
    assert responses_path.name == "meta-llama-Llama-3-1-8B_550_150_individual_responses.json"
    data = json.loads(summary_path.read_text())
    assert data["results_num_completed_requests"] == 2
    assert len(json.loads(responses_path.read_text())) == 4


def test_extra_body_is_flattened_as_llmperf_does() -> None:
    _, summary, _ = llmperf.summary(_run(), _config(extra_body={"temperature": 0}), timestamp=0)
    assert summary["additional_sampling_params_temperature"] == 0
