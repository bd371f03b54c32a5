"""`gennstack drill` against a botocore-Stubber FIS client: start, follow, Ctrl-C, every failure message.

Stubber validates every request against FIS's service model and every queued response against
its output shape, so the calls and fields the command uses are FIS's own. No test reaches AWS.
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


def tags(generation: str = "g6e", nodes: int = 1, cluster: str = "gennstack") -> dict[str, str]:
    return {
        "gennstack.io/drill": "spot-interruption",
        "gennstack.io/cluster": cluster,
        "gennstack.io/generation": generation,
        "gennstack.io/nodes": str(nodes),
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
    def __init__(self, client: Any) -> None:
        self.client_ = client
        self.region_name = "eu-central-1"
        self.asked: list[tuple[str, str | None]] = []

    def client(self, service: str, region_name: str | None = None, config: Any = None) -> Any:
        self.asked.append((service, region_name))
        return self.client_


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


@pytest.fixture
def fis() -> tuple[Any, Stubber]:
    client = boto3.Session(region_name=REGION).client("fis", region_name=REGION, config=client_config(1))
    stubber = Stubber(client)
    stubber.activate()
    return client, stubber


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


def drill_cli(tmp_path: Path, fis: tuple[Any, Stubber], argv: list[str], *, config: dict[str, Any] | None = None,
              bench: list[FakeBench] | None = None, bench_code: int = 0, sleep_hook: Any = None) -> tuple[int, str, str, Path]:
    from gennstack.cli import build_parser

    client, stubber = fis
    config_file = tmp_path / "drill.json"
    config_file.write_text(json.dumps(config or {"region": REGION, "drills": {"enabled": True}}))
    output = tmp_path / "result"
    args = build_parser().parse_args(
        ["drill", "--cdk-json", str(ROOT / "cdk.json"), "--config", str(config_file), "--output-dir", str(output), *argv]
    )
    clock = Clock()
    out, err = io.StringIO(), io.StringIO()
    session = FakeSession(client)

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
    assert session.asked in ([], [("fis", REGION)])
    return code, out.getvalue(), err.getvalue(), output


def events(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "drill-events.jsonl").read_text().splitlines()]


def test_starts_the_tagged_template_and_follows_it_to_completion(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary("EXTother000000001", generation="trn2"), summary("EXTother000000002", nodes=2),
                   summary("EXTother000000003", cluster="staging"), summary())
    start(stubber)
    get(stubber, "initiating")
    get(stubber, "running")
    get(stubber, "running")
    get(stubber, "completed", "Experiment completed.")
    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--nodes", "1", "--poll-seconds", "5"])
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"12:00:00Z  drill: 1 g6e spot node(s), template {TEMPLATE_ID}"
    assert lines[1] == f"12:00:00Z  experiment {EXPERIMENT_ID}: initiating"
    # a state is printed when it changes, with the time of the poll that saw it
    assert lines[2] == f"12:00:10Z  experiment {EXPERIMENT_ID}: running"
    assert lines[3] == f"12:00:20Z  experiment {EXPERIMENT_ID}: completed (Experiment completed.)"
    assert lines[-1] == f"results: {output}"
    log = events(output)
    assert [e["event"] for e in log] == ["drill_start", "experiment_started", "experiment_state", "experiment_state", "drill_end"]
    assert log[0] == {"time": "2026-11-30T12:00:00Z", "event": "drill_start", "template_id": TEMPLATE_ID, "generation": "g6e",
                      "nodes": 1, "cluster": "gennstack", "region": REGION}
    assert [e.get("status") for e in log[1:4]] == ["initiating", "running", "completed"]
    assert log[-1]["outcome"] == "completed"


def test_ctrl_c_stops_the_experiment_and_waits_for_it(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber, "running")
    stubber.add_response("stop_experiment", experiment("stopping"), {"id": EXPERIMENT_ID})
    get(stubber, "stopping")
    get(stubber, "stopped", "Experiment stopped by user.")

    def interrupt(sleeps: int) -> None:
        if sleeps == 1:  # during the first poll wait; the stop's own waits go on
            raise KeyboardInterrupt

    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e"], sleep_hook=interrupt)
    assert code == 130
    assert f"Ctrl-C: stopping experiment {EXPERIMENT_ID}" in out
    log = events(output)
    assert [e["event"] for e in log][-3:] == ["stop_requested", "experiment_state", "drill_end"]
    assert log[-2]["status"] == "stopped" and log[-1]["outcome"] == "interrupted"


def test_bench_runs_around_the_experiment_into_the_same_folder(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber)
    get(stubber, "completed")
    made: list[FakeBench] = []
    code, out, _, output = drill_cli(
        tmp_path, fis,
        ["--generation", "g6e", "--bench-lead", "30", "--bench-args", "--base-url https://gw.example/v1 --model 'gennstack-default' --duration 600"],
        bench=made,
    )
    assert code == 0
    (bench,) = made
    assert bench.argv[1:] == ["-m", "gennstack.cli", "bench", "--base-url", "https://gw.example/v1", "--model",
                              "gennstack-default", "--duration", "600", "--output-dir", str(output / "bench"),
                              "--events", str(output / "drill-events.jsonl")]
    assert bench.events == ["start", "wait"]
    log = events(output)
    assert [e["event"] for e in log] == ["drill_start", "bench_start", "experiment_started", "experiment_state", "bench_end", "drill_end"]
    # the experiment starts bench-lead seconds after the bench
    assert log[1]["time"] == "2026-11-30T12:00:00Z" and log[2]["time"] == "2026-11-30T12:00:30Z"


def test_a_failing_bench_fails_the_drill(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber)
    get(stubber, "completed")
    code, _, _, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--bench-lead", "0", "--bench-args", "--duration 5"], bench_code=3)
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
    code, out, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert code == 1
    assert err.strip() == (f"gennstack drill: experiment {EXPERIMENT_ID} failed: Target resolution returned empty set "
                           "for target gen3-g6e-spot-nodes. [TargetResolutionFailed]")


def test_stop_condition_reports_stopped(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber)
    get(stubber, "stopped", "Experiment stopped by stop condition.")
    code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"])
    assert code == 1 and f"experiment {EXPERIMENT_ID} stopped: Experiment stopped by stop condition. (a stop condition alarm" in err


@pytest.mark.parametrize(
    ("method", "code", "status", "message"),
    [
        ("list_experiment_templates", "AccessDeniedException", 403,
         "permission denied: fis:ListExperimentTemplates (AccessDeniedException: no); the drill needs fis:ListExperimentTemplates, "
         "fis:StartExperiment, fis:TagResource, fis:GetExperiment, fis:StopExperiment"),
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
def test_a_real_bench_run_lands_beside_the_drill_log(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    """The real `gennstack bench` subprocess (its bundled mock server, loopback only) writes into the drill's folder."""
    _, stubber = fis
    list_templates(stubber, summary())
    start(stubber)
    get(stubber, "completed")
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
    code = run_drill(args, make_session=lambda **_: FakeSession(fis[0]), sleep=clock.sleep, monotonic=clock.monotonic,
                     now=clock.now, stdout=io.StringIO(), stderr=io.StringIO())
    stubber.assert_no_pending_responses()
    assert code == 0
    result = json.loads((output / "bench" / "result.json").read_text())
    assert result  # the bench's own result, written by the bench
    assert [e["event"] for e in events(output)] == [
        "drill_start", "bench_start", "experiment_started", "experiment_state", "bench_end", "drill_end"]
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
