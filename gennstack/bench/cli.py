"""``gennstack bench``: the command line of the benchmark, its ``compare``, ``mock-server`` and
``demo`` subcommands. Flags are read and validated here, once, into a :class:`BenchConfig`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gennstack.bench.arrivals import ARRIVALS
from gennstack.bench.config import WORKLOADS, BenchConfig, ConfigError, Distribution, Workload, parse_concurrency, parse_rates
from gennstack.bench.run import execute

DEFAULT_DURATION_S = 60.0
# `bench demo`'s objectives against its mock server (--ttft 0.15 --itl 0.02, slowed down by its load: --slowdown)
DEMO_SLO = "ttft_p90=400ms,itl_p90=40ms"
DESCRIPTION = """\
Drive an OpenAI-compatible endpoint with N concurrent streaming chat completions (closed loop,
--concurrency) or requests arriving at a rate (open loop, --rate, with --slo attainment and goodput) and report
what users feel (TTFT, inter-token latency, per-user tokens/s) and what the fleet delivers
(aggregate tokens/s, requests/s). Writes result.json, requests.csv, report.html and
LLMPerf-compatible files to --output-dir. Metric definitions: docs/benchmark.md.

examples:
  gennstack bench demo                      # against a local mock server, one command
  gennstack bench --base-url http://127.0.0.1:8080/v1 --model smollm2 --workload multi-turn --turns 6 --think-time 1
  gennstack bench --base-url http://127.0.0.1:8080/v1 --model smollm2 --workload shared-prefix --num-prefixes 8 --prefix-tokens 400 --prefix-zipf 1.1
  gennstack bench --base-url https://gateway/v1 --ca-file gennstack-ca.pem --model llama --concurrency 32,160,200
  gennstack bench --base-url http://127.0.0.1:8080/v1 --model smollm2 --rate 0.5,1,2 --slo ttft_p90=500ms,itl_p90=50ms
  gennstack bench --base-url https://gateway/v1 --ca-file gennstack-ca.pem --model llama --rate sweep --slo ttft_p90=1s,itl_p90=60ms --hourly-price 10.49
  gennstack bench compare gen1/result.json gen2/result.json
"""


def add_run_arguments(parser: argparse.ArgumentParser, *, for_demo: bool = False) -> None:
    if not for_demo:
        parser.add_argument("--base-url", help="OpenAI-compatible base URL, e.g. http://host:8000/v1")
        parser.add_argument("--model", help="model name sent in each request")
        parser.add_argument("--api-key", help="bearer token (default: $OPENAI_API_KEY); never written to results")
        parser.add_argument("--ca-file", help="PEM CA certificate to trust for an https:// base URL instead of the "
                                              "public roots (the gateway's own CA: docs/gateway.md)")
    parser.add_argument("--concurrency",
                        help="closed loop: concurrent streams, one level or a comma list run in order, e.g. 32,160,200 "
                             f"(default: {'a sweep, below' if for_demo else '1'}, unless --rate)")
    openloop = parser.add_argument_group("open loop (requests sent on a schedule, whatever is in flight; docs/benchmark.md#open-loop)")
    openloop.add_argument("--rate", help="requests/s (multi-turn: conversations/s), one level or a comma list, e.g. 0.5,1,2; "
                                         "or sweep: the synchronous and saturated rates, then --sweep-levels between them "
                                         f"(needs --slo){' (default: sweep)' if for_demo else ''}")
    openloop.add_argument("--arrival", choices=ARRIVALS, default="poisson",
                          help="gaps between arrivals: poisson (gamma, shape --burstiness) or constant 1/rate (default: %(default)s)")
    openloop.add_argument("--burstiness", type=float, default=1.0,
                          help="poisson: gamma shape of the gaps, as vllm bench serve's; 1: Poisson, <1 burstier, >1 more even "
                               "(default: %(default)s)")
    openloop.add_argument("--max-in-flight", type=int, default=32 if for_demo else 256,
                          help="most requests in flight at once; a request due while it is full waits and is reported late; "
                               "--rate sweep's throughput run uses this many streams (default: %(default)s)")
    openloop.add_argument("--schedule-tolerance", type=float, default=0.010,
                          help="seconds after its due time a request may go out before it counts as late (default: %(default)s)")
    openloop.add_argument("--slo", default=DEMO_SLO if for_demo else None,
                          help="per-request objectives, e.g. ttft_p90=500ms,itl_p90=50ms,e2e_p90=10s (metrics ttft, itl, "
                               "tpot, e2e); each level reports the share of requests within all of them and the goodput"
                               + (" (default: %(default)s)" if for_demo else ""))
    openloop.add_argument("--slo-target", type=float, default=0.9,
                          help="--rate sweep: the share of requests within the SLO a rate must reach (default: %(default)s)")
    openloop.add_argument("--sweep-levels", type=int, default=4 if for_demo else 5,
                          help="--rate sweep: rates between the synchronous and the saturated one, the last one the saturated "
                               "rate (default: %(default)s)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, default=8.0 if for_demo else None,
                        help=f"measured seconds per level (default: {8 if for_demo else int(DEFAULT_DURATION_S)} unless --num-requests)")
    length.add_argument("--num-requests", type=int, help="measured requests per level, after warm-up")
    parser.add_argument("--max-tokens", default="64" if for_demo else "256",
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
    load = parser.add_argument_group(
        "workload (what each request holds; docs/benchmark.md#workloads)")
    load.add_argument("--workload", choices=WORKLOADS, default="single",
                      help="single: a fresh prompt per request; multi-turn: conversations that resend their history each "
                           "turn; shared-prefix: a system prompt from a skewed set, then a distinct question (default: %(default)s)")
    load.add_argument("--turns", type=int, default=1,
                      help="multi-turn: turns per conversation, each a new user message of --prompt-tokens (default: %(default)s)")
    load.add_argument("--think-time", type=float, default=0.0,
                      help="multi-turn: seconds from an answer to the conversation's next turn (default: %(default)s)")
    load.add_argument("--num-prefixes", type=int, default=0,
                      help="shared-prefix (or multi-turn, one per conversation): distinct system prompts to pick from")
    load.add_argument("--prefix-tokens", type=int, default=0, help="length of each system prompt in tokens (approximate, synthetic words)")
    load.add_argument("--prefix-zipf", type=float, default=0.0,
                      help="skew of the pick: prefix k (1..N) with probability proportional to 1/k**S; 0: uniform (default: %(default)s)")
    load.add_argument("--record-header", metavar="NAME",
                      help="record this response header per request (requests.csv upstream, result.json upstreams), "
                           "e.g. the replica a gateway chose")
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
    sub = parser.add_subparsers(dest="bench_command", metavar="{compare,compare-routing,mock-server,demo}")

    compare = sub.add_parser("compare", help="put two or more result files side by side (terminal and HTML)")
    compare.add_argument("results", nargs="+", help="result.json files or run directories")
    compare.add_argument("--label", action="append", help="name of each run, in order (default: its directory name)")
    compare.add_argument("--html", type=Path, default=Path("bench-results") / "compare.html", help="HTML page to write (default: %(default)s)")
    compare.set_defaults(func=run_compare)

    from gennstack.bench import routing_compare

    routing = sub.add_parser("compare-routing", help="least-request against prefix-aware routing on local replicas (minutes)",
                             description=routing_compare.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = routing_compare.CompareSettings()
    routing.add_argument("--backend", choices=("llama", "mock"), default=d.backend,
                         help="llama: SmolLM2 on llama-cpp-python (make setup-demo); mock: mock servers (default: %(default)s)")
    routing.add_argument("--replicas", type=int, default=d.replicas, help="model servers (default: %(default)s)")
    routing.add_argument("--runs", type=int, default=d.runs, help="runs per policy, fresh servers each (default: %(default)s)")
    routing.add_argument("--seed", type=int, default=d.seed, help="seed of run 1; run k uses seed + k - 1 (default: %(default)s)")
    routing.add_argument("--rates", default=None,
                         help="the ladder: offered requests/s, comma separated, rising; Poisson arrivals (multi-turn: "
                              "conversations at rate / --turns) (default: " + "; ".join(
                                  f"{b}: {','.join(f'{r:g}' for r in rates)}" for b, rates in routing_compare.DEFAULT_RATES.items()) + ")")
    routing.add_argument("--conversations", type=int, default=d.conversations, help="multi-turn: conversations per level (default: %(default)s)")
    routing.add_argument("--turns", type=int, default=d.turns, help="multi-turn: turns per conversation (default: %(default)s)")
    routing.add_argument("--think-time", type=float, default=d.think_time_s, help="multi-turn: seconds between turns (default: %(default)s)")
    routing.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, help="multi-turn: tokens per user message (default: %(default)s)")
    routing.add_argument("--max-tokens", type=int, default=d.max_tokens, help="tokens per answer (default: %(default)s)")
    routing.add_argument("--shared-requests", type=int, default=d.shared_requests, help="shared-prefix: requests per level (default: %(default)s)")
    routing.add_argument("--num-prefixes", type=int, default=d.num_prefixes, help="shared-prefix: system prompts (default: %(default)s)")
    routing.add_argument("--prefix-tokens", type=int, default=d.prefix_tokens, help="shared-prefix: tokens per system prompt (default: %(default)s)")
    routing.add_argument("--prefix-zipf", type=float, default=d.prefix_zipf, help="shared-prefix: Zipf exponent of the pick (default: %(default)s)")
    routing.add_argument("--question-tokens", type=int, default=d.question_tokens, help="shared-prefix: tokens per question (default: %(default)s)")
    routing.add_argument("--slo", default=d.slo, help="the per-request SLO of the goodput, as gennstack bench --slo (default: %(default)s)")
    routing.add_argument("--hash-balance-factor", type=int, default=None,
                         help="prefix routing's bounded load, %% of the mean in flight (default: gateway.routing.hash_balance_factor)")
    routing.add_argument("--no-kill", action="store_true", help="skip the kill drill")
    routing.add_argument("--kill-conversations", type=int, default=d.kill_conversations,
                         help="kill drill: conversations at a time, closed loop (default: %(default)s)")
    routing.add_argument("--kill-after", type=float, default=d.kill_after,
                         help="kill drill: kill the busiest replica once this fraction of the run's requests was served (default: %(default)s)")
    routing.add_argument("--kill-turns", type=int, default=d.kill_turns, help="kill drill: turns per conversation (default: %(default)s)")
    routing.add_argument("--health-interval", type=int, default=d.health_interval_s,
                         help="the gateway's active health check interval, seconds (default: %(default)s)")
    routing.add_argument("--result", type=Path, default=routing_compare.RESULT_FILE,
                         help="the comparison (JSON), its markdown table beside it (.md) (default: %(default)s)")
    routing.add_argument("--work-dir", type=Path, default=Path("bench-results") / "compare-routing",
                         help="each run's bench results and server logs (default: %(default)s)")
    routing.add_argument("--from-result", type=Path, metavar="JSON",
                         help="run nothing: write the table (and --update-readme) again from this comparison's JSON, its "
                              "targets recomputed")
    routing.add_argument("--update-readme", type=Path, metavar="README",
                         help="replace the block between <!-- prefix-routing:start/end --> in README with comparison.md")
    routing.set_defaults(func=run_compare_routing)

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
    demo.add_argument("--slowdown", type=float, default=0.05,
                      help="mock server: TTFT and ITL grow by this fraction per stream already in flight, so it saturates "
                           "as a model server does (default: %(default)s)")
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
    if args.rate is not None and args.concurrency is not None:
        raise ConfigError(f"--concurrency={args.concurrency!r} and --rate={args.rate!r}: give one (closed loop: "
                          "--concurrency; open loop: --rate)")
    rates, sweep = parse_rates(args.rate) if args.rate is not None else ((), False)
    slo = None
    if args.slo:
        from gennstack.bench.slo import SLO

        slo = SLO.parse(args.slo)
    return BenchConfig(
        base_url=base_url,
        model=model,
        api_key=api_key,
        concurrency=parse_concurrency(args.concurrency or "1"),
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
        workload=Workload(kind=args.workload, turns=args.turns, think_time_s=args.think_time, num_prefixes=args.num_prefixes,
                          prefix_tokens=args.prefix_tokens, prefix_zipf=args.prefix_zipf),
        record_header=args.record_header,
        rates=rates, sweep=sweep, arrival=args.arrival, burstiness=args.burstiness, max_in_flight=args.max_in_flight,
        schedule_tolerance_s=args.schedule_tolerance, slo=slo, slo_target=args.slo_target, sweep_levels=args.sweep_levels,
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
    if args.rate is None and args.concurrency is None:
        args.rate = "sweep"
    try:
        config_from_args(args, base_url="http://127.0.0.1/v1", model="mock-model", api_key=None)  # validate first
        layout = layout_from_args(args)
    except ConfigError as exc:
        print(f"gennstack bench demo: error: {exc}", file=sys.stderr)
        return 2
    proc, base_url = start_mock_server(["--ttft", str(args.ttft), "--itl", str(args.itl),
                                        "--tokens-per-chunk", str(args.tokens_per_chunk),
                                        "--slowdown-per-stream", str(args.slowdown)])
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


def run_compare_routing(args: argparse.Namespace) -> int:
    from gennstack.bench import routing_compare as rc

    try:
        settings = rc.CompareSettings(
            backend=args.backend, replicas=args.replicas, runs=args.runs, seed=args.seed,
            rates=None if args.rates is None else rc.parse_rates(args.rates),
            conversations=args.conversations, turns=args.turns, think_time_s=args.think_time, prompt_tokens=args.prompt_tokens,
            max_tokens=args.max_tokens, shared_requests=args.shared_requests, num_prefixes=args.num_prefixes,
            prefix_tokens=args.prefix_tokens, prefix_zipf=args.prefix_zipf, question_tokens=args.question_tokens,
            slo=args.slo, hash_balance_factor=args.hash_balance_factor, kill=not args.no_kill,
            kill_conversations=args.kill_conversations, kill_after=args.kill_after, kill_turns=args.kill_turns,
            health_interval_s=args.health_interval)
        if args.update_readme is not None and rc.README_START not in args.update_readme.read_text(encoding="utf-8"):
            raise rc.CompareError(f"--update-readme={str(args.update_readme)!r}: no {rc.README_START} block in it")
        if args.from_result is not None:
            result = rc.load(args.from_result)
            result["targets"] = rc.targets(result)
        else:
            result = rc.compare(settings, args.work_dir, log=lambda line: print(line, flush=True))
    except (rc.CompareError, OSError) as exc:
        print(f"gennstack bench compare-routing: error: {exc}", file=sys.stderr)
        return 2
    table_path = rc.write(result, args.result)
    table = rc.markdown(result)
    print(table)
    if args.update_readme is not None:
        rc.update_readme(args.update_readme, table)
        print(f"updated {args.update_readme}")
    print(f"wrote {args.result} and {table_path}")
    return 0
