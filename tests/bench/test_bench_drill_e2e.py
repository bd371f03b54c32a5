"""End to end: ``gennstack bench`` against a local mock replica that is doomed on a schedule, then replaced.

The schedule (scaled down from AWS's two minutes): the bench runs 10 s at concurrency 4 (1 s warm-up); once it
is sending, the replica is told (``POST /doom``) to warn 3 s later and to be gone 1 s after the warning; 1.5 s
after it is gone a replacement listens on the same port. The replica writes the warning and gone moments into
the events file, the test the replacement's; the bench reads the file (``--events``). Expected from the
schedule, with the tolerances stated at each assertion: every stream in flight at "gone" breaks mid-way;
nothing fails before it or after the replacement is up; goodput is under half the baseline for about the
outage (gone to replacement ready plus one request's length) and back at 95 % about as long after the dip.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from tests.bench_process import bench_process, wait_until_sending

CONCURRENCY = 4
TTFT, ITL, TOKENS = 0.02, 0.01, 20
REQUEST_S = TTFT + (TOKENS - 1) * ITL  # one request's length on the mock's schedule: 0.21 s


@pytest.mark.timing
def test_timeline_of_a_doomed_replica_and_its_replacement(mock_server, tmp_path):
    events = tmp_path / "drill-events.jsonl"
    schedule = ("--ttft", str(TTFT), "--itl", str(ITL))
    doomed = mock_server(*schedule, "--events-file", str(events))
    out = tmp_path / "run"
    with bench_process(doomed.base_url, model="mock-model", events=events, out=out, concurrency=CONCURRENCY,
                       duration=9, max_tokens=TOKENS) as bench:
        wait_until_sending(doomed, bench)
        doomed.doom(warning_in_s=3.0, gone_after_s=1.0)
        assert doomed.proc.wait(timeout=15) == 0
        time.sleep(1.5)
        mock_server(*schedule, port=doomed.port)  # listening when start() returns
        with events.open("a", encoding="utf-8") as fh:
            stamp = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
            fh.write(json.dumps({"time": stamp, "event": "replacement_ready", "source": "test"}) + "\n")
        output, _ = bench.communicate(timeout=60)
    assert bench.returncode == 0, output
    level = json.loads((out / "result.json").read_text())["levels"][0]
    timeline = level["timeline"]
    marks = {m["event"]: m["t_s"] for m in timeline["markers"]}
    assert list(marks) == ["interruption_warning", "replica_gone", "replacement_ready"]
    warning, gone, ready = marks["interruption_warning"], marks["replica_gone"], marks["replacement_ready"]
    assert gone - warning == pytest.approx(1.0, abs=0.15)
    totals = timeline["totals"]
    assert totals["disruption"] == {"t_s": warning, "event": "interruption_warning"}
    assert totals["baseline_tok_s"] > 0 and totals["baseline_buckets"] >= 1

    # Requests lost: the streams in flight at "gone" (one per worker; a worker may be between two requests at
    # that instant, hence CONCURRENCY - 1), then refused connections until the replacement listens.
    assert CONCURRENCY - 1 <= totals["broken_streams"] <= CONCURRENCY
    failed = [b for b in timeline["buckets"] if b["errors"]]
    classes = {cls for b in failed for cls in b["errors"]}
    assert classes <= {"broken_stream", "connection_error"}, classes
    assert totals["requests_lost"] == sum(n for b in failed for n in b["errors"].values())
    # ... and nothing failed before "gone" or after the replacement was up (1 s buckets: by bucket)
    assert all(int(gone) <= b["t_s"] <= int(ready) for b in failed), (gone, ready, [b["t_s"] for b in failed])
    assert level["requests"]["failures_by_class"].get("broken_stream", 0) >= CONCURRENCY - 1

    # Goodput: zero from "gone" until the first request on the replacement completes.
    outage = ready + REQUEST_S - gone
    assert abs(totals["seconds_below_50pct"] - outage) <= 1.0, (totals, outage)
    assert totals["time_to_recover_95_s"] is not None, totals
    assert abs(totals["time_to_recover_95_s"] - outage) <= 1.5, (totals, outage)
    assert "interruption_warning at" in output and "what users lost" in output
    assert (out / "report.html").read_text().count('data-event="replica_gone"') == 2
