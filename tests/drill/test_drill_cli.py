"""`gennstack drill` against botocore-Stubber FIS and CloudWatch Logs clients: start, follow, Ctrl-C,
the interruption handler's markers, every failure message.

Stubber validates every request against the service's model and every queued response against
its output shape, so the calls and fields the command uses are FIS's and CloudWatch Logs' own. No
test reaches AWS.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from gennstack.drill.cli import BenchProcess, client_config, run
from tests.support import ROOT

REGION = "us-east-2"
TEMPLATE_ID = "EXT1a2b3c4d5e6f7"
EXPERIMENT_ID = "EXPaBcDeFgHiJkLmN"
START = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
LOG_GROUP = "GenNStack-InterruptionHandlerLogs5716003B-Ab3dEf6hIj9k"
INSTANCE = "i-0a1b2c3d4e5f60718"


def tags(generation: str = "g6e", nodes: int = 1, cluster: str = "gennstack") -> dict[str, str]:
    return {
        "gennstack.io/drill": "spot-interruption",
        "gennstack.io/cluster": cluster,
        "gennstack.io/generation": generation,
        "gennstack.io/nodes": str(nodes),
        "gennstack.io/handler-log-group": LOG_GROUP,
        "project": "gennstack",
    }


def experiment(status: str, reason: str = "", code: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"status": status}
    if reason:
        state["reason"] = reason
    if code:
        state["error"] = {"code": code}
    return {"experiment": {"id": EXPERIMENT_ID, "experimentTemplateId": TEMPLATE_ID, "state": state}}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return START + timedelta(seconds=self.t)


class FakeSession:
    def __init__(self, fis: Any, logs: Any) -> None:
        self.clients = {"fis": fis, "logs": logs}
        self.region_name = "eu-central-1"
        self.asked: list[tuple[str, str | None]] = []

    def client(self, service: str, region_name: str | None = None, config: Any = None) -> Any:
        self.asked.append((service, region_name))
        return self.clients[service]


class FakeBench(BenchProcess):
    def __init__(self, bench_args: Sequence[str], output_dir: Path, *, code: int = 0) -> None:
        super().__init__(bench_args, output_dir)
        self.events: list[str] = []
        self.code = code

    def start(self) -> None:
        self.events.append("start")

    def wait(self) -> int:
        self.events.append("wait")
        return self.code

    def stop(self) -> None:
        self.events.append("stop")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    for key in ("AWS_PROFILE", "AWS_REGION", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))


def stubbed(service: str) -> tuple[Any, Stubber]:
    """A real botocore client of ``service`` behind an active Stubber (no retries)."""
    client = boto3.Session(region_name=REGION).client(service, region_name=REGION, config=client_config(1))
    stubber = Stubber(client)
    stubber.activate()
    return client, stubber


@pytest.fixture
def fis() -> tuple[Any, Stubber]:
    return stubbed("fis")


@pytest.fixture
def logs() -> tuple[Any, Stubber]:
    return stubbed("logs")


def list_templates(stubber: Stubber, *summaries: dict[str, Any]) -> None:
    stubber.add_response("list_experiment_templates", {"experimentTemplates": list(summaries)}, {})


def summary(template_id: str = TEMPLATE_ID, **tag_args: Any) -> dict[str, Any]:
    return {"id": template_id, "description": "GenNStack drill", "tags": tags(**tag_args)}


def start(stubber: Stubber, status: str = "initiating") -> None:
    stubber.add_response(
        "start_experiment",
        experiment(status),
        {"clientToken": ANY, "experimentTemplateId": TEMPLATE_ID,
         "tags": {"gennstack.io/drill": "spot-interruption", "gennstack.io/generation": "g6e"}},
    )


def get(stubber: Stubber, status: str, reason: str = "", code: str | None = None) -> None:
    stubber.add_response("get_experiment", experiment(status, reason, code), {"id": EXPERIMENT_ID})


def ms(seconds: float) -> int:
    """START + seconds, in CloudWatch's epoch milliseconds."""
    return int((START + timedelta(seconds=seconds)).timestamp() * 1000)


def resolved(stubber: Stubber, *instances: str, experiment_id: str = EXPERIMENT_ID) -> None:
    """ListExperimentResolvedTargets: the spot instances the experiment interrupted."""
    stubber.add_response(
        "list_experiment_resolved_targets",
        {"resolvedTargets": [
            {"resourceType": "aws:ec2:spot-instance", "targetName": "gen3-g6e-spot-nodes",
             "targetInformation": {"arn": f"arn:aws:ec2:{REGION}:123456789012:instance/{instance}"}}
            for instance in instances
        ]},
        {"experimentId": experiment_id},
    )


def handler_line(message: str, instance: str = INSTANCE, **fields: Any) -> str:
    """A line as the handler's Powertools logger writes it (shape of tests/lambdas' real output)."""
    line = {
        "level": "INFO", "location": "_publish:109", "message": message, "timestamp": "2026-11-30 12:01:00,633+0000",
        "service": "interruption-handler", "cold_start": False, "function_name": "GenNStack-InterruptionHandler",
        "function_memory_size": 256, "function_arn": f"arn:aws:lambda:{REGION}:123456789012:function:GenNStack-InterruptionHandler",
        "function_request_id": "52fdfc07-2182-154f-163f-5f0f9a621d72", "event_id": "12345678-1234-1234-1234-123456789012",
        "outcome": message.split(" ", 1)[1], "instance_id": instance, **fields,
    }
    return json.dumps(line) + "\n"


def recorded(signal: str, instance: str = INSTANCE, outcome: str = "recorded", drained: list[str] | None = None) -> str:
    fields: dict[str, Any] = {"nodepool": "gen3-g6e", "generation": "g6e", "replicas": 2, "previous_replicas": 1, "active": 1,
                              "signal": signal, "prewarm_latency_ms": 812.4}
    if drained is not None:
        fields.update(node="ip-10-0-1-1.us-east-2.compute.internal", drained_pods=drained, drain_latency_ms=640.2)
    return handler_line(f"instance {outcome}", instance, **fields)


def terminated(instance: str = INSTANCE, state: str = "shutting-down") -> str:
    return handler_line("instance terminated", instance, detail=state)


def log_event(at_s: float, message: str) -> dict[str, Any]:
    return {"logStreamName": "2026/11/30/[$LATEST]0123456789abcdef0123456789abcdef", "timestamp": ms(at_s), "message": message,
            "ingestionTime": ms(at_s + 4), "eventId": f"3797{ms(at_s)}000000000000000000000000000000"}


def filtered(stubber: Stubber, *events: dict[str, Any], until_s: float, instances: Sequence[str] = (INSTANCE,),
             log_group: str = LOG_GROUP) -> None:
    """One FilterLogEvents page: the handler's lines from the drill's start to ``until_s``."""
    pattern = "{ " + " || ".join(f'($.instance_id = "{i}")' for i in instances) + " }"
    stubber.add_response(
        "filter_log_events",
        {"events": list(events), "searchedLogStreams": []},
        {"logGroupName": log_group, "startTime": ms(0), "endTime": ms(until_s), "filterPattern": pattern},
    )


def handler_seen(fis_stubber: Stubber, logs_stubber: Stubber, *, until_s: float) -> None:
    """The usual end of a drill: one instance, its warning and its gone line already in the log."""
    resolved(fis_stubber, INSTANCE)
    filtered(logs_stubber, log_event(until_s - 15, recorded("spot_interruption_warning")),
             log_event(until_s - 5, terminated()), until_s=until_s)


def completed_drill(stubber: Stubber) -> None:
    """Template, start, completed at t=5 (one poll)."""
    list_templates(stubber, summary())
    start(stubber)
    get(stubber, "completed")


def drill_cli(tmp_path: Path, fis: tuple[Any, Stubber], argv: list[str], *, config: dict[str, Any] | None = None,
              bench: list[FakeBench] | None = None, bench_code: int = 0, sleep_hook: Any = None,
              logs: tuple[Any, Stubber] | None = None) -> tuple[int, str, str, Path]:
    from gennstack.cli import build_parser

    client, stubber = fis
    if logs is None:  # a drill that never reads the handler's log: any call fails the stubber
        logs = stubbed("logs")
    config_file = tmp_path / "drill.json"
    config_file.write_text(json.dumps(config or {"region": REGION, "drills": {"enabled": True}}))
    output = tmp_path / "result"
    args = build_parser().parse_args(
        ["drill", "--cdk-json", str(ROOT / "cdk.json"), "--config", str(config_file), "--output-dir", str(output), *argv]
    )
    clock = Clock()
    out, err = io.StringIO(), io.StringIO()
    session = FakeSession(client, logs[0])

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if sleep_hook is not None:
            sleep_hook(len(clock.sleeps))

    def make_bench(bench_args: Sequence[str], output_dir: Path) -> FakeBench:
        made = FakeBench(bench_args, output_dir, code=bench_code)
        if bench is not None:
            bench.append(made)
        return made

    code = run(args, make_session=lambda **_: session, sleep=sleep, monotonic=clock.monotonic, now=clock.now,
               make_bench=make_bench, stdout=out, stderr=err)
    stubber.assert_no_pending_responses()
    logs[1].assert_no_pending_responses()
    assert session.asked in ([], [("fis", REGION), ("logs", REGION)])
    return code, out.getvalue(), err.getvalue(), output


def events(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "drill-events.jsonl").read_text().splitlines()]


def test_starts_the_tagged_template_and_follows_it_to_completion(tmp_path: Path, fis: tuple[Any, Stubber],
                                                                 logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary("EXTother000000001", generation="trn2"), summary("EXTother000000002", nodes=2),
                   summary("EXTother000000003", cluster="staging"), summary())
    start(stubber)
    get(stubber, "initiating")
    get(stubber, "running")
    get(stubber, "running")
    get(stubber, "completed", "Experiment completed.")
    handler_seen(stubber, logs[1], until_s=20)
    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--nodes", "1", "--poll-seconds", "5"], logs=logs)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"12:00:00Z  drill: 1 g6e spot node(s), template {TEMPLATE_ID}"
    assert lines[1] == f"12:00:00Z  experiment {EXPERIMENT_ID}: initiating"
    # a state is printed when it changes, with the time of the poll that saw it
    assert lines[2] == f"12:00:10Z  experiment {EXPERIMENT_ID}: running"
    assert lines[3] == f"12:00:20Z  experiment {EXPERIMENT_ID}: completed (Experiment completed.)"
    # the handler's lines, printed at their own times, once the experiment has ended
    assert lines[4:7] == [f"12:00:05Z  handler: {INSTANCE} interruption warning",
                          f"12:00:15Z  handler: {INSTANCE} node gone (state shutting-down)",
                          "12:00:20Z  handler: 2 marker(s) for 1 instance(s)"]
    assert lines[-1] == f"results: {output}"
    log = events(output)
    assert [e["event"] for e in log] == ["drill_start", "experiment_started", "experiment_state", "experiment_state",
                                         "interruption_warning", "node_gone", "drill_end"]
    assert log[0] == {"time": "2026-11-30T12:00:00Z", "event": "drill_start", "template_id": TEMPLATE_ID, "generation": "g6e",
                      "nodes": 1, "cluster": "gennstack", "region": REGION}
    assert [e.get("status") for e in log[1:4]] == ["initiating", "running", "completed"]
    assert log[-1]["outcome"] == "completed"


def test_ctrl_c_stops_the_experiment_and_waits_for_it(tmp_path: Path, fis: tuple[Any, Stubber], logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber, "running")
    stubber.add_response("stop_experiment", experiment("stopping"), {"id": EXPERIMENT_ID})
    get(stubber, "stopping")
    get(stubber, "stopped", "Experiment stopped by user.")
    # stopped before the reclaim: the warning is in the log, the gone line never comes
    resolved(stubber, INSTANCE)
    for until in (10, 20, 30, 40, 50, 60, 70):
        filtered(logs[1], log_event(3, recorded("rebalance_recommendation")), until_s=until)

    def interrupt(sleeps: int) -> None:
        if sleeps == 1:  # during the first poll wait; the stop's own waits go on
            raise KeyboardInterrupt

    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"], sleep_hook=interrupt, logs=logs)
    assert code == 130 and err == ""
    assert f"Ctrl-C: stopping experiment {EXPERIMENT_ID}" in out
    assert f"handler: 1 marker(s) for 1 instance(s); no gone line (yet) for {INSTANCE}" in out
    log = events(output)
    assert [e["event"] for e in log][-4:] == ["stop_requested", "experiment_state", "rebalance_recommendation", "drill_end"]
    assert log[-3]["status"] == "stopped" and log[-1]["outcome"] == "interrupted"


def test_bench_runs_around_the_experiment_into_the_same_folder(tmp_path: Path, fis: tuple[Any, Stubber],
                                                               logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    completed_drill(stubber)
    handler_seen(stubber, logs[1], until_s=35)
    made: list[FakeBench] = []
    code, out, _, output = drill_cli(
        tmp_path, fis,
        ["--generation", "g6e", "--bench-lead", "30", "--bench-args", "--base-url https://gw.example/v1 --model 'gennstack-default' --duration 600"],
        bench=made, logs=logs,
    )
    assert code == 0
    (bench,) = made
    assert bench.argv[1:] == ["-m", "gennstack.cli", "bench", "--base-url", "https://gw.example/v1", "--model",
                              "gennstack-default", "--duration", "600", "--output-dir", str(output / "bench"),
                              "--events", str(output / "drill-events.jsonl")]
    assert bench.events == ["start", "wait"]
    log = events(output)
    # the handler's markers are in the file before the bench ends (it reads the file at its end)
    assert [e["event"] for e in log] == ["drill_start", "bench_start", "experiment_started", "experiment_state",
                                         "interruption_warning", "node_gone", "bench_end", "drill_end"]
    # the experiment starts bench-lead seconds after the bench
    assert log[1]["time"] == "2026-11-30T12:00:00Z" and log[2]["time"] == "2026-11-30T12:00:30Z"


def test_a_failing_bench_fails_the_drill(tmp_path: Path, fis: tuple[Any, Stubber], logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    completed_drill(stubber)
    handler_seen(stubber, logs[1], until_s=5)
    code, _, _, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--bench-lead", "0", "--bench-args", "--duration 5"],
                                   bench_code=3, logs=logs)
    bench_end = events(output)[-2]
    assert code == 1 and (bench_end["event"], bench_end["exit_code"]) == ("bench_end", 3)
    assert events(output)[-1]["outcome"] == "completed"  # the experiment itself completed


def test_ctrl_c_also_stops_the_bench(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())

    def interrupt(sleeps: int) -> None:
        if sleeps == 1:  # during the bench lead, before the experiment exists: nothing to stop in FIS
            raise KeyboardInterrupt

    made: list[FakeBench] = []
    code, out, _, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--bench-args", "--duration 600"], bench=made,
                                     sleep_hook=interrupt)
    assert code == 130 and made[0].events == ["start", "stop"]
    assert [e["event"] for e in events(output)] == ["drill_start", "bench_start", "bench_end", "drill_end"]


def test_the_real_bench_command_line_is_gennstack_bench(tmp_path: Path) -> None:
    bench = BenchProcess(["--duration", "5"], tmp_path / "b")
    assert bench.argv[1:4] == ["-m", "gennstack.cli", "bench"]
    from gennstack.cli import build_parser

    parsed = build_parser().parse_args(bench.argv[3:])
    assert parsed.duration == 5.0 and parsed.output_dir == tmp_path / "b"
    assert parsed.events == tmp_path / "drill-events.jsonl"
    # an --events of the operator's own is left alone
    own = BenchProcess(["--events=mine.jsonl"], tmp_path / "b")
    assert build_parser().parse_args(own.argv[3:]).events == Path("mine.jsonl") and own.argv.count("--events") == 0


# ---- every failure, with its message ---------------------------------------------------------------


def test_no_template_means_drills_are_off_or_not_deployed(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary(generation="trn2"))
    code, _, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert code == 1
    assert "no FIS experiment template tagged gennstack.io/drill=spot-interruption, gennstack.io/cluster=gennstack, " \
           "gennstack.io/generation=g6e, gennstack.io/nodes=1 in region us-east-2: drills are off (drills.enabled: false)" in err
    assert "set drills.enabled: true in your config and deploy" in err
    assert events(output)[-1]["outcome"] == "error"


def test_two_matching_templates_are_refused(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary("EXTaaaaaaaaaaaaa1"), summary("EXTaaaaaaaaaaaaa2"))
    code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert code == 1 and "2 FIS experiment templates carry the same drill tags (EXTaaaaaaaaaaaaa1, EXTaaaaaaaaaaaaa2)" in err


def test_failed_experiment_reports_its_reason(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber)
    get(stubber, "failed", "Target resolution returned empty set for target gen3-g6e-spot-nodes.", "TargetResolutionFailed")
    resolved(stubber)  # nothing resolved: no handler line to look for
    code, out, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert code == 1
    assert f"handler: no markers, experiment {EXPERIMENT_ID} resolved no spot instance" in out
    assert err.strip() == (f"gennstack drill: experiment {EXPERIMENT_ID} failed: Target resolution returned empty set "
                           "for target gen3-g6e-spot-nodes. [TargetResolutionFailed]")


def test_stop_condition_reports_stopped(tmp_path: Path, fis: tuple[Any, Stubber], logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber)
    get(stubber, "stopped", "Experiment stopped by stop condition.")
    handler_seen(stubber, logs[1], until_s=5)
    code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"], logs=logs)
    assert code == 1 and f"experiment {EXPERIMENT_ID} stopped: Experiment stopped by stop condition. (a stop condition alarm" in err


@pytest.mark.parametrize(
    ("method", "code", "status", "message"),
    [
        ("list_experiment_templates", "AccessDeniedException", 403,
         "permission denied: fis:ListExperimentTemplates (AccessDeniedException: no); the drill needs fis:ListExperimentTemplates, "
         "fis:StartExperiment, fis:TagResource, fis:GetExperiment, fis:StopExperiment, fis:ListExperimentResolvedTargets, "
         "logs:FilterLogEvents"),
        ("list_experiment_templates", "ThrottlingException", 400, "throttled: fis:ListExperimentTemplates answered ThrottlingException"),
        ("list_experiment_templates", "ExpiredTokenException", 400, "credentials rejected by fis:ListExperimentTemplates"),
        ("start_experiment", "ServiceQuotaExceededException", 402, "fis:StartExperiment failed: ServiceQuotaExceededException: no"),
        ("start_experiment", "AccessDeniedException", 403, "permission denied: fis:StartExperiment"),
        ("get_experiment", "ThrottlingException", 400,
         f"throttled: fis:GetExperiment answered ThrottlingException; run the drill again in a minute; experiment {EXPERIMENT_ID} "
         f"may still be running: aws fis stop-experiment --id {EXPERIMENT_ID}"),
    ],
)
def test_aws_errors_name_the_action_and_the_fix(tmp_path: Path, fis: tuple[Any, Stubber], method: str, code: str, status: int,
                                                message: str) -> None:
    _, stubber = fis
    if method != "list_experiment_templates":
        list_templates(stubber, summary())
    if method == "get_experiment":
        start(stubber)
    stubber.add_client_error(method, service_error_code=code, service_message="no", http_status_code=status)
    exit_code, _, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert exit_code == 1 and message in err, err
    assert events(output)[-1]["event"] == "drill_end"


def test_stop_failure_says_how_to_stop_it(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber, "running")
    stubber.add_client_error("stop_experiment", service_error_code="AccessDeniedException", service_message="no", http_status_code=403)

    def interrupt(sleeps: int) -> None:
        if sleeps == 1:
            raise KeyboardInterrupt

    code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"], sleep_hook=interrupt)
    assert code == 1 and "permission denied: fis:StopExperiment" in err and f"aws fis stop-experiment --id {EXPERIMENT_ID}" in err


@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        (["--generation", "trn2"], {"generations": {"trn2": {"enabled": False}}}, "--generation trn2: not enabled in the config"),
        (["--generation", "g6e", "--nodes", "3"], {"drills": {"max_nodes": 2}}, "--nodes 3: allowed 1 to drills.max_nodes (2)"),
        (["--generation", "g6e", "--nodes", "0"], {}, "--nodes 0: allowed 1 to drills.max_nodes (2)"),
        (["--generation", "g6e", "--bench-args", "--model 'x"], {}, "--bench-args \"--model 'x\": No closing quotation"),
        (["--generation", "g6e", "--bench-args=--output-dir"], {}, "--bench-args must not hold --output-dir"),
        (["--generation", "g6e"], {"drills": {"max_nodes": 9}}, "drills.max_nodes: got 9"),
    ],
)
def test_bad_arguments_exit_2_without_calling_aws(tmp_path: Path, fis: tuple[Any, Stubber], argv: list[str], config: dict[str, Any],
                                                  message: str) -> None:
    code, _, err, _ = drill_cli(tmp_path, fis, argv, config={"region": REGION, **config})
    assert code == 2 and message in err, err


@pytest.mark.slow
def test_a_real_bench_run_lands_beside_the_drill_log(tmp_path: Path, fis: tuple[Any, Stubber], logs: tuple[Any, Stubber]) -> None:
    """The real `gennstack bench` subprocess (its bundled mock server, loopback only) writes into the drill's folder."""
    _, stubber = fis
    completed_drill(stubber)
    handler_seen(stubber, logs[1], until_s=5)
    from gennstack.cli import build_parser
    from gennstack.drill.cli import run as run_drill

    config_file = tmp_path / "drill.json"
    config_file.write_text(json.dumps({"region": REGION, "drills": {"enabled": True}}))
    output = tmp_path / "result"
    args = build_parser().parse_args([
        "drill", "--cdk-json", str(ROOT / "cdk.json"), "--config", str(config_file), "--output-dir", str(output),
        "--generation", "g6e", "--bench-lead", "0",
        "--bench-args", "demo --concurrency 1 --duration 2 --max-tokens 8 --warmup-seconds 0 --no-progress",
    ])
    clock = Clock()
    code = run_drill(args, make_session=lambda **_: FakeSession(fis[0], logs[0]), sleep=clock.sleep, monotonic=clock.monotonic,
                     now=clock.now, stdout=io.StringIO(), stderr=io.StringIO())
    stubber.assert_no_pending_responses()
    logs[1].assert_no_pending_responses()
    assert code == 0
    result = json.loads((output / "bench" / "result.json").read_text())
    assert result  # the bench's own result, written by the bench
    assert [e["event"] for e in events(output)] == [
        "drill_start", "bench_start", "experiment_started", "experiment_state", "interruption_warning", "node_gone",
        "bench_end", "drill_end"]
    assert events(output)[-2]["exit_code"] == 0


def test_following_a_stop_that_fails_says_so(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber, "running")
    stubber.add_response("stop_experiment", experiment("stopping"), {"id": EXPERIMENT_ID})
    stubber.add_client_error("get_experiment", service_error_code="ThrottlingException", service_message="slow down", http_status_code=400)

    def interrupt(sleeps: int) -> None:
        if sleeps == 2:  # sleep 1 is the bench lead, 2 the first poll
            raise KeyboardInterrupt

    made: list[FakeBench] = []
    code, _, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--bench-lead", "0", "--bench-args", "--duration 9"],
                                     bench=made, sleep_hook=interrupt)
    assert code == 1 and "throttled: fis:GetExperiment" in err and f"check experiment {EXPERIMENT_ID} in the FIS console" in err
    assert made[0].events == ["start", "stop"]
    assert [e["event"] for e in events(output)][-3:] == ["stop_requested", "bench_end", "drill_end"]


# ---- the interruption handler's markers -------------------------------------------------------------

SECOND = "i-0f1e2d3c4b5a69788"


def test_handler_lines_become_markers_in_time_order_as_they_arrive(tmp_path: Path, fis: tuple[Any, Stubber],
                                                                   logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    completed_drill(stubber)
    resolved(stubber, INSTANCE, SECOND)
    both = (INSTANCE, SECOND)
    rebalance = log_event(1, recorded("rebalance_recommendation", drained=["gen3-g6e-7f9c-0"]))
    rebalance_2 = log_event(1.5, recorded("rebalance_recommendation", SECOND))
    platform = log_event(1.6, "START RequestId: 52fdfc07-2182-154f-163f-5f0f9a621d72 Version: $LATEST\n")
    warning = log_event(3, recorded("spot_interruption_warning", outcome="duplicate"))
    redelivered = log_event(3.5, recorded("spot_interruption_warning", outcome="duplicate"))
    warning_2 = log_event(3.2, recorded("spot_interruption_warning", SECOND, outcome="duplicate", drained=["gen3-g6e-7f9c-1"]))
    gone = log_event(4, terminated())
    gone_again = log_event(4.5, terminated(state="terminated"))
    gone_2 = log_event(6, terminated(SECOND))
    # ingestion lags: the first read has the first instance's lines only, the second has everything
    filtered(logs[1], rebalance, platform, warning, gone, until_s=5, instances=both)
    filtered(logs[1], rebalance, rebalance_2, platform, warning_2, warning, redelivered, gone, gone_again, gone_2,
             until_s=15, instances=both)
    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"], logs=logs)
    assert (code, err) == (0, "")
    assert "12:00:15Z  handler: 8 marker(s) for 2 instance(s)" in out
    assert f"12:00:01Z  handler: {INSTANCE} drained (node ip-10-0-1-1.us-east-2.compute.internal, pods gen3-g6e-7f9c-0)" in out
    handler = [e for e in events(output) if e.get("source") == "interruption-handler"]
    assert [(e["time"], e["event"], e["instance_id"]) for e in handler] == [
        ("2026-11-30T12:00:01Z", "rebalance_recommendation", INSTANCE),
        ("2026-11-30T12:00:01Z", "drained", INSTANCE),
        ("2026-11-30T12:00:01.500000Z", "rebalance_recommendation", SECOND),
        ("2026-11-30T12:00:03Z", "interruption_warning", INSTANCE),
        ("2026-11-30T12:00:03.200000Z", "interruption_warning", SECOND),
        ("2026-11-30T12:00:03.200000Z", "drained", SECOND),
        ("2026-11-30T12:00:04Z", "node_gone", INSTANCE),
        ("2026-11-30T12:00:06Z", "node_gone", SECOND),
    ]
    assert handler[1] == {"time": "2026-11-30T12:00:01Z", "event": "drained", "source": "interruption-handler",
                          "instance_id": INSTANCE, "signal": "rebalance_recommendation", "generation": "g6e",
                          "nodepool": "gen3-g6e", "pods": ["gen3-g6e-7f9c-0"], "node": "ip-10-0-1-1.us-east-2.compute.internal",
                          "drain_latency_ms": 640.2}
    assert handler[3]["handler_outcome"] == "duplicate" and handler[6]["state"] == "shutting-down"
    assert [e["event"] for e in events(output)][-1] == "drill_end"
    # the bench's timeline reads them as markers, in time order (gennstack.bench.timeline)
    from gennstack.bench.timeline import load_events

    assert [e["event"] for e in load_events(output / "drill-events.jsonl")][:4] == [
        "drill_start", "experiment_started", "rebalance_recommendation", "drained"]


def test_an_instance_without_handler_lines_is_named_after_the_wait(tmp_path: Path, fis: tuple[Any, Stubber],
                                                                   logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    completed_drill(stubber)
    resolved(stubber, INSTANCE, SECOND)
    lines = (log_event(2, recorded("spot_interruption_warning")), log_event(4, terminated()))
    for until in range(5, 66, 10):  # every 10 s for 60 s
        filtered(logs[1], *lines, until_s=until, instances=(INSTANCE, SECOND))
    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"], logs=logs)
    assert (code, err) == (0, "")
    assert f"12:01:05Z  handler: 2 marker(s) for 2 instance(s); no handler line for {SECOND}" in out
    assert [e["event"] for e in events(output)][-3:] == ["interruption_warning", "node_gone", "drill_end"]


def test_denied_logs_warn_and_leave_the_exit_code(tmp_path: Path, fis: tuple[Any, Stubber], logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    completed_drill(stubber)
    resolved(stubber, INSTANCE)
    logs[1].add_client_error("filter_log_events", service_error_code="AccessDeniedException",
                             service_message="not authorized to perform: logs:FilterLogEvents", http_status_code=400)
    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"], logs=logs)
    assert code == 0
    (line,) = err.splitlines()
    assert line.startswith("gennstack drill: warning: handler markers incomplete: permission denied: logs:FilterLogEvents "
                           "(AccessDeniedException: not authorized to perform: logs:FilterLogEvents); the drill needs ")
    assert line.endswith(f"fis:ListExperimentResolvedTargets, logs:FilterLogEvents; the lines stay in log group {LOG_GROUP}")
    assert "12:00:05Z  handler: 0 marker(s) for 1 instance(s)\n" in out  # the log was never read: nothing said about the instance
    assert [e["event"] for e in events(output)][-2:] == ["experiment_state", "drill_end"]


def test_throttled_resolved_targets_warn_without_advice_to_rerun(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    completed_drill(stubber)
    stubber.add_client_error("list_experiment_resolved_targets", service_error_code="ThrottlingException",
                             service_message="Rate exceeded", http_status_code=400)
    code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert code == 0
    assert err == ("gennstack drill: warning: handler markers incomplete: throttled: fis:ListExperimentResolvedTargets answered "
                   f"ThrottlingException; the lines stay in log group {LOG_GROUP}\n")


def test_a_template_without_the_log_group_tag_warns(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    """A stack deployed before the tag: the drill runs as before, without asking FIS or the log."""
    _, stubber = fis
    older = summary()
    del older["tags"]["gennstack.io/handler-log-group"]
    list_templates(stubber, older)
    start(stubber)
    get(stubber, "completed")
    code, _, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert code == 0
    assert err == (f"gennstack drill: warning: no handler markers: template {TEMPLATE_ID} has no gennstack.io/handler-log-group "
                   "tag (a stack deployed before the tag existed); deploy the stack again to get them\n")
    assert [e["event"] for e in events(output)] == ["drill_start", "experiment_started", "experiment_state", "drill_end"]


def test_ctrl_c_while_reading_the_log_keeps_what_was_found(tmp_path: Path, fis: tuple[Any, Stubber], logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    completed_drill(stubber)
    resolved(stubber, INSTANCE)
    filtered(logs[1], log_event(2, recorded("spot_interruption_warning")), until_s=5)

    def interrupt(sleeps: int) -> None:
        if sleeps == 2:  # sleep 1 is the experiment poll, 2 the first wait for more log lines
            raise KeyboardInterrupt

    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"], logs=logs, sleep_hook=interrupt)
    assert code == 0  # the experiment completed; no StopExperiment for a finished experiment
    assert err == "gennstack drill: warning: handler markers incomplete: interrupted (Ctrl-C) while reading the handler's log\n"
    assert [e["event"] for e in events(output)][-2:] == ["interruption_warning", "drill_end"]
    assert f"no gone line (yet) for {INSTANCE}" in out


def test_prometheus_url_adds_the_replacements_ready_and_served_after_the_experiment(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    """--prometheus-url: once the experiment completed, the generation's server pods created since the drill
    started are read from the cluster's start phases (a local HTTP server answering as Prometheus' /api/v1/query)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    asked: list[str] = []
    created = START.timestamp() + 100

    class Prometheus(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            query = parse_qs(urlsplit(self.path).query)["query"][0]
            asked.append(query)
            if query.startswith("kube_pod_created"):
                result = [{"metric": {"namespace": "gennstack-serving", "pod": "gen3-g6e-new"}, "value": [0, repr(created)]}]
            else:
                result = [{"metric": {"namespace": "gennstack-serving", "pod": "gen3-g6e-new", "phase": phase},
                           "value": [0, seconds]} for phase, seconds in (("ready", "60"), ("served", "62.5"))]
            data = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _, stubber = fis
    older = summary()
    del older["tags"]["gennstack.io/handler-log-group"]  # no handler log to read: this test is about Prometheus
    list_templates(stubber, older)
    start(stubber)
    get(stubber, "completed")
    try:
        code, out, _, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--prometheus-url", f"http://127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
    assert code == 0 and len(asked) == 2 and 'label_app_kubernetes_io_name="gen3-g6e"' in asked[0]
    assert f"> {START.timestamp():.3f}" in asked[0]  # created after the drill started
    replacements = [(e["time"], e["event"], e["pod"]) for e in events(output) if e.get("source") == "prometheus"]
    assert replacements == [("2026-11-30T12:02:40Z", "replacement_ready", "gen3-g6e-new"),
                            ("2026-11-30T12:02:42.500000Z", "replacement_served", "gen3-g6e-new")]
    assert "replacements: 1 gen3-g6e pod(s) created since the drill started, 1 served" in out
    assert [e["event"] for e in events(output)][-1] == "drill_end"
