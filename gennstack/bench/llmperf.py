"""LLMPerf-compatible output, computed with LLMPerf's definitions (ray-project/llmperf).

Older published numbers, including the ones GenNStack was first sized by, come from
LLMPerf's ``token_benchmark_ray.py``. Its definitions differ from ours, so this module
recomputes them from the same raw requests:

* ``inter_token_latency_s`` = (last content chunk - send time) / n: it *includes* TTFT.
* ``request_output_throughput_token_per_s`` = n / end-to-end latency (which includes TTFT).
* ``mean_output_throughput_token_per_s`` = output tokens of all non-errored requests /
  the test's length (here: the level's measured window).
* statistics are over non-errored requests: quantiles p25/p50/p75/p90/p95/p99 (linear
  interpolation, as pandas), mean, min, max and sample standard deviation.
* ``num_requests_started`` counts every request it sent; ``error_rate`` is errors / started.

Differences that remain and are stated in docs/benchmark.md: LLMPerf counts ``n`` with a
Llama tokenizer on the generated text; we take the server's usage report or the chunk count.
Warm-up requests and requests cut off by the end of a --duration window are left out here
(LLMPerf has neither). Where pandas would write NaN (standard deviation of one value) we
write ``null`` so the file stays valid JSON.

The summary file is ``{model}_{mean_input}_{mean_output}_summary.json`` with LLMPerf's
sanitising of the name, flattened with ``_`` as LLMPerf's ``LLMPerfResults`` does, so the
keys are ``results_ttft_s_quantiles_p50``, ``results_error_rate`` and so on; the
per-request file is ``..._individual_responses.json``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from gennstack.bench.config import BenchConfig
from gennstack.bench.metrics import describe
from gennstack.bench.runner import COMPLETED, FAILED, LevelRun, RequestRecord

RESULTS_VERSION = "2023-08-31"  # the version string LLMPerf writes
LLMPERF_QUANTILES = (25, 50, 75, 90, 95, 99)
METRIC_KEYS = (
    "inter_token_latency_s",
    "ttft_s",
    "end_to_end_latency_s",
    "request_output_throughput_token_per_s",
    "number_input_tokens",
    "number_output_tokens",
)


def file_stem(model: str, mean_input_tokens: int, mean_output_tokens: int) -> str:
    name = f"{model}_{mean_input_tokens}_{mean_output_tokens}"
    name = re.sub(r"[^\w\d-]+", "-", name)
    return re.sub(r"-{2,}", "-", name)


def individual_response(rec: RequestRecord) -> dict:
    """One request in LLMPerf's per-request shape."""
    n = rec.output_tokens
    errored = rec.status == FAILED
    e2e = rec.e2e or 0.0
    last = rec.chunk_times[-1] - rec.t_send if rec.chunk_times else 0.0
    return {
        "error_code": (rec.http_status if rec.error_class and rec.error_class.startswith("http_") else -1) if errored else None,
        "error_msg": rec.error_detail if errored else "",
        "inter_token_latency_s": last / n if n else 0,
        "ttft_s": rec.ttft or 0,
        "end_to_end_latency_s": e2e if not errored else 0,
        "request_output_throughput_token_per_s": n / e2e if e2e and not errored else 0,
        "number_total_tokens": rec.prompt_tokens + n,
        "number_output_tokens": n,
        "number_input_tokens": rec.prompt_tokens,
        "start_time": rec.t_send,
    }


def _flatten(d: dict, parent: str = "") -> dict:
    out: dict = {}
    for key, value in d.items():
        name = f"{parent}_{key}" if parent else key
        if isinstance(value, dict):
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


def summary(run: LevelRun, config: BenchConfig, *, timestamp: int | None = None) -> tuple[str, dict, list[dict]]:
    """``(file_stem, summary_dict, individual_responses)`` for one level."""
    recs = [r for r in run.records if not r.warmup and r.status in (COMPLETED, FAILED)]
    responses = [individual_response(r) for r in recs]
    ok = [resp for resp in responses if resp["error_code"] is None]
    results: dict = {}
    for key in METRIC_KEYS:
        stats = describe((resp[key] for resp in ok), quantiles=LLMPERF_QUANTILES)
        results[key] = {
            "quantiles": {f"p{q}": stats[f"p{q}"] for q in LLMPERF_QUANTILES},
            "mean": stats["mean"],
            "min": stats["min"],
            "max": stats["max"],
            "stddev": stats["stddev"],
        }
    window = max(run.window_end - run.window_start, 1e-9)
    errors = [resp["error_code"] for resp in responses if resp["error_code"] is not None]
    frequency: dict[int, int] = {}
    for code in errors:
        frequency[code] = frequency.get(code, 0) + 1
    results["num_requests_started"] = len(responses)
    results["error_rate"] = len(errors) / len(responses) if responses else 0
    results["number_errors"] = len(errors)
    results["error_code_frequency"] = str(frequency)
    results["mean_output_throughput_token_per_s"] = sum(resp["number_output_tokens"] for resp in ok) / window
    results["num_completed_requests"] = len(ok)
    results["num_completed_requests_per_min"] = len(ok) / window * 60

    stem = file_stem(config.model, config.prompt_tokens.mean, config.max_tokens.mean)
    metadata = {
        "version": RESULTS_VERSION,
        "name": f"{stem}_summary",
        "model": config.model,
        "mean_input_tokens": config.prompt_tokens.mean,
        "stddev_input_tokens": config.prompt_tokens.stddev,
        "mean_output_tokens": config.max_tokens.mean,
        "stddev_output_tokens": config.max_tokens.stddev,
        "num_concurrent_requests": run.concurrency,
        "additional_sampling_params": dict(config.extra_body),
        "results": results,
        "timestamp": int(time.time()) if timestamp is None else timestamp,
    }
    return stem, _flatten(metadata), responses


def write(run: LevelRun, config: BenchConfig, directory: Path) -> tuple[Path, Path]:
    stem, data, responses = summary(run, config)
    directory.mkdir(parents=True, exist_ok=True)
    summary_path = directory / f"{stem}_summary.json"
    responses_path = directory / f"{stem}_individual_responses.json"
    summary_path.write_text(json.dumps(data, indent=4, default=str) + "\n", encoding="utf-8")
    responses_path.write_text(json.dumps(responses, indent=4) + "\n", encoding="utf-8")
    return summary_path, responses_path
