"""From raw requests to the numbers the report shows. Every definition lives here.

Per request (measured, completed requests only; warm-up requests are excluded):

* ``ttft_s``: first chunk with non-empty ``content`` or ``reasoning_content`` minus send time.
* ``itl_s``: ``(t_last - t_first) / (n - 1)``, the inter-token latency excluding the first
  token (requests with ``n >= 2``).
* ``chunk_gap_s``: every gap between consecutive content chunks, pooled over requests
  (servers may put several tokens in one chunk, so this differs from ``itl_s``).
* ``e2e_s``: end of stream minus send time.
* ``user_output_tokens_per_s``: ``n / e2e_s``.
* ``n`` (``output_tokens``): the server's ``usage.completion_tokens`` where it reports one,
  else the number of content chunks; ``token_source`` says which.

Per level:

* ``aggregate_output_tokens_per_s``: tokens that arrived inside the measured window, from
  any request (warm-up, incomplete and failed ones included: the fleet delivered them),
  divided by the window's length. A chunk's tokens arrive with the chunk; a completed
  request with a usage report spreads its ``n`` evenly over its chunks; a request without
  one counts its chunks times the level's mean tokens per chunk (1 when no request
  reported usage).
* ``requests_per_s``: measured requests completed inside the window / window length.

With ``--workload multi-turn`` or ``shared-prefix`` a level also has ``workload``: per turn (1 = a
conversation's first request, whose prompt no server has seen) the measured requests, TTFT and
end-to-end latency, so turn 1 compares with later turns; and per prefix the measured requests.
With ``--record-header``, ``upstreams`` counts measured requests by that response header's value.

Quantiles use linear interpolation between closest ranks (NumPy's and pandas' default).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from gennstack.bench.runner import COMPLETED, FAILED, INCOMPLETE, LevelRun, RequestRecord

QUANTILES = (50, 90, 95, 99)

# metric key -> (label, unit) for tables and charts
METRICS: dict[str, tuple[str, str]] = {
    "ttft_s": ("Time to first token", "s"),
    "itl_s": ("Inter-token latency (excl. first)", "s"),
    "chunk_gap_s": ("Gap between chunks", "s"),
    "e2e_s": ("End-to-end latency", "s"),
    "user_output_tokens_per_s": ("Per-user output tokens/s", "tok/s"),
    "output_tokens": ("Output tokens per request", "tok"),
    "prompt_tokens": ("Prompt tokens per request", "tok"),
}


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; ``q`` in [0, 1]."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    position = (len(sorted_values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def describe(values: Iterable[float], quantiles: Sequence[int] = QUANTILES) -> dict:
    """count, mean, min, max, stddev (sample) and the ``p<q>`` quantiles; None when empty."""
    data = sorted(v for v in values if v is not None)
    out: dict = {"count": len(data)}
    if not data:
        out.update({"mean": None, "min": None, "max": None, "stddev": None})
        out.update({f"p{q}": None for q in quantiles})
        return out
    mean = math.fsum(data) / len(data)
    out["mean"] = mean
    out["min"] = data[0]
    out["max"] = data[-1]
    out["stddev"] = math.sqrt(math.fsum((v - mean) ** 2 for v in data) / (len(data) - 1)) if len(data) > 1 else None
    for q in quantiles:
        out[f"p{q}"] = quantile(data, q / 100)
    return out


def token_weights(records: Sequence[RequestRecord]) -> dict[int, float]:
    """Tokens carried by each content chunk of each request, keyed by request index."""
    with_usage = [r for r in records if r.status == COMPLETED and r.usage_completion_tokens is not None and r.n_chunks]
    per_chunk_default = (
        math.fsum(r.usage_completion_tokens for r in with_usage) / sum(r.n_chunks for r in with_usage)
        if with_usage else 1.0
    )
    weights = {}
    for r in records:
        if r.status == COMPLETED and r.usage_completion_tokens is not None and r.n_chunks:
            weights[r.index] = r.usage_completion_tokens / r.n_chunks
        else:
            weights[r.index] = per_chunk_default
    return weights


def tokens_in_window(records: Sequence[RequestRecord], start: float, end: float) -> float:
    weights = token_weights(records)
    total = 0.0
    for r in records:
        inside = sum(1 for t in r.chunk_times if start <= t <= end)
        total += inside * weights[r.index]
    return total


def throughput_series(records: Sequence[RequestRecord], start: float, end: float, bucket_s: float = 1.0) -> list[list[float]]:
    """``[[t, tokens/s], ...]``: ``t`` is the middle of each bucket, in seconds from the window start
    (the last bucket may be short)."""
    weights = token_weights(records)
    count = max(1, math.ceil((end - start) / bucket_s - 1e-9))
    buckets = [0.0] * count
    for r in records:
        w = weights[r.index]
        for t in r.chunk_times:
            if start <= t <= end:
                buckets[min(count - 1, int((t - start) / bucket_s))] += w
    series = []
    for i, tokens in enumerate(buckets):
        length = min(bucket_s, end - start - i * bucket_s)
        if length > 0:
            series.append([round(i * bucket_s + length / 2, 3), tokens / length])
    return series


def workload_summary(records: Sequence[RequestRecord], kind: str) -> dict:
    """Per turn and per prefix, over measured requests (completed ones for latencies)."""
    measured = [r for r in records if not r.warmup]
    turns = []
    for number in sorted({r.turn for r in measured if r.turn is not None}):
        of_turn = [r for r in measured if r.turn == number]
        done = [r for r in of_turn if r.status == COMPLETED]
        turns.append({
            "turn": number,
            "measured": len(of_turn),
            "completed": len(done),
            "failed": sum(1 for r in of_turn if r.status == FAILED),
            "ttft_s": describe(r.ttft for r in done),
            "e2e_s": describe(r.e2e for r in done),
            "prompt_tokens": describe(r.prompt_tokens for r in done),
        })
    prefixes: dict[int, int] = {}
    for r in measured:
        if r.prefix is not None:
            prefixes[r.prefix] = prefixes.get(r.prefix, 0) + 1
    later = [r.ttft for r in measured if r.status == COMPLETED and r.turn is not None and r.turn > 1]
    return {
        "kind": kind,
        "conversations": len({r.conversation for r in measured if r.conversation is not None}),
        "turns": turns,
        "later_turns_ttft_s": describe(later),
        "requests_by_prefix": {str(k): prefixes[k] for k in sorted(prefixes)},
    }


def upstream_counts(records: Sequence[RequestRecord]) -> dict[str, int] | None:
    """Measured requests by the recorded response header's value ("" where it was absent); None when none was recorded."""
    measured = [r for r in records if not r.warmup]
    if not any(r.upstream is not None for r in measured):
        return None
    counts: dict[str, int] = {}
    for r in measured:
        counts[r.upstream or ""] = counts.get(r.upstream or "", 0) + 1
    return dict(sorted(counts.items()))


def level_label(level: dict) -> str:
    """A level's name in tables and legends: its concurrency (closed loop) or its rate (open loop)."""
    if level.get("rate_rps") is not None:
        return f"{level['rate_rps']:.3g}/s"
    return str(level["concurrency"])


def schedule_summary(run: LevelRun, tolerance_s: float) -> dict:
    """How well an open-loop level kept its schedule, over its measured requests: lag = send time - due time.
    ``offered_rps``: requests due per second: (measured + not sent) / window with --duration; with --num-requests,
    (N - 1) / (last due - first due) (its window runs on to the last answer's end)."""
    measured = [r for r in run.records if not r.warmup and r.t_due is not None]
    lags = sorted(r.t_send - r.t_due for r in measured)
    late = sum(1 for v in lags if v > tolerance_s)
    window = max(run.window_end - run.window_start, 1e-9)
    due = sorted(r.t_due for r in measured)
    if run.mode == "duration":
        offered = (len(measured) + run.not_sent) / window
    else:  # --num-requests: the window runs on to the last answer's end, so measure the rate on the due times
        offered = (len(due) - 1) / (due[-1] - due[0]) if len(due) > 1 and due[-1] > due[0] else None
    return {
        "rate_rps": run.rate,
        "offered_rps": offered,
        "due": len(measured) + run.not_sent,
        "sent": len(measured),
        "not_sent": run.not_sent,
        "tolerance_s": tolerance_s,
        "late": late,
        "late_share": late / len(measured) if measured else None,
        "lag_s": {"p50": quantile(lags, 0.5) if lags else None, "p99": quantile(lags, 0.99) if lags else None,
                  "max": lags[-1] if lags else None},
        "peak_in_flight": run.peak_in_flight,
        "max_in_flight": run.concurrency,
        "on_schedule": late == 0 and run.not_sent == 0,
    }


def summarize_level(run: LevelRun, *, tolerance_s: float = 0.010) -> dict:
    """The per-level block of the result file (summary plus per-request samples). Open-loop levels (``run.rate``)
    add ``rate_rps`` and ``schedule`` (:func:`schedule_summary`); with --slo, gennstack.bench.slo.level_slo adds
    ``slo``."""
    measured = [r for r in run.records if not r.warmup]
    completed = [r for r in measured if r.status == COMPLETED]
    failed = [r for r in measured if r.status == FAILED]
    incomplete = [r for r in measured if r.status == INCOMPLETE]
    window = max(run.window_end - run.window_start, 1e-9)
    failures: dict[str, int] = {}
    for r in failed:
        failures[r.error_class] = failures.get(r.error_class, 0) + 1
    sources = {r.token_source for r in completed}
    token_source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
    completed_in_window = [r for r in completed if run.window_start <= r.t_end <= run.window_end + 1e-9]
    gaps = [g for r in completed for g in r.chunk_gaps]
    samples = {
        "ttft_s": [r.ttft for r in completed],
        "itl_s": [r.itl for r in completed],
        "e2e_s": [r.e2e for r in completed],
        "user_output_tokens_per_s": [r.user_tokens_per_s for r in completed],
        "output_tokens": [r.output_tokens for r in completed],
        "prompt_tokens": [r.prompt_tokens for r in completed],
    }
    metrics = {key: describe(values) for key, values in samples.items()}
    metrics["chunk_gap_s"] = describe(gaps)
    aggregate = tokens_in_window(run.records, run.window_start, run.window_end) / window
    level = {
        "concurrency": run.concurrency,
        "mode": run.mode,
        "started_at_unix": run.started_wall,
        "window": {"start_s": run.window_start, "end_s": run.window_end, "length_s": window},
        "requests": {
            "sent": len(run.records),
            "warmup": len(run.records) - len(measured),
            "measured": len(measured),
            "completed": len(completed),
            "incomplete": len(incomplete),
            "failed": len(failed),
            "failures_by_class": dict(sorted(failures.items())),
        },
        "token_source": token_source,
        "aggregate_output_tokens_per_s": aggregate,
        "requests_per_s": len(completed_in_window) / window,
        "metrics": metrics,
        "samples": {key: [round(v, 6) for v in values if v is not None] for key, values in samples.items()},
        "throughput_series": throughput_series(run.records, run.window_start, run.window_end),
    }
    if run.workload != "single":
        level["workload"] = workload_summary(run.records, run.workload)
    upstreams = upstream_counts(run.records)
    if upstreams is not None:
        level["upstreams"] = upstreams
    if run.rate is not None:
        level["rate_rps"] = run.rate
        level["schedule"] = schedule_summary(run, tolerance_s)
    return level
