"""End to end: ``gennstack bench`` against a local mock replica that is doomed on a schedule, then replaced.

The schedule (scaled down from AWS's two minutes): the bench runs 18 s at concurrency 4 (1 s warm-up), its
workers started 25 ms apart, each request 0.87 s on the mock's schedule; once it is sending, the replica is
told (``POST /doom``) to warn 7 s later and to be gone 1 s after the warning; 1.5 s after it is gone a
replacement starts on the same port (it listens when its process is up: later on a busy machine, which the
18 s leave room for). The replica writes the warning and gone moments into the events
file, with the streams it had in flight when it went; the test writes the replacement's. The bench reads
the file (``--events``).

Expected from what the servers report, not from how fast this machine is: the streams the replica had in
flight at "gone" are exactly the broken ones; every other failure is a refused connection in the outage;
every stream either server completed, the bench counted as completed. Goodput is zero from "gone" until a
stream on the replacement can have ended, and back at 95 % once whole buckets of streams end on it.

Why this workload: a request shorter than a 1 s bucket but not much shorter ends at least once per worker
in every bucket, and twice in one bucket of about eight, whatever the machine's load adds to each request
(up to 0.13 s). So the baseline, a median over 5 buckets, is one request per worker per bucket, and every
bucket after the outage is at least that: whether goodput is "back at 95 %" does not depend on where the
request ends fall (with requests of 0.2 s a bucket holds 4 or 5 rounds of them, the load decides which,
and the 95 % rule with it). The workers start apart so that they are never all between two requests at
"gone"; the outage puts them in step (they all reconnect when the replacement listens), which such a
request tolerates.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest

from tests.bench_process import bench_process, wait_until_sending

CONCURRENCY = 4
TTFT, ITL, TOKENS = 0.3, 0.03, 20
REQUEST_S = TTFT + (TOKENS - 1) * ITL  # one request's length on the mock's schedule: 0.87 s
RAMP_UP_S = 0.1  # workers 25 ms apart: never all between two requests at once
# 5 whole buckets of baseline before the warning; an outage that, with a request's length after it, always
# holds a whole bucket in which nothing can complete (1.5 + 0.87 - 0.1 > 2 s)
WARNING_IN_S, GONE_AFTER_S, OUTAGE_S = 7.0, 1.0, 1.5
# At twice the load, how much later than its schedule the bench may see a stream on the new process end.
LATE_S = 0.5


def _event_times(events) -> dict[str, float]:
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    return {line["event"]: datetime.fromisoformat(line["time"].replace("Z", "+00:00")).timestamp() for line in lines}


@pytest.mark.timing
def test_timeline_of_a_doomed_replica_and_its_replacement(mock_server, tmp_path):
    events = tmp_path / "drill-events.jsonl"
    schedule = ("--ttft", str(TTFT), "--itl", str(ITL))
    doomed = mock_server(*schedule, "--events-file", str(events))
    out = tmp_path / "run"
    with bench_process(doomed.base_url, model="mock-model", events=events, out=out, concurrency=CONCURRENCY,
                       duration=18, max_tokens=TOKENS, ramp_up=RAMP_UP_S) as bench:
        wait_until_sending(doomed, bench)
        doomed.doom(warning_in_s=WARNING_IN_S, gone_after_s=GONE_AFTER_S)
        assert doomed.proc.wait(timeout=30) == 0
        time.sleep(OUTAGE_S)  # the outage: nothing listens
        replacement = mock_server(*schedule, port=doomed.port)  # listening when start() returns
        with events.open("a", encoding="utf-8") as fh:
            stamp = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
            fh.write(json.dumps({"time": stamp, "event": "replacement_ready", "source": "test"}) + "\n")
        output, _ = bench.communicate(timeout=90)
        served_by_replacement = replacement.stats()
    assert bench.returncode == 0, output
    (gone_event,) = [json.loads(line) for line in events.read_text().splitlines() if '"replica_gone"' in line]
    level = json.loads((out / "result.json").read_text())["levels"][0]
    timeline = level["timeline"]
    buckets, totals = timeline["buckets"], timeline["totals"]
    report = json.dumps({"gone_event": gone_event, "replacement": served_by_replacement, "totals": totals,
                         "markers": timeline["markers"], "requests": level["requests"],
                         "buckets": [(b["t_s"], b["completed"], b["errors"]) for b in buckets]})
    marks = {m["event"]: m["t_s"] for m in timeline["markers"]}
    assert list(marks) == ["interruption_warning", "replica_gone", "replacement_ready"]
    warning, gone, ready = marks["interruption_warning"], marks["replica_gone"], marks["replacement_ready"]
    # the markers sit on the level's clock as the events file has them (times rounded to 1 ms), and the
    # replica kept its own schedule (never gone before gone_after_s; how much later is the machine's business)
    written = _event_times(events)
    assert gone - warning == pytest.approx(written["replica_gone"] - written["interruption_warning"], abs=0.002)
    assert ready - gone == pytest.approx(written["replacement_ready"] - written["replica_gone"], abs=0.002)
    assert written["replica_gone"] - written["interruption_warning"] >= GONE_AFTER_S - 0.001
    assert totals["disruption"] == {"t_s": warning, "event": "interruption_warning"}
    assert totals["baseline_buckets"] >= 5, report
    assert totals["baseline_tok_s"] == CONCURRENCY * TOKENS, report  # one request per worker per bucket

    # Requests lost: exactly the streams the replica had in flight at "gone" broke mid-way (HTTP 200, then
    # cut); every other failure is a connection the outage refused (or reset, a request sent as it went).
    cut = gone_event["streams_in_flight"]
    assert 1 <= cut <= CONCURRENCY, report
    assert totals["broken_streams"] == cut, report
    failed = [b for b in buckets if b["errors"]]
    classes = {cls for b in failed for cls in b["errors"]}
    assert classes <= {"broken_stream", "connection_error"}, report
    assert totals["requests_lost"] == sum(n for b in failed for n in b["errors"].values()) == level["requests"]["failed"]
    assert level["requests"]["failures_by_class"]["broken_stream"] >= cut, report
    # ... and nothing failed before "gone" or after the replacement was up (1 s buckets: by bucket)
    assert all(int(gone) <= b["t_s"] <= int(ready) for b in failed), report
    # every stream a server completed, the bench counted as completed (warm-up included), but for those
    # the end of its window cut on the bench's side after the server had sent their last chunk
    servers_completed = gone_event["completed_streams"] + served_by_replacement["completed_streams"]
    bench_completed = level["requests"]["completed"] + level["requests"]["warmup"]
    assert 0 <= servers_completed - bench_completed <= level["requests"]["incomplete"], report

    # Goodput: zero from "gone" until a stream on the replacement can have ended (it takes REQUEST_S on the
    # mock's schedule; 0.1 s for requests that reached it before the test wrote its marker)...
    zero = [b for b in buckets if gone <= b["t_s"] and b["t_s"] + 1 <= ready + REQUEST_S - 0.1]
    assert zero and all(b["completed"] == 0 and b["goodput_tok_s"] == 0 for b in zero), report
    # ... and under half the baseline only in buckets that touch that outage
    latest = ready + REQUEST_S + LATE_S
    touching = int(latest) - int(gone) + 1
    assert len(zero) <= totals["seconds_below_50pct"] <= touching, report
    # Recovery, in the bench's terms (module docstring of gennstack.bench.timeline): from the dip, the first
    # bucket under 95 % of the baseline, to the first bucket from which the median of 3 is back at 95 %.
    # That bucket cannot come before the last of the zero buckets but one (a median of 3 holds at most one
    # zero), nor later than the first bucket after `latest`, from which each bucket ends a stream per worker.
    assert totals["time_to_recover_95_s"] is not None, report
    dip = next(b["t_s"] for b in buckets if b["t_s"] >= int(warning) and b["goodput_tok_s"] < 0.95 * totals["baseline_tok_s"])
    recovered = dip + totals["time_to_recover_95_s"]
    assert int(warning) <= dip <= zero[0]["t_s"], report
    assert zero[-1]["t_s"] - 1 <= recovered <= int(latest) + 1, report
    assert "interruption_warning at" in output and "what users lost" in output
    assert (out / "report.html").read_text().count('data-event="replica_gone"') == 2
