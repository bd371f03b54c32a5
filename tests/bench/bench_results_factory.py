"""Result files built from constructed requests, for compare and report tests (no network)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from gennstack.bench.config import BenchConfig, Distribution
from gennstack.bench.metrics import summarize_level
from gennstack.bench.results import build_result
from gennstack.bench.runner import COMPLETED, FAILED, LevelRun, RequestRecord


def level_run(concurrency: int, *, ttft: float, itl: float, n: int = 20, requests: int = 30, failures: int = 0) -> LevelRun:
    """``requests`` back-to-back requests per worker-slot, each ``ttft + (n-1)*itl`` long."""
    records = []
    length = ttft + (n - 1) * itl
    for i in range(requests):
        t_send = (i // concurrency) * length + (i % concurrency) * 0.001
        rec = RequestRecord(index=i, worker=i % concurrency, warmup=False, prompt_tokens_requested=64, max_tokens=n)
        rec.t_send = t_send
        if i < failures:
            rec.status, rec.error_class, rec.http_status, rec.t_end = FAILED, "http_503", 503, t_send + 0.01
        else:
            rec.chunk_times = [t_send + ttft + k * itl for k in range(n)]
            rec.t_end, rec.status, rec.usage_completion_tokens = rec.chunk_times[-1], COMPLETED, n
        records.append(rec)
    end = max(r.t_end for r in records)
    return LevelRun(concurrency, records, 0.0, end, 0.0, "requests")


def write_result(directory: Path, *, ttft: float, itl: float, levels=(1, 8, 32), failures: int = 0) -> Path:
    config = BenchConfig(base_url="http://127.0.0.1:8000/v1", model="mock", concurrency=tuple(levels),
                         prompt_tokens=Distribution("fixed", 64), max_tokens=Distribution("fixed", 20), num_requests=30)
    summaries = [summarize_level(level_run(c, ttft=ttft, itl=itl, failures=failures)) for c in levels]
    result = build_result(config, summaries, command=["gennstack", "bench"], started_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "result.json"
    path.write_text(json.dumps(result))
    return path
