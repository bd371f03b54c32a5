"""``gennstack bench compare-routing``: least-request against prefix-aware routing, measured on this machine.

What runs, all on 127.0.0.1:

* ``replicas`` model servers: SmolLM2-135M-Instruct on llama-cpp-python's OpenAI-compatible server (the
  gateway's ``--demo`` backend, with its prompt cache on: ``--cache True``, a ``LlamaRAMCache`` that keeps
  the state of several earlier prompts, not only the last one), or, for tests, mock servers with the
  simulated prefix cache of :mod:`gennstack.bench.mockserver`;
* the local gateway (real Envoy, :mod:`gennstack.gateway.local`) in front of them as the one model
  ``gpt-oss-20b`` (a gen3/g6e model, the generation whose routing is configurable), its routing set
  through :class:`gennstack.gateway.config.RoutingConfig`: ``least_request`` (Envoy Gateway's default) or
  ``prefix`` (consistent hash with bounded load on the prompt's leading messages);
* ``gennstack bench`` through the gateway: the ``multi-turn`` workload (the TTFT target), then the
  ``shared-prefix`` workload with a Zipf-skewed choice of system prompt (the share target).

Each policy runs ``runs`` times with fresh servers (cold caches), the same seeds in the same order, so
both see the same prompts. Per run: TTFT p50/p90, end-to-end p50, aggregate tokens/s, requests/s from
the bench; per replica its share of the chat requests and its prefix-cache hit rate, from the server
itself (:func:`parse_llama_server_log`: llama-cpp-python's own log; the mock's ``/stats``). Then, with
prefix routing, one replica is killed in the middle of a multi-turn run: what failed, and whether the
conversations went on.

Results: ``--result`` (default ``benchmarks/results/prefix_routing_local.json``) and the table the README
shows, with the machine it ran on, beside it (``.md``); every run's bench output and server logs under
``--work-dir`` (default ``bench-results/compare-routing``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import platform
import signal
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from gennstack.bench.config import BenchConfig, Distribution, Workload

MODEL = "gpt-oss-20b"  # the gateway's gen3 (g6e) model: the generation whose routing GatewayConfig sets
GENERATION = "g6e"
POLICIES = ("least_request", "prefix")  # gennstack.gateway.config.RoutingMode
UPSTREAM_HEADER = "x-gennstack-upstream-host"  # the replica that answered, from the local gateway
RESULT_FILE = Path("benchmarks") / "results" / "prefix_routing_local.json"
README_START = "<!-- prefix-routing:start -->"
README_END = "<!-- prefix-routing:end -->"
SCHEMA = "gennstack-routing-compare/1"


class CompareError(Exception):
    """A comparison that could not run; the message says why."""


@dataclass(frozen=True)
class CompareSettings:
    backend: str = "llama"  # llama (SmolLM2 on llama-cpp-python) or mock
    replicas: int = 3
    runs: int = 3
    seed: int = 0
    # multi-turn: `conversations` at a time, `turns` each, `think_time_s` between an answer and the next turn
    conversations: int = 4
    turns: int = 4
    think_time_s: float = 1.0
    prompt_tokens: int = 60
    max_tokens: int = 16
    # shared-prefix: `shared_requests` requests at `shared_concurrency`, `num_prefixes` system prompts of
    # `prefix_tokens`, Zipf exponent `prefix_zipf`
    shared_requests: int = 12
    shared_concurrency: int = 3
    num_prefixes: int = 8
    prefix_tokens: int = 300
    prefix_zipf: float = 1.1
    question_tokens: int = 24
    # the kill drill: prefix routing; once the servers have served `kill_after` of a multi-turn run of `kill_turns`
    # turns per conversation, the replica that served the most of it is killed
    kill: bool = True
    kill_after: float = 0.5
    kill_turns: int = 6
    health_interval_s: int = 5  # the gateway's default (ResilienceConfig.health_interval_s)

    def __post_init__(self) -> None:
        checks = {
            "--backend": (self.backend in ("llama", "mock"), "llama or mock"),
            "--replicas": (2 <= self.replicas <= 8, "2 to 8"),
            "--runs": (1 <= self.runs <= 20, "1 to 20"),
            "--conversations": (self.conversations >= 1, "at least 1"),
            "--turns": (self.turns >= 2, "at least 2 (turn 1 is the cold one)"),
            "--think-time": (self.think_time_s >= 0, "0 or more seconds"),
            "--prompt-tokens": (self.prompt_tokens >= 1, "at least 1"),
            "--max-tokens": (self.max_tokens >= 1, "at least 1"),
            "--shared-requests": (self.shared_requests >= 1, "at least 1"),
            "--shared-concurrency": (self.shared_concurrency >= 1, "at least 1"),
            "--num-prefixes": (self.num_prefixes >= 1, "at least 1"),
            "--prefix-tokens": (self.prefix_tokens >= 1, "at least 1"),
            "--prefix-zipf": (math.isfinite(self.prefix_zipf) and self.prefix_zipf >= 0, "a finite number >= 0"),
            "--kill-after": (0 < self.kill_after < 1, "a fraction of the run's requests between 0 and 1"),
            "--kill-turns": (self.kill_turns >= 2, "at least 2"),
        }
        for flag, (ok, allowed) in checks.items():
            if not ok:
                value = {"--backend": self.backend, "--replicas": self.replicas, "--runs": self.runs,
                         "--conversations": self.conversations, "--turns": self.turns, "--think-time": self.think_time_s,
                         "--prompt-tokens": self.prompt_tokens, "--max-tokens": self.max_tokens,
                         "--shared-requests": self.shared_requests, "--shared-concurrency": self.shared_concurrency,
                         "--num-prefixes": self.num_prefixes, "--prefix-tokens": self.prefix_tokens,
                         "--prefix-zipf": self.prefix_zipf, "--kill-after": self.kill_after, "--kill-turns": self.kill_turns}[flag]
                raise CompareError(f"{flag}={value!r}: must be {allowed}")


# ---- replicas -------------------------------------------------------------------------------------

@dataclass
class Counters:
    """What a server says it did: chat requests, prompt tokens, and those of them served from its cache."""

    chat_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def minus(self, other: Counters) -> Counters:
        return Counters(self.chat_requests - other.chat_requests, self.prompt_tokens - other.prompt_tokens,
                        self.cached_tokens - other.cached_tokens)


class LlamaReplica:
    """One replica of gennstack.gateway.demo (SmolLM2 on llama-cpp-python, its RAM prompt cache on); its
    counters from its own log (gennstack.gateway.demo.cache_stats: the access log and llama-cpp-python
    0.3.36's ``Llama.generate: N prefix-match hit, remaining M prompt tokens to eval``, so the prompt tokens
    counted are those of completions that printed that line, every one but a server's first)."""

    def __init__(self, replica) -> None:
        self.replica = replica
        self.name = replica.address
        self.base_url = replica.url

    def counters(self) -> Counters:
        stats = self.replica.cache_stats()
        return Counters(stats.requests, stats.reused_tokens + stats.evaluated_tokens, stats.reused_tokens)

    def kill(self) -> None:
        if self.replica.process.poll() is None:
            os.killpg(self.replica.process.pid, signal.SIGKILL)
            self.replica.process.wait(timeout=10)


class MockReplica:
    """A mock server (its simulated prefix cache on); counters from its ``/stats`` (words for tokens)."""

    FLAGS = ("--ttft", "0.01", "--itl", "0.004", "--prefix-cache-entries", "64", "--prefill-per-token", "0.0004")

    def __init__(self) -> None:
        from gennstack.bench.mockserver import start_process

        self.server = start_process(*self.FLAGS)
        self.base_url = self.server.base_url
        self.name = f"{self.server.host}:{self.server.port}"  # as the gateway's x-gennstack-upstream-host names it

    def counters(self) -> Counters:
        stats = self.server.stats()
        return Counters(stats["chat_requests"], stats["prompt_words"], stats["cached_prompt_words"])

    def kill(self) -> None:
        self.server.kill()

    def stop(self) -> None:
        self.server.stop()


# ---- the fleet: replicas behind the local gateway -------------------------------------------------

def prefix_routing_available() -> bool:
    from gennstack.gateway.config import GatewayConfig

    return "routing" in GatewayConfig.model_fields


@dataclass
class Fleet:
    policy: str
    replicas: list
    base_url: str

    def counters(self) -> list[Counters]:
        return [r.counters() for r in self.replicas]


MOCK_HEALTH_PATH = "/v1/models"


@contextlib.contextmanager
def start_fleet(settings: CompareSettings, policy: str, workdir: Path) -> Iterator[Fleet]:
    """The replicas behind the local gateway with ``policy``, as gennstack.gateway.demo.demo_gateway builds it
    (its start_replicas, wait_ready and with_routing; every model served by the replicas, health checks on
    its LLAMA_HEALTH_PATH), with this comparison's health interval and, for mock replicas, their path."""
    from gennstack.config_base import frozen
    from gennstack.gateway.config import GatewayConfig, routing_table
    from gennstack.gateway.demo import LLAMA_HEALTH_PATH, free_ports, start_replicas, wait_ready, with_routing
    from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap

    workdir.mkdir(parents=True, exist_ok=True)
    health = LLAMA_HEALTH_PATH if settings.backend == "llama" else MOCK_HEALTH_PATH
    data = with_routing(frozen({"resilience": {"health_interval_s": settings.health_interval_s, "health_path": health}}), policy)
    config = GatewayConfig.model_validate(data)
    table = routing_table(config)
    replicas: list = []
    started: list = []
    try:
        if settings.backend == "llama":
            try:
                started = start_replicas(settings.replicas, free_ports(settings.replicas), workdir)
                wait_ready(started)
            except (RuntimeError, TimeoutError, ValueError) as exc:
                raise CompareError(f"the demo replicas did not start: {exc}") from None
            replicas = [LlamaReplica(r) for r in started]
        else:
            replicas = [MockReplica() for _ in range(settings.replicas)]
        endpoints = {name: [r.base_url for r in replicas] for name in table.backends}
        bootstrap = envoy_bootstrap(table, endpoints, config, LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0))
        with LocalGateway.start(bootstrap, log_file=workdir / "envoy.log") as gw:
            gw.wait_healthy(60)
            warm_up(replicas)
            yield Fleet(policy, replicas, gw.base_url)
    finally:
        for replica in started:
            replica.stop()
        for replica in replicas:
            if isinstance(replica, MockReplica):
                replica.stop()


def warm_up(replicas: Sequence) -> None:
    """Two short requests to each server directly, outside any measurement: a server's first request loads
    its weights into memory and prints no cache line (LlamaReplica.counters)."""
    body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 4, "stream": False}).encode()
    for replica in replicas:
        for _ in range(2):  # the second one prints its hit line: the counters start from a settled server
            request = urllib.request.Request(replica.base_url + "/chat/completions", data=body, method="POST",
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as resp:
                resp.read()


# ---- one measured bench run --------------------------------------------------------------------------

def bench_config(settings: CompareSettings, base_url: str, workload: str, seed: int) -> BenchConfig:
    if workload == "multi-turn":
        load = Workload(kind="multi-turn", turns=settings.turns, think_time_s=settings.think_time_s)
        concurrency, requests = settings.conversations, settings.conversations * settings.turns
        prompt = settings.prompt_tokens
    elif workload == "shared-prefix":
        load = Workload(kind="shared-prefix", num_prefixes=settings.num_prefixes, prefix_tokens=settings.prefix_tokens,
                        prefix_zipf=settings.prefix_zipf)
        concurrency, requests, prompt = settings.shared_concurrency, settings.shared_requests, settings.question_tokens
    else:  # the kill drill: longer conversations, so that they outlive the kill
        load = Workload(kind="multi-turn", turns=settings.kill_turns, think_time_s=settings.think_time_s)
        concurrency, requests = settings.conversations, settings.conversations * settings.kill_turns
        prompt = settings.prompt_tokens
    return BenchConfig(
        base_url=base_url, model=MODEL, concurrency=(concurrency,),
        prompt_tokens=Distribution.parse(str(prompt), option="--prompt-tokens"),
        max_tokens=Distribution.parse(str(settings.max_tokens), option="--max-tokens"),
        num_requests=requests, warmup_requests=0, request_timeout_s=300.0, stall_timeout_s=120.0,
        seed=seed, workload=load, record_header=UPSTREAM_HEADER, extra_body={"temperature": 0},
    )


def run_bench(config: BenchConfig, out: Path) -> dict:
    from rich.console import Console

    from gennstack.bench.run import execute

    quiet = Console(file=io.StringIO(), width=120)
    command = ["gennstack", "bench", "compare-routing", "(inner run)", config.workload.kind]
    _, result, _ = execute(config, output_dir=out, command=command, progress=False, console=quiet)
    return result


def replica_rows(names: Sequence[str], deltas: Sequence[Counters], upstreams: dict[str, int] | None) -> list[dict]:
    """Per replica: its share of the run's requests (from the gateway's x-gennstack-upstream-host on each answer;
    from the server's own count where no answer carried it) and its cache hit rate (cached / prompt tokens, from
    the server)."""
    by_header = upstreams is not None and any(upstreams.get(name) for name in names)
    served = [upstreams.get(name, 0) if by_header else d.chat_requests for name, d in zip(names, deltas)]
    total = sum(served)
    rows = []
    for name, d, n in zip(names, deltas, served):
        rows.append({"replica": name, "requests": n, "share": n / total if total else None,
                     "server_chat_requests": d.chat_requests, "prompt_tokens": d.prompt_tokens,
                     "cached_tokens": d.cached_tokens,
                     "cache_hit_rate": d.cached_tokens / d.prompt_tokens if d.prompt_tokens else None})
    return rows


def run_summary(result: dict, replicas: list[dict]) -> dict:
    level = result["levels"][0]
    m = level["metrics"]
    block = level.get("workload") or {}
    turns = block.get("turns") or []
    shares = [r["share"] for r in replicas if r["share"] is not None]
    mean_share = 1 / len(replicas) if replicas else None
    return {
        "ttft_p50_s": m["ttft_s"]["p50"], "ttft_p90_s": m["ttft_s"]["p90"],
        "turn1_ttft_p50_s": turns[0]["ttft_s"]["p50"] if turns else None,
        "later_turns_ttft_p50_s": (block.get("later_turns_ttft_s") or {}).get("p50"),
        "e2e_p50_s": m["e2e_s"]["p50"],
        "aggregate_output_tokens_per_s": level["aggregate_output_tokens_per_s"],
        "requests_per_s": level["requests_per_s"],
        "completed": level["requests"]["completed"], "failed": level["requests"]["failed"],
        "max_share_over_mean": (max(shares) / mean_share) if shares and mean_share else None,
        "replicas": replicas,
        "upstreams": level.get("upstreams"),
    }


def measured_run(fleet: Fleet, settings: CompareSettings, workload: str, seed: int, out: Path) -> dict:
    before = fleet.counters()
    result = run_bench(bench_config(settings, fleet.base_url, workload, seed), out)
    after = fleet.counters()
    rows = replica_rows([r.name for r in fleet.replicas], [a.minus(b) for a, b in zip(after, before)],
                        result["levels"][0].get("upstreams"))
    return run_summary(result, rows)


# ---- the kill drill ----------------------------------------------------------------------------------

def kill_drill(settings: CompareSettings, workdir: Path, seed: int) -> dict:
    """Prefix routing; once the servers have counted ``kill_after`` of the run's requests, the replica that served
    the most of them is killed (SIGKILL, as a node that is gone). Which requests failed, when, and whether the
    conversations it served went on elsewhere."""
    with start_fleet(settings, "prefix", workdir / "fleet") as fleet:
        config = bench_config(settings, fleet.base_url, "kill", seed)
        threshold = math.ceil(settings.kill_after * config.num_requests)
        before = fleet.counters()
        killed: dict = {}
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.05):
                served = [now.minus(then).chat_requests for now, then in zip(fleet.counters(), before)]
                if sum(served) >= threshold:
                    victim = fleet.replicas[max(range(len(served)), key=served.__getitem__)]
                    killed.update(wall=time.time(), victim=victim)
                    victim.kill()
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            result = run_bench(config, workdir / "bench")
        finally:
            done.set()
            watcher.join(timeout=10)
    if "wall" not in killed:
        raise CompareError(f"the kill drill's run ended before the servers counted {threshold} requests")
    killed_at, victim = killed, killed["victim"]
    level = result["levels"][0]
    kill_s = killed_at["wall"] - level["started_at_unix"]
    with (workdir / "bench" / "requests.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    failed = [r for r in rows if r["status"] == "failed"]
    after = [r for r in rows if float(r["send_s"]) > kill_s]
    late = [r for r in after if float(r["send_s"]) > kill_s + settings.health_interval_s]
    conversations_after = {r["conversation"] for r in after}
    finished = {c for c in conversations_after
                if all(r["status"] == "completed" for r in after if r["conversation"] == c and float(r["send_s"]) > kill_s
                       + settings.health_interval_s)}
    # conversations the victim served before the kill, and where their turns after it went
    on_victim = {r["conversation"] for r in rows if r["upstream"] == victim.name and float(r["send_s"]) <= kill_s}
    on_victim &= conversations_after  # those that had turns left to send
    moved = [r for r in after if r["conversation"] in on_victim and r["status"] == "completed"]
    first_after = {}
    for r in sorted(moved, key=lambda r: float(r["send_s"])):
        first_after.setdefault(r["conversation"], r)
    return {
        "killed": victim.name, "kill_s": kill_s, "health_interval_s": settings.health_interval_s,
        "requests": len(rows), "failed": len(failed),
        "failed_by_class": {k: sum(1 for r in failed if r["error_class"] == k) for k in sorted({r["error_class"] for r in failed})},
        "failed_send_s": [round(float(r["send_s"]), 3) for r in failed],
        "sent_after_kill": len(after), "failed_after_kill": sum(1 for r in after if r["status"] == "failed"),
        "sent_after_one_interval": len(late), "failed_after_one_interval": sum(1 for r in late if r["status"] == "failed"),
        "conversations_after_kill": len(conversations_after), "conversations_all_later_turns_completed": len(finished),
        "victim_conversations": len(on_victim),
        "victim_conversations_moved": len({r["conversation"] for r in moved if r["upstream"] and r["upstream"] != victim.name}),
        "victim_conversations_completed_after": len({c for c in on_victim if c in finished}),
        "first_turn_after_move_ttft_p50_s": median([float(r["ttft_s"]) for r in first_after.values() if r["ttft_s"]]),
        "turns_before_kill_ttft_p50_s": median([float(r["ttft_s"]) for r in rows if r["ttft_s"] and r["turn"] != "1"
                                                and float(r["send_s"]) <= kill_s]),
        "upstreams": level.get("upstreams"),
    }


# ---- the whole comparison ------------------------------------------------------------------------------

def machine() -> dict:
    """The machine it ran on: cores, CPU model, memory, load before the run (``/proc``)."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {"cores": os.cpu_count(), "cpu_model": model, "memory_gib": memory,
            "load_average_1m": round(os.getloadavg()[0], 2), "python": platform.python_version()}


def median(values: Sequence[float | None]) -> float | None:
    data = [v for v in values if v is not None]
    return statistics.median(data) if data else None


def aggregate(runs: list[dict]) -> dict:
    """Medians over the runs. Replicas are fresh servers in every run, so they are compared by rank: per run the
    busiest first, then the median share and cache hit rate of each rank."""
    keys = ("ttft_p50_s", "ttft_p90_s", "turn1_ttft_p50_s", "later_turns_ttft_p50_s", "e2e_p50_s",
            "aggregate_output_tokens_per_s", "requests_per_s", "max_share_over_mean", "cache_hit_rate")
    for r in runs:
        prompt = sum(row["prompt_tokens"] for row in r["replicas"])
        r["cache_hit_rate"] = sum(row["cached_tokens"] for row in r["replicas"]) / prompt if prompt else None
    out = {key: median([r[key] for r in runs]) for key in keys}
    out["failed"] = sum(r["failed"] for r in runs)
    ranked = [sorted(r["replicas"], key=lambda row: -(row["requests"] or 0)) for r in runs]
    out["replicas"] = [{"rank": i + 1,
                        "share": median([rows[i]["share"] for rows in ranked]),
                        "cache_hit_rate": median([rows[i]["cache_hit_rate"] for rows in ranked])}
                       for i in range(len(ranked[0]))]
    return out


def targets(results: dict) -> dict:
    """The issue's targets, from the medians: multi-turn TTFT p50 at least 2x lower with prefix routing; no replica
    above 1.25x the mean share on the skewed shared prefix; after a kill nothing fails past one health interval."""
    mt = results["policies"]
    out = {}
    lr, pa = mt["least_request"]["multi-turn"]["ttft_p50_s"], (mt.get("prefix") or {}).get("multi-turn", {}).get("ttft_p50_s")
    out["multi_turn_ttft_p50_speedup"] = (lr / pa) if lr and pa else None
    out["multi_turn_ttft_met"] = out["multi_turn_ttft_p50_speedup"] is not None and out["multi_turn_ttft_p50_speedup"] >= 2
    share = (mt.get("prefix") or {}).get("shared-prefix", {}).get("max_share_over_mean")
    out["shared_prefix_max_share_over_mean"] = share
    out["shared_prefix_share_met"] = share is not None and share <= 1.25 + 1e-9  # 5/12 of 12 requests is 1.25x
    drill = results.get("kill")
    out["kill_met"] = (drill is not None and drill["failed_after_one_interval"] == 0
                       and drill["conversations_all_later_turns_completed"] == drill["conversations_after_kill"]
                       and drill["victim_conversations_moved"] == drill["victim_conversations"])
    return out


def compare(settings: CompareSettings, output_dir: Path, *, log=print) -> dict:
    """Run everything, each run's files under ``output_dir``; return the result (:func:`write` stores it)."""
    started = datetime.now(timezone.utc)
    output_dir = output_dir / started.strftime("%Y%m%dT%H%M%SZ")
    output_dir.mkdir(parents=True, exist_ok=True)
    host = machine()
    policies = list(POLICIES)
    if not prefix_routing_available():
        log("this gateway has no prefix routing (gennstack.gateway.config.GatewayConfig.routing): least request only")
        policies = ["least_request"]
    raw: dict[str, dict[str, list[dict]]] = {p: {"multi-turn": [], "shared-prefix": []} for p in policies}
    for run in range(settings.runs):
        for policy in policies:  # alternate, so that a change in the machine's load hits both
            where = output_dir / "runs" / f"{policy}-{run + 1}"
            log(f"run {run + 1}/{settings.runs}: {policy}")
            with start_fleet(settings, policy, where / "fleet") as fleet:
                for workload in ("multi-turn", "shared-prefix"):
                    raw[policy][workload].append(measured_run(fleet, settings, workload, settings.seed + run, where / workload))
    result = {
        "schema": SCHEMA, "started_at": started.isoformat(timespec="seconds"), "settings": asdict(settings),
        "work_dir": str(output_dir),
        "machine": host, "policies": {p: {w: aggregate(runs) for w, runs in by.items()} for p, by in raw.items()},
        "runs": raw,
    }
    if settings.kill and "prefix" in policies:
        log("kill drill: prefix routing, one replica killed mid-run")
        result["kill"] = kill_drill(settings, output_dir / "kill", settings.seed)
    result["machine"]["load_average_1m_after"] = round(os.getloadavg()[0], 2)
    result["targets"] = targets(result)
    return result


def write(result: dict, path: Path) -> Path:
    """``path`` (JSON) and its table beside it (``.md``); returns the table's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    table = path.with_suffix(".md")
    table.write_text(markdown(result) + "\n", encoding="utf-8")
    return table


# ---- the table ------------------------------------------------------------------------------------------

def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:,.0f} ms"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown(result: dict) -> str:
    """The comparison as the README shows it (generated from comparison.json alone)."""
    s, host = result["settings"], result["machine"]
    backend = ("SmolLM2-135M-Instruct on llama-cpp-python (prompt cache on)" if s["backend"] == "llama"
               else "mock servers with a simulated prefix cache")
    lines = [
        f"Local comparison: {s['replicas']} replicas of {backend} behind the local gateway (real Envoy), "
        f"{s['runs']} runs per policy with fresh servers, seeds {s['seed']}..{s['seed'] + s['runs'] - 1} for both; "
        f"medians over the runs (replicas by rank, busiest first). Cache hit rate: prompt tokens the servers report as a "
        f"prefix-cache hit over all prompt tokens they report. Multi-turn: {s['conversations']} conversations at a time, {s['turns']} turns, "
        f"{s['prompt_tokens']}-token user messages, {s['max_tokens']}-token answers, {s['think_time_s']:g} s think time. "
        f"Shared prefix: {s['shared_requests']} requests at concurrency {s['shared_concurrency']}, {s['num_prefixes']} system "
        f"prompts of {s['prefix_tokens']} tokens picked with Zipf exponent {s['prefix_zipf']:g}, {s['question_tokens']}-token questions.",
        "",
        f"Machine: {host['cores']} cores ({host['cpu_model']}), {host['memory_gib']} GiB memory, shared with other work "
        f"while it ran (1-minute load average {host['load_average_1m']} before, {host.get('load_average_1m_after', 'n/a')} after).",
        "",
        "| routing | workload | TTFT p50 | TTFT p90 | turn 1 TTFT p50 | later turns TTFT p50 | e2e p50 | output tok/s | requests/s "
        "| failed | cache hit rate | request share per replica, busiest first | its cache hit rate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy, by in result["policies"].items():
        for workload, agg in by.items():
            shares = " / ".join(_pct(r["share"]) for r in agg["replicas"])
            hits = " / ".join(_pct(r["cache_hit_rate"]) for r in agg["replicas"])
            turn1 = _ms(agg["turn1_ttft_p50_s"]) if workload == "multi-turn" else "–"
            later = _ms(agg["later_turns_ttft_p50_s"]) if workload == "multi-turn" else "–"
            lines.append(
                f"| {policy.replace('_', '-')} | {workload} | {_ms(agg['ttft_p50_s'])} | {_ms(agg['ttft_p90_s'])} | {turn1} | "
                f"{later} | {_ms(agg['e2e_p50_s'])} | {agg['aggregate_output_tokens_per_s']:.1f} | "
                f"{agg['requests_per_s']:.2f} | {agg['failed']} | {_pct(agg['cache_hit_rate'])} | {shares} | {hits} |")
    t = result["targets"]
    lines += ["", "Targets (issue 24):", ""]
    lines.append(f"- multi-turn TTFT p50, least-request / prefix-aware: {_x(t['multi_turn_ttft_p50_speedup'])} "
                 f"(target >= 2x: {'met' if t['multi_turn_ttft_met'] else 'missed'})")
    lines.append(f"- shared prefix, busiest replica's share / mean share with prefix-aware routing: "
                 f"{_x(t['shared_prefix_max_share_over_mean'])} (target <= 1.25x: {'met' if t['shared_prefix_share_met'] else 'missed'})")
    drill = result.get("kill")
    if drill is None:
        lines.append("- kill drill: not run")
    else:
        lines.append(
            f"- kill drill (prefix-aware): {drill['killed']} killed {drill['kill_s']:.1f} s into a multi-turn run of "
            f"{drill['requests']} requests; {drill['failed']} failed ({', '.join(f'{k}: {v}' for k, v in drill['failed_by_class'].items()) or 'none'}), "
            f"{drill['failed_after_one_interval']} of the {drill['sent_after_one_interval']} sent more than one health-check "
            f"interval ({drill['health_interval_s']} s) after the kill; {drill['conversations_all_later_turns_completed']} of "
            f"{drill['conversations_after_kill']} conversations went on and completed every later turn; "
            f"{drill['victim_conversations_moved']} of the {drill['victim_conversations']} conversations it had served moved to "
            f"another replica, their first turn there at TTFT p50 {_ms(drill['first_turn_after_move_ttft_p50_s'])} "
            f"(later turns before the kill: {_ms(drill['turns_before_kill_ttft_p50_s'])}) "
            f"(target: they move and nothing fails after one interval: {'met' if t['kill_met'] else 'missed'})")
    return "\n".join(lines)


def update_readme(readme: Path, block: str) -> None:
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise CompareError(f"{readme}: no {README_START} ... {README_END} block to replace")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_START}\n{block}\n{README_END}{tail}", encoding="utf-8")


def load(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise CompareError(f"{path}: not a compare-routing result (expected schema {SCHEMA!r})")
    return data


__all__ = ["CompareError", "CompareSettings", "Counters", "compare", "markdown"]
