"""Terminal output: the live progress bar during a level and the summary tables after it."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gennstack.bench.metrics import level_label
from gennstack.bench.runner import COMPLETED, RequestRecord


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:,.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


class LevelProgress:
    """A progress bar for one level: by time (``--duration``) or by requests (``--num-requests``).

    Updated from the event loop at most every 0.2 s, so its cost stays off the hot path.
    """

    def __init__(self, console: Console, *, concurrency: int, duration_s: float | None, total_requests: int | None, enabled: bool,
                 name: str | None = None):
        self.enabled = enabled
        self.duration_s = duration_s
        self.total = total_requests
        self.done = 0
        self.failed = 0
        self.tokens = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self.progress = Progress(
            TextColumn(f"[bold]{name or f'c={concurrency}'}[/bold]"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not enabled,
            refresh_per_second=4,
        )
        self.task = self.progress.add_task("bench", total=duration_s or total_requests or 1, status="starting")

    def __enter__(self) -> LevelProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._refresh(final=True)
        self.progress.__exit__(*exc)

    def on_record(self, rec: RequestRecord) -> None:
        self.done += 1
        self.failed += rec.status != COMPLETED
        self.tokens += rec.output_tokens
        self._refresh()

    def _refresh(self, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last < 0.2:
            return
        self._last = now
        elapsed = now - self._t0
        status = f"{self.done} done · {self.failed} failed · {self.tokens / max(elapsed, 1e-9):,.0f} tok/s"
        completed = (min(elapsed, self.duration_s) if self.duration_s else self.done) if not final else self.progress.tasks[0].total
        self.progress.update(self.task, completed=completed, status=status)


def summary_tables(levels: list[dict], *, title: str = "gennstack bench") -> list[Table]:
    """Two narrow tables (each fits an 80-column terminal): per-user latency, then throughput."""
    latency = Table(title=f"{title} · per user (ms unless noted)", title_justify="left")
    for name in ("conc.", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "gap p99", "e2e p50 s", "user tok/s"):
        latency.add_column(name, justify="right")
    throughput = Table(title="aggregate", title_justify="left")
    for name in ("conc.", "agg tok/s", "req/s", "completed", "incomplete", "failed", "n from"):
        throughput.add_column(name, justify="right")
    for lvl in levels:
        m = lvl["metrics"]
        req = lvl["requests"]
        latency.add_row(
            level_label(lvl), _ms(m["ttft_s"]["p50"]), _ms(m["ttft_s"]["p99"]), _ms(m["itl_s"]["p50"]),
            _ms(m["itl_s"]["p99"]), _ms(m["chunk_gap_s"]["p99"]), _num(m["e2e_s"]["p50"], 2),
            _num(m["user_output_tokens_per_s"]["mean"]),
        )
        throughput.add_row(
            level_label(lvl), _num(lvl["aggregate_output_tokens_per_s"]), _num(lvl["requests_per_s"], 2),
            str(req["completed"]), str(req["incomplete"]), str(req["failed"]), lvl["token_source"],
        )
    return [latency, throughput]


def failures_table(levels: list[dict]) -> Table | None:
    rows = [(level_label(lvl), cls, count) for lvl in levels for cls, count in lvl["requests"]["failures_by_class"].items()]
    if not rows:
        return None
    table = Table(title="failures by class", title_justify="left")
    table.add_column("conc.", justify="right")
    table.add_column("class")
    table.add_column("count", justify="right")
    for concurrency, cls, count in rows:
        table.add_row(str(concurrency), cls, str(count))
    return table


def cost_table(rows: list[dict], prices) -> Table:
    """$ per 1M output and total tokens per level, beside throughput (gennstack.cost.tokens rows)."""
    table = Table(title=f"cost · {prices.source}", title_justify="left")
    for name in ("conc.", "agg tok/s", "user tok/s"):
        table.add_column(name, justify="right")
    present = [(key, name) for key, name in (("recorded", "recorded"), ("spot", prices.spot_label), ("on_demand", "on-demand"))
               if rows and rows[0][f"usd_per_hour_{key}"] is not None]
    for _, name in present:
        table.add_column(f"{name} $/1M out", justify="right")
        table.add_column("$/1M total", justify="right")
    for row in rows:
        cells = [level_label(row), _num(row["aggregate_output_tokens_per_s"]), _num(row["user_output_tokens_per_s"])]
        for key, _ in present:
            cells += [_num(row[f"usd_per_m_output_{key}"], 2), _num(row[f"usd_per_m_total_{key}"], 2)]
        table.add_row(*cells)
    return table


def _secs(value: float | None, none: str) -> str:
    return none if value is None else f"{value:,.1f}"


def timeline_table(levels: list[dict]) -> Table:
    """What users lost per level (the ``timeline`` totals; definitions in gennstack.bench.timeline)."""
    table = Table(title="timeline · what users lost (baseline: median goodput before the first disruption marker)",
                  title_justify="left")
    for name in ("conc.", "lost req.", "broken", "baseline tok/s", "s <50%", "recover 95% s", "disruption"):
        table.add_column(name, justify="right")
    for lvl in levels:
        timeline = lvl.get("timeline")
        if timeline is None:
            continue
        t = timeline["totals"]
        disruption = t["disruption"]
        table.add_row(
            level_label(lvl), str(t["requests_lost"]), str(t["broken_streams"]), _num(t["baseline_tok_s"]),
            _secs(t["seconds_below_50pct"], "–"),
            _secs(t["time_to_recover_95_s"], "not recovered" if t["seconds_below_50pct"] is not None else "–"),
            f"{disruption['event']} at {disruption['t_s']:.1f} s" if disruption else "no marker",
        )
    return table


def workload_table(levels: list[dict]) -> Table | None:
    """Per turn of a multi-turn (or the one turn of a shared-prefix) workload: TTFT of turn 1 against later turns."""
    with_workload = [lvl for lvl in levels if lvl.get("workload")]
    if not with_workload:
        return None
    t = Table(title=f"per turn ({with_workload[0]['workload']['kind']}; TTFT and end-to-end in ms)", title_justify="left")
    for name in ("conc.", "turn", "completed", "failed", "TTFT p50", "TTFT p90", "e2e p50", "prompt tok mean"):
        t.add_column(name, justify="right")
    for lvl in with_workload:
        for row in lvl["workload"]["turns"]:
            t.add_row(level_label(lvl), str(row["turn"]), str(row["completed"]), str(row["failed"]),
                      _ms(row["ttft_s"]["p50"]), _ms(row["ttft_s"]["p90"]), _ms(row["e2e_s"]["p50"]),
                      _num(row["prompt_tokens"]["mean"], 0))
    return t


def open_loop_tables(levels: list[dict]) -> list[Table]:
    """Open-loop levels: how well the client kept its schedule; with --slo, attainment and goodput per level."""
    tables = []
    scheduled = [lvl for lvl in levels if lvl.get("schedule")]
    if scheduled:
        t = Table(title="open loop · schedule (lag = send - due; late: lag above the tolerance)", title_justify="left")
        for name in ("rate/s", "offered/s", "due", "sent", "not sent", "late", "lag p50 ms", "lag p99 ms", "lag max ms", "peak in flight"):
            t.add_column(name, justify="right")
        for lvl in scheduled:
            s = lvl["schedule"]
            t.add_row(_num(s["rate_rps"], 3), _num(s["offered_rps"], 3), str(s["due"]), str(s["sent"]), str(s["not_sent"]),
                      f"{s['late']} (>{s['tolerance_s'] * 1000:g} ms)", _ms(s["lag_s"]["p50"]), _ms(s["lag_s"]["p99"]),
                      _ms(s["lag_s"]["max"]), f"{s['peak_in_flight']}/{s['max_in_flight']}")
        tables.append(t)
    with_slo = [lvl for lvl in levels if lvl.get("slo")]
    if with_slo:
        thresholds = ", ".join(f"{k} {v * 1000:g} ms" for k, v in with_slo[0]["slo"]["thresholds"].items())
        t = Table(title=f"SLO · {thresholds} (attainment: requests within every threshold)", title_justify="left")
        for name in ("level", "attainment", "goodput req/s", "goodput tok/s", *with_slo[0]["slo"]["percentiles"]):
            t.add_column(name, justify="right")
        for lvl in with_slo:
            b = lvl["slo"]
            pct = [f"{_ms(p['value_s'])} {'ok' if p['met'] else 'MISS'}" for p in b["percentiles"].values()]
            t.add_row(level_label(lvl), "–" if b["attainment"] is None else f"{b['attainment']:.1%}", _num(b["goodput_rps"], 2),
                      _num(b["goodput_output_tokens_per_s"]), *pct)
        tables.append(t)
    return tables


def sweep_line(sweep: dict) -> str:
    """One sentence: the rate at the SLO, its tokens/s and $ per 1M output tokens there."""
    head = (f"sweep: synchronous {sweep['synchronous_rps']:.3g} req/s, saturated {sweep['saturated_rps']:.3g} req/s; ")
    at = sweep.get("at_slo")
    if at is None:
        return head + sweep.get("note", "no rate met the SLO")
    cost = "; ".join(f"{key.replace('_', '-')} ${at[f'usd_per_m_output_{key}']:,.2f}/1M output tokens"
                     for key in ("recorded", "spot", "on_demand") if at.get(f"usd_per_m_output_{key}") is not None)
    return (head + f"highest rate meeting the SLO for {sweep['target']:.0%}: [bold]{at['rate_rps']:.3g} req/s[/bold] "
            f"({at['attainment']:.1%} within it), {at['output_tokens_per_s']:,.1f} output tok/s, goodput "
            f"{at['goodput_output_tokens_per_s']:,.1f} tok/s" + (f"; {cost}" if cost else f"; {at.get('cost', '')}"))
