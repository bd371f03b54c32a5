"""``gennstack drill``: start a spot-interruption drill (AWS FIS), follow it, optionally under load.

Finds the stack's experiment template for ``--generation`` and ``--nodes`` by its tags
(``gennstack.drill.templates.template_tags``), starts it, polls ``GetExperiment`` and prints every
state change with its time. Ctrl-C stops the experiment (``StopExperiment``) and waits for it to
stop. With ``--bench-args``, ``gennstack bench`` runs against the gateway as a subprocess, started
``--bench-lead`` seconds before the experiment so the result holds a baseline. One result folder
holds ``drill-events.jsonl`` (one JSON object a line: drill start, experiment states, end) and the
bench's own result in ``bench/``, whose timeline carries the drill's events as markers (the bench gets
``--events <folder>/drill-events.jsonl`` unless ``--bench-args`` names another file).

When the experiment has ended (or stopped after Ctrl-C), before waiting for the bench, the
interruption handler's lines about the interrupted instances (FIS's resolved targets) are read from
the log group named by the template's ``gennstack.io/handler-log-group`` tag, for up to 60 s while
they arrive, and added as events with ``source: "interruption-handler"``: rebalance_recommendation,
interruption_warning, scheduled_change, drained, node_gone (gennstack/drill/handler_log.py). They
reach the bench's timeline only if the bench is still running then; a failure here prints a warning
and never fails the drill. With ``--prometheus-url`` (the stack's Prometheus, port-forwarded), the
generation's server pods created since the drill started, the replacements, are then followed for up
to ``--replacement-wait`` seconds until each has served: their ``ready`` and ``served`` start phases
(gennstack/observability/rules.py, recorded in the cluster from the pods' conditions and their own
vLLM's request counter) become events ``replacement_ready`` and ``replacement_served`` at the time
each happened (gennstack/drill/replacements.py). Without it the output has no replacement times.

``--target multinode`` interrupts one member node of a multi-node group (``serving.multi_node``): the
template for it targets one running spot node of the generation's NodePool of the groups' instance
type (gennstack/drill/templates.py ``multinode_template``); the handler's "drained" line then names
the group it took out of routing, whole and once.

``--target no-warning`` terminates one running spot node of the generation's NodePool at once, with no
rebalance recommendation and no warning (``aws:ec2:terminate-instances``: gennstack/drill/templates.py
``no_warning_template``): the case drain routing cannot save. Run it under ``--bench-args`` with long
answers (``--max-tokens``) to see what stream resume saves: the bench counts broken streams.

Exit codes: 0 the experiment completed (and the bench, if any, exited 0); 1 it failed, was stopped
or an AWS call failed (the message says which and why); 2 bad arguments or config; 130 Ctrl-C.

``--local`` runs the drill on this machine instead, without AWS: mock replicas of the generation's
model behind the local gateway, one of them warned and then gone, once with drain routing and once
without (gennstack/drill/local.py), each time replacing the doomed replica when it is gone and
timing its replacement's Ready and first served stream; it writes ``comparison.md``,
``replacements.md`` and each run's bench result. Then the
cases drain cannot save (gennstack/drill/resume_drill.py): a replica SIGKILLed mid-answer without warning,
and answers longer than the grace, each with the resume relay off and on; it writes ``resume.md``.
``--cases smollm2`` (not in the default; needs ``make setup-demo``) runs the SIGKILL case on the real model,
SmolLM2 replicas on the demo token server (gennstack/drill/smollm2_drill.py), and writes ``smollm2.md``
(``--cases`` picks any of drain, resume, smollm2).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from gennstack.config import GenNStackConfig
from gennstack.config_base import GENERATION_NAMES
from gennstack.drill.events import EVENTS_FILE, EventLog
from gennstack.drill.handler_log import SOURCE as HANDLER_SOURCE
from gennstack.drill.handler_log import Marker, gone, handler_events, markers_from_events, resolved_instances
from gennstack.drill.replacements import PHASES as REPLACEMENT_EVENTS
from gennstack.drill.replacements import SOURCE as REPLACEMENT_SOURCE
from gennstack.drill.replacements import Fetch, Phase, PrometheusError, all_served, http_fetch, replacement_phases
from gennstack.drill.templates import HANDLER_LOG_GROUP_TAG, TARGET_TAG, TARGETS, template_tags
from gennstack.observability.rules import POOLS, SERVED_PHASE

TERMINAL = frozenset({"completed", "stopped", "failed", "cancelled"})
# The IAM actions the command uses (StartExperiment with tags also needs fis:TagResource; the last two
# read the interruption handler's lines afterwards, and without them the drill runs without those markers).
ACTIONS = ("fis:ListExperimentTemplates", "fis:StartExperiment", "fis:TagResource", "fis:GetExperiment", "fis:StopExperiment",
           "fis:ListExperimentResolvedTargets", "logs:FilterLogEvents")
_ACTION = {
    "ListExperimentTemplates": "fis:ListExperimentTemplates",
    "StartExperiment": "fis:StartExperiment",
    "GetExperiment": "fis:GetExperiment",
    "StopExperiment": "fis:StopExperiment",
    "ListExperimentResolvedTargets": "fis:ListExperimentResolvedTargets",
    "FilterLogEvents": "logs:FilterLogEvents",
}
_THROTTLED = frozenset({"ThrottlingException", "Throttling", "TooManyRequestsException"})
_DENIED = frozenset({"AccessDeniedException", "AccessDenied", "UnauthorizedOperation"})
_BAD_CREDENTIALS = frozenset({"ExpiredTokenException", "ExpiredToken", "UnrecognizedClientException", "InvalidClientTokenId"})
# After a stop request, how long to wait for FIS to report "stopped" before giving up waiting.
STOP_WAIT_SECONDS = 120.0
# After the experiment ends: how long to keep asking CloudWatch Logs for the handler's lines (they
# arrive with a lag) until every interrupted instance has its "gone" line, and how often.
HANDLER_WAIT_SECONDS = 60.0
# With --prometheus-url, after the experiment: how long to keep asking for the replacement pods' phases
# (the reclaim comes two minutes after the warning, then the new pod loads: minutes), and how often.
REPLACEMENT_WAIT_SECONDS = 900.0
REPLACEMENT_POLL_SECONDS = 15.0
HANDLER_POLL_SECONDS = 10.0


class DrillError(Exception):
    """A failure with a message for the operator; the command prints it and exits 1."""


def client_config(max_attempts: int = 5) -> Config:
    return Config(retries={"mode": "standard", "total_max_attempts": max_attempts}, user_agent_extra="gennstack-drill")


def explain(exc: ClientError | BotoCoreError) -> str:
    """One line: which call failed, why, and what to do."""
    if isinstance(exc, BotoCoreError):
        return f"AWS call failed: {type(exc).__name__}: {exc} (check your profile, credentials and network)"
    error = exc.response.get("Error", {})
    code, message = str(error.get("Code", "")), str(error.get("Message", ""))
    action = _ACTION.get(exc.operation_name, exc.operation_name)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _THROTTLED or status == 429:
        retries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts")
        after = f" after {retries + 1} attempts" if isinstance(retries, int) else ""
        return f"throttled: {action} answered {code or 'HTTP 429'}{after}; run the drill again in a minute"
    if code in _DENIED:
        return f"permission denied: {action} ({code}: {message}); the drill needs {', '.join(ACTIONS)}"
    if code in _BAD_CREDENTIALS:
        return f"credentials rejected by {action} ({code}: {message}); refresh them (aws sso login) and run again"
    return f"{action} failed: {code}: {message}"


@dataclass(frozen=True)
class DrillTemplate:
    id: str
    handler_log_group: str | None  # None: a template from before the tag existed


def find_template(fis: Any, *, cluster_name: str, generation: str, nodes: int, region: str | None,
                  target: str = "nodes") -> DrillTemplate:
    wanted = template_tags(cluster_name=cluster_name, generation=generation, nodes=nodes, target=target)
    matches = []
    for page in fis.get_paginator("list_experiment_templates").paginate():
        for summary in page.get("experimentTemplates", []):
            tags = summary.get("tags") or {}
            # A template without the target tag is a "nodes" one (they predate it).
            if all(tags.get(key) == value for key, value in wanted.items()) and tags.get(TARGET_TAG, "nodes") == target:
                matches.append(DrillTemplate(summary["id"], tags.get(HANDLER_LOG_GROUP_TAG) or None))
    if not matches:
        labels = ", ".join(f"{k}={v}" for k, v in wanted.items())
        if target == "multinode":
            raise DrillError(
                f"no FIS experiment template tagged {labels} in region {region or '(default)'}: drills or "
                f"serving.multi_node are off, or the stack is not deployed there with both on; set drills.enabled: true "
                f"and serving.multi_node.enabled: true in your config and deploy"
            )
        if target == "no-warning":
            raise DrillError(
                f"no FIS experiment template tagged {labels} in region {region or '(default)'}: drills are off "
                f"(drills.enabled: false), or the stack there was deployed before the no-warning templates existed; "
                f"set drills.enabled: true in your config and deploy"
            )
        raise DrillError(
            f"no FIS experiment template tagged {labels} in region {region or '(default)'}: drills are off "
            f"(drills.enabled: false), --nodes is above drills.max_nodes, or the stack is not deployed "
            f"there; set drills.enabled: true in your config and deploy"
        )
    if len(matches) > 1:
        raise DrillError(f"{len(matches)} FIS experiment templates carry the same drill tags "
                         f"({', '.join(sorted(m.id for m in matches))}); delete the strays")
    return matches[0]


def _state(experiment: dict[str, Any]) -> tuple[str, str, str]:
    state = experiment.get("state") or {}
    error = state.get("error") or {}
    code = error.get("code", "")
    return str(state.get("status", "")), str(state.get("reason", "")), str(code)


class BenchProcess:
    """``gennstack bench`` as a subprocess writing into ``output_dir``."""

    def __init__(self, bench_args: Sequence[str], output_dir: Path) -> None:
        self.argv = [sys.executable, "-m", "gennstack.cli", "bench", *bench_args, "--output-dir", str(output_dir)]
        if not any(arg == "--events" or arg.startswith("--events=") for arg in bench_args):
            # the bench places the drill's events on its timeline (gennstack.bench.timeline)
            self.argv += ["--events", str(output_dir.parent / EVENTS_FILE)]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv)

    def wait(self) -> int:
        assert self.process is not None
        return self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _warn_stderr(text: str) -> None:
    print(f"gennstack drill: warning: {text}", file=sys.stderr, flush=True)


def drill(
    fis: Any,
    *,
    config: GenNStackConfig,
    generation: str,
    nodes: int,
    region: str | None,
    log: EventLog,
    poll_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    bench: BenchProcess | None = None,
    bench_lead_seconds: float = 0.0,
    logs: Any = None,
    warn: Callable[[str], None] = _warn_stderr,
    target: str = "nodes",
    prometheus: Fetch | None = None,
    replacement_wait_seconds: float = REPLACEMENT_WAIT_SECONDS,
) -> int:
    """Run one drill; returns the exit code. Raises :class:`DrillError` with the operator's message.

    Once the experiment has ended (or stopped after Ctrl-C), and before waiting for the bench, the
    interruption handler's lines become markers (:func:`handler_markers`; skipped without ``logs``);
    then, with ``prometheus``, the replacement pods' Ready and first served request
    (:func:`replacement_markers`).
    """
    try:
        template = find_template(fis, cluster_name=config.cluster_name, generation=generation, nodes=nodes, region=region,
                                 target=target)
    except (ClientError, BotoCoreError) as exc:
        raise DrillError(explain(exc)) from exc
    template_id = template.id
    what = {"multinode": f"1 {generation} spot node holding a multi-node group member",
            "no-warning": f"1 {generation} spot node terminated without warning"}.get(target, f"{nodes} {generation} spot node(s)")
    started_at = log.add("drill_start", f"drill: {what}, template {template_id}",
                         template_id=template_id, generation=generation, nodes=nodes, cluster=config.cluster_name, region=region,
                         **({"target": target} if target != "nodes" else {}))
    since = datetime.fromisoformat(started_at["time"].replace("Z", "+00:00"))

    def markers(experiment_id: str) -> None:
        if logs is not None:
            handler_markers(fis, logs, experiment_id=experiment_id, template=template, since=since, log=log, warn=warn,
                            sleep=sleep, monotonic=monotonic)

    experiment_id: str | None = None
    try:
        if bench is not None:
            bench.start()
            log.add("bench_start", f"bench started: {shlex.join(bench.argv[3:])}", argv=bench.argv[3:])
            sleep(bench_lead_seconds)
        try:
            started = fis.start_experiment(
                clientToken=str(uuid.uuid4()),
                experimentTemplateId=template_id,
                tags={"gennstack.io/drill": "spot-interruption", "gennstack.io/generation": generation,
                      **({TARGET_TAG: target} if target != "nodes" else {})},
            )["experiment"]
        except (ClientError, BotoCoreError) as exc:
            raise DrillError(explain(exc)) from exc
        experiment_id = started["id"]
        status, reason, code = _state(started)
        log.add("experiment_started", f"experiment {experiment_id}: {status}", experiment_id=experiment_id, status=status, reason=reason)
        status, reason, code = _follow(fis, experiment_id, log, poll_seconds=poll_seconds, sleep=sleep, last=(status, reason, code))
        markers(experiment_id)
        _check_outcome(experiment_id, status, reason, code)
        if prometheus is not None and target == "multinode":
            warn(f"no replacement markers for --target {target}: the start phases are recorded for server pods only")
        elif prometheus is not None:
            replacement_markers(prometheus, namespace=config.serving.namespace, pool=POOLS[generation], since=since, log=log,
                                warn=warn, sleep=sleep, monotonic=monotonic, wait_seconds=replacement_wait_seconds,
                                served=generation != "inf2")
    except KeyboardInterrupt:
        try:
            if experiment_id is not None:
                _stop(fis, experiment_id, log, sleep=sleep, monotonic=monotonic, poll_seconds=poll_seconds)
                markers(experiment_id)
        finally:
            if bench is not None:
                bench.stop()
                log.add("bench_end", "bench stopped", exit_code=None)
        log.add("drill_end", "drill interrupted (Ctrl-C)", outcome="interrupted")
        return 130
    except DrillError:
        if bench is not None:
            bench.stop()
            log.add("bench_end", "bench stopped", exit_code=None)
        raise
    bench_code = 0
    if bench is not None:
        bench_code = bench.wait()
        log.add("bench_end", f"bench exited {bench_code}", exit_code=bench_code)
    log.add("drill_end", f"drill {status}", outcome=status)
    if status != "completed":
        return 1
    return 0 if bench_code == 0 else 1


def _follow(fis: Any, experiment_id: str, log: EventLog, *, poll_seconds: float, sleep: Callable[[float], None],
            last: tuple[str, str, str]) -> tuple[str, str, str]:
    """Poll until the experiment ends; its final status, reason and error code."""
    status, reason, code = last
    while status not in TERMINAL:
        sleep(poll_seconds)
        try:
            experiment = fis.get_experiment(id=experiment_id)["experiment"]
        except (ClientError, BotoCoreError) as exc:
            raise DrillError(f"{explain(exc)}; experiment {experiment_id} may still be running: "
                             f"aws fis stop-experiment --id {experiment_id}") from exc
        current = _state(experiment)
        if current != (status, reason, code):
            status, reason, code = current
            detail = f" ({reason})" if reason else ""
            log.add("experiment_state", f"experiment {experiment_id}: {status}{detail}",
                    experiment_id=experiment_id, status=status, reason=reason, error_code=code or None)
    return status, reason, code


def _check_outcome(experiment_id: str, status: str, reason: str, code: str) -> None:
    if status == "failed":
        raise DrillError(f"experiment {experiment_id} failed: {reason or 'no reason given'}" + (f" [{code}]" if code else ""))
    if status in ("stopped", "cancelled"):
        raise DrillError(f"experiment {experiment_id} {status}: {reason or 'no reason given'} "
                         "(a stop condition alarm, or someone stopped it)")


def _stop(fis: Any, experiment_id: str, log: EventLog, *, sleep: Callable[[float], None],
          monotonic: Callable[[], float], poll_seconds: float) -> None:
    log.add("stop_requested", f"Ctrl-C: stopping experiment {experiment_id}", experiment_id=experiment_id)
    try:
        fis.stop_experiment(id=experiment_id)
    except (ClientError, BotoCoreError) as exc:
        raise DrillError(f"{explain(exc)}; stop it yourself: aws fis stop-experiment --id {experiment_id}") from exc
    deadline = monotonic() + STOP_WAIT_SECONDS
    while monotonic() < deadline:
        try:
            experiment = fis.get_experiment(id=experiment_id)["experiment"]
        except (ClientError, BotoCoreError) as exc:
            raise DrillError(f"{explain(exc)}; the stop was requested: check experiment {experiment_id} in the FIS console") from exc
        status, reason, _ = _state(experiment)
        if status in TERMINAL:
            log.add("experiment_state", f"experiment {experiment_id}: {status}", experiment_id=experiment_id, status=status, reason=reason)
            return
        sleep(poll_seconds)
    raise DrillError(f"experiment {experiment_id} did not stop within {STOP_WAIT_SECONDS:.0f} s; check it in the FIS console")


def replacement_markers(
    prometheus: Fetch,
    *,
    namespace: str,
    pool: str,
    since: datetime,
    log: EventLog,
    warn: Callable[[str], None],
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
    wait_seconds: float = REPLACEMENT_WAIT_SECONDS,
    poll_seconds: float = REPLACEMENT_POLL_SECONDS,
    served: bool = True,
) -> int:
    """Add, as events, when each of ``pool``'s server pods created since the drill started became Ready
    and served its first request, from the pods' start phases in Prometheus (gennstack/drill/replacements.py);
    how many. Asks again every ``poll_seconds`` until each such pod has served or ``wait_seconds`` have
    passed (a replacement starts when its node is reclaimed or drained, and loads for minutes). Never fails
    the drill: an unreachable Prometheus, an error or a Ctrl-C prints one warning line and keeps what was found."""
    pods: list[str] = []
    phases: list[Phase] = []
    try:
        deadline = monotonic() + wait_seconds
        while True:
            pods, phases = replacement_phases(prometheus, namespace=namespace, pool=pool, since_unix=since.timestamp())
            # gen1-inf2 records no served phase (its vLLM is not scraped): Ready is the last there is to wait for
            if all_served(pods, phases, served=served) or monotonic() + poll_seconds > deadline:
                break
            sleep(poll_seconds)
    except PrometheusError as exc:
        warn(f"replacement markers incomplete: {exc}")
    except KeyboardInterrupt:
        warn("replacement markers incomplete: interrupted (Ctrl-C) while asking Prometheus")
    for phase in phases:
        event = REPLACEMENT_EVENTS[phase.phase]
        log.add(event, f"{phase.pod}: {phase.phase} {phase.seconds:g} s after it was created", at=phase.at,
                source=REPLACEMENT_SOURCE, pod=phase.pod, seconds_after_created=phase.seconds)
    done = {p.pod for p in phases if p.phase == (SERVED_PHASE if served else "ready")}
    summary = (f"replacements: {len(pods)} {pool} pod(s) created since the drill started, {len(done)} "
               + ("served" if served else "Ready (no served phase: its vLLM is not scraped)"))
    if not pods:
        summary += f" (none in {namespace} yet)"
    elif set(pods) - done:
        summary += f"; not {'served' if served else 'Ready'} (yet): {', '.join(sorted(set(pods) - done))}"
    log.say(summary)
    return len(phases)


def handler_markers(
    fis: Any,
    logs: Any,
    *,
    experiment_id: str,
    template: DrillTemplate,
    since: datetime,
    log: EventLog,
    warn: Callable[[str], None],
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
    wait_seconds: float = HANDLER_WAIT_SECONDS,
    poll_seconds: float = HANDLER_POLL_SECONDS,
) -> int:
    """Add the interruption handler's lines about the experiment's instances as events; how many.

    Reads the handler's log group from ``since`` (the drill's start) to now, again every
    ``poll_seconds`` until each instance has its "gone" line or ``wait_seconds`` have passed (log
    lines arrive late). Never fails the drill: a missing tag, a denied or throttled call or a
    Ctrl-C prints one warning line and keeps what was found.
    """
    if template.handler_log_group is None:
        warn(f"no handler markers: template {template.id} has no {HANDLER_LOG_GROUP_TAG} tag (a stack deployed before "
             "the tag existed); deploy the stack again to get them")
        return 0
    markers: list[Marker] = []
    instances: list[str] = []
    read = False  # whether the log was read at least once
    try:
        instances = resolved_instances(fis, experiment_id)
        if not instances:  # it failed at target resolution (EmptyTargetResolutionMode: fail)
            log.say(f"handler: no markers, experiment {experiment_id} resolved no spot instance")
            return 0
        deadline = monotonic() + wait_seconds
        while True:
            events = handler_events(logs, log_group=template.handler_log_group, instances=instances,
                                    start_ms=int(since.timestamp() * 1000), end_ms=int(log.now().timestamp() * 1000))
            markers, read = markers_from_events(events, instances), True
            if gone(markers) >= set(instances) or monotonic() + poll_seconds > deadline:
                break
            sleep(poll_seconds)
    except (ClientError, BotoCoreError) as exc:
        problem = explain(exc)
        if problem.startswith("throttled:"):
            problem = problem.split("; run the drill again", 1)[0]
        warn(f"handler markers incomplete: {problem}; the lines stay in log group {template.handler_log_group}")
    except KeyboardInterrupt:
        warn("handler markers incomplete: interrupted (Ctrl-C) while reading the handler's log")
    for marker in markers:
        log.add(marker.event, marker.text, at=marker.time, source=HANDLER_SOURCE, instance_id=marker.instance_id, **marker.fields)
    silent = [i for i in instances if read and i not in {m.instance_id for m in markers}]
    not_gone = [i for i in instances if read and i not in gone(markers) and i not in silent]
    summary = f"handler: {len(markers)} marker(s) for {len(instances)} instance(s)"
    if silent:
        summary += f"; no handler line for {', '.join(silent)}"
    if not_gone:
        summary += f"; no gone line (yet) for {', '.join(not_gone)}"
    if instances:
        log.say(summary)
    return len(markers)


def run_local(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None,
              now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> int:
    """``gennstack drill --local``: drain routing on against off, on this machine."""
    from gennstack.cli_config import command_config
    from gennstack.drill.local import LocalDrillError, LocalDrillSettings, run_local_drill

    out, err = stdout or sys.stdout, stderr or sys.stderr
    config = command_config(args, command="drill", err=err)
    if config is None:
        return 2
    generation = args.generation or "g6e"
    models = [name for name, backend in config.gateway.models.items() if backend.generation == generation]
    if not models:
        print(f"gennstack drill --local: --generation {generation}: no model in gateway.models is served by it", file=err)
        return 2
    settings = LocalDrillSettings(model=models[0], replicas=args.replicas, concurrency=args.concurrency,
                                  duration_s=args.duration, warning_at_s=args.warning_at, gone_after_s=args.gone_after,
                                  dns_ttl_s=args.dns_ttl)
    try:
        settings.check()
    except LocalDrillError as exc:
        print(f"gennstack drill --local: {exc}", file=err)
        return 2
    output = Path(args.output_dir or Path("drill-results") / f"{now():%Y%m%dT%H%M%SZ}-local-{generation}")
    output.mkdir(parents=True, exist_ok=True)
    cases = {case.strip() for case in args.cases.split(",")}
    if not cases or cases - {"drain", "resume", "smollm2"}:
        print(f"gennstack drill --local: --cases {args.cases!r}: a comma-separated choice of drain, resume, smollm2",
              file=err)
        return 2
    try:
        if "drain" in cases:
            run_local_drill(settings, output, gateway=config.gateway, out=out)
        if "resume" in cases:
            from gennstack.drill.resume_drill import run_resume_drill

            run_resume_drill(output)
        if "smollm2" in cases:
            from gennstack.drill.smollm2_drill import run_demo_drill

            run_demo_drill(output)
    except (LocalDrillError, RuntimeError, TimeoutError, OSError) as exc:
        print(f"gennstack drill --local: {exc}", file=err)
        return 1
    except KeyboardInterrupt:
        print("gennstack drill --local: interrupted", file=err)
        return 130
    for name in ("comparison.md", "replacements.md", "resume.md", "smollm2.md"):
        if (output / name).exists():
            print("", file=out)
            print((output / name).read_text(encoding="utf-8"), file=out)
    print(f"results: {output}", file=out)
    return 0


def run(
    args: argparse.Namespace,
    *,
    make_session: Callable[..., Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    make_bench: Callable[[Sequence[str], Path], BenchProcess] = BenchProcess,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    from gennstack.cli_config import command_config, resolve_region

    if args.local and args.target == "multinode":
        print("gennstack drill --local: --target multinode: the local drill's replicas are single processes, it models no "
              "multi-node group (drop --target, or run it in AWS)", file=stderr or sys.stderr)
        return 2
    if args.local and args.target == "no-warning":
        print("gennstack drill --local: --target no-warning: the local drill's no-warning case is --cases resume (a replica "
              "SIGKILLed); --target picks an AWS FIS template", file=stderr or sys.stderr)
        return 2
    if args.local:
        return run_local(args, stdout=stdout, stderr=stderr, now=now)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    if args.generation is None and args.target != "multinode":
        print("gennstack drill: --generation is required (or --local for a drill on this machine)", file=err)
        return 2
    config = command_config(args, command="drill", err=err)
    if config is None:
        return 2
    if args.target == "no-warning" and args.nodes != 1:
        print(f"gennstack drill: --target no-warning --nodes {args.nodes}: allowed 1 (one template terminates one node)",
              file=err)
        return 2
    if args.target == "multinode":
        multi_node = config.serving.multi_node
        if not multi_node.enabled:
            print("gennstack drill: --target multinode: serving.multi_node.enabled is false in the config (no group to target)", file=err)
            return 2
        if args.generation not in (None, multi_node.generation):
            print(f"gennstack drill: --target multinode --generation {args.generation}: the groups run on "
                  f"{multi_node.generation} (serving.multi_node.generation)", file=err)
            return 2
        if args.nodes != 1:
            print(f"gennstack drill: --target multinode --nodes {args.nodes}: allowed 1 (one member node; the handler "
                  "drains its whole group)", file=err)
            return 2
        args.generation = multi_node.generation
    if args.generation not in config.generations.enabled():
        print(f"gennstack drill: --generation {args.generation}: not enabled in the config (enabled: {list(config.generations.enabled())})", file=err)
        return 2
    if not 1 <= args.nodes <= config.drills.max_nodes:
        print(f"gennstack drill: --nodes {args.nodes}: allowed 1 to drills.max_nodes ({config.drills.max_nodes})", file=err)
        return 2
    try:
        bench_args = shlex.split(args.bench_args) if args.bench_args else None
    except ValueError as exc:
        print(f"gennstack drill: --bench-args {args.bench_args!r}: {exc}", file=err)
        return 2
    if bench_args and "--output-dir" in bench_args:
        print("gennstack drill: --bench-args must not hold --output-dir: the bench writes into the drill's folder", file=err)
        return 2
    which = "multinode" if args.target == "multinode" else str(args.nodes)
    output = Path(args.output_dir or Path("drill-results") / f"{now():%Y%m%dT%H%M%SZ}-{args.generation}-{which}")
    output.mkdir(parents=True, exist_ok=True)
    log = EventLog(output / EVENTS_FILE, out, now)
    if make_session is None:
        import boto3

        make_session = boto3.Session
    try:
        session = make_session(profile_name=args.profile) if args.profile else make_session()
        region, _ = resolve_region(args.region, config, session.region_name)
        fis = session.client("fis", region_name=region, config=client_config())
        logs = session.client("logs", region_name=region, config=client_config())
    except BotoCoreError as exc:
        print(f"gennstack drill: {explain(exc)}", file=err)
        return 1
    bench = make_bench(bench_args, output / "bench") if bench_args else None
    try:
        code = drill(fis, config=config, generation=args.generation, nodes=args.nodes, region=region, log=log,
                     poll_seconds=args.poll_seconds, sleep=sleep, monotonic=monotonic, bench=bench,
                     bench_lead_seconds=args.bench_lead, logs=logs,
                     warn=lambda text: print(f"gennstack drill: warning: {text}", file=err, flush=True), target=args.target,
                     prometheus=http_fetch(args.prometheus_url) if args.prometheus_url else None,
                     replacement_wait_seconds=args.replacement_wait)
    except DrillError as exc:
        log.add("drill_end", f"drill failed: {exc}", outcome="error", error=str(exc))
        print(f"gennstack drill: {exc}", file=err)
        return 1
    print(f"results: {output}", file=out)
    return code


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "drill",
        help="interrupt spot nodes on purpose with AWS FIS (drills.enabled), optionally under gennstack bench load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--generation", choices=GENERATION_NAMES,
                        help="whose spot NodePool to interrupt (required in AWS; with --local, whose model to serve, default g6e)")
    parser.add_argument("--nodes", type=int, default=1, help="how many running spot nodes (1 to drills.max_nodes; default: %(default)s)")
    parser.add_argument("--target", choices=TARGETS, default="nodes",
                        help="nodes: any running spot nodes of the generation's NodePool; multinode: one member node of a "
                             "multi-node group (serving.multi_node; --generation defaults to its generation, --nodes 1); "
                             "no-warning: one running spot node terminated at once, no rebalance or warning (--nodes 1) "
                             "(default: %(default)s)")
    parser.add_argument("--bench-args", metavar="ARGS",
                        help="run `gennstack bench ARGS` meanwhile, e.g. --bench-args=\"--base-url https://GATEWAY/v1 --model gennstack-default "
                             "--concurrency 32 --duration 600\" (write it with '=': ARGS starts with '-')")
    parser.add_argument("--bench-lead", type=float, default=60.0, metavar="SECONDS",
                        help="start the bench this long before the experiment, for a baseline (default: %(default)s)")
    parser.add_argument("--poll-seconds", type=float, default=5.0, help="GetExperiment interval (default: %(default)s)")
    parser.add_argument("--prometheus-url", metavar="URL",
                        help="the stack's Prometheus (e.g. a kubectl port-forward, http://127.0.0.1:9090): after the experiment, "
                             "add when the generation's replacement pods became Ready and served their first request, "
                             "from their start phases")
    parser.add_argument("--replacement-wait", type=float, default=REPLACEMENT_WAIT_SECONDS, metavar="SECONDS",
                        help="with --prometheus-url, how long to wait for every replacement to serve (default: %(default)s)")
    parser.add_argument("--output-dir", help="result folder (default: drill-results/<UTC time>-<generation>-<nodes>)")
    parser.add_argument("--config", metavar="PATH", help="config file deep-merged over cdk.json, as `-c config=PATH`")
    parser.add_argument("--cdk-json", default="cdk.json", metavar="PATH", help="cdk.json to read (default: %(default)s)")
    parser.add_argument("--region", help="region (default: the config's region, else your profile's)")
    parser.add_argument("--profile", help="AWS profile to use (default: the environment's credentials)")
    local = parser.add_argument_group("--local: a drill on this machine, drain routing on against off (no AWS)")
    local.add_argument("--local", action="store_true", help="run the local drill instead of an AWS FIS experiment")
    local.add_argument("--replicas", type=int, default=2, help="mock replicas of the model, one doomed (default: %(default)s)")
    local.add_argument("--concurrency", type=int, default=16, help="bench concurrency (default: %(default)s)")
    local.add_argument("--duration", type=int, default=30, help="bench seconds per run (default: %(default)s)")
    local.add_argument("--warning-at", type=float, default=10.0, metavar="SECONDS",
                       help="the doomed replica's warning, after the bench reaches it (default: %(default)s)")
    local.add_argument("--gone-after", type=float, default=12.0, metavar="SECONDS",
                       help="the doomed replica is gone this long after its warning (AWS: 120; default: %(default)s)")
    local.add_argument("--dns-ttl", type=int, default=1, metavar="SECONDS",
                       help="TTL of the Service's DNS answer (CoreDNS's default: 5; default: %(default)s)")
    local.add_argument("--cases", default="drain,resume", metavar="drain,resume",
                       help="drain: the warned replica, drain routing on and off (comparison.md); resume: a replica "
                            "SIGKILLed without warning and answers longer than the grace, stream resume off and on "
                            "(resume.md); smollm2: the real model (make setup-demo), a SmolLM2 replica SIGKILLed "
                            "mid-answer, stream resume off and on (smollm2.md) (default: %(default)s)")
    parser.set_defaults(func=run)
