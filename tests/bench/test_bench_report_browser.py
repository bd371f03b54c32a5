"""The HTML report in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``).

Without them the test skips locally with a message; under CI=true it fails, so CI cannot pass
without the browser check.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from bench_results_factory import write_result

from gennstack.bench import compare, report
from gennstack.bench.results import load_result

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        message = f"headless Chromium not installed ({', '.join(missing)} missing): apt-get install chromium chromium-driver"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _visible_charts(driver, section_id: str) -> list:
    from selenium.webdriver.common.by import By

    section = driver.find_element(By.ID, section_id)
    return [svg for svg in section.find_elements(By.CSS_SELECTOR, "svg.chart") if svg.is_displayed()]


def _check_views(driver, page: Path) -> dict[str, int]:
    """Toggle both views; return the number of series drawn in each per-user chart."""
    from selenium.webdriver.common.by import By

    driver.get(page.as_uri())
    user, aggregate = driver.find_element(By.ID, "section-user"), driver.find_element(By.ID, "section-aggregate")
    assert user.is_displayed() and not aggregate.is_displayed()
    assert driver.find_element(By.ID, "view-user").get_attribute("aria-pressed") == "true"
    user_charts = _visible_charts(driver, "section-user")
    assert len(user_charts) >= 6
    series = {}
    for svg in user_charts:
        assert svg.size["width"] > 300 and svg.size["height"] > 200
        lines = svg.find_elements(By.CSS_SELECTOR, "g.series polyline")
        assert lines, svg.get_attribute("id")
        assert all(len(line.get_attribute("points").split()) >= 2 for line in lines)
        series[svg.get_attribute("id")] = len(lines)

    driver.find_element(By.ID, "view-aggregate").click()
    assert aggregate.is_displayed() and not user.is_displayed()
    assert driver.find_element(By.ID, "view-aggregate").get_attribute("aria-pressed") == "true"
    assert driver.execute_script("return location.hash") == "#aggregate"
    agg_charts = _visible_charts(driver, "section-aggregate")
    assert len(agg_charts) >= 3
    assert all(svg.size["width"] > 300 for svg in agg_charts)
    assert "aggregate tok/s" in aggregate.find_element(By.CSS_SELECTOR, "table.aggregate").text

    driver.find_element(By.ID, "view-user").click()
    assert user.is_displayed() and not aggregate.is_displayed()

    # a link to #aggregate opens on that view
    driver.get(page.as_uri() + "#aggregate")
    driver.refresh()
    assert driver.find_element(By.ID, "section-aggregate").is_displayed()
    assert not driver.find_element(By.ID, "section-user").is_displayed()

    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    return series


def test_single_run_report_in_chromium(browser, tmp_path) -> None:
    result = load_result(write_result(tmp_path / "run", ttft=0.2, itl=0.03, levels=(1, 8, 32)))
    page = tmp_path / "report.html"
    page.write_text(report.render([result]))
    series = _check_views(browser, page)
    # vs-concurrency charts: one series (the run); distributions: one per level
    assert series["user-tps-vs-concurrency"] == 1
    assert series["user-ttft_s"] == series["user-itl_s"] == 3


def test_compare_report_in_chromium(browser, tmp_path) -> None:
    paths = [write_result(tmp_path / "gen1", ttft=0.4, itl=0.05, levels=(8, 32)),
             write_result(tmp_path / "gen2", ttft=0.2, itl=0.03, levels=(8, 32))]
    page = tmp_path / "compare.html"
    page.write_text(compare.render_html(compare.load_all([str(p) for p in paths])))
    series = _check_views(browser, page)
    # every chart draws both runs
    assert series["user-tps-vs-concurrency"] == series["user-ttft_s-c8"] == 2
