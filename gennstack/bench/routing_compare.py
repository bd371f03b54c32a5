"""``gennstack bench compare-routing``: least-request against prefix-aware routing at equal offered rates,
measured on this machine.

What runs, all on 127.0.0.1:

* ``replicas`` model servers: SmolLM2-135M-Instruct on llama-cpp-python's OpenAI-compatible server (the
  gateway's ``--demo`` backend, with its prompt cache on: ``--cache True``, a ``LlamaRAMCache`` that keeps
  the state of several earlier prompts, not only the last one), or, for tests, mock servers with the
  simulated prefix cache of :mod:`gennstack.bench.mockserver`;
* the local gateway (real Envoy, :mod:`gennstack.gateway.local`) in front of them as the one model
  ``gpt-oss-20b`` (a gen3/g6e model, the generation whose routing is configurable), its routing set
  through :class:`gennstack.gateway.config.RoutingConfig`: ``least_request`` (Envoy Gateway's default) or
  ``prefix`` (consistent hash with bounded load on the prompt's leading messages);
* ``gennstack bench`` through the gateway, open loop (:func:`gennstack.bench.runner.run_rate_level`): at each
  offered rate of ``rates`` (requests/s, Poisson arrivals), the ``multi-turn`` workload (conversations arrive at
  rate / turns, each sends its next turn ``think_time_s`` after the answer) and the ``shared-prefix`` workload
  with a Zipf-skewed choice of system prompt.

Every (rate, workload) level runs on fresh servers (cold caches) under each policy, the two policies one after
the other with the same seed, so both see the same arrival times and prompts. Per level: TTFT p50/p90 (multi-turn:
first turn and later turns apart), end-to-end p50, the SLO attainment and goodput (:mod:`gennstack.bench.slo`),
the requests/s completed; per replica its share of the chat requests and its prefix-cache hit rate, from the
server itself (:func:`parse_llama_server_log`: llama-cpp-python's own log; the mock's ``/stats``). Then, with
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
SCHEMA = "gennstack-routing-compare/2"  # 2: open loop, a rate ladder


class CompareError(Exception):
    """A comparison that could not run; the message says why."""


# The default ladders, requests/s offered. SmolLM2 on this project's 2-core machine: least-request's later turns
# queued for 8 s (p50) at 0.3 requests/s, 8 conversations of 3 turns; the mock answers in tens of milliseconds.
DEFAULT_RATES = {"llama": (0.1, 0.2), "mock": (4.0, 8.0)}


@dataclass(frozen=True)
class CompareSettings:
    backend: str = "llama"  # llama (SmolLM2 on llama-cpp-python) or mock
    replicas: int = 3
    runs: int = 1
    seed: int = 0
    # the ladder: offered requests/s, Poisson arrivals (multi-turn: conversations at rate / turns); None: the
    # backend's DEFAULT_RATES, below the rate where its least-request level falls behind
    rates: tuple[float, ...] | None = None
    # multi-turn: `conversations` per level, `turns` each, `think_time_s` between an answer and the next turn
    conversations: int = 8
    turns: int = 3
    think_time_s: float = 1.0
    prompt_tokens: int = 60
    max_tokens: int = 16
    # shared-prefix: `shared_requests` per level, `num_prefixes` system prompts of `prefix_tokens`, Zipf exponent
    # `prefix_zipf`
    shared_requests: int = 12
    num_prefixes: int = 8
    prefix_tokens: int = 300
    prefix_zipf: float = 1.1
    question_tokens: int = 24
    # per-request SLO of the goodput (gennstack.bench.slo.SLO.parse)
    slo: str = "ttft_p90=4s,itl_p90=200ms"
    # prefix routing's bounded load (gateway.routing.hash_balance_factor); None: the config's default
    hash_balance_factor: int | None = None
    # the kill drill: prefix routing, closed loop of `kill_conversations` conversations; once the servers have served
    # `kill_after` of a multi-turn run of `kill_turns` turns per conversation, the replica that served the most of it
    # is killed
    kill: bool = True
    kill_conversations: int = 4
    kill_after: float = 0.5
    kill_turns: int = 6
    health_interval_s: int = 5  # the gateway's default (ResilienceConfig.health_interval_s)

    def __post_init__(self) -> None:
        from gennstack.bench.config import ConfigError
        from gennstack.bench.slo import SLO

        if self.rates is None and self.backend in DEFAULT_RATES:
            object.__setattr__(self, "rates", DEFAULT_RATES[self.backend])
        rates_ok = (isinstance(self.rates, tuple) and len(self.rates) >= 1
                    and all(isinstance(r, (int, float)) and math.isfinite(r) and r > 0 for r in self.rates)
                    and list(self.rates) == sorted(set(self.rates)))
        checks = {
            "--backend": (self.backend in ("llama", "mock"), "llama or mock"),
            "--replicas": (2 <= self.replicas <= 8, "2 to 8"),
            "--runs": (1 <= self.runs <= 20, "1 to 20"),
            "--rates": (rates_ok, "one or more rates above 0 requests/s, rising, comma separated"),
            "--conversations": (self.conversations >= 1, "at least 1"),
            "--turns": (self.turns >= 2, "at least 2 (turn 1 is the cold one)"),
            "--think-time": (self.think_time_s >= 0, "0 or more seconds"),
            "--prompt-tokens": (self.prompt_tokens >= 1, "at least 1"),
            "--max-tokens": (self.max_tokens >= 1, "at least 1"),
            "--shared-requests": (self.shared_requests >= 1, "at least 1"),
            "--num-prefixes": (self.num_prefixes >= 1, "at least 1"),
            "--prefix-tokens": (self.prefix_tokens >= 1, "at least 1"),
            "--prefix-zipf": (math.isfinite(self.prefix_zipf) and self.prefix_zipf >= 0, "a finite number >= 0"),
            "--hash-balance-factor": (self.hash_balance_factor is None or 100 <= self.hash_balance_factor <= 1000,
                                      "100 to 1000 (gateway.routing.hash_balance_factor)"),
            "--kill-conversations": (self.kill_conversations >= 1, "at least 1"),
            "--kill-after": (0 < self.kill_after < 1, "a fraction of the run's requests between 0 and 1"),
            "--kill-turns": (self.kill_turns >= 2, "at least 2"),
        }
        for flag, (ok, allowed) in checks.items():
            if not ok:
                attribute = {"--think-time": "think_time_s", "--health-interval": "health_interval_s"}.get(
                    flag, flag[2:].replace("-", "_"))
                raise CompareError(f"{flag}={getattr(self, attribute)!r}: must be {allowed}")
        try:
            SLO.parse(self.slo)
        except ConfigError as exc:
            raise CompareError(str(exc)) from None


def parse_rates(text: str) -> tuple[float, ...]:
    """``--rates 0.25,0.5``: the ladder's offered requests/s (CompareSettings checks that they rise)."""
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise CompareError(f"--rates={text!r}: must be requests/s, comma separated, such as 0.25,0.5") from None


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
    base: dict = {"resilience": {"health_interval_s": settings.health_interval_s, "health_path": health}}
    if settings.hash_balance_factor is not None:
        base["routing"] = {"hash_balance_factor": settings.hash_balance_factor}
    data = with_routing(frozen(base), policy)
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

def bench_config(settings: CompareSettings, base_url: str, workload: str, seed: int, rate: float | None = None) -> BenchConfig:
    """One level's bench: open loop at ``rate`` requests/s offered (multi-turn: conversations at rate / turns), or
    the kill drill's closed loop (``workload`` "kill")."""
    from gennstack.bench.slo import SLO

    open_loop: dict = {}
    if workload == "multi-turn":
        load = Workload(kind="multi-turn", turns=settings.turns, think_time_s=settings.think_time_s)
        requests, prompt = settings.conversations * settings.turns, settings.prompt_tokens
        open_loop = {"rates": (rate / settings.turns,)}
    elif workload == "shared-prefix":
        load = Workload(kind="shared-prefix", num_prefixes=settings.num_prefixes, prefix_tokens=settings.prefix_tokens,
                        prefix_zipf=settings.prefix_zipf)
        requests, prompt = settings.shared_requests, settings.question_tokens
        open_loop = {"rates": (rate,)}
    else:  # the kill drill: longer conversations, so that they outlive the kill
        load = Workload(kind="multi-turn", turns=settings.kill_turns, think_time_s=settings.think_time_s)
        requests, prompt = settings.kill_conversations * settings.kill_turns, settings.prompt_tokens
    if open_loop and rate is None:
        raise CompareError(f"{workload}: an open-loop level needs its rate")
    return BenchConfig(
        base_url=base_url, model=MODEL, concurrency=(settings.kill_conversations,),
        prompt_tokens=Distribution.parse(str(prompt), option="--prompt-tokens"),
        max_tokens=Distribution.parse(str(settings.max_tokens), option="--max-tokens"),
        num_requests=requests, warmup_requests=0, request_timeout_s=300.0, stall_timeout_s=120.0,
        seed=seed, workload=load, record_header=UPSTREAM_HEADER, extra_body={"temperature": 0},
        **open_loop, **({"arrival": "poisson", "slo": SLO.parse(settings.slo)} if open_loop else {}),
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
    later = block.get("later_turns_ttft_s") or {}
    slo = level.get("slo") or {}
    schedule = level.get("schedule") or {}
    shares = [r["share"] for r in replicas if r["share"] is not None]
    mean_share = 1 / len(replicas) if replicas else None
    return {
        "rate_rps": level.get("rate_rps"), "offered_rps": schedule.get("offered_rps"),
        "on_schedule": schedule.get("on_schedule"),
        "ttft_p50_s": m["ttft_s"]["p50"], "ttft_p90_s": m["ttft_s"]["p90"],
        "turn1_ttft_p50_s": turns[0]["ttft_s"]["p50"] if turns else None,
        "turn1_ttft_p90_s": turns[0]["ttft_s"]["p90"] if turns else None,
        "later_turns_ttft_p50_s": later.get("p50"), "later_turns_ttft_p90_s": later.get("p90"),
        "e2e_p50_s": m["e2e_s"]["p50"],
        "aggregate_output_tokens_per_s": level["aggregate_output_tokens_per_s"],
        "requests_per_s": level["requests_per_s"],
        "slo_attainment": slo.get("attainment"), "goodput_rps": slo.get("goodput_rps"),
        "completed": level["requests"]["completed"], "failed": level["requests"]["failed"],
        "max_share_over_mean": (max(shares) / mean_share) if shares and mean_share else None,
        "replicas": replicas,
        "upstreams": level.get("upstreams"),
    }


def measured_run(fleet: Fleet, settings: CompareSettings, workload: str, seed: int, out: Path, rate: float) -> dict:
    before = fleet.counters()
    result = run_bench(bench_config(settings, fleet.base_url, workload, seed, rate), out)
    after = fleet.counters()
    rows = replica_rows([r.name for r in fleet.replicas], [a.minus(b) for a, b in zip(after, before)],
                        result["levels"][0].get("upstreams"))
    return {**run_summary(result, rows), "rate_rps": rate}


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


WORKLOADS = ("multi-turn", "shared-prefix")
SUMMARY_KEYS = ("ttft_p50_s", "ttft_p90_s", "turn1_ttft_p50_s", "turn1_ttft_p90_s", "later_turns_ttft_p50_s",
                "later_turns_ttft_p90_s", "e2e_p50_s", "aggregate_output_tokens_per_s", "requests_per_s", "offered_rps",
                "slo_attainment", "goodput_rps", "max_share_over_mean", "cache_hit_rate")


def aggregate(runs: list[dict]) -> dict:
    """Medians over the runs of one level. Replicas are fresh servers in every run, so they are compared by rank: per
    run the busiest first, then the median share and cache hit rate of each rank."""
    for r in runs:
        prompt = sum(row["prompt_tokens"] for row in r["replicas"])
        r["cache_hit_rate"] = sum(row["cached_tokens"] for row in r["replicas"]) / prompt if prompt else None
    out = {key: median([r.get(key) for r in runs]) for key in SUMMARY_KEYS}
    out["rate_rps"] = runs[0]["rate_rps"]
    out["failed"] = sum(r["failed"] for r in runs)
    out["on_schedule"] = all(r.get("on_schedule") for r in runs)
    ranked = [sorted(r["replicas"], key=lambda row: -(row["requests"] or 0)) for r in runs]
    out["replicas"] = [{"rank": i + 1,
                        "share": median([rows[i]["share"] for rows in ranked]),
                        "cache_hit_rate": median([rows[i]["cache_hit_rate"] for rows in ranked])}
                       for i in range(len(ranked[0]))]
    return out


def rate_key(rate: float) -> str:
    return f"{rate:g}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def targets(results: dict) -> dict:
    """Issue 32's targets per rate of the ladder, multi-turn, from the medians: prefix-aware beats least-request on
    later-turn TTFT p50 by at least 1.5x and on later-turn TTFT p90, and worsens first-turn TTFT p90 by at most 10 %;
    after a kill nothing fails past one health interval."""
    by = results["policies"]
    per_rate = {}
    saturated = saturated_rates(results)
    if "prefix" in by:
        for key, lr in by["least_request"]["multi-turn"].items():
            pa = by["prefix"]["multi-turn"].get(key)
            if pa is None:
                continue
            p50 = _ratio(lr["later_turns_ttft_p50_s"], pa["later_turns_ttft_p50_s"])
            p90 = _ratio(lr["later_turns_ttft_p90_s"], pa["later_turns_ttft_p90_s"])
            first = _ratio(pa["turn1_ttft_p90_s"], lr["turn1_ttft_p90_s"])
            row = {"later_turns_ttft_p50_speedup": p50, "later_turns_ttft_p50_met": p50 is not None and p50 >= 1.5,
                   "later_turns_ttft_p90_speedup": p90, "later_turns_ttft_p90_met": p90 is not None and p90 > 1,
                   "turn1_ttft_p90_ratio": first, "turn1_ttft_p90_met": first is not None and first <= 1.10 + 1e-9}
            row["met"] = row["later_turns_ttft_p50_met"] and row["later_turns_ttft_p90_met"] and row["turn1_ttft_p90_met"]
            row["saturated"] = key in saturated
            per_rate[key] = row
    below = [r for r in per_rate.values() if not r["saturated"]]
    out: dict = {"multi_turn": per_rate, "saturated_rates": sorted(saturated, key=float),
                 "multi_turn_met": bool(below) and all(r["met"] for r in below)}
    drill = results.get("kill")
    out["kill_met"] = (drill is not None and drill["failed_after_one_interval"] == 0
                       and drill["conversations_all_later_turns_completed"] == drill["conversations_after_kill"]
                       and drill["victim_conversations_moved"] == drill["victim_conversations"])
    return out


def prefix_routing_settings(settings: CompareSettings) -> dict:
    """The prefix policy's knobs this comparison ran with (gateway.routing): the key's bytes and the bounded load."""
    from gennstack.gateway.config import RoutingConfig

    default = RoutingConfig()
    factor = settings.hash_balance_factor if settings.hash_balance_factor is not None else default.hash_balance_factor
    return {"prefix_bytes": default.prefix_bytes, "hash_balance_factor": factor}


SATURATED_SHARE = 0.9  # a level that completed fewer requests/s than this share of its offered rate fell behind it


def saturated_rates(results: dict) -> set[str]:
    """The ladder's rates at which some level (any workload, either policy) completed less than SATURATED_SHARE of
    the requests/s its schedule offered (``offered_rps``: the seeded schedule's own rate, gennstack.bench.metrics
    schedule_summary): there the servers fell behind the arrivals and queues grew for as long as the level ran."""
    out = set()
    for by in results["policies"].values():
        for levels in by.values():
            for key, agg in levels.items():
                offered, done = agg.get("offered_rps"), agg.get("requests_per_s")
                if offered and done is not None and done < SATURATED_SHARE * offered - 1e-9:
                    out.add(key)
    return out


def compare(settings: CompareSettings, output_dir: Path, *, log=print) -> dict:
    """Run everything, each level's files under ``output_dir``; return the result (:func:`write` stores it)."""
    started = datetime.now(timezone.utc)
    output_dir = output_dir / started.strftime("%Y%m%dT%H%M%SZ")
    output_dir.mkdir(parents=True, exist_ok=True)
    host = machine()
    policies = list(POLICIES)
    if not prefix_routing_available():
        log("this gateway has no prefix routing (gennstack.gateway.config.GatewayConfig.routing): least request only")
        policies = ["least_request"]
    raw: dict[str, dict[str, dict[str, list[dict]]]] = {
        p: {w: {rate_key(r): [] for r in settings.rates} for w in WORKLOADS} for p in policies}
    for run in range(settings.runs):
        for rate in settings.rates:
            for workload in WORKLOADS:
                for policy in policies:  # one after the other, so that a change in the machine's load hits both
                    where = output_dir / "runs" / f"{policy}-{run + 1}" / f"{workload}-{rate_key(rate)}"
                    log(f"run {run + 1}/{settings.runs}: {workload} at {rate:g} requests/s, {policy}")
                    with start_fleet(settings, policy, where / "fleet") as fleet:  # fresh servers, cold caches
                        raw[policy][workload][rate_key(rate)].append(
                            measured_run(fleet, settings, workload, settings.seed + run, where / "bench", rate))
    result = {
        "schema": SCHEMA, "started_at": started.isoformat(timespec="seconds"), "settings": asdict(settings),
        "work_dir": str(output_dir), "machine": host, "prefix_routing": prefix_routing_settings(settings),
        "policies": {p: {w: {k: aggregate(runs) for k, runs in levels.items()} for w, levels in by.items()}
                     for p, by in raw.items()},
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


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def saturation_detail(result: dict, key: str) -> str:
    """The lowest completed / offered share of the levels at one rate, and where it was."""
    worst = None
    for policy, by in result["policies"].items():
        for workload, levels in by.items():
            agg = levels.get(key)
            if agg and agg.get("offered_rps") and agg.get("requests_per_s") is not None:
                share = agg["requests_per_s"] / agg["offered_rps"]
                if worst is None or share < worst[0]:
                    worst = (share, workload, policy)
    if worst is None:
        return "no offered rate recorded"
    return f"lowest completed / offered {worst[0]:.0%}, {worst[1]} with {worst[2].replace('_', '-')}"


def markdown(result: dict) -> str:
    """The comparison as the README shows it (generated from the result JSON alone)."""
    s, host, knobs = result["settings"], result["machine"], result["prefix_routing"]
    backend = ("SmolLM2-135M-Instruct on llama-cpp-python (prompt cache on)" if s["backend"] == "llama"
               else "mock servers with a simulated prefix cache")
    rates = ", ".join(f"{r:g}" for r in s["rates"])
    runs = (f"{s['runs']} runs per level, seeds {s['seed']}..{s['seed'] + s['runs'] - 1}, medians over the runs"
            if s["runs"] > 1 else f"1 run per level, seed {s['seed']}")
    lines = [
        f"Local comparison, open loop: {s['replicas']} replicas of {backend} behind the local gateway (real Envoy). "
        f"Poisson arrivals at {rates} requests/s offered; every level on fresh servers (cold caches) under each policy, "
        f"the same seed and arrival times for both; {runs}. Prefix-aware: Maglev on the first "
        f"{knobs['prefix_bytes']:,} bytes of the prompt's leading messages, bounded load {knobs['hash_balance_factor']} %. "
        f"Multi-turn: {s['conversations']} conversations per level arriving at rate / {s['turns']}, {s['turns']} turns, "
        f"{s['prompt_tokens']}-token user messages, {s['max_tokens']}-token answers, {s['think_time_s']:g} s think time. "
        f"Shared prefix: {s['shared_requests']} requests per level, {s['num_prefixes']} system prompts of {s['prefix_tokens']} "
        f"tokens picked with Zipf exponent {s['prefix_zipf']:g}, {s['question_tokens']}-token questions. Goodput: "
        f"requests/s within every per-request SLO ({s['slo']}); attainment: their share. Cache hit rate: prompt tokens the "
        f"servers report as a prefix-cache hit over all prompt tokens they report.",
        "",
        f"Machine: {host['cores']} cores ({host['cpu_model']}), {host['memory_gib']} GiB memory, shared with other work "
        f"while it ran (1-minute load average {host['load_average_1m']} before, {host.get('load_average_1m_after', 'n/a')} after).",
        "",
        "| workload | offered req/s | routing | TTFT p50 | TTFT p90 | turn 1 TTFT p50 | turn 1 TTFT p90 | later turns TTFT p50 "
        "| later turns TTFT p90 | e2e p50 | completed req/s | SLO attainment | goodput req/s | failed | cache hit rate "
        "| request share per replica, busiest first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = result["policies"]
    for workload in WORKLOADS:
        for rate in s["rates"]:
            for policy in by:
                agg = by[policy][workload][rate_key(rate)]
                shares = " / ".join(_pct(r["share"]) for r in agg["replicas"])
                mt = workload == "multi-turn"
                turn_cells = [_ms(agg[k]) if mt else "–" for k in
                              ("turn1_ttft_p50_s", "turn1_ttft_p90_s", "later_turns_ttft_p50_s", "later_turns_ttft_p90_s")]
                lines.append(
                    f"| {workload} | {rate:g} | {policy.replace('_', '-')} | {_ms(agg['ttft_p50_s'])} | {_ms(agg['ttft_p90_s'])} | "
                    f"{' | '.join(turn_cells)} | {_ms(agg['e2e_p50_s'])} | {_num(agg['requests_per_s'])} | "
                    f"{_pct(agg['slo_attainment'])} | {_num(agg['goodput_rps'])} | {agg['failed']} | "
                    f"{_pct(agg['cache_hit_rate'])} | {shares} |")
    t = result["targets"]
    lines += ["", "Targets (issue 32), multi-turn, prefix-aware against least-request at each offered rate below saturation "
              f"(saturated: a level at that rate completed under {SATURATED_SHARE:.0%} of the requests/s its schedule offered):", ""]
    for key, row in t["multi_turn"].items():
        where = "saturated, so outside the targets: " if row["saturated"] else ""
        lines.append(
            f"- {key} requests/s ({where or 'below saturation: '}"
            f"{saturation_detail(result, key)}): later-turn TTFT p50 {_x(row['later_turns_ttft_p50_speedup'])} lower "
            f"(target >= 1.5x: {'met' if row['later_turns_ttft_p50_met'] else 'missed'}), later-turn TTFT p90 "
            f"{_x(row['later_turns_ttft_p90_speedup'])} lower (target > 1x: {'met' if row['later_turns_ttft_p90_met'] else 'missed'}), "
            f"first-turn TTFT p90 {_x(row['turn1_ttft_p90_ratio'])} least-request's "
            f"(target <= 1.10x: {'met' if row['turn1_ttft_p90_met'] else 'missed'})")
    drill = result.get("kill")
    if drill is None:
        lines.append("- kill drill: not run")
    else:
        lines.append(
            f"- kill drill (prefix-aware, closed loop of {s['kill_conversations']} conversations): {drill['killed']} killed "
            f"{drill['kill_s']:.1f} s into a multi-turn run of "
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
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CompareError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise CompareError(f"{path}: not a compare-routing result (expected schema {SCHEMA!r})")
    return data


__all__ = ["CompareError", "CompareSettings", "Counters", "compare", "markdown"]
