"""``gennstack bench``: the command line of the benchmark, its ``compare``, ``mock-server`` and
``demo`` subcommands. Flags are read and validated here, once, into a :class:`BenchConfig`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from gennstack.bench.config import BenchConfig, ConfigError, Distribution, parse_concurrency

DEFAULT_DURATION_S = 60.0
DESCRIPTION = """\
Drive an OpenAI-compatible endpoint with N concurrent streaming chat completions and report
what users feel (TTFT, inter-token latency, per-user tokens/s) and what the fleet delivers
(aggregate tokens/s, requests/s). Writes result.json, requests.csv, report.html and
LLMPerf-compatible files to --output-dir. Metric definitions: docs/benchmark.md.

examples:
  gennstack bench demo                      # against a local mock server, one command
  gennstack bench --base-url https://gateway/v1 --ca-file gennstack-ca.pem --model llama --concurrency 32,160,200
  gennstack bench compare gen1/result.json gen2/result.json
"""


def add_run_arguments(parser: argparse.ArgumentParser, *, for_demo: bool = False) -> None:
    if not for_demo:
        parser.add_argument("--base-url", help="OpenAI-compatible base URL, e.g. http://host:8000/v1")
        parser.add_argument("--model", help="model name sent in each request")
        parser.add_argument("--api-key", help="bearer token (default: $OPENAI_API_KEY); never written to results")
        parser.add_argument("--ca-file", help="PEM CA certificate to trust for an https:// base URL instead of the "
                                              "public roots (the gateway's own CA: docs/gateway.md)")
    parser.add_argument("--concurrency", default="1,8,32" if for_demo else "1",
                        help="concurrent streams: one level or a comma list run in order, e.g. 32,160,200 (default: %(default)s)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, default=10.0 if for_demo else None,
                        help=f"measured seconds per level (default: {10 if for_demo else int(DEFAULT_DURATION_S)} unless --num-requests)")
    length.add_argument("--num-requests", type=int, help="measured requests per level, after warm-up")
    parser.add_argument("--max-tokens", default="128" if for_demo else "256",
                        help="output tokens asked for: N, normal:MEAN,STD or uniform:LO,HI (default: %(default)s)")
    parser.add_argument("--prompt-tokens", default="256" if for_demo else "512",
                        help="prompt length in tokens (approximate, synthetic words): N, normal:MEAN,STD or uniform:LO,HI (default: %(default)s)")
    parser.add_argument("--output-dir", type=Path, help="where results go (default: bench-results/<UTC time>-<model>)")
    parser.add_argument("--warmup-seconds", type=float,
                        help="with --duration: seconds before the window whose requests are excluded (default: 10%% of --duration, at most 30)")
    parser.add_argument("--warmup-requests", type=int,
                        help="with --num-requests: requests before the measured ones, excluded (default: one per worker)")
    parser.add_argument("--ramp-up", type=float, default=0.0,
                        help="start the workers evenly spread over this many seconds, so they do not move in lockstep (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request limit in seconds; past it: failure class timeout (default: %(default)s)")
    parser.add_argument("--stall-timeout", type=float, default=60.0,
                        help="longest wait for the connection or the next bytes, seconds; past it: timeout (default: %(default)s)")
    parser.add_argument("--ignore-eos", action="store_true", help="send ignore_eos=true (vLLM) so every response runs to max_tokens")
    parser.add_argument("--no-usage", action="store_true", help="do not ask for stream_options.include_usage; n comes from chunks")
    parser.add_argument("--extra-body", default="{}", help="JSON object merged into each request body, e.g. '{\"temperature\":0}'")
    parser.add_argument("--seed", type=int, default=0, help="seed for prompts and sampled lengths (default: %(default)s)")
    parser.add_argument("--upload", metavar="S3_URI", help="after the run, copy the output directory to s3://BUCKET/PREFIX/<dir name>/")
    parser.add_argument("--no-progress", action="store_true", help="no live progress bar (still prints the summary)")
    parser.add_argument("--events", type=Path, metavar="FILE",
                        help="JSON-lines event markers (gennstack drill's drill-events.jsonl), read after each level and "
                             "placed on its timeline; the file may be written while the bench runs")
    layout = parser.add_argument_group("layout of the target (recorded in result.json; the report then shows $ per 1M tokens)")
    layout.add_argument("--instance-type", help="node type serving the endpoint, e.g. g6e.12xlarge")
    layout.add_argument("--replicas", type=int, help="model-server replicas behind the endpoint")
    layout.add_argument("--replicas-per-node", type=int, help="replicas sharing one node (default: 1)")
    layout.add_argument("--capacity-type", help="spot, on-demand or reserved")
    layout.add_argument("--hourly-price", type=float, help="$ per node-hour paid (else the bundled price table of --region)")
    layout.add_argument("--region", help="region whose bundled prices price --instance-type")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmark an OpenAI-compatible endpoint (LLMPerf-style)",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser)
    parser.set_defaults(func=run_bench)
    sub = parser.add_subparsers(dest="bench_command", metavar="{compare,mock-server,demo}")

    compare = sub.add_parser("compare", help="put two or more result files side by side (terminal and HTML)")
    compare.add_argument("results", nargs="+", help="result.json files or run directories")
    compare.add_argument("--label", action="append", help="name of each run, in order (default: its directory name)")
    compare.add_argument("--html", type=Path, default=Path("bench-results") / "compare.html", help="HTML page to write (default: %(default)s)")
    compare.set_defaults(func=run_compare)

    from gennstack.bench import mockserver

    mock = sub.add_parser("mock-server", help="a local OpenAI-compatible server streaming on a programmed schedule",
                          description=mockserver.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mockserver.add_arguments(mock)
    mock.set_defaults(func=mockserver.run)

    demo = sub.add_parser("demo", help="start the mock server and benchmark it: the whole tool in one command")
    add_run_arguments(demo, for_demo=True)
    demo.add_argument("--ttft", type=float, default=0.15, help="mock server time to first token, seconds (default: %(default)s)")
    demo.add_argument("--itl", type=float, default=0.02, help="mock server gap between chunks, seconds (default: %(default)s)")
    demo.add_argument("--tokens-per-chunk", type=int, default=1, help="mock server tokens per chunk (default: %(default)s)")
    demo.set_defaults(func=run_demo)


def config_from_args(args: argparse.Namespace, *, base_url: str, model: str, api_key: str | None) -> BenchConfig:
    try:
        extra_body = json.loads(args.extra_body)
    except ValueError:
        raise ConfigError(f"--extra-body={args.extra_body!r}: not valid JSON") from None
    if not isinstance(extra_body, dict):
        raise ConfigError(f"--extra-body={args.extra_body!r}: must be a JSON object")
    duration = args.duration
    if duration is None and args.num_requests is None:
        duration = DEFAULT_DURATION_S
    warmup_s = args.warmup_seconds
    if warmup_s is None:
        warmup_s = min(30.0, duration * 0.1) if duration is not None else 0.0
    return BenchConfig(
        base_url=base_url,
        model=model,
        api_key=api_key,
        concurrency=parse_concurrency(args.concurrency),
        prompt_tokens=Distribution.parse(args.prompt_tokens, option="--prompt-tokens"),
        max_tokens=Distribution.parse(args.max_tokens, option="--max-tokens"),
        duration_s=duration,
        num_requests=args.num_requests,
        warmup_s=warmup_s,
        ramp_up_s=args.ramp_up,
        warmup_requests=args.warmup_requests,
        request_timeout_s=args.timeout,
        stall_timeout_s=args.stall_timeout,
        ignore_eos=args.ignore_eos,
        include_usage=not args.no_usage,
        extra_body=extra_body,
        seed=args.seed,
        ca_file=getattr(args, "ca_file", None),
    )


def layout_from_args(args: argparse.Namespace):
    """The target's layout from the --instance-type ... flags, or None when none was given."""
    from gennstack.cost.tokens import BenchLayout, CostInputError

    given = {"instance_type": args.instance_type, "replicas": args.replicas, "replicas_per_node": args.replicas_per_node,
             "capacity_type": args.capacity_type, "hourly_price": args.hourly_price, "region": args.region}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    try:
        return BenchLayout(**given)
    except CostInputError as exc:
        raise ConfigError(str(exc)) from None


def default_output_dir(model: str, now: datetime) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-") or "model"
    return Path("bench-results") / f"{now.strftime('%Y%m%dT%H%M%SZ')}-{slug}"


def execute(config: BenchConfig, *, output_dir: Path | None, command: list[str], progress: bool = True,
            upload: str | None = None, console=None, layout=None, events: Path | None = None) -> tuple[int, dict, Path]:
    """Run every level, write all outputs, print the summary. Returns (exit code, result, dir).

    Each level gets a ``timeline`` (gennstack.bench.timeline), with the markers of ``events`` when given."""
    from rich.console import Console

    from gennstack.bench import llmperf, report
    from gennstack.bench.console import LevelProgress, cost_table, failures_table, summary_tables, timeline_table
    from gennstack.bench.metrics import summarize_level
    from gennstack.bench.results import REPORT_FILE, REQUESTS_FILE, RESULT_FILE, build_result, write_requests_csv, write_result
    from gennstack.bench.runner import run_level
    from gennstack.bench.timeline import EventsFileError, build_timeline, load_events, markers_for_level

    console = console or Console(width=None if sys.stdout.isatty() else 120)
    started = datetime.now(timezone.utc)
    output_dir = output_dir or default_output_dir(config.model, started)
    output_dir.mkdir(parents=True, exist_ok=True)
    runs, levels = [], []
    for concurrency in config.concurrency:
        total = None if config.num_requests is None else config.num_requests + config.warmup_requests_for(concurrency)
        length = None if config.duration_s is None else config.warmup_s + config.duration_s
        with LevelProgress(console, concurrency=concurrency, duration_s=length, total_requests=total,
                           enabled=progress and console.is_terminal) as bar:
            run = asyncio.run(run_level(config, concurrency, on_record=bar.on_record))
        runs.append(run)
        level = summarize_level(run)
        markers = []
        if events is not None:
            try:
                markers = markers_for_level(load_events(events), started_unix=run.started_wall, end_s=run.window_end)
            except EventsFileError as exc:
                console.print(f"[red]timeline without markers: {exc}[/red]")
        level["timeline"] = build_timeline(run.records, window_start=run.window_start, window_end=run.window_end,
                                           markers=markers)
        levels.append(level)
        llmperf.write(run, config, output_dir / "llmperf" / f"concurrency-{concurrency}")
    result = build_result(config, levels, command=command, started_at=started, layout=layout)
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


def run_bench(args: argparse.Namespace) -> int:
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    missing = [flag for flag, value in (("--base-url", args.base_url), ("--model", args.model)) if not value]
    if missing:
        print(f"gennstack bench: error: {' and '.join(missing)} required (or try `gennstack bench demo`)", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args, base_url=args.base_url, model=args.model, api_key=api_key)
        layout = layout_from_args(args)
        if args.upload:
            from gennstack.bench.upload import parse_s3_uri

            parse_s3_uri(args.upload)
    except (ConfigError, ValueError) as exc:
        print(f"gennstack bench: error: {exc}", file=sys.stderr)
        return 2
    code, _, _ = execute(config, output_dir=args.output_dir, command=["gennstack", *sys.argv[1:]],
                         progress=not args.no_progress, upload=args.upload, layout=layout, events=args.events)
    return code


def start_mock_server(extra_args: list[str]) -> tuple[subprocess.Popen, str]:
    """Start ``python -m gennstack.bench.mockserver --port 0`` and return (process, base URL)."""
    proc = subprocess.Popen([sys.executable, "-m", "gennstack.bench.mockserver", "--port", "0", *extra_args],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"(http://\S+/v1)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"mock server did not start: {line!r}")
    return proc, match.group(1)


def run_demo(args: argparse.Namespace) -> int:
    try:
        config_from_args(args, base_url="http://127.0.0.1/v1", model="mock-model", api_key=None)  # validate first
        layout = layout_from_args(args)
    except ConfigError as exc:
        print(f"gennstack bench demo: error: {exc}", file=sys.stderr)
        return 2
    proc, base_url = start_mock_server(["--ttft", str(args.ttft), "--itl", str(args.itl),
                                        "--tokens-per-chunk", str(args.tokens_per_chunk)])
    try:
        config = config_from_args(args, base_url=base_url, model="mock-model", api_key=None)
        code, _, _ = execute(config, output_dir=args.output_dir, command=["gennstack", *sys.argv[1:]],
                             progress=not args.no_progress, upload=args.upload, layout=layout, events=args.events)
        return code
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run_compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from gennstack.bench import compare
    from gennstack.bench.results import ResultFileError

    if len(args.results) < 2:
        print("gennstack bench compare: error: give at least two result files", file=sys.stderr)
        return 2
    try:
        results = compare.load_all(args.results, args.label)
    except (ResultFileError, ValueError) as exc:
        print(f"gennstack bench compare: error: {exc}", file=sys.stderr)
        return 2
    Console().print(compare.table(results))
    args.html.parent.mkdir(parents=True, exist_ok=True)
    args.html.write_text(compare.render_html(results), encoding="utf-8")
    print(f"wrote {args.html}")
    return 0
