#!/usr/bin/env python3
"""Benchmark of the resume relay's cost (not a test), two parts:

1. **Added latency**: ``gennstack bench`` at concurrency 200 against one mock model server (250 ms TTFT,
   40 ms ITL) through ``gennstack gateway local --no-resume`` and through ``gennstack gateway local`` (resume
   on: the relay between the front and the routing listener), side by side in one run: rounds alternate off /
   on so that the machine's load drifts over both alike. Added = the difference of the pooled percentiles.
2. **Relay throughput**: one relay process (one asyncio loop: one core) directly in front of a mock that
   streams as fast as it can; streamed tokens it relayed divided by the CPU seconds the relay process used
   (from /proc/<pid>/stat), so the number is tokens/s of one core however loaded the machine is.

What runs where: every server, the gateways and each ``gennstack bench`` are processes of their own on this
machine. On a shared machine the latency numbers move with everything else running there: read them with
the run's ``cpus`` and ``loadavg`` in the output.

    .venv/bin/python benchmarks/bench_resume_relay.py               # ~3 minutes
    .venv/bin/python benchmarks/bench_resume_relay.py --rounds 2 --duration 15
    .venv/bin/python benchmarks/bench_resume_relay.py --rate 80 --output benchmarks/results/resume_relay_poisson.json
    .venv/bin/python benchmarks/bench_resume_relay.py --pin    # client and mock on CPU 0, the gateways on CPU 1

``--pin``: unpinned, the client, the mock, both Envoys and the relay compete for two CPUs, so the resume
side also measures the client and the mock slowed by the relay's CPU; pinned, the client and the mock
share CPU 0 on both sides alike and the gateways (Envoy, the relay) run on CPU 1.

Writes ``benchmarks/results/resume_relay.json`` and prints a markdown table. Targets (issue 30): TTFT p50
<= 2 ms, p90 <= 5 ms and ITL p50 <= 0.5 ms added, nothing failing.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

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


def _bench(base_url: str, out: Path, args: argparse.Namespace) -> tuple[dict[str, list[float]], int, int]:
    load = (["--rate", str(args.rate), "--arrival", "poisson", "--max-in-flight", str(args.concurrency)] if args.rate
            else ["--concurrency", str(args.concurrency)])
    cmd = [*_on(args.client_cpu), sys.executable, "-m", "gennstack.cli", "bench", "--base-url", base_url, "--model", MODEL, *load,
           "--duration", str(args.duration), "--max-tokens", str(args.max_tokens),
           "--prompt-tokens", "256", "--warmup-seconds", "2", "--no-progress", "--output-dir", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO_ROOT)
    got: dict[str, list[float]] = {"ttft_s": [], "itl_s": []}
    failed = total = 0
    with (out / "requests.csv").open() as fh:
        for row in csv.DictReader(fh):
            if row.get("warmup") in ("1", "True", "true"):
                continue  # the first connections through each hop: excluded on both sides
            total += 1
            failed += row.get("status") == "failed"
            for key in got:
                if row.get(key):
                    got[key].append(float(row[key]))
    return got, failed, total


def _gateway(port: int, admin_port: int, mock_port: int, resume: bool, env: dict, cpu: int | None) -> subprocess.Popen:
    cmd = [*_on(cpu), sys.executable, "-m", "gennstack.cli", "gateway", "local", "--port", str(port), "--admin-port", str(admin_port),
           "--rate-limit", "0", "--endpoint", f"{MODEL}=http://127.0.0.1:{mock_port}/v1"]
    cmd += ["--resume-port", str(admin_port + 1)] if resume else ["--no-resume"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _relay_pid(gateway_pid: int) -> int:
    """The relay process `gennstack gateway local` started (its child running `resume serve`)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{gateway_pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                if b"resume" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
        time.sleep(0.2)
    raise RuntimeError("no relay process under the resume-on gateway")


def relay_throughput(streams: int, seconds: float, env: dict) -> dict[str, float]:
    """Tokens per CPU-second of one relay process, streams of 1-token chunks as fast as the mock sends them."""
    mock_port = free_ports(2)
    relay_port = mock_port + 1
    mock = subprocess.Popen([sys.executable, "-m", "gennstack.cli", "bench", "mock-server", "--port", str(mock_port),
                             "--ttft", "0", "--itl", "0", "--model-name", MODEL],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "resume.json"
        config.write_text(json.dumps({"models": {MODEL: {}}}))
        relay = subprocess.Popen([sys.executable, "-m", "gennstack.cli", "resume", "serve", "--listen", f"127.0.0.1:{relay_port}",
                                  "--upstream", f"http://127.0.0.1:{mock_port}", "--config", str(config)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        try:
            wait_http(f"http://127.0.0.1:{mock_port}/health", 60)
            wait_http(f"http://127.0.0.1:{relay_port}/healthz", 60)
            tokens = 0

            async def one(session: aiohttp.ClientSession, deadline: float) -> None:
                nonlocal tokens
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500, "stream": True}
                while time.monotonic() < deadline:
                    async with session.post(f"http://127.0.0.1:{relay_port}/v1/chat/completions", json=body) as resp:
                        async for line in resp.content:
                            if line.startswith(b"data: {") and b'"content":" w' in line:
                                tokens += 1

            async def run() -> None:
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                    deadline = time.monotonic() + seconds
                    await asyncio.gather(*(one(session, deadline) for _ in range(streams)))

            cpu0, wall0 = _cpu_s(relay.pid), time.monotonic()
            asyncio.run(run())
            cpu, wall = _cpu_s(relay.pid) - cpu0, time.monotonic() - wall0
        finally:
            for proc in (relay, mock):
                proc.terminate()
                proc.wait(timeout=30)
    return {"tokens": tokens, "relay_cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "tokens_per_cpu_s": round(tokens / cpu) if cpu else 0.0, "tokens_per_wall_s": round(tokens / wall)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per round (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=200, help="closed loop: this many workers; with --rate: "
                        "the most requests in flight (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=None, help="open loop instead: Poisson arrivals at this many "
                        "requests/s (the closed loop's workers start in waves: every stream is as long)")
    parser.add_argument("--max-tokens", type=int, default=50)
    parser.add_argument("--throughput-streams", type=int, default=64)
    parser.add_argument("--throughput-seconds", type=float, default=15.0)
    parser.add_argument("--pin", action="store_true",
                        help="the client and the mock on CPU 0, the gateways on CPU 1 (needs taskset and 2 CPUs)")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "resume_relay.json")
    args = parser.parse_args(argv)
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs 2 CPUs")
    args.client_cpu, gateway_cpu = (0, 1) if args.pin else (None, None)

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    mock_port = free_ports(8)
    mock = subprocess.Popen([*_on(args.client_cpu), sys.executable, "-m", "gennstack.cli", "bench", "mock-server", "--port", str(mock_port),
                             "--ttft", str(TTFT_S), "--itl", str(ITL_S), "--model-name", MODEL],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    gateways = []
    pooled = {side: {"ttft_s": [], "itl_s": []} for side in ("off", "on")}
    failures = {"off": 0, "on": 0}
    requests = {"off": 0, "on": 0}
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health", 60)
        sides = {}
        for i, side in enumerate(("off", "on")):
            port = mock_port + 1 + 3 * i
            gateways.append(_gateway(port, port + 1, mock_port, side == "on", env, gateway_cpu))
            wait_http(f"http://127.0.0.1:{port + 1}/ready", 60)
            sides[side] = f"http://127.0.0.1:{port}/v1"
        relay_pid = _relay_pid(gateways[1].pid)
        relay_cpu = 0.0
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for side, url in sides.items():
                    cpu0 = _cpu_s(relay_pid)
                    got, failed, total = _bench(url, Path(tmp) / f"{side}-{r}", args)
                    if side == "on":
                        relay_cpu += _cpu_s(relay_pid) - cpu0
                    failures[side] += failed
                    requests[side] += total
                    for key, values in got.items():
                        pooled[side][key] += values
    finally:
        for proc in (*gateways, mock):
            proc.terminate()
            proc.wait(timeout=30)
    throughput = relay_throughput(args.throughput_streams, args.throughput_seconds, env)

    def summary(side: str, key: str) -> dict[str, float]:
        values = pooled[side][key]
        return {f"p{p}": _percentile(values, p) * 1000 for p in (50, 90, 99)} | {"n": len(values)}

    result = {
        "what": f"gennstack bench, {f'Poisson arrivals at {args.rate:g} requests/s' if args.rate else f'concurrency {args.concurrency}'}, "
                f"{args.max_tokens} tokens, mock TTFT {TTFT_S * 1000:g} ms "
                f"ITL {ITL_S * 1000:g} ms; gennstack gateway local --no-resume vs resume on (the relay between two Envoy "
                f"listeners), {'client and mock on CPU 0, gateways on CPU 1, ' if args.pin else ''}{args.rounds} alternating rounds of {args.duration:g} s each",
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "python": platform.python_version()},
        "ms": {side: {key: summary(side, key) for key in ("ttft_s", "itl_s")} for side in pooled},
        "requests": requests, "failed": failures,
        # the relay's own CPU in the resume-on rounds: its cost per request, streamed tokens included
        "relay_cpu_ms_per_request": round(relay_cpu * 1000 / max(1, requests["on"]), 3),
        "relay_throughput": throughput,
    }
    result["added_ms"] = {key: {p: result["ms"]["on"][key][p] - result["ms"]["off"][key][p] for p in ("p50", "p90", "p99")}
                          for key in ("ttft_s", "itl_s")}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"{result['what']}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    print("| metric | resume off p50/p90/p99 (ms) | resume on p50/p90/p99 (ms) | added p50/p90/p99 (ms) |\n|---|---|---|---|")
    for key in ("ttft_s", "itl_s"):
        d, g, a = result["ms"]["off"][key], result["ms"]["on"][key], result["added_ms"][key]
        fmt = lambda x: "/".join(f"{x[p]:.2f}" for p in ("p50", "p90", "p99"))  # noqa: E731
        print(f"| {key[:-2].upper()} | {fmt(d)} | {fmt(g)} | {fmt(a)} |")
    print(f"\nrequests off/on: {requests['off']}/{requests['on']}, failed: {failures['off']}/{failures['on']}")
    print(f"relay CPU per request in the bench (50 tokens): {result['relay_cpu_ms_per_request']} ms")
    print(f"relay: {throughput['tokens_per_cpu_s']} streamed tokens per CPU-second ({throughput})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
