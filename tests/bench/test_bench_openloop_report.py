"""The report's open-loop section: TTFT and ITL against offered rate with the SLO line, attainment against the target,
and ``bench compare`` drawing two runs' curves on one chart; checked in the markup and in headless Chromium."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from test_bench_report_browser import browser  # noqa: F401  (the headless Chromium fixture)

from gennstack.bench import compare, report
from gennstack.bench.config import BenchConfig, Distribution
from gennstack.bench.metrics import summarize_level
from gennstack.bench.results import build_result, load_result
from gennstack.bench.runner import COMPLETED, LevelRun, RequestRecord
from gennstack.bench.slo import SLO, level_slo

SLO_SPEC = "ttft_p90=500ms,itl_p90=40ms"


def _rate_run(rate: float, slow: float) -> LevelRun:
    """20 requests due every 1/rate s, sent on time; TTFT and ITL grow with the rate (times ``slow``)."""
    records = []
    ttft, itl, n = (0.1 + 0.05 * rate) * slow, 0.01 * rate * slow, 10
    for i in range(20):
        rec = RequestRecord(index=i, worker=i, warmup=False, prompt_tokens_requested=16, max_tokens=n, t_due=i / rate)
        rec.t_send = rec.t_due + 0.001
        rec.chunk_times = [rec.t_send + ttft + k * itl for k in range(n)]
        rec.t_end, rec.status, rec.usage_completion_tokens = rec.chunk_times[-1], COMPLETED, n
        records.append(rec)
    return LevelRun(8, records, 0.0, max(r.t_end for r in records), 0.0, "requests", rate=rate, peak_in_flight=3)


def _write(directory, *, slow: float):
    slo = SLO.parse(SLO_SPEC)
    config = BenchConfig(base_url="http://127.0.0.1:8000/v1", model="mock", concurrency=(1,), rates=(1.0, 2.0, 4.0),
                         prompt_tokens=Distribution("fixed", 16), max_tokens=Distribution("fixed", 10), num_requests=20,
                         max_in_flight=8, slo=slo)
    levels = []
    for rate in config.rates:
        run = _rate_run(rate, slow)
        levels.append({**summarize_level(run), "slo": level_slo(run.records, slo, window_start=run.window_start,
                                                                window_end=run.window_end)})
    result = build_result(config, levels, command=["gennstack", "bench"], started_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "result.json").write_text(json.dumps(result))
    return directory / "result.json"


def test_report_draws_latency_against_offered_rate_with_the_slo_line(tmp_path) -> None:
    result = load_result(_write(tmp_path / "run", slow=1.0))
    page = report.render([result])
    for chart in ("rate-ttft", "rate-itl", "rate-attainment"):
        assert f'id="{chart}"' in page
    assert 'data-label="SLO ttft_p90 500 ms"' in page and 'data-label="SLO itl_p90 40 ms"' in page
    assert 'data-label="target 90%"' in page
    assert "open loop: rate 1, 2, 4 requests/s, poisson arrivals, at most 8 in flight" in page
    assert '<table class="schedule">' in page
    # closed-loop charts against concurrency hold no open-loop level
    svg = page[page.index('id="user-ttft-vs-concurrency"'):]
    assert svg[:svg.index("</svg>")].count("<circle") == 0


def test_compare_puts_both_runs_curves_on_one_chart(tmp_path) -> None:
    paths = [_write(tmp_path / "least-request", slow=1.5), _write(tmp_path / "prefix-aware", slow=1.0)]
    results = compare.load_all([str(p) for p in paths])
    page = compare.render_html(results)
    ttft = page[page.index('id="rate-ttft"'):]
    ttft = ttft[:ttft.index("</svg>")]
    assert {f'data-series="{run} p{q}"' in ttft for run in ("least-request", "prefix-aware") for q in (50, 90)} == {True}
    attainment = page[page.index('id="rate-attainment"'):]
    attainment = attainment[:attainment.index("</svg>")]
    assert 'data-series="least-request"' in attainment and 'data-series="prefix-aware"' in attainment
    # compare's table keys open-loop levels by rate
    rows = compare.comparison_rows(results)
    assert {row["level"] for row in rows} == {"1/s", "2/s", "4/s"}


def test_open_loop_charts_in_chromium(browser, tmp_path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    paths = [_write(tmp_path / "a", slow=1.5), _write(tmp_path / "b", slow=1.0)]
    page = tmp_path / "compare.html"
    page.write_text(compare.render_html(compare.load_all([str(p) for p in paths])))
    browser.get(page.as_uri())
    for chart_id, series in (("rate-ttft", 4), ("rate-itl", 4), ("rate-attainment", 2)):
        svg = browser.find_element(By.ID, chart_id)
        assert svg.is_displayed() and svg.size["width"] > 300
        lines = svg.find_elements(By.CSS_SELECTOR, "g.series polyline")
        assert len(lines) == series and all(len(line.get_attribute("points").split()) == 3 for line in lines)
        threshold = svg.find_element(By.CSS_SELECTOR, "g.threshold line")
        y = float(threshold.get_attribute("y1"))
        assert 48 <= y <= 300 - 46  # inside the plot area (svg.line_chart's top and bottom margins)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


@pytest.mark.parametrize("levels", [(1, 8)])
def test_closed_loop_compare_rows_keep_their_concurrency(tmp_path, levels) -> None:
    from bench_results_factory import write_result

    paths = [write_result(tmp_path / "a", ttft=0.1, itl=0.02, levels=levels), write_result(tmp_path / "b", ttft=0.1, itl=0.02, levels=levels)]
    rows = compare.comparison_rows(compare.load_all([str(p) for p in paths]))
    assert {row["concurrency"] for row in rows} == {1, 8} and {row["level"] for row in rows} == {"1", "8"}
