"""``gennstack drill --local``: a spot drill on this machine, drain routing on against off.

What runs, all on 127.0.0.1 and its loopback neighbours:

* ``replicas`` mock model servers (:mod:`gennstack.bench.mockserver` processes), one per loopback
  address (127.0.0.2, 127.0.0.3, ...) on one port, as the pods of a headless Service are one
  address each on the Service's port;
* :class:`~gennstack.drill.service_dns.ServiceDNS`, answering the model's Service name (the
  gateway chart's Backend host) with the addresses of the pods whose labels match the serving
  chart's Service selector, ``gennstack.io/routable: "true"`` included;
* the local gateway (real Envoy, :mod:`gennstack.gateway.local`) finding the servers through that
  DNS as Envoy Gateway does in the cluster (STRICT_DNS at the records' TTL, hosts removed from
  DNS dropped at once although their health checks pass);
* ``gennstack bench`` streaming through the gateway, with this drill's events on its timeline.

The first replica is doomed: its interruption warning comes ``warning_at_s`` after the bench's
first request reaches it, and it is gone ``gone_after_s`` later (the two minutes of a spot
warning, scaled down). With drain routing on, the drill sets the doomed pod's
``gennstack.io/routable`` label to ``"false"`` at the warning, which is what the interruption
handler does in a cluster (``lambdas/interruption_handler/drain.py``; that the handler does it for a
spot warning is tested end to end in ``tests/lambdas/test_drain_routing_e2e.py``). With it off,
nothing changes until the replica is gone. Both runs use the same schedule, and the comparison
(``comparison.md``, ``comparison.json``) says what users lost in each.

When the doomed replica is gone, the drill starts its replacement, as the Deployment does when its
pod goes: a mock server on the next loopback address, added to the Service's answer once its
``/health`` answers (Ready). The drill times, from "gone", that Ready and the replacement's first
completed stream by its own count (``/stats``), the phases a cluster pod records as
``ready`` and ``served`` (gennstack/observability/rules.py); both are events of the run
(``replacement_ready``, ``replacement_served``), so they are markers on the bench's timeline, and
fields of ``comparison.json``; ``replacements.md`` is their table. "Gone" is when the drill sees the
replica's ``replica_gone`` line (it polls every 20 ms). A mock starts in a fraction of a second: the
numbers show the drill's mechanism, not a model server's cold start.

What it does not model: the EndpointSlice controller's own delay (about a second) and a real
CoreDNS cache; Karpenter's drain at the warning (in AWS it evicts the node's pods within the two
minutes, so "drain off" here is the case where nothing removes the pod before the reclaim: no
warning, or an eviction a PodDisruptionBudget holds back); model servers' own load limits (a mock
replica serves any number of streams, so losing one costs no capacity here).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gennstack.bench.mockserver import MockProcess, start_process
from gennstack.drill.events import EVENTS_FILE, EventLog
from gennstack.drill.service_dns import Service, ServiceDNS
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap
from gennstack.gateway.names import backend_host

# The serving chart's drain-routing label (assets/charts/gennstack-serving/templates/_routing.tpl) and
# its pods' selector labels (_helpers.tpl gennstack-serving.selectorLabels, role "server");
# tests/test_drain_routing.py checks both against the rendered chart.
ROUTABLE_LABEL = "gennstack.io/routable"
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
SERVER_COMPONENT = "server"
SOURCE = "local-drill"  # the "source" of this drill's own lines in drill-events.jsonl
FIRST_ADDRESS = ipaddress.IPv4Address("127.0.0.2")
MAX_REPLICAS = 16
# Seconds of bench after "gone" for the timeline to see goodput back: its recovery rule needs three
# whole 1 s buckets (gennstack.bench.timeline, recover_buckets), plus the dip and one to spare.
RECOVERY_WINDOW_S = 5


class LocalDrillError(Exception):
    """A local drill that could not run; the message says why."""


def service_for(model: str, gateway: GatewayConfig | None = None) -> Service:
    """The headless Service of ``model``'s server as the cluster has it: the gateway chart's Backend
    host, the serving chart's Service selector."""
    gateway = gateway or GatewayConfig()
    backend = gateway.models[model]
    return Service(
        hostname=backend_host(backend.service, gateway.serving_namespace),
        selector={NAME_LABEL: backend.service, COMPONENT_LABEL: SERVER_COMPONENT, ROUTABLE_LABEL: "true"},
    )


def replica_pods(model: str, replicas: Sequence[MockProcess], gateway: GatewayConfig | None = None) -> list[dict[str, Any]]:
    """One Ready Pod (the fields ServiceDNS and the handler read) per replica, each on its own node,
    labelled as the serving chart labels its server pods."""
    gateway = gateway or GatewayConfig()
    service = gateway.models[model].service
    return [
        {
            "metadata": {"name": f"{service}-local-{i}", "namespace": gateway.serving_namespace,
                         "labels": {NAME_LABEL: service, COMPONENT_LABEL: SERVER_COMPONENT, ROUTABLE_LABEL: "true"}},
            "spec": {"nodeName": f"local-node-{i}"},
            "status": {"podIP": replica.host, "conditions": [{"type": "Ready", "status": "True"}]},
        }
        for i, replica in enumerate(replicas)
    ]


@contextlib.contextmanager
def start_replicas(count: int, *flags: str, attempts: int = 5) -> Iterator[list[MockProcess]]:
    """``count`` mock servers on 127.0.0.2, 127.0.0.3, ... sharing one port (a free one); all stopped on exit."""
    if not 1 <= count <= MAX_REPLICAS:
        raise LocalDrillError(f"replicas {count}: allowed 1 to {MAX_REPLICAS}")
    started: list[MockProcess] = []
    try:
        for _ in range(attempts):
            first = start_process(*flags, host=str(FIRST_ADDRESS))
            started.append(first)
            try:
                for i in range(1, count):
                    started.append(start_process(*flags, host=str(FIRST_ADDRESS + i), port=first.port))
                break
            except RuntimeError:  # the port was taken on another address: start over on a new one
                for replica in started:
                    replica.stop()
                started.clear()
        else:
            raise LocalDrillError(f"could not start {count} mock servers on one port in {attempts} attempts")
        yield list(started)
    finally:
        for replica in started:
            replica.stop()


@dataclass(frozen=True)
class LocalDrillSettings:
    """The schedule of both runs (seconds); defaults give two runs of about 35 s each."""

    model: str = "gpt-oss-20b"
    replicas: int = 2
    concurrency: int = 16
    duration_s: int = 30
    warmup_s: int = 2
    max_tokens: int = 50
    ttft_s: float = 0.02
    itl_s: float = 0.01
    warning_at_s: float = 10.0  # from the bench's first request at the doomed replica
    gone_after_s: float = 12.0  # from the warning: AWS's 120 s, scaled 1:10
    dns_ttl_s: int = 1  # CoreDNS's default 5 s, scaled

    @property
    def stream_s(self) -> float:
        """One request's time on the mock's schedule."""
        return self.ttft_s + self.itl_s * (self.max_tokens - 1)

    def check(self) -> None:
        problems = []
        if not 2 <= self.replicas <= MAX_REPLICAS:
            problems.append(f"replicas {self.replicas}: allowed 2 to {MAX_REPLICAS} (one is doomed, one must survive)")
        if self.concurrency < 1 or self.max_tokens < 1 or self.warmup_s < 0:
            problems.append("concurrency and max_tokens must be >= 1, warmup >= 0")
        if self.ttft_s < 0 or self.itl_s < 0:
            problems.append("ttft and itl must be >= 0")
        if not 1 <= self.dns_ttl_s <= 3600:
            problems.append(f"dns_ttl_s {self.dns_ttl_s}: allowed 1 to 3600 (Envoy re-resolves a TTL of 0 only at its DNS refresh rate)")
        stream_s = self.stream_s
        if self.warning_at_s <= self.warmup_s:
            problems.append(f"warning_at_s {self.warning_at_s} must come after the {self.warmup_s} s warm-up (no baseline otherwise)")
        if self.gone_after_s <= self.dns_ttl_s + stream_s + 1:
            problems.append(f"gone_after_s {self.gone_after_s}: must exceed the DNS TTL ({self.dns_ttl_s} s) plus one "
                            f"request ({stream_s:g} s) plus 1 s, or drain routing has no time to act")
        if self.warning_at_s + self.gone_after_s + RECOVERY_WINDOW_S > self.duration_s:
            problems.append(f"duration_s {self.duration_s}: must outlast the warning and gone ({self.warning_at_s:g} + "
                            f"{self.gone_after_s:g} s) by {RECOVERY_WINDOW_S} s, or the recovery is not seen")
        if problems:
            raise LocalDrillError("; ".join(problems))


@dataclass
class RunResult:
    """What one run measured (the bench's totals, and what the doomed replica itself counted)."""

    drain: bool
    requests_lost: int
    broken_streams: int
    failures_by_class: dict[str, int]
    baseline_tok_s: float | None
    seconds_below_50pct: float | None
    time_to_recover_95_s: float | None
    doomed_new_requests_after_warning: int
    doomed_new_requests_after_out_of_rotation: int | None
    doomed_streams_started: int
    doomed_streams_completed: int
    survivors_streams_completed: int
    label_to_out_of_rotation_s: float | None
    markers: list[dict[str, Any]] = field(default_factory=list)
    # The doomed replica's replacement, started when it was gone: seconds from "gone" to its /health
    # answering (Ready) and to its first completed stream (served); None: not within the run.
    replacement_ready_s: float | None = None
    replacement_served_s: float | None = None
    replacement_streams_completed: int = 0


def _bench_argv(settings: LocalDrillSettings, base_url: str, out: Path, events: Path) -> list[str]:
    """The bench's workers start spread over one request's time (``--ramp-up``): the mock's schedule is
    exact, so workers started together would finish together for the whole run, and each second's
    goodput would swing with how many of their request ends fall in it, not with what the drill did."""
    return [sys.executable, "-m", "gennstack.cli", "bench", "--base-url", base_url, "--model", settings.model,
            "--concurrency", str(settings.concurrency), "--duration", str(settings.duration_s),
            "--ramp-up", f"{settings.stream_s:g}",
            "--warmup-seconds", str(settings.warmup_s), "--max-tokens", str(settings.max_tokens),
            "--prompt-tokens", "16", "--events", str(events), "--output-dir", str(out), "--no-progress"]


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.02) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise LocalDrillError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(poll_s)
    return time.monotonic() - start


def run_once(settings: LocalDrillSettings, *, drain: bool, folder: Path, gateway: GatewayConfig,
             out: TextIO | None = None) -> RunResult:
    """One run of the schedule; writes ``folder/drill-events.jsonl`` and the bench's result in ``folder/bench``."""
    folder.mkdir(parents=True, exist_ok=True)
    events_path = folder / EVENTS_FILE
    events_path.write_text("", encoding="utf-8")
    log = EventLog(events_path, out)
    flags = ("--ttft", str(settings.ttft_s), "--itl", str(settings.itl_s), "--model-name", settings.model,
             "--events-file", str(events_path))
    service = service_for(settings.model, gateway)
    try:
        with start_replicas(settings.replicas, *flags) as replicas:
            doomed = replicas[0]
            pods = replica_pods(settings.model, replicas, gateway)
            with ServiceDNS([service], lambda: pods, ttl_s=settings.dns_ttl_s) as dns:
                bootstrap = envoy_bootstrap(
                    routing_table(gateway), {settings.model: f"http://{service.hostname}:{doomed.port}/v1"}, gateway,
                    LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0, dns_resolver=dns.address))
                with LocalGateway.start(bootstrap) as gw:
                    gw.wait_healthy(expect={f"{r.host}:{r.port}": True for r in replicas})
                    log.add("drill_start", f"local drill, drain routing {'on' if drain else 'off'}: {settings.replicas} "
                            f"replicas of {settings.model}, {doomed.host} doomed", drain=drain, replicas=settings.replicas,
                            source=SOURCE)
                    with (folder / "bench.log").open("w", encoding="utf-8") as bench_log:
                        bench = subprocess.Popen(_bench_argv(settings, gw.base_url, folder / "bench", events_path),
                                                 stdout=bench_log, stderr=subprocess.STDOUT)
                        replacement: list[MockProcess] = []
                        try:
                            drained = _drive(settings, drain=drain, gw=gw, doomed=doomed, doomed_pod=pods[0], bench=bench, log=log)
                            replaced = _replace(settings, flags=flags, port=doomed.port, pods=pods, gateway=gateway,
                                                events_path=events_path, bench=bench, log=log, started=replacement)
                            code = bench.wait(timeout=settings.duration_s + 120)
                            survivors_completed = sum(r.stats()["completed_streams"] for r in replicas[1:])
                            replacement_completed = replacement[0].stats()["completed_streams"] if replacement else 0
                        finally:
                            if bench.poll() is None:
                                bench.kill()
                                bench.wait()
                            for process in replacement:
                                process.stop()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:  # URLError and TimeoutError are OSErrors
        raise LocalDrillError(f"the {'drain-on' if drain else 'drain-off'} run failed: {exc}") from exc
    log.add("drill_end", f"bench exited {code}", exit_code=code, source=SOURCE)
    if code != 0:
        raise LocalDrillError(f"the bench exited {code}; see {folder / 'bench.log'}")
    gone = _gone_counts(events_path)
    level = json.loads((folder / "bench" / "result.json").read_text(encoding="utf-8"))["levels"][0]
    timeline = level["timeline"]
    totals = timeline["totals"]
    at_out = drained["requests_at_out_of_rotation"]
    return RunResult(
        drain=drain,
        requests_lost=totals["requests_lost"],
        broken_streams=totals["broken_streams"],
        failures_by_class=dict(level["requests"].get("failures_by_class") or {}),
        baseline_tok_s=totals["baseline_tok_s"],
        seconds_below_50pct=totals["seconds_below_50pct"],
        time_to_recover_95_s=totals["time_to_recover_95_s"],
        doomed_new_requests_after_warning=gone["chat_requests_after_warning"],
        doomed_new_requests_after_out_of_rotation=None if at_out is None else gone["chat_requests"] - at_out,
        doomed_streams_started=gone["chat_requests"],
        doomed_streams_completed=gone["completed_streams"],
        survivors_streams_completed=survivors_completed,
        label_to_out_of_rotation_s=drained["label_to_out_of_rotation_s"],
        markers=list(timeline["markers"]),
        replacement_ready_s=replaced["ready_s"],
        replacement_served_s=replaced["served_s"],
        replacement_streams_completed=replacement_completed,
    )


def _gone_seen(events_path: Path) -> bool:
    """Whether the doomed replica's ``replica_gone`` line is in the events file (a line being written is not yet)."""
    for line in events_path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get("event") == "replica_gone":
                return True
        except json.JSONDecodeError:
            continue
    return False


def _health_ok(process: MockProcess) -> bool:
    try:
        with urllib.request.urlopen(process.base_url.removesuffix("/v1") + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _replace(settings: LocalDrillSettings, *, flags: Sequence[str], port: int, pods: list[dict[str, Any]],
             gateway: GatewayConfig, events_path: Path, bench: subprocess.Popen, log: EventLog,
             started: list[MockProcess]) -> dict[str, float | None]:
    """Once the doomed replica is gone (its ``replica_gone`` line), start its replacement on the next loopback
    address and the same port, add its pod to the Service's answer once it is Ready, and time, from "gone",
    Ready and its first completed stream (None: the bench ended first). ``started`` receives the process."""
    _wait(lambda: _gone_seen(events_path) or bench.poll() is not None, settings.gone_after_s + 60, "the doomed replica going")
    if bench.poll() is not None:
        return {"ready_s": None, "served_s": None}
    gone_at = time.monotonic()
    process = start_process(*flags, host=str(FIRST_ADDRESS + settings.replicas), port=port)
    started.append(process)
    _wait(lambda: _health_ok(process), 30, "the replacement answering /health")
    ready_s = round(time.monotonic() - gone_at, 3)
    service = gateway.models[settings.model].service
    name = f"{service}-local-{settings.replicas}"
    pods.append({"metadata": {"name": name, "namespace": gateway.serving_namespace,
                              "labels": {NAME_LABEL: service, COMPONENT_LABEL: SERVER_COMPONENT, ROUTABLE_LABEL: "true"}},
                 "spec": {"nodeName": f"local-node-{settings.replicas}"},
                 "status": {"podIP": process.host, "conditions": [{"type": "Ready", "status": "True"}]}})
    log.add("replacement_ready", f"{name} ({process.host}) Ready {ready_s:.2f} s after the doomed replica was gone",
            pod=name, seconds_after_gone=ready_s, source=SOURCE)
    try:
        _wait(lambda: process.stats()["completed_streams"] > 0 or bench.poll() is not None, settings.duration_s + 60,
              "the replacement's first completed stream")
    except LocalDrillError:
        return {"ready_s": ready_s, "served_s": None}
    if process.stats()["completed_streams"] == 0:
        return {"ready_s": ready_s, "served_s": None}
    served_s = round(time.monotonic() - gone_at, 3)
    log.add("replacement_served", f"{name} completed its first stream {served_s:.2f} s after the doomed replica was gone",
            pod=name, seconds_after_gone=served_s, source=SOURCE)
    return {"ready_s": ready_s, "served_s": served_s}


# After Envoy's admin page shows a host removed, how long until every worker thread has the update
# (the cluster manager posts it to them): requests that reach the replica before then were sent
# before the workers knew.
OUT_OF_ROTATION_GRACE_S = 0.25


def _drive(settings: LocalDrillSettings, *, drain: bool, gw: LocalGateway, doomed: MockProcess, doomed_pod: dict,
           bench: subprocess.Popen, log: EventLog) -> dict[str, Any]:
    """From the bench's first request at the doomed replica to the drain having taken effect (if on)."""
    _wait(lambda: doomed.stats()["chat_requests"] > 0 or bench.poll() is not None, 60, "the bench's first request")
    if bench.poll() is not None:
        raise LocalDrillError(f"the bench exited {bench.returncode} before it sent a request")
    doomed.doom(settings.warning_at_s, settings.gone_after_s)
    # the drain follows the replica's own warning (its clock), as the handler follows EC2's
    _wait(lambda: doomed.stats()["doomed"]["warned"], settings.warning_at_s + 30, "the doomed replica's warning")
    if not drain:
        return {"requests_at_out_of_rotation": None, "label_to_out_of_rotation_s": None}
    doomed_host = f"{doomed.host}:{doomed.port}"
    doomed_pod["metadata"]["labels"][ROUTABLE_LABEL] = "false"
    log.add("drained", f"{doomed_pod['metadata']['name']}: {ROUTABLE_LABEL}=false", pod=doomed_pod["metadata"]["name"], source=SOURCE)
    label_to_out = _wait(lambda: doomed_host not in gw.host_health(), settings.dns_ttl_s + 5, "Envoy dropping the drained pod")
    log.add("out_of_rotation", f"the gateway dropped {doomed_host} ({label_to_out:.2f} s after the label)",
            seconds_after_label=round(label_to_out, 3), source=SOURCE)
    time.sleep(OUT_OF_ROTATION_GRACE_S)
    return {"requests_at_out_of_rotation": doomed.stats()["chat_requests"], "label_to_out_of_rotation_s": round(label_to_out, 3)}


def _gone_counts(events_path: Path) -> dict[str, int]:
    """The doomed replica's final counts, from its ``replica_gone`` line (gennstack.bench.mockserver)."""
    for line in events_path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("event") == "replica_gone" and record.get("source") == "mock-server":
            return {key: int(record[key]) for key in ("chat_requests", "chat_requests_after_warning", "completed_streams")}
    raise LocalDrillError(f"the doomed replica never reported being gone in {events_path}: the bench ended first "
                          "(lengthen --duration)")


def run_local_drill(settings: LocalDrillSettings, output: Path, *, gateway: GatewayConfig | None = None,
                    out: TextIO | None = None) -> list[RunResult]:
    """Drain routing on, then off, with the same schedule; writes ``comparison.json`` and ``comparison.md``."""
    settings.check()
    gateway = gateway or GatewayConfig()
    if settings.model not in gateway.models:
        raise LocalDrillError(f"model {settings.model!r} is not in gateway.models ({', '.join(gateway.models)})")
    _check_loopback(settings.replicas + 1)  # the replicas and the doomed one's replacement
    results = [run_once(settings, drain=drain, folder=output / ("drain-on" if drain else "drain-off"), gateway=gateway, out=out)
               for drain in (True, False)]
    payload = {"settings": asdict(settings), "runs": [asdict(r) for r in results]}
    (output / "comparison.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    (output / "comparison.md").write_text(comparison_markdown(settings, results), encoding="utf-8")
    (output / "replacements.md").write_text(replacement_markdown(results), encoding="utf-8")
    return results


def _check_loopback(replicas: int) -> None:
    """Every 127.0.0.x the replicas use must be bindable (Linux routes all of 127/8 to lo)."""
    for i in range(replicas):
        address = str(FIRST_ADDRESS + i)
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError as exc:
                raise LocalDrillError(f"cannot listen on {address} ({exc}); the local drill needs the loopback "
                                      f"addresses 127.0.0.2 to {FIRST_ADDRESS + replicas - 1} (Linux has them)") from None


def _fmt(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:g}{unit}"


def comparison_markdown(settings: LocalDrillSettings, results: Sequence[RunResult]) -> str:
    """The report's table: one row per run."""
    stream_s = settings.stream_s
    lines = [
        f"Local drill: {settings.replicas} mock replicas of `{settings.model}` behind the local gateway (real Envoy, "
        f"servers found by DNS, TTL {settings.dns_ttl_s} s); `gennstack bench` at concurrency {settings.concurrency}, "
        f"{settings.max_tokens}-token streams of {stream_s:g} s, {settings.duration_s} s; one replica warned "
        f"{settings.warning_at_s:g} s after the bench reached it and gone {settings.gone_after_s:g} s later.",
        "",
        "| drain routing | requests lost | broken mid-way | doomed replica: new requests after the warning "
        "| after it left rotation | its streams completed | label to out of rotation | s under 50 % | recover to 95 % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {'on' if r.drain else 'off'} | {r.requests_lost} | {r.broken_streams} | {r.doomed_new_requests_after_warning} "
            f"| {_fmt(r.doomed_new_requests_after_out_of_rotation)} | {r.doomed_streams_completed} of {r.doomed_streams_started} "
            f"| {_fmt(r.label_to_out_of_rotation_s, ' s')} | {_fmt(r.seconds_below_50pct)} | {_fmt(r.time_to_recover_95_s, ' s')} |")
    return "\n".join(lines) + "\n"


def replacement_markdown(results: Sequence[RunResult]) -> str:
    """The doomed replica's replacement in each run: seconds from "gone" to Ready and to its first served stream."""
    lines = [
        "Each run's replacement of the doomed replica, started when it was gone (as the Deployment replaces a "
        "deleted pod): seconds from \"gone\" until its `/health` answered (Ready, then in the Service's answer) "
        "and until it completed its first stream (served), by its own count. A mock server starts in a fraction of a "
        "second: this shows the drill's mechanism, not a model server's cold start.",
        "",
        "| drain routing | replacement Ready | replacement served | its streams completed |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {'on' if r.drain else 'off'} | {_fmt(r.replacement_ready_s, ' s')} | "
                     f"{_fmt(r.replacement_served_s, ' s')} | {r.replacement_streams_completed} |")
    return "\n".join(lines) + "\n"
