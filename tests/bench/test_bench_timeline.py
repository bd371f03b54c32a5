"""The bench timeline (gennstack/bench/timeline.py) on hand-built series: every figure computed by hand."""

from __future__ import annotations

import json

import pytest

from gennstack.bench.report import render
from gennstack.bench.runner import COMPLETED, FAILED, INCOMPLETE, RequestRecord
from gennstack.bench.timeline import EventsFileError, build_timeline, impact, load_events, markers_for_level


def rec(index, *, t_send, chunks, t_end, usage=None, status=COMPLETED, error_class=None, http_status=200) -> RequestRecord:
    r = RequestRecord(index=index, worker=0, warmup=False, prompt_tokens_requested=10, max_tokens=8)
    r.t_send, r.chunk_times, r.t_end, r.status = t_send, list(chunks), t_end, status
    r.usage_completion_tokens, r.error_class, r.http_status = usage, error_class, http_status
    return r


# Goodput per 1 s bucket, 0 .. 13 s; warm-up ends at 2 s; the warning marker is at 6.0 s.
SERIES = [0, 50, 100, 110, 90, 100, 100, 40, 0, 30, 80, 100, 100, 100]
MARKERS = [{"t_s": 0.1, "event": "bench_start"}, {"t_s": 6.0, "event": "interruption_warning"},
           {"t_s": 8.0, "event": "replica_gone"}]


def test_impact_on_a_hand_built_series():
    out = impact(SERIES, bucket_s=1.0, window_start=2.0, window_end=14.0, markers=MARKERS)
    # bench_start is not a disruption; baseline = median of buckets 2..5 = median(100, 110, 90, 100) = 100
    assert out["disruption"] == {"t_s": 6.0, "event": "interruption_warning"}
    assert out["baseline_tok_s"] == 100 and out["baseline_buckets"] == 4
    # from bucket 6: 100, 40, 0, 30, 80, 100, 100, 100 -> under 50: 40, 0, 30 -> 3 s
    assert out["seconds_below_50pct"] == 3
    # the dip starts at bucket 7 (40 < 95); medians of 3 buckets from bucket 8: 30, 80, 100 -> bucket 10 -> 3 s
    assert out["time_to_recover_95_s"] == 3


def test_impact_never_recovered_no_dip_and_no_marker():
    assert impact(SERIES[:12], bucket_s=1.0, window_start=2.0, window_end=12.0, markers=MARKERS)["time_to_recover_95_s"] is None
    flat = impact([100.0] * 10, bucket_s=1.0, window_start=2.0, window_end=10.0, markers=MARKERS)
    assert flat["time_to_recover_95_s"] == 0 and flat["seconds_below_50pct"] == 0
    none = impact(SERIES, bucket_s=1.0, window_start=2.0, window_end=14.0)
    assert none["disruption"] is None and none["seconds_below_50pct"] is None and none["time_to_recover_95_s"] is None
    assert none["baseline_tok_s"] == 100  # median of buckets 2..13
    # a marker before the end of warm-up leaves no baseline bucket
    early = impact(SERIES, bucket_s=1.0, window_start=2.0, window_end=14.0, markers=[{"t_s": 1.5, "event": "x"}, {"t_s": 2.5, "event": "y"}])
    assert early["disruption"]["event"] == "y" and early["baseline_tok_s"] is None and early["seconds_below_50pct"] is None


def test_build_timeline_buckets_errors_broken_streams_and_latency():
    records = [
        rec(0, t_send=0.2, chunks=[0.5, 0.7], t_end=0.9, usage=10),  # bucket 0: 10 tokens
        rec(1, t_send=0.2, chunks=[1.0, 1.2, 1.4], t_end=1.5, usage=20),  # bucket 1: 20 tokens
        rec(2, t_send=1.0, chunks=[1.6], t_end=1.7, status=FAILED, error_class="broken_stream"),  # broken mid-way
        rec(3, t_send=2.1, chunks=[], t_end=2.2, status=FAILED, error_class="connection_error", http_status=None),
        rec(4, t_send=2.1, chunks=[], t_end=2.3, status=FAILED, error_class="http_503", http_status=503),
        rec(5, t_send=2.0, chunks=[2.2], t_end=None, status=INCOMPLETE),  # cut by the window: not lost
    ]
    timeline = build_timeline(records, window_start=0.5, window_end=2.5, markers=[{"t_s": 2.0, "event": "replica_gone"}])
    b = timeline["buckets"]
    assert [x["t_s"] for x in b] == [0, 1, 2]
    assert [x["goodput_tok_s"] for x in b] == [10, 20, 0]  # the last bucket is 0.5 s long
    assert [x["completed"] for x in b] == [1, 1, 0]
    assert [x["errors"] for x in b] == [{}, {"broken_stream": 1}, {"connection_error": 1, "http_503": 1}]
    assert [x["broken"] for x in b] == [0, 1, 0]
    (window,) = timeline["latency"]
    assert window["completed"] == 2
    assert window["ttft_s"]["p50"] == pytest.approx((0.3 + 0.8) / 2)
    assert window["itl_s"]["p50"] == pytest.approx((0.2 / 9 + 0.4 / 19) / 2)
    t = timeline["totals"]
    assert t["requests_lost"] == 3 and t["broken_streams"] == 1
    assert t["baseline_tok_s"] == 20 and t["baseline_buckets"] == 1  # bucket 1 only: bucket 0 is in warm-up
    # no whole bucket follows the marker (bucket 2 is 0.5 s long): nothing to say about the dip
    assert t["seconds_below_50pct"] is None and t["time_to_recover_95_s"] is None


def test_events_file_is_read_in_the_drill_format_and_placed_on_the_level_clock(tmp_path):
    path = tmp_path / "drill-events.jsonl"
    path.write_text(
        '{"event": "drill_start", "time": "2026-11-30T12:00:00Z"}\n'
        '{"event": "experiment_started", "time": "2026-11-30T12:00:05.500000Z", "experiment_id": "EXP1"}\n'
        "\n"
        '{"event": "drill_end", "time": "2026-11-30T12:01:00+00:00"}\n')
    events = load_events(path)
    assert [e["event"] for e in events] == ["drill_start", "experiment_started", "drill_end"]
    assert events[1]["experiment_id"] == "EXP1"
    start = events[0]["unix"] + 2.0  # the level started 2 s after the drill
    assert markers_for_level(events, started_unix=start, end_s=30.0) == [{"t_s": 3.5, "event": "experiment_started"}]


@pytest.mark.parametrize("line, message", [
    ("not json", "line 1: Expecting value"),
    ("[1]", "line 1: not a JSON object"),
    ('{"time": "2026-11-30T12:00:00Z"}', "line 1: 'event' is None, wanted a non-empty string"),
    ('{"event": "x"}', "line 1: 'time' is None, wanted an ISO 8601 time"),
    ('{"event": "x", "time": "2026-11-30T12:00:00"}', "give its time zone (Z for UTC)"),
    ('{"event": "x", "time": "yesterday"}', "line 1: Invalid isoformat string"),
])
def test_bad_events_files_name_the_line_and_the_problem(tmp_path, line, message):
    path = tmp_path / "e.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(EventsFileError, match="--events=") as info:
        load_events(path)
    assert message in str(info.value)


def test_missing_events_file_names_the_flag(tmp_path):
    with pytest.raises(EventsFileError, match=r"--events=.*nope.jsonl: cannot read"):
        load_events(tmp_path / "nope.jsonl")


def test_html_report_plots_goodput_and_broken_streams_with_markers(tmp_path):
    from gennstack.bench.results import load_result
    from tests.bench.bench_results_factory import write_result

    result = load_result(write_result(tmp_path, ttft=0.1, itl=0.01, levels=(4,)))
    records = [rec(0, t_send=0.0, chunks=[0.5], t_end=0.9, usage=10),
               rec(1, t_send=1.0, chunks=[1.6], t_end=1.7, status=FAILED, error_class="broken_stream")]
    result["levels"][0]["timeline"] = build_timeline(records, window_start=0.0, window_end=3.0,
                                                     markers=[{"t_s": 1.2, "event": "replica_gone"}])
    html = render([result])
    c = result["levels"][0]["concurrency"]
    assert f'id="timeline-0-c{c}-goodput"' in html and f'id="timeline-0-c{c}-lost"' in html
    assert html.count('<g class="marker" data-event="replica_gone">') == 2
    assert 'data-series="broken mid-way"' in html
    # a result written before the timeline existed renders without the section
    del result["levels"][0]["timeline"]
    assert "timeline-0" not in render([result])


def test_old_result_files_without_timeline_still_load(tmp_path):
    from gennstack.bench import compare
    from gennstack.bench.results import load_result
    from tests.bench.bench_results_factory import write_result

    old = [write_result(tmp_path / name, ttft=0.1, itl=0.01, levels=(4,)) for name in ("a", "b")]
    assert all("timeline" not in lvl for lvl in json.loads(old[0].read_text())["levels"])
    assert load_result(old[0])["levels"][0]["concurrency"] == 4
    results = compare.load_all([str(p) for p in old], None)
    assert "timeline-" not in compare.render_html(results)


def test_terminal_table_shows_the_totals_and_says_when_goodput_did_not_recover():
    from rich.console import Console

    from gennstack.bench.console import timeline_table

    def level(concurrency, goodput, markers):
        totals = impact(goodput, bucket_s=1.0, window_start=2.0, window_end=len(goodput), markers=markers)
        return {"concurrency": concurrency, "timeline": {"totals": {"requests_lost": 7, "broken_streams": 3, **totals}}}

    console = Console(width=200, record=True)
    console.print(timeline_table([level(4, SERIES, MARKERS), level(8, SERIES[:12], MARKERS), level(16, SERIES, []),
                                  {"concurrency": 32}]))
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in console.export_text().splitlines()
            if line.startswith("│")]
    assert rows == [  # a level without a timeline has no row
        ["4", "7", "3", "100.0", "3.0", "3.0", "interruption_warning at 6.0 s"],
        ["8", "7", "3", "100.0", "3.0", "not recovered", "interruption_warning at 6.0 s"],
        ["16", "7", "3", "100.0", "–", "–", "no marker"],
    ]
