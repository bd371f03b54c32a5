"""One benchmark run from a :class:`~gennstack.bench.config.BenchConfig`: every level, every output file, the
terminal summary. ``gennstack bench`` (:mod:`gennstack.bench.cli`) and ``bench compare-routing``
(:mod:`gennstack.bench.routing_compare`) both run it."""

from __future__ import annotations

import asyncio
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

from gennstack.bench.config import BenchConfig


def default_output_dir(model: str, now: datetime) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-") or "model"
    return Path("bench-results") / f"{now.strftime('%Y%m%dT%H%M%SZ')}-{slug}"


def execute(config: BenchConfig, *, output_dir: Path | None, command: list[str], progress: bool = True,
            upload: str | None = None, console=None, layout=None, events: Path | None = None) -> tuple[int, dict, Path]:
    """Run every level, write all outputs, print the summary. Returns (exit code, result, dir).

    Each level gets a ``timeline`` (gennstack.bench.timeline), with the markers of ``events`` when given."""
    from rich.console import Console

    from gennstack.bench import llmperf, report
    from gennstack.bench.console import (LevelProgress, cost_table, failures_table, open_loop_tables, summary_tables, sweep_line,
                                         timeline_table, workload_table)
    from gennstack.bench.metrics import summarize_level
    from gennstack.bench.results import REPORT_FILE, REQUESTS_FILE, RESULT_FILE, build_result, write_requests_csv, write_result
    from gennstack.bench.runner import run_level, run_rate_level
    from gennstack.bench.slo import at_slo, level_slo, request_rate, sweep_rates
    from gennstack.bench.timeline import EventsFileError, build_timeline, load_events, markers_for_level

    console = console or Console(width=None if sys.stdout.isatty() else 120)
    started = datetime.now(timezone.utc)
    output_dir = output_dir or default_output_dir(config.model, started)
    output_dir.mkdir(parents=True, exist_ok=True)
    runs, levels = [], []

    def run_one(concurrency: int | None = None, rate: float | None = None, role: str | None = None) -> dict:
        """One level (closed loop at ``concurrency``, or open loop at ``rate``): run, summarize, add its timeline."""
        warmup = config.warmup_requests_for(concurrency if rate is None else 0)
        total = None if config.num_requests is None else config.num_requests + warmup
        length = None if config.duration_s is None else config.warmup_s + config.duration_s
        name = f"c={concurrency}" if rate is None else f"{rate:.3g} req/s"
        with LevelProgress(console, concurrency=concurrency or 0, duration_s=length, total_requests=total,
                           enabled=progress and console.is_terminal, name=name) as bar:
            if rate is None:
                run = asyncio.run(run_level(config, concurrency, on_record=bar.on_record))
            else:
                run = asyncio.run(run_rate_level(config, rate, on_record=bar.on_record))
        runs.append(run)
        level = summarize_level(run, tolerance_s=config.schedule_tolerance_s)
        if config.slo is not None:
            level["slo"] = level_slo(run.records, config.slo, window_start=run.window_start, window_end=run.window_end)
        if role is not None:
            level["sweep_role"] = role
        markers = []
        if events is not None:
            try:
                markers = markers_for_level(load_events(events), started_unix=run.started_wall, end_s=run.window_end)
            except EventsFileError as exc:
                console.print(f"[red]timeline without markers: {exc}[/red]")
        level["timeline"] = build_timeline(run.records, window_start=run.window_start, window_end=run.window_end,
                                           markers=markers)
        levels.append(level)
        if rate is None:  # LLMPerf has no open loop: its files stay those of closed-loop levels
            llmperf.write(run, config, output_dir / "llmperf" / f"concurrency-{concurrency}")
        return level

    sweep = None
    if not config.open_loop:
        for concurrency in config.concurrency:
            run_one(concurrency)
    elif not config.sweep:
        for rate in config.rates:
            run_one(rate=rate)
    else:
        synchronous = request_rate(run_one(1, role="synchronous"))
        saturated = request_rate(run_one(config.max_in_flight, role="throughput"))
        try:
            rates = sweep_rates(synchronous, saturated, config.sweep_levels)
        except ValueError as exc:
            console.print(f"[red]sweep stopped: {exc}[/red]")
            rates = []
        # the closed-loop runs measure requests/s; a multi-turn level's rate counts conversations, each --turns requests
        turns = config.workload.turns
        for rate in rates:
            run_one(rate=rate / turns, role="rate")
        sweep = {"synchronous_rps": synchronous, "saturated_rps": saturated, "rates": rates}
        if turns > 1:
            sweep["conversation_rates"] = [rate / turns for rate in rates]
    result = build_result(config, levels, command=command, started_at=started, layout=layout)
    if sweep is not None:
        result["sweep"] = {**sweep, **at_slo(result, config.slo_target)}
    write_result(result, output_dir / RESULT_FILE)
    write_requests_csv(runs, output_dir / REQUESTS_FILE)
    result["_label"] = output_dir.name
    (output_dir / REPORT_FILE).write_text(report.render([result]), encoding="utf-8")
    del result["_label"]
    console.print(f"[bold]gennstack bench[/bold] · {config.model} · {config.chat_url}")
    for table in summary_tables(levels, title="results"):
        console.print(table)
    from gennstack.cost.tokens import report_costs

    costs = report_costs(result)
    if isinstance(costs, str):
        console.print(f"$ per 1M tokens: {costs}")
    else:
        console.print(cost_table(*costs))
    failures = failures_table(levels)
    if failures is not None:
        console.print(failures)
    console.print(timeline_table(levels))
    for table in open_loop_tables(levels):
        console.print(table)
    if sweep is not None:
        console.print(sweep_line(result["sweep"]))
    turns = workload_table(levels)
    if turns is not None:
        console.print(turns)
    sources = {lvl["token_source"] for lvl in levels}
    console.print(f"n (output tokens) from: {', '.join(sorted(sources))}  ·  results in {output_dir}/ "
                  f"({RESULT_FILE}, {REQUESTS_FILE}, {REPORT_FILE}, llmperf/)")
    if upload:
        from gennstack.bench.upload import upload_directory

        keys = upload_directory(output_dir, upload)
        console.print(f"uploaded {len(keys)} files to {upload.rstrip('/')}/{output_dir.name}/")
    ok = any(lvl["requests"]["completed"] for lvl in levels)
    if not ok:
        console.print("[red]no request completed: see the failures above[/red]")
    return (0 if ok else 1), result, output_dir
