"""The self-contained HTML report (one run, or several side by side for ``compare``).

Everything is inline: SVG charts drawn by :mod:`gennstack.bench.svg`, a stylesheet, and a
few lines of script for the per-user / aggregate toggle. No CDN, so it opens offline.
The two views are ``<section data-view="user">`` and ``<section data-view="aggregate">``;
the buttons ``#view-user`` and ``#view-aggregate`` switch between them (also ``#aggregate``
in the address).
"""

from __future__ import annotations

from html import escape

from gennstack.bench.metrics import level_label
from gennstack.bench.svg import Series, cdf_points, line_chart

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:1.4em;margin:0 0 4px} h2{font-size:1.15em;margin:28px 0 8px} h3{font-size:1em;margin:18px 0 6px}
.meta{color:#555;font-size:.9em} .meta code{font-size:.95em;word-break:break-all}
.toggle{margin:18px 0;display:flex;gap:0}
.toggle button{font-size:1em;padding:8px 18px;border:1px solid #1f77b4;background:#fff;color:#1f77b4;cursor:pointer}
.toggle button[aria-pressed=true]{background:#1f77b4;color:#fff}
.toggle button:first-child{border-radius:6px 0 0 6px}.toggle button:last-child{border-radius:0 6px 6px 0}
.charts{display:flex;flex-wrap:wrap;gap:12px}
svg.chart{background:#fafafa;border:1px solid #e3e3e3;border-radius:4px}
svg .grid{stroke:#e6e6e6} svg .axis,svg .tickmark{stroke:#888} svg text{font-size:11px;fill:#444}
svg .chart-title{font-size:13px;font-weight:600;fill:#222} svg .label{font-size:12px}
table{border-collapse:collapse;font-size:.88em;margin:6px 0} th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f2f2f2} td:first-child,th:first-child{text-align:left}
.note{color:#555;font-size:.88em;max-width:900px} .table-wrap{overflow-x:auto}
"""

_SCRIPT = """
(function(){
  function show(view){
    document.querySelectorAll('section[data-view]').forEach(function(s){ s.hidden = s.dataset.view !== view; });
    document.querySelectorAll('.toggle button').forEach(function(b){ b.setAttribute('aria-pressed', String(b.dataset.view === view)); });
    document.body.dataset.view = view;
  }
  document.querySelectorAll('.toggle button').forEach(function(b){
    b.addEventListener('click', function(){ show(b.dataset.view); history.replaceState(null, '', '#' + b.dataset.view); });
  });
  show(location.hash === '#aggregate' ? 'aggregate' : 'user');
})();
"""

_PER_USER_ROWS = (
    ("ttft_s", "TTFT", "s"),
    ("itl_s", "ITL (excl. first)", "s"),
    ("chunk_gap_s", "Chunk gap", "s"),
    ("e2e_s", "End-to-end", "s"),
    ("user_output_tokens_per_s", "Per-user tok/s", "tok/s"),
)


def _v(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 10 else f"{value:.2f} s"
    return f"{value:,.1f}"


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def _label(result: dict, i: int) -> str:
    return result.get("_label") or f"run {i + 1}"


def _user_table(results: list[dict]) -> str:
    head = "<tr><th>run</th><th>concurrency</th>" + "".join(
        f"<th>{escape(name)} mean</th><th>p50</th><th>p99</th>" for _, name, _ in _PER_USER_ROWS
    ) + "<th>n from</th></tr>"
    rows = []
    for i, result in enumerate(results):
        for level in result["levels"]:
            cells = [f"<td>{escape(_label(result, i))}</td><td>{level_label(level)}</td>"]
            for key, _, unit in _PER_USER_ROWS:
                m = level["metrics"][key]
                cells.append("".join(f"<td>{_v(m[q], unit)}</td>" for q in ("mean", "p50", "p99")))
            cells.append(f"<td>{escape(level['token_source'])}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="table-wrap"><table class="per-user">{head}{"".join(rows)}</table></div>'


def _aggregate_table(results: list[dict]) -> str:
    head = ("<tr><th>run</th><th>concurrency</th><th>aggregate tok/s</th><th>requests/s</th><th>window</th>"
            "<th>completed</th><th>incomplete</th><th>failed</th><th>failures by class</th></tr>")
    rows = []
    for i, result in enumerate(results):
        for level in result["levels"]:
            req = level["requests"]
            failures = ", ".join(f"{k}: {v}" for k, v in req["failures_by_class"].items()) or "none"
            rows.append(
                f"<tr><td>{escape(_label(result, i))}</td><td>{level_label(level)}</td>"
                f"<td>{level['aggregate_output_tokens_per_s']:,.1f}</td><td>{level['requests_per_s']:,.2f}</td>"
                f"<td>{level['window']['length_s']:.1f} s</td><td>{req['completed']}</td><td>{req['incomplete']}</td>"
                f"<td>{req['failed']}</td><td>{escape(failures)}</td></tr>"
            )
    return f'<table class="aggregate">{head}{"".join(rows)}</table>'


def _cost_table(results: list[dict]) -> str:
    """$ per 1M output and total tokens beside throughput, per run and level (gennstack.cost.tokens)."""
    from gennstack.cost.tokens import report_costs

    parts = ['<h3>Cost per million tokens</h3><p class="note">Fleet $/hour divided by the tokens it delivered: '
             "$/1M output = $/h / (aggregate output tok/s x 3600) x 10<sup>6</sup>; total tokens add each request's prompt "
             "tokens. Spot from the bundled table is an estimate and says so.</p>"]
    for i, result in enumerate(results):
        costs = report_costs(result)
        if isinstance(costs, str):
            parts.append(f'<p class="note cost-missing">{escape(_label(result, i))}: {escape(costs)}</p>')
            continue
        rows, prices = costs
        present = [(key, name) for key, name in (("recorded", "recorded"), ("spot", prices.spot_label), ("on_demand", "on-demand"))
                   if rows[0][f"usd_per_hour_{key}"] is not None]
        head = ("<tr><th>run</th><th>concurrency</th><th>aggregate tok/s</th><th>per-user tok/s</th>"
                + "".join(f"<th>{escape(name)} $/h</th><th>$/1M output</th><th>$/1M total</th>" for _, name in present) + "</tr>")
        body = []
        for row in rows:
            cells = (f"<td>{escape(_label(result, i))}</td><td>{level_label(row)}</td>"
                     f"<td>{row['aggregate_output_tokens_per_s']:,.1f}</td><td>{_v(row['user_output_tokens_per_s'])}</td>")
            for key, _ in present:
                total = row[f"usd_per_m_total_{key}"]
                cells += (f"<td>{row[f'usd_per_hour_{key}']:,.2f}</td><td>{row[f'usd_per_m_output_{key}']:,.2f}</td>"
                          f"<td>{'–' if total is None else f'{total:,.2f}'}</td>")
            body.append(f"<tr>{cells}</tr>")
        parts.append(f'<p class="note">{escape(_label(result, i))}: {escape(prices.source)}</p>'
                     f'<div class="table-wrap"><table class="cost">{head}{"".join(body)}</table></div>')
    return "".join(parts)


def _workload_section(results: list[dict]) -> str:
    """Per turn of a multi-turn or shared-prefix run (turn 1 against later turns), requests per prefix and per
    recorded upstream; empty for runs of the single workload without --record-header."""
    parts = []
    for i, result in enumerate(results):
        spec = result["settings"].get("workload") or {"kind": "single"}
        for level in result["levels"]:
            block, upstreams = level.get("workload"), level.get("upstreams")
            if block is None and upstreams is None:
                continue
            name = f"{_label(result, i)}, {_level_words(level)}"
            params = ", ".join(f"{k} {v}" for k, v in spec.items() if k != "kind")
            parts.append(f"<h3>{escape(spec['kind'])} workload: {escape(name)}</h3>"
                         + (f'<p class="note">{escape(params)}</p>' if params else ""))
            if block is not None:
                rows = "".join(
                    f"<tr><td>{row['turn']}</td><td>{row['completed']}</td><td>{row['failed']}</td>"
                    f"<td>{_v(row['ttft_s']['p50'], 's')}</td><td>{_v(row['ttft_s']['p90'], 's')}</td>"
                    f"<td>{_v(row['e2e_s']['p50'], 's')}</td><td>{_v(row['prompt_tokens']['mean'])}</td></tr>"
                    for row in block["turns"])
                parts.append('<table class="turns"><tr><th>turn</th><th>completed</th><th>failed</th><th>TTFT p50</th>'
                             f"<th>TTFT p90</th><th>e2e p50</th><th>prompt tokens mean</th></tr>{rows}</table>")
                if block["requests_by_prefix"]:
                    cells = "".join(f"<tr><td>{escape(k)}</td><td>{v}</td></tr>" for k, v in block["requests_by_prefix"].items())
                    parts.append(f'<table class="prefixes"><tr><th>prefix</th><th>requests</th></tr>{cells}</table>')
            if upstreams is not None:
                total = sum(upstreams.values()) or 1
                cells = "".join(f"<tr><td>{escape(k or '(none)')}</td><td>{v}</td><td>{v / total:.1%}</td></tr>"
                                for k, v in upstreams.items())
                parts.append(f'<table class="upstreams"><tr><th>upstream</th><th>requests</th><th>share</th></tr>{cells}</table>')
    if not parts:
        return ""
    return ('<h3>Workload</h3><p class="note">Per turn: turn 1 is a conversation\'s first request (no server has seen '
            "its prompt); later turns resend the history, which a prefix cache on the replica that served the last turn "
            "already holds.</p>" + "".join(parts))


def _key(level: dict) -> str:
    """A level's key across runs and in chart ids: ``c8`` (concurrency 8) or ``r2.5`` (2.5 requests/s)."""
    return f"r{level['rate_rps']:.3g}" if level.get("rate_rps") is not None else f"c{level['concurrency']}"


def _keys(results: list[dict]) -> list[str]:
    """Every level key of the runs: closed-loop levels by concurrency, then open-loop ones by rate."""
    levels = {_key(lvl): lvl for r in results for lvl in r["levels"]}
    return sorted(levels, key=lambda k: (k[0], levels[k].get("rate_rps") or levels[k]["concurrency"]))


def _short(level: dict) -> str:
    return f"{level['rate_rps']:.3g}/s" if level.get("rate_rps") is not None else f"c={level['concurrency']}"


def _level_words(level: dict) -> str:
    return f"{level['rate_rps']:.3g} requests/s" if level.get("rate_rps") is not None else f"concurrency {level['concurrency']}"


def _vs_concurrency(results: list[dict], value, *, title: str, y_label: str, chart_id: str) -> str:
    series = []
    for i, result in enumerate(results):
        closed = [lvl for lvl in result["levels"] if lvl.get("rate_rps") is None]  # open-loop levels: _open_loop_section
        points = [(lvl["concurrency"], value(lvl)) for lvl in sorted(closed, key=lambda x: x["concurrency"])]
        series.append(Series(_label(result, i), [(x, y) for x, y in points if y is not None]))
    return line_chart(series, title=title, x_label="concurrency (streams)", y_label=y_label, chart_id=chart_id)


def _distribution_charts(results: list[dict], keys: tuple[tuple[str, str, str], ...], prefix: str) -> str:
    """CDFs: one series per level for a single run; per level, one series per run to compare."""
    charts = []
    if len(results) == 1:
        groups = [(None, [(_short(lvl), lvl) for lvl in results[0]["levels"]])]
    else:
        groups = [(key, [(_label(r, i), lvl) for i, r in enumerate(results) for lvl in r["levels"] if _key(lvl) == key])
                  for key in _keys(results)]
    for key_, members in groups:
        suffix = "" if key_ is None else f" at {_level_words(members[0][1])}"
        for key, name, unit in keys:
            scale = 1000.0 if unit == "milliseconds" else 1.0
            series = [Series(label, cdf_points([v * scale for v in lvl["samples"].get(key, [])]), markers=False)
                      for label, lvl in members]
            chart_id = f"{prefix}-{key}" + ("" if key_ is None else f"-{key_}")
            charts.append(line_chart(series, title=f"{name}{suffix} (CDF)", x_label=unit, y_label="fraction of requests",
                                     chart_id=chart_id, step=True))
    return "".join(charts)


def _time_series_charts(results: list[dict]) -> str:
    if len(results) == 1:
        series = [Series(_short(lvl), [tuple(p) for p in lvl["throughput_series"]], markers=False)
                  for lvl in results[0]["levels"]]
        return line_chart(series, title="Aggregate output tokens/s over the measured window", x_label="seconds into window",
                          y_label="tokens/s", chart_id="agg-timeseries")
    charts = []
    for key in _keys(results):
        members = [(i, r, lvl) for i, r in enumerate(results) for lvl in r["levels"] if _key(lvl) == key]
        series = [Series(_label(r, i), [tuple(p) for p in lvl["throughput_series"]], markers=False) for i, r, lvl in members]
        charts.append(line_chart(series, title=f"Aggregate output tokens/s over time at {_level_words(members[0][2])}",
                                 x_label="seconds into window", y_label="tokens/s", chart_id=f"agg-timeseries-{key}"))
    return "".join(charts)


def _timeline_charts(results: list[dict]) -> str:
    """Per level with a timeline: goodput, and broken streams and errors per second, with the event markers."""
    charts = []
    for i, r in enumerate(results):
        for lvl in r["levels"]:
            timeline = lvl.get("timeline")
            if timeline is None:
                continue
            name = _short(lvl) if len(results) == 1 else f"{_label(r, i)} {_short(lvl)}"
            chart_id = f"timeline-{i}-{_key(lvl)}"
            half = timeline["bucket_s"] / 2
            marks = [(m["t_s"], m["event"]) for m in timeline["markers"]]
            buckets = timeline["buckets"]
            goodput = [Series("goodput", [(b["t_s"] + half, b["goodput_tok_s"]) for b in buckets], markers=False)]
            baseline = timeline["totals"]["baseline_tok_s"]
            if baseline is not None and buckets:
                goodput.append(Series("baseline", [(0.0, baseline), (buckets[-1]["t_s"] + 2 * half, baseline)], markers=False))
            charts.append(line_chart(goodput, title=f"Goodput over time, {name} (tokens/s of requests that completed)",
                                     x_label="seconds from level start", y_label="tokens/s", chart_id=f"{chart_id}-goodput",
                                     vlines=marks))
            lost = [Series("broken mid-way", [(b["t_s"] + half, b["broken"]) for b in buckets], markers=False),
                    Series("all errors", [(b["t_s"] + half, sum(b["errors"].values())) for b in buckets], markers=False)]
            charts.append(line_chart(lost, title=f"Broken streams and errors per {timeline['bucket_s']:g} s, {name}",
                                     x_label="seconds from level start", y_label="requests", chart_id=f"{chart_id}-lost",
                                     vlines=marks))
    if not charts:
        return ""
    return ('<h3>Timeline: what users lost</h3><p class="note">Goodput: output tokens of requests that completed in each '
            "second. Broken: streams that started (HTTP 200) and then failed or ended without [DONE]. Baseline: the median "
            "goodput between warm-up and the first disruption marker. Dashed lines: event markers (--events).</p>"
            '<div class="charts">' + "".join(charts) + "</div>")


def _objective(result: dict, metric: str) -> tuple[int, float | None]:
    """(percentile, threshold in seconds) of the run's SLO for ``metric``; (90, None) without one."""
    for key, value in (result["settings"].get("slo") or {}).items():
        if key.startswith(f"{metric}_p"):
            return int(key.rsplit("_p", 1)[1]), value
    return 90, None


def _open_loop_section(results: list[dict]) -> str:
    """Open-loop levels: TTFT and ITL (p50 and the SLO's percentile) and SLO attainment against the offered rate,
    one series per run and statistic, the SLO as a dashed line; then how well the client kept its schedule."""
    runs = [(i, r, sorted((lvl for lvl in r["levels"] if lvl.get("schedule")), key=lambda lvl: lvl["schedule"]["offered_rps"]))
            for i, r in enumerate(results)]
    runs = [(i, r, levels) for i, r, levels in runs if levels]
    if not runs:
        return ""
    charts = []
    for metric, key, name in (("ttft", "ttft_s", "TTFT"), ("itl", "itl_s", "ITL")):
        series, lines = [], []
        for i, r, levels in runs:
            pct, threshold = _objective(r, metric)
            for q in sorted({50, pct}):
                points = [(lvl["schedule"]["offered_rps"], _ms(_percentile(lvl["samples"][key], q))) for lvl in levels]
                series.append(Series(f"{_label(r, i)} p{q}" if len(runs) > 1 else f"p{q}", [p for p in points if p[1] is not None]))
            if threshold is not None and (threshold * 1000, f"SLO {metric}_p{pct} {threshold * 1000:g} ms") not in lines:
                lines.append((threshold * 1000, f"SLO {metric}_p{pct} {threshold * 1000:g} ms"))
        charts.append(line_chart(series, title=f"{name} vs offered rate", x_label="offered rate (requests/s)",
                                 y_label="milliseconds", chart_id=f"rate-{metric}", hlines=lines))
    with_slo = [(i, r, [lvl for lvl in levels if lvl.get("slo")]) for i, r, levels in runs]
    if any(levels for _, _, levels in with_slo):
        series = [Series(_label(r, i), [(lvl["schedule"]["offered_rps"], lvl["slo"]["attainment"] * 100) for lvl in levels
                                        if lvl["slo"]["attainment"] is not None]) for i, r, levels in with_slo if levels]
        targets = sorted({(r["settings"]["slo"]["target"] * 100, f"target {r['settings']['slo']['target']:.0%}")
                          for _, r, levels in with_slo if levels})
        charts.append(line_chart(series, title="SLO attainment vs offered rate", x_label="offered rate (requests/s)",
                                 y_label="% of requests within every SLO", chart_id="rate-attainment", hlines=targets))
    rows = []
    for i, r, levels in runs:
        for lvl in levels:
            s, slo = lvl["schedule"], lvl.get("slo")
            attainment = "–" if not slo or slo["attainment"] is None else f"{slo['attainment']:.1%}"
            goodput_rps = "–" if not slo else f"{slo['goodput_rps']:.2f}"
            goodput_tps = "–" if not slo else f"{slo['goodput_output_tokens_per_s']:,.1f}"
            rows.append(f"<tr><td>{escape(_label(r, i))}</td><td>{s['rate_rps']:.3g}</td><td>{s['offered_rps']:.3g}</td>"
                        f"<td>{s['due']}</td><td>{s['not_sent']}</td><td>{s['late']}</td><td>{_v(s['lag_s']['p50'], 's')}</td>"
                        f"<td>{_v(s['lag_s']['p99'], 's')}</td><td>{_v(s['lag_s']['max'], 's')}</td>"
                        f"<td>{s['peak_in_flight']} / {s['max_in_flight']}</td><td>{attainment}</td><td>{goodput_rps}</td>"
                        f"<td>{goodput_tps}</td></tr>")
    sweeps = []
    for i, r, _ in runs:
        at = (r.get("sweep") or {}).get("at_slo")
        if r.get("sweep") is None:
            continue
        if at is None:
            sweeps.append(f"<li>{escape(_label(r, i))}: {escape(r['sweep'].get('note', 'no rate met the SLO'))}</li>")
            continue
        price = "; ".join(f"${at[f'usd_per_m_output_{k}']:,.2f} per 1M output tokens ({k.replace('_', '-')})"
                          for k in ("recorded", "spot", "on_demand") if at.get(f"usd_per_m_output_{k}") is not None)
        sweeps.append(f"<li>{escape(_label(r, i))}: <strong>{at['rate_rps']:.3g} requests/s</strong> meets the SLO for "
                      f"{at['attainment']:.1%} of requests (target {r['sweep']['target']:.0%}): {at['output_tokens_per_s']:,.1f} "
                      f"output tokens/s{'; ' + escape(price) if price else ''}</li>")
    return ('<h3>Open loop: latency against offered rate</h3><p class="note">Offered rate: requests due in the measured '
            "window per second (multi-turn: every turn). Lag: send time minus due time; late: lag above the stated "
            "tolerance. Attainment: requests within every SLO threshold / requests with an outcome.</p>"
            + (f'<ul class="sweep">{"".join(sweeps)}</ul>' if sweeps else "")
            + '<div class="charts">' + "".join(charts) + "</div>"
            '<div class="table-wrap"><table class="schedule"><tr><th>run</th><th>rate/s</th><th>offered/s</th><th>due</th>'
            "<th>not sent</th><th>late</th><th>lag p50</th><th>lag p99</th><th>lag max</th><th>peak in flight</th>"
            f"<th>SLO attainment</th><th>goodput req/s</th><th>goodput tok/s</th></tr>{''.join(rows)}</table></div>")


def _percentile(values: list[float], q: int) -> float | None:
    from gennstack.bench.metrics import quantile

    data = sorted(values)
    return quantile(data, q / 100) if data else None


def _load_words(settings: dict) -> str:
    """``concurrency 1, 8`` (closed loop), or the open loop's rates, arrival process and cap."""
    spec = settings.get("open_loop")
    if spec is None:
        return f"concurrency {', '.join(map(str, settings['concurrency']))}"
    rates = spec["rates"] if spec["rates"] == "sweep" else ", ".join(f"{r:g}" for r in spec["rates"]) + " requests/s"
    burst = f" (burstiness {spec['burstiness']:g})" if spec["arrival"] == "poisson" and spec["burstiness"] != 1 else ""
    return f"open loop: rate {rates}, {spec['arrival']} arrivals{burst}, at most {spec['max_in_flight']} in flight"


def _workload_meta(settings: dict) -> str:
    spec = settings.get("workload") or {"kind": "single"}
    if spec["kind"] == "single":
        return ""
    return " · workload " + escape(", ".join([spec["kind"], *(f"{k} {v}" for k, v in spec.items() if k != "kind")]))


def _header(results: list[dict]) -> str:
    if len(results) == 1:
        r = results[0]
        settings = r["settings"]
        length = f"{settings['duration_s']} s per level" if settings["duration_s"] else f"{settings['num_requests']} requests per level"
        return (
            f"<h1>gennstack bench: {escape(r['model'])}</h1>"
            f'<p class="meta">endpoint <code>{escape(r["endpoint"])}</code> · started {escape(r["started_at"])} · '
            f"{escape(r['tool']['name'])} {escape(r['tool']['version'])} · {escape(_load_words(settings))} · "
            f"{escape(length)} · prompt tokens {escape(settings['prompt_tokens']['spec'])} · max tokens {escape(settings['max_tokens']['spec'])}"
            f"{_workload_meta(settings)}</p>"
            f'<p class="meta">command <code>{escape(" ".join(r["command"]))}</code></p>'
        )
    rows = "".join(
        f"<tr><td>{escape(_label(r, i))}</td><td>{escape(r['model'])}</td><td>{escape(r['endpoint'])}</td>"
        f"<td>{escape(r['started_at'])}</td><td>{', '.join(level_label(lvl) for lvl in r['levels'])}</td>"
        f"<td>{escape(r['settings']['prompt_tokens']['spec'])} / {escape(r['settings']['max_tokens']['spec'])}</td></tr>"
        for i, r in enumerate(results)
    )
    return (
        f"<h1>gennstack bench compare: {len(results)} runs</h1>"
        "<table class=\"runs\"><tr><th>run</th><th>model</th><th>endpoint</th><th>started</th><th>concurrency</th>"
        f"<th>prompt / max tokens</th></tr>{rows}</table>"
    )


def render(results: list[dict]) -> str:
    """The full HTML page for one result (a run) or several (a comparison)."""
    title = "gennstack bench compare" if len(results) > 1 else f"gennstack bench: {results[0]['model']}"
    user = (
        '<section data-view="user" id="section-user"><h2>Per-user view: what each user feels</h2>'
        '<p class="note">Per request, warm-up excluded, completed requests only. TTFT: to the first chunk with '
        "non-empty content or reasoning. ITL: (t_last − t_first) / (n − 1). Per-user tokens/s: n / end-to-end.</p>"
        '<div class="charts">'
        + _vs_concurrency(results, lambda lvl: lvl["metrics"]["user_output_tokens_per_s"]["mean"],
                          title="Per-user output tokens/s (mean) vs concurrency", y_label="tokens/s per user", chart_id="user-tps-vs-concurrency")
        + _vs_concurrency(results, lambda lvl: _ms(lvl["metrics"]["ttft_s"]["p50"]),
                          title="TTFT p50 vs concurrency", y_label="milliseconds", chart_id="user-ttft-vs-concurrency")
        + _vs_concurrency(results, lambda lvl: _ms(lvl["metrics"]["itl_s"]["p50"]),
                          title="ITL p50 vs concurrency", y_label="milliseconds", chart_id="user-itl-vs-concurrency")
        + _distribution_charts(results, (("ttft_s", "Time to first token", "milliseconds"), ("itl_s", "Inter-token latency", "milliseconds"),
                                         ("e2e_s", "End-to-end latency", "milliseconds"),
                                         ("user_output_tokens_per_s", "Per-user output tokens/s", "tokens/s")), "user")
        + "</div>" + _open_loop_section(results) + _user_table(results) + _workload_section(results) + "</section>"
    )
    aggregate = (
        '<section data-view="aggregate" id="section-aggregate"><h2>Aggregate view: what the fleet delivers</h2>'
        '<p class="note">Aggregate tokens/s: tokens that arrived inside the measured window (from any request) divided '
        "by its length. Requests/s: measured requests completed inside the window divided by its length.</p>"
        '<div class="charts">'
        + _vs_concurrency(results, lambda lvl: lvl["aggregate_output_tokens_per_s"],
                          title="Aggregate output tokens/s vs concurrency", y_label="tokens/s", chart_id="agg-tps-vs-concurrency")
        + _vs_concurrency(results, lambda lvl: lvl["requests_per_s"],
                          title="Requests/s vs concurrency", y_label="requests/s", chart_id="agg-rps-vs-concurrency")
        + _time_series_charts(results)
        + "</div>" + _timeline_charts(results) + _aggregate_table(results) + _cost_table(results) + "</section>"
    )
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body data-view=\"user\">"
        + _header(results)
        + '<div class="toggle" role="group" aria-label="view">'
        '<button id="view-user" type="button" data-view="user" aria-pressed="true">Per-user</button>'
        '<button id="view-aggregate" type="button" data-view="aggregate" aria-pressed="false">Aggregate</button></div>'
        + user + aggregate.replace('<section data-view="aggregate"', '<section data-view="aggregate" hidden', 1)
        + f"<script>{_SCRIPT}</script></body></html>\n"
    )
