#!/usr/bin/env python3
"""Benchmark of the open-loop client itself (not a test): the highest request rate, and the streams it then holds,
that one client process on one core sends on its schedule.

The mock server and the client run in separate processes, pinned to different cores with ``taskset`` when it is
available (the server on core 1, the client on core 0), as in benchmarks/bench_client.py. Each point is one
open-loop ``--duration`` level at a Poisson rate (seed 0), every request 60 tokens at 20 tokens/s with one token a
chunk (the costliest case) after a 0.1 s TTFT, so a request lasts 3.05 s and the client holds about 3.05 x rate
streams. A point keeps its schedule when at most 1 % of its requests go out more than the tolerance (10 ms,
``--schedule-tolerance``'s default) after they were due and none is left unsent; the server's own lateness (its
``/stats``) is reported so that a point where the server, not the client, fell behind is visible.

    python benchmarks/bench_openloop_client.py                   # the default ladder, about 2 minutes
    python benchmarks/bench_openloop_client.py --json out.json   # also write the points as JSON
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
ITL_S = 0.05
TOKENS = 60
TOLERANCE_S = 0.010
LATE_SHARE = 0.01


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def child(args: argparse.Namespace) -> None:
    """One open-loop level, in this (pinned) process; prints one JSON line."""
    from gennstack.bench.config import BenchConfig, Distribution
    from gennstack.bench.metrics import summarize_level
    from gennstack.bench.runner import run_rate_level

    config = BenchConfig(base_url=args.base_url, model="mock", concurrency=(1,), prompt_tokens=Distribution("fixed", 32),
                         max_tokens=Distribution("fixed", TOKENS), duration_s=args.duration, warmup_s=1.0,
                         stall_timeout_s=30, rates=(args.rate,), max_in_flight=4096, schedule_tolerance_s=TOLERANCE_S)
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    run = asyncio.run(run_rate_level(config, args.rate))
    wall = time.monotonic() - wall0
    after = resource.getrusage(resource.RUSAGE_SELF)
    level = summarize_level(run, tolerance_s=TOLERANCE_S)
    s = level["schedule"]
    print(json.dumps({
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "wall_s": wall,
        "schedule": s, "failed": level["requests"]["failed"], "ttft_mean": level["metrics"]["ttft_s"]["mean"],
        "aggregate": level["aggregate_output_tokens_per_s"],
    }))


def run_point(rate: float, duration: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    server = subprocess.Popen([*_pin(1), sys.executable, "-m", "gennstack.bench.mockserver", "--port", "0",
                               "--ttft", str(TTFT_S), "--itl", str(ITL_S)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        base_url = re.search(r"(http://\S+/v1)", server.stdout.readline()).group(1)
        out = subprocess.run([*_pin(0), sys.executable, __file__, "--child", "--base-url", base_url, "--rate", str(rate),
                              "--duration", str(duration)], capture_output=True, text=True, env=env,
                             timeout=duration * 4 + 60, check=True)
        point = json.loads(out.stdout.strip().splitlines()[-1])
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats", timeout=10) as resp:
            point["server"] = json.loads(resp.read())
    finally:
        server.terminate()
        server.wait(timeout=10)
    s = point["schedule"]
    point.update(rate=rate, cpu_fraction=point["cpu_s"] / point["wall_s"])
    point["kept"] = (s["late_share"] or 0) <= LATE_SHARE and s["not_sent"] == 0 and point["failed"] == 0
    return point


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per point (default: %(default)s)")
    parser.add_argument("--rates", default="10,25,50,75,100,150,200", help="requests/s to offer (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the points as JSON here")
    args = parser.parse_args()
    if args.child:
        child(args)
        return 0
    pinned = "pinned with taskset (client core 0, server core 1)" if _pin(0) else "not pinned (no taskset or one core)"
    request_s = TTFT_S + (TOKENS - 1) * ITL_S
    print(f"open-loop client benchmark: Poisson arrivals, {TOKENS} tokens/request at {1 / ITL_S:g} tok/s, 1 token/chunk, "
          f"{request_s:.2f} s per request; late: sent > {TOLERANCE_S * 1000:g} ms after due; {pinned}")
    print(f"{'rate/s':>7} {'streams':>8} {'tok/s':>7} {'sent':>6} {'late':>6} {'not sent':>8} {'lag p50':>8} {'lag p99':>8} "
          f"{'lag max':>8} {'client CPU':>10} {'srv late':>9}  schedule")
    points = []
    for rate in (float(r) for r in args.rates.split(",")):
        p = run_point(rate, args.duration)
        points.append(p)
        s = p["schedule"]
        print(f"{rate:>7g} {s['peak_in_flight']:>8} {p['aggregate']:>7.0f} {s['sent']:>6} {s['late_share']:>6.1%} "
              f"{s['not_sent']:>8} {s['lag_s']['p50'] * 1000:>6.1f}ms {s['lag_s']['p99'] * 1000:>6.1f}ms "
              f"{s['lag_s']['max'] * 1000:>6.1f}ms {p['cpu_fraction']:>10.0%} {p['server']['mean_lateness_s'] * 1000:>7.2f}ms  "
              f"{'kept' if p['kept'] else 'BEHIND'}", flush=True)
    first_behind = next((i for i, p in enumerate(points) if not p["kept"]), len(points))
    if first_behind:
        best = points[first_behind - 1]
        print(f"\nhighest rate one core kept on schedule: {best['rate']:g} requests/s, {best['schedule']['peak_in_flight']} "
              f"streams at the peak, {best['aggregate']:.0f} tokens/s, client at {best['cpu_fraction']:.0%} of a core")
    if first_behind < len(points):
        print(f"first point behind its schedule: {points[first_behind]['rate']:g} requests/s")
    if args.json:
        args.json.write_text(json.dumps(points, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
