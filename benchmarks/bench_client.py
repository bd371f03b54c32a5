#!/usr/bin/env python3
"""Benchmark of the benchmark client itself (not a test): how much CPU ``gennstack bench``
spends per 1,000 streamed tokens, and the highest aggregate token rate one core sustains
before its measurements drift.

The mock server and the client run in separate processes, pinned to different cores with
``taskset`` when it is available (the server on core 1, the client on core 0). For each
offered load (concurrency x tokens/s per stream, one token per chunk: the costliest case),
the client runs one ``--duration`` level with a one-request ramp-up and reports:

* client CPU seconds (user + system, from ``getrusage``) per 1,000 tokens received;
* its CPU use as a fraction of one core;
* the error of its measured aggregate tokens/s, ITL and TTFT against the programmed truth.

"Drift" is any of: aggregate tokens/s or mean ITL off by more than 2 %, or mean TTFT off by
more than 10 ms. The server's own lateness (from ``/stats``) is reported so a point where the
server, not the client, fell behind is visible.

    python benchmarks/bench_client.py                  # the default sweep, about 2 minutes
    python benchmarks/bench_client.py --json out.json  # also write the table as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

TTFT_S = 0.1
TOKENS = 60
DRIFT_REL = 0.02
DRIFT_TTFT_S = 0.010


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def child(args: argparse.Namespace) -> None:
    """One level, in this (pinned) process; prints one JSON line."""
    from gennstack.bench.config import BenchConfig, Distribution
    from gennstack.bench.metrics import summarize_level
    from gennstack.bench.runner import run_level

    request_s = TTFT_S + (TOKENS - 1) * args.itl
    config = BenchConfig(base_url=args.base_url, model="mock", concurrency=(args.concurrency,),
                         prompt_tokens=Distribution("fixed", 32), max_tokens=Distribution("fixed", TOKENS),
                         duration_s=args.duration, ramp_up_s=request_s, warmup_s=0.5, stall_timeout_s=30)
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    run = asyncio.run(run_level(config, args.concurrency))
    wall = time.monotonic() - wall0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    level = summarize_level(run)
    tokens = sum(r.n_chunks for r in run.records)
    m = level["metrics"]
    print(json.dumps({
        "cpu_s": cpu, "wall_s": wall, "tokens": tokens,
        "aggregate": level["aggregate_output_tokens_per_s"], "aggregate_truth": args.concurrency * TOKENS / request_s,
        "itl": m["itl_s"]["mean"], "itl_truth": args.itl, "ttft": m["ttft_s"]["mean"],
        "gap_p99": m["chunk_gap_s"]["p99"], "failed": level["requests"]["failed"],
    }))


def run_point(concurrency: int, itl: float, duration: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    server = subprocess.Popen([*_pin(1), sys.executable, "-m", "gennstack.bench.mockserver", "--port", "0",
                               "--ttft", str(TTFT_S), "--itl", str(itl)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        base_url = re.search(r"(http://\S+/v1)", server.stdout.readline()).group(1)
        out = subprocess.run([*_pin(0), sys.executable, __file__, "--child", "--base-url", base_url,
                              "--concurrency", str(concurrency), "--itl", str(itl), "--duration", str(duration)],
                             capture_output=True, text=True, env=env, timeout=duration * 4 + 60, check=True)
        point = json.loads(out.stdout.strip().splitlines()[-1])
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats", timeout=10) as resp:
            point["server"] = json.loads(resp.read())
    finally:
        server.terminate()
        server.wait(timeout=10)
    point.update(concurrency=concurrency, per_stream=1 / itl, offered=concurrency / itl)
    point["cpu_per_1k_tokens_ms"] = point["cpu_s"] / point["tokens"] * 1e6 if point["tokens"] else None
    point["cpu_fraction"] = point["cpu_s"] / point["wall_s"]
    point["aggregate_err"] = point["aggregate"] / point["aggregate_truth"] - 1
    point["itl_err"] = point["itl"] / point["itl_truth"] - 1 if point["itl"] else None
    point["ttft_err_s"] = point["ttft"] - TTFT_S if point["ttft"] else None
    point["drift"] = (point["itl_err"] is None or abs(point["aggregate_err"]) > DRIFT_REL
                      or abs(point["itl_err"]) > DRIFT_REL or abs(point["ttft_err_s"]) > DRIFT_TTFT_S or point["failed"] > 0)
    return point


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--itl", type=float, default=0.05, help="seconds between tokens of one stream (default: %(default)s = 20 tok/s)")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per point (default: %(default)s)")
    parser.add_argument("--levels", default="50,100,200,300,400,500,600,800",
                        help="concurrency levels to offer (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the points as JSON here")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0

    pinned = "pinned with taskset (client core 0, server core 1)" if _pin(0) else "not pinned (no taskset or one core)"
    print(f"client benchmark: {TOKENS} tokens/request, 1 token/chunk, {1 / args.itl:g} tok/s per stream; {pinned}")
    header = (f"{'streams':>7} {'offered':>8} {'measured':>9} {'agg err':>8} {'ITL err':>8} {'TTFT err':>9} "
              f"{'gap p99':>8} {'CPU/1k tok':>10} {'client CPU':>10} {'srv late':>9}  drift")
    print(header)
    points = []
    for concurrency in (int(c) for c in args.levels.split(",")):
        p = run_point(concurrency, args.itl, args.duration)
        points.append(p)
        print(f"{concurrency:>7} {p['offered']:>8.0f} {p['aggregate']:>9.0f} {p['aggregate_err']:>+8.1%} "
              f"{(p['itl_err'] or 0):>+8.1%} {(p['ttft_err_s'] or 0) * 1000:>+7.1f}ms {(p['gap_p99'] or 0) * 1000:>6.1f}ms "
              f"{p['cpu_per_1k_tokens_ms']:>8.1f}ms {p['cpu_fraction']:>10.0%} {p['server']['mean_lateness_s'] * 1000:>7.2f}ms  "
              f"{'DRIFT' if p['drift'] else 'ok'}", flush=True)
    # sustained: the points before the first one that drifted
    first_drift = next((i for i, p in enumerate(points) if p["drift"]), len(points))
    steady = points[:first_drift]
    if steady:
        best = steady[-1]
        print(f"\nclient CPU per 1,000 streamed tokens: {min(p['cpu_per_1k_tokens_ms'] for p in steady):.0f}-"
              f"{max(p['cpu_per_1k_tokens_ms'] for p in steady):.0f} ms over the steady points "
              f"(lower at higher load: fixed per-second costs are shared by more tokens)")
        print(f"highest aggregate rate one core sustained before drift: {best['aggregate']:.0f} tokens/s "
              f"({best['concurrency']} streams x {best['per_stream']:g} tok/s, client at {best['cpu_fraction']:.0%} of a core)")
    if first_drift < len(points):
        print(f"first drift at {points[first_drift]['concurrency']} streams ({points[first_drift]['offered']:.0f} tokens/s offered)")
    if args.json:
        args.json.write_text(json.dumps(points, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
