"""The timeline of one level: what users lost second by second, and event markers (a drill's).

Times are seconds from the level's start (the clock of :mod:`gennstack.bench.runner`). Buckets
are ``[i * bucket_s, (i + 1) * bucket_s)``, up to the end of the measured window; a request
belongs to the bucket in which it ended (``t_end``), warm-up requests included.

Per bucket:

* ``goodput_tok_s``: output tokens of requests that completed in the bucket, divided by its length
  (tokens of a request that failed or was cut never count, however many arrived);
* ``completed``; ``errors``: failed requests by class; ``broken``: failed requests whose stream had
  started (HTTP 200 received) and then failed or ended without ``[DONE]``/``finish_reason``.

Per latency window (``latency_window_s``): TTFT p50/p95/p99 and ITL p50/p99 of the requests that
completed in it.

Markers come from a JSON-lines file in the format ``gennstack drill`` writes (``drill-events.jsonl``:
one object a line with ``time``, an ISO 8601 UTC time, and ``event``), placed on the level's clock
with the level's wall-clock start. Totals:

* ``requests_lost``: failed requests, any class (``broken_streams`` of them broken mid-way);
* ``baseline_tok_s``: the median goodput of the whole buckets between the end of warm-up and the
  first *disruption marker*: the first marker after warm-up other than ``bench_start``/``bench_end``
  (None when there is no such bucket); with no marker, the whole window;
* ``seconds_below_50pct``: whole buckets from the one holding the first disruption marker to the
  end of the window whose goodput is under half the baseline, times ``bucket_s``;
* ``time_to_recover_95_s``: from the start of the first such bucket under 95 % of the baseline
  (the dip) to the start of the first later bucket from which the median goodput of
  ``recover_buckets`` whole buckets is at least 95 % of the baseline (a median, like the baseline, so
  that one slow bucket neither hides nor fakes a recovery); 0 when there is no dip,
  None when goodput never recovers within the window (both None when no whole bucket follows the marker).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from gennstack.bench.metrics import quantile
from gennstack.bench.runner import COMPLETED, FAILED, RequestRecord

NOT_DISRUPTIONS = frozenset({"bench_start", "bench_end"})


class EventsFileError(ValueError):
    pass


def load_events(path: str | Path) -> list[dict]:
    """Every line of a drill-events file as ``{"unix": seconds, "event": name, ...}``, in time order."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise EventsFileError(f"--events={p}: cannot read: {exc.strerror or exc}") from None
    events = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            event, stamp = obj.get("event"), obj.get("time")
            if not isinstance(event, str) or not event:
                raise ValueError(f"'event' is {event!r}, wanted a non-empty string")
            if not isinstance(stamp, str):
                raise ValueError(f"'time' is {stamp!r}, wanted an ISO 8601 time such as 2026-01-01T12:00:00.5Z")
            when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            if when.tzinfo is None:
                raise ValueError(f"'time' is {stamp!r}: give its time zone (Z for UTC)")
        except ValueError as exc:
            raise EventsFileError(f"--events={p} line {number}: {exc}") from None
        events.append({**obj, "unix": when.timestamp()})
    return sorted(events, key=lambda e: e["unix"])


def markers_for_level(events: Sequence[dict], *, started_unix: float, end_s: float) -> list[dict]:
    """The events inside ``[0, end_s]`` of a level that started at ``started_unix``, as ``{"t_s", "event"}``."""
    markers = []
    for e in events:
        t = e["unix"] - started_unix
        if 0.0 <= t <= end_s:
            markers.append({"t_s": round(t, 3), "event": e["event"]})
    return markers


def _percentiles(values: list[float], qs: Sequence[int]) -> dict:
    data = sorted(values)
    return {f"p{q}": (quantile(data, q / 100) if data else None) for q in qs}


def build_timeline(
    records: Sequence[RequestRecord],
    *,
    window_start: float,
    window_end: float,
    markers: Sequence[dict] = (),
    bucket_s: float = 1.0,
    latency_window_s: float = 5.0,
    recover_buckets: int = 3,
) -> dict:
    """The ``timeline`` block of a level (see the module docstring for every definition)."""
    count = max(1, math.ceil(window_end / bucket_s - 1e-9))
    buckets = [{"t_s": round(i * bucket_s, 6), "goodput_tok_s": 0.0, "completed": 0, "errors": {}, "broken": 0}
               for i in range(count)]
    lat_count = max(1, math.ceil(window_end / latency_window_s - 1e-9))
    ttfts: list[list[float]] = [[] for _ in range(lat_count)]
    itls: list[list[float]] = [[] for _ in range(lat_count)]
    lost = broken = 0
    for r in records:
        if r.t_end is None or r.t_end > window_end + 1e-9 or r.status not in (COMPLETED, FAILED):
            continue
        b = buckets[min(count - 1, int(r.t_end / bucket_s))]
        if r.status == COMPLETED:
            b["goodput_tok_s"] += r.output_tokens
            b["completed"] += 1
            w = min(lat_count - 1, int(r.t_end / latency_window_s))
            if r.ttft is not None:
                ttfts[w].append(r.ttft)
            if r.itl is not None:
                itls[w].append(r.itl)
        else:
            lost += 1
            b["errors"][r.error_class] = b["errors"].get(r.error_class, 0) + 1
            if r.http_status == 200:
                b["broken"] += 1
                broken += 1
    for i, b in enumerate(buckets):
        length = min(bucket_s, window_end - i * bucket_s)
        b["goodput_tok_s"] = b["goodput_tok_s"] / length if length > 0 else 0.0
        b["errors"] = dict(sorted(b["errors"].items()))
    latency = [{"t_s": round(i * latency_window_s, 6), "completed": len(ttfts[i]),
                "ttft_s": _percentiles(ttfts[i], (50, 95, 99)), "itl_s": _percentiles(itls[i], (50, 99))}
               for i in range(lat_count)]
    totals = impact([b["goodput_tok_s"] for b in buckets], bucket_s=bucket_s, window_start=window_start,
                    window_end=window_end, markers=markers, recover_buckets=recover_buckets)
    return {
        "bucket_s": bucket_s,
        "latency_window_s": latency_window_s,
        "markers": list(markers),
        "buckets": buckets,
        "latency": latency,
        "totals": {"requests_lost": lost, "broken_streams": broken, **totals},
    }


def impact(goodput: Sequence[float], *, bucket_s: float, window_start: float, window_end: float,
           markers: Sequence[dict] = (), recover_buckets: int = 3) -> dict:
    """Baseline, seconds below 50 % and time to recover to 95 % from a per-bucket goodput series."""
    whole = [i for i in range(len(goodput)) if (i + 1) * bucket_s <= window_end + 1e-9]
    disruption = next((m for m in markers if m["event"] not in NOT_DISRUPTIONS and m["t_s"] > window_start), None)
    cut = disruption["t_s"] if disruption else window_end
    before = [goodput[i] for i in whole if i * bucket_s >= window_start - 1e-9 and (i + 1) * bucket_s <= cut + 1e-9]
    out = {
        "baseline_tok_s": statistics.median(before) if before else None,
        "baseline_buckets": len(before),
        "disruption": disruption,
        "seconds_below_50pct": None,
        "time_to_recover_95_s": None,
    }
    if not before or disruption is None:
        return out
    baseline = out["baseline_tok_s"]
    after = [i for i in whole if i >= int(cut / bucket_s)]
    if not after:  # the window ended before a whole bucket after the marker
        return out
    out["seconds_below_50pct"] = round(sum(bucket_s for i in after if goodput[i] < 0.5 * baseline), 6)
    dip = next((i for i in after if goodput[i] < 0.95 * baseline), None)
    if dip is None:
        out["time_to_recover_95_s"] = 0.0
        return out
    last = after[-1]
    for r in range(dip + 1, last - recover_buckets + 2):
        if statistics.median(goodput[r:r + recover_buckets]) >= 0.95 * baseline:
            out["time_to_recover_95_s"] = round((r - dip) * bucket_s, 6)
            break
    return out
