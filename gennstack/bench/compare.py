"""``gennstack bench compare``: two or more result files side by side.

For each concurrency level found in any run, one row per metric, one column per run, and
the change of each later run against the first (the baseline). The HTML page is the report
of :mod:`gennstack.bench.report` with one series per run.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from gennstack.bench import report
from gennstack.bench.metrics import level_label
from gennstack.bench.results import load_result

# (label, getter, unit, higher_is_better)
ROWS = (
    ("TTFT p50", lambda lvl: lvl["metrics"]["ttft_s"]["p50"], "ms", False),
    ("TTFT p99", lambda lvl: lvl["metrics"]["ttft_s"]["p99"], "ms", False),
    ("ITL p50", lambda lvl: lvl["metrics"]["itl_s"]["p50"], "ms", False),
    ("ITL p99", lambda lvl: lvl["metrics"]["itl_s"]["p99"], "ms", False),
    ("e2e p50", lambda lvl: lvl["metrics"]["e2e_s"]["p50"], "s", False),
    ("per-user tok/s mean", lambda lvl: lvl["metrics"]["user_output_tokens_per_s"]["mean"], "", True),
    ("aggregate tok/s", lambda lvl: lvl["aggregate_output_tokens_per_s"], "", True),
    ("requests/s", lambda lvl: lvl["requests_per_s"], "", True),
    ("failed", lambda lvl: lvl["requests"]["failed"], "", False),
    ("incomplete", lambda lvl: lvl["requests"]["incomplete"], "", False),
)


# open-loop levels with --slo (gennstack.bench.slo)
SLO_ROWS = (
    ("SLO attainment", lambda lvl: (lvl.get("slo") or {}).get("attainment"), "", True),
    ("goodput req/s", lambda lvl: (lvl.get("slo") or {}).get("goodput_rps"), "", True),
    ("goodput tok/s", lambda lvl: (lvl.get("slo") or {}).get("goodput_output_tokens_per_s"), "", True),
    ("schedule lag p99", lambda lvl: ((lvl.get("schedule") or {}).get("lag_s") or {}).get("p99"), "ms", False),
)


def load_all(paths: list[str], labels: list[str] | None = None) -> list[dict]:
    results = [load_result(p) for p in paths]
    if labels and len(labels) != len(results):
        raise ValueError(f"--label given {len(labels)} times for {len(results)} result files")
    for i, result in enumerate(results):
        result["_label"] = labels[i] if labels else Path(result["_path"]).parent.name or f"run {i + 1}"
    # two runs in directories of the same name still need distinct labels
    seen: dict[str, int] = {}
    for result in results:
        seen[result["_label"]] = seen.get(result["_label"], 0) + 1
    for i, result in enumerate(results):
        if seen[result["_label"]] > 1:
            result["_label"] = f"{result['_label']} ({i + 1})"
    return results


def _fmt(value, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "ms":
        return f"{value * 1000:,.1f} ms"
    if unit == "s":
        return f"{value:,.2f} s"
    if unit == "$":
        return f"${value:,.2f}"
    return f"{value:,.1f}" if isinstance(value, float) else str(value)


def delta(base, value) -> str:
    if base in (None, 0) or value is None:
        return ""
    return f"{(value - base) / base * 100:+.1f}%"


def _costs_by_level(result: dict) -> dict[str, dict]:
    """Level label (concurrency, or rate for an open-loop level) -> gennstack.cost.tokens row, for a result whose layout can be priced (else empty)."""
    from gennstack.cost.tokens import report_costs

    costs = report_costs(result)
    return {} if isinstance(costs, str) else {level_label(row): row for row in costs[0]}


# (label, cost row key): compared like the other rows, lower is better; "–" where a run has no priced layout. Spot comes
# from the bundled table here, so it is always the stated estimate (gennstack.cost.prices).
COST_ROWS = (
    ("$/1M output (recorded)", "usd_per_m_output_recorded"),
    ("$/1M output (spot estimate)", "usd_per_m_output_spot"),
    ("$/1M output (on-demand)", "usd_per_m_output_on_demand"),
)


def comparison_rows(results: list[dict]) -> list[dict]:
    """Rows as data (also what the tests check): level, metric, values per run, deltas."""
    found: dict[str, dict] = {}
    for r in results:
        for lvl in r["levels"]:
            found.setdefault(level_label(lvl), lvl)
    # closed-loop levels by concurrency, then open-loop levels by rate
    levels = sorted(found, key=lambda k: (found[k].get("rate_rps") is not None, found[k].get("rate_rps") or found[k]["concurrency"]))
    costs = [_costs_by_level(r) for r in results]
    rows = []
    for name in levels:
        by_run = [next((lvl for lvl in r["levels"] if level_label(lvl) == name), None) for r in results]
        c = found[name]["concurrency"]
        slo_rows = SLO_ROWS if any(lvl is not None and lvl.get("slo") for lvl in by_run) else ()
        for label, getter, unit, higher in (*ROWS, *slo_rows):
            values = [getter(lvl) if lvl is not None else None for lvl in by_run]
            rows.append({
                "concurrency": c, "level": name, "metric": label, "unit": unit, "higher_is_better": higher, "values": values,
                "deltas": [""] + [delta(values[0], v) for v in values[1:]],
            })
        for label, key in COST_ROWS:
            values = [cost.get(name, {}).get(key) for cost in costs]
            if any(v is not None for v in values):
                rows.append({"concurrency": c, "level": name, "metric": label, "unit": "$", "higher_is_better": False,
                             "values": values, "deltas": [""] + [delta(values[0], v) for v in values[1:]]})
    return rows


def table(results: list[dict]) -> Table:
    t = Table(title="gennstack bench compare (Δ against the first run)", title_justify="left")
    t.add_column("conc.", justify="right")
    t.add_column("metric")
    for i, result in enumerate(results):
        t.add_column(result["_label"], justify="right")
        if i:
            t.add_column("Δ", justify="right")
    previous = None
    for row in comparison_rows(results):
        cells = [row["level"] if row["level"] != previous else "", row["metric"]]
        previous = row["level"]
        for i, value in enumerate(row["values"]):
            cells.append(_fmt(value, row["unit"]))
            if i:
                d = row["deltas"][i]
                better = d and ((d.startswith("+")) == row["higher_is_better"]) and d not in ("+0.0%", "-0.0%")
                cells.append(f"[green]{d}[/green]" if better else (f"[red]{d}[/red]" if d and d not in ("+0.0%", "-0.0%") else d))
        t.add_row(*cells)
    return t


def render_html(results: list[dict]) -> str:
    return report.render(results)
