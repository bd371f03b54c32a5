"""The Lambda end to end: real-shaped events, moto for EC2 and DynamoDB, the local Kubernetes API."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from lambdas.interruption_handler.errors import InvocationFailed
from tests.lambdas.lambda_support import NAMESPACE, REGION, LambdaContext, load_event
from tests.lambdas.fake_kubernetes import FakeKubernetes

Launch = Callable[..., str]


def _lines(captured: str) -> list[dict[str, Any]]:
    out = []
    for line in captured.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _metrics(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in lines if "_aws" in line and name in line]


def _errors(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("level") == "ERROR"]


def _records(table: Any) -> dict[str, dict[str, Any]]:
    return {item["instance_id"]: item for item in table.scan(ConsistentRead=True)["Items"]}


def test_spot_warning_records_and_prewarms(
    handler: Any, lambda_context: LambdaContext, launch: Launch, table: Any, kubernetes: FakeKubernetes, capsys: pytest.CaptureFixture[str]
) -> None:
    instance_id = launch("gen1-inf2-spot")
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)

    assert result["outcome"] == "done"
    [entry] = result["results"]
    assert entry["outcome"] == "recorded"
    assert (entry["generation"], entry["nodepool"], entry["replicas"], entry["previous_replicas"]) == ("inf2", "gen1-inf2-spot", 1, 0)
    record = _records(table)[instance_id]
    assert record["pk"] == f"instance#{instance_id}"
    assert record["signals"] == {"spot_interruption_warning"}
    assert record["expires_at"] - record["recorded_at"] == 1800
    [patch] = kubernetes.patches()
    assert patch.path == f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/inf2-warm-spare/scale"
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.body["spec"] == {"replicas": 1}
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 1

    lines = _lines(capsys.readouterr().out)
    [interruptions] = _metrics(lines, "Interruptions")
    assert interruptions["Interruptions"] == [1.0]
    assert interruptions["generation"] == "inf2" and interruptions["signal"] == "spot_interruption_warning"
    assert interruptions["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "GenNStackTest"
    assert _metrics(lines, "PrewarmLatency") and _metrics(lines, "HandlerLatency")
    assert not _errors(lines)


def test_another_accounts_event_is_dropped_with_a_warning_and_a_metric(
    handler: Any, lambda_context: LambdaContext, launch: Launch, table: Any, kubernetes: FakeKubernetes, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spot warning naming one of our instances, from another account: nothing recorded, nothing scaled."""
    instance_id = launch("gen1-inf2-spot")
    event = load_event("spot_interruption_warning", instance_id=instance_id, fields={"account": "210987654321"})
    result = handler.lambda_handler(event, lambda_context)

    assert (result["outcome"], result["reason"]) == ("ignored", "foreign_account")
    assert _records(table) == {}
    assert kubernetes.patches() == []
    lines = _lines(capsys.readouterr().out)
    [warning] = [line for line in lines if line.get("level") == "WARNING"]
    assert warning["reason"] == "foreign_account" and "210987654321" in warning["detail"]
    [metric] = _metrics(lines, "ForeignEvents")
    assert metric["ForeignEvents"] == [1.0] and metric["reason"] == "foreign_account"
    assert not _errors(lines)


def test_duplicate_delivery_does_nothing_twice(
    handler: Any, lambda_context: LambdaContext, launch: Launch, table: Any, kubernetes: FakeKubernetes, capsys: pytest.CaptureFixture[str]
) -> None:
    event = load_event("spot_interruption_warning", instance_id=launch("gen1-inf2-spot"))
    handler.lambda_handler(event, lambda_context)
    capsys.readouterr()
    again = handler.lambda_handler(event, lambda_context)

    assert again["results"][0]["outcome"] == "duplicate"
    assert again["results"][0]["replicas"] == 1
    assert len(kubernetes.patches()) == 1, "the second delivery finds the count already right"
    assert len(_records(table)) == 1
    lines = _lines(capsys.readouterr().out)
    assert not _metrics(lines, "Interruptions")
    assert _metrics(lines, "DuplicateSignals")


def test_rebalance_then_warning_counts_once(
    handler: Any, lambda_context: LambdaContext, launch: Launch, table: Any, kubernetes: FakeKubernetes
) -> None:
    instance_id = launch("gen3-g6e-spot", instance_type="g6e.xlarge")
    first = handler.lambda_handler(load_event("rebalance_recommendation", instance_id=instance_id), lambda_context)
    second = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)
    third = handler.lambda_handler(load_event("health_scheduled_change", instance_id=instance_id), lambda_context)

    assert [r["results"][0]["outcome"] for r in (first, second, third)] == ["recorded", "duplicate", "duplicate"]
    assert kubernetes.replicas(NAMESPACE, "g6e-warm-spare") == 2  # baseline 1 + one interruption
    assert [p.body["spec"]["replicas"] for p in kubernetes.patches()] == [2]
    assert _records(table)[instance_id]["signals"] == {"rebalance_recommendation", "spot_interruption_warning", "scheduled_change"}


def test_storm_is_capped(handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes, table: Any) -> None:
    instances = [launch("gen1-inf2-spot") for _ in range(5)]
    for instance_id in instances:
        handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)
    assert len(_records(table)) == 5
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 2  # cap
    assert [p.body["spec"]["replicas"] for p in kubernetes.patches()] == [1, 2]
    assert kubernetes.replicas(NAMESPACE, "g6e-warm-spare") == 1, "other generations are untouched"


def test_health_event_with_several_instances_scales_once_per_generation(
    handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes
) -> None:
    ours = [launch("gen1-inf2-spot"), launch("gen1-inf2-spot")]
    theirs = launch("gen1-inf2-spot", cluster="someone-else")
    result = handler.lambda_handler(load_event("health_scheduled_change", instance_ids=[*ours, theirs]), lambda_context)
    outcomes = {r["instance_id"]: (r["outcome"], r.get("reason")) for r in result["results"]}
    assert outcomes == {ours[0]: ("recorded", None), ours[1]: ("recorded", None), theirs: ("ignored", "other_cluster")}
    assert [p.body["spec"]["replicas"] for p in kubernetes.patches()] == [2]


@pytest.mark.parametrize(
    ("launch_args", "reason"),
    [
        ({"pool": "gen1-inf2-spot", "cluster": "someone-else"}, "other_cluster"),
        ({"pool": "gen1-inf2-spot", "cluster": None}, "other_cluster"),
        ({"pool": None}, "not_karpenter"),
        ({"pool": "gen1-inf2-on-demand", "spot": False}, "not_spot"),
        ({"pool": "batch-spot"}, "unknown_pool"),
    ],
)
def test_instances_that_are_not_ours_are_logged_and_left_alone(
    handler: Any,
    lambda_context: LambdaContext,
    launch: Launch,
    table: Any,
    kubernetes: FakeKubernetes,
    capsys: pytest.CaptureFixture[str],
    launch_args: dict[str, Any],
    reason: str,
) -> None:
    instance_id = launch(**launch_args)
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)
    [entry] = result["results"]
    assert (entry["outcome"], entry["reason"], entry["instance_id"]) == ("ignored", reason, instance_id)
    assert kubernetes.requests == []
    assert _records(table) == {}
    [log] = [line for line in _lines(capsys.readouterr().out) if line.get("message") == "instance is not ours"]
    assert log["reason"] == reason and log["instance_id"] == instance_id and log["level"] == "INFO"


def test_foreign_events_return_without_touching_anything(
    handler: Any, lambda_context: LambdaContext, kubernetes: FakeKubernetes, capsys: pytest.CaptureFixture[str]
) -> None:
    result = handler.lambda_handler(load_event("foreign_s3_object_created"), lambda_context)
    assert result["outcome"] == "ignored" and result["reason"] == "foreign_event"
    assert kubernetes.requests == []
    [log] = [line for line in _lines(capsys.readouterr().out) if line.get("message") == "event is not ours"]
    assert log["reason"] == "foreign_event"


def test_unknown_instance_fails_so_the_event_is_retried(
    handler: Any, lambda_context: LambdaContext, kubernetes: FakeKubernetes, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvocationFailed) as caught:
        handler.lambda_handler(load_event("spot_interruption_warning", instance_id="i-0badc0ffee0000000"), lambda_context)
    assert caught.value.reasons == ["unknown_instance"]
    lines = _lines(capsys.readouterr().out)
    [error] = _errors(lines)
    assert error["reason"] == "unknown_instance" and error["instance_id"] == "i-0badc0ffee0000000"
    [metric] = _metrics(lines, "Errors")
    assert metric["reason"] == "unknown_instance"
    assert kubernetes.requests == []


@pytest.mark.parametrize("name", ["malformed_missing_instance_id", "malformed_bad_instance_id", "malformed_no_envelope", "malformed_detail_not_object"])
def test_malformed_events_fail_with_a_reason(
    handler: Any, lambda_context: LambdaContext, kubernetes: FakeKubernetes, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    event = load_event(name)
    with pytest.raises(InvocationFailed) as caught:
        handler.lambda_handler(event, lambda_context)
    assert caught.value.reasons == ["malformed_event"]
    lines = _lines(capsys.readouterr().out)
    [error] = _errors(lines)
    assert error["reason"] == "malformed_event" and error["error"]
    assert _metrics(lines, "Errors")[0]["reason"] == "malformed_event"
    assert kubernetes.requests == []


@pytest.mark.parametrize(
    ("faults", "reason"),
    [
        ([401], "kube_unauthorized"),
        ([403], "kube_forbidden"),
        ([503, 503, 503], "kube_server_error"),
        (["hang", "hang", "hang"], "kube_timeout"),
    ],
)
def test_kubernetes_failures_raise_and_the_retry_completes_the_prewarm(
    handler: Any,
    lambda_context: LambdaContext,
    launch: Launch,
    table: Any,
    kubernetes: FakeKubernetes,
    capsys: pytest.CaptureFixture[str],
    faults: list[Any],
    reason: str,
) -> None:
    kubernetes.hang_seconds = 2.0  # past KUBE_TIMEOUT_SECONDS=1.0
    event = load_event("spot_interruption_warning", instance_id=launch("gen1-inf2-spot"))
    kubernetes.faults.extend(faults)
    with pytest.raises(InvocationFailed) as caught:
        handler.lambda_handler(event, lambda_context)
    assert caught.value.reasons == [reason]
    [error] = _errors(_lines(capsys.readouterr().out))
    assert error["reason"] == reason
    assert error["generation"] == "inf2" and error["deployment"] == "inf2-warm-spare" and error["path"].endswith("/scale")
    assert len(_records(table)) == 1, "the interruption is recorded before the scale call"
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 0

    retried = handler.lambda_handler(event, lambda_context)  # Lambda's retry of the same event
    assert retried["results"][0]["outcome"] == "duplicate"
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 1, "nothing lost: the retry pre-warms"


def test_conflict_is_redone_with_a_fresh_count(
    handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes
) -> None:
    kubernetes.faults.extend([None, 409])  # GET passes, the first PATCH conflicts
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=launch("gen1-inf2-spot")), lambda_context)
    assert [(r.method, r.status) for r in kubernetes.requests] == [("GET", 200), ("PATCH", 409), ("GET", 200), ("PATCH", 200)]
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 1


def test_persistent_conflict_fails(handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes) -> None:
    kubernetes.faults.extend([None, 409, None, 409, None, 409])
    with pytest.raises(InvocationFailed) as caught:
        handler.lambda_handler(load_event("spot_interruption_warning", instance_id=launch("gen1-inf2-spot")), lambda_context)
    assert caught.value.reasons == ["kube_conflict"]
    assert caught.value.failures[0].context["attempts"] == 3


def test_state_change_marks_the_record_and_keeps_the_spare(
    handler: Any, lambda_context: LambdaContext, launch: Launch, table: Any, kubernetes: FakeKubernetes
) -> None:
    instance_id = launch("gen1-inf2-spot")
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)
    event = load_event("instance_state_change", instance_id=instance_id)
    result = handler.lambda_handler(event, lambda_context)
    assert result["results"][0]["outcome"] == "terminated"
    record = _records(table)[instance_id]
    assert record["terminated_at"] == 1772446625  # the event's time, 2026-03-02T10:17:05Z
    assert len(kubernetes.patches()) == 1, "termination alone does not scale down: the replacement still needs the spare"


def test_state_change_for_an_unrecorded_instance_is_ignored(handler: Any, lambda_context: LambdaContext, kubernetes: FakeKubernetes, table: Any) -> None:
    result = handler.lambda_handler(load_event("instance_state_change", instance_id="i-0123456789abcdef0"), lambda_context)
    assert result["results"] == [{"outcome": "ignored", "reason": "no_record", "instance_id": "i-0123456789abcdef0", "detail": "terminated"}]
    assert _records(table) == {}
    assert kubernetes.requests == []


def test_reordered_events_end_where_ordered_ones_do(
    handler: Any, lambda_context: LambdaContext, launch: Launch, table: Any, kubernetes: FakeKubernetes, ec2: Any
) -> None:
    instance_id = launch("gen1-inf2-spot")
    ec2.terminate_instances(InstanceIds=[instance_id])
    # the termination arrives before the warning, and the rebalance recommendation last
    handler.lambda_handler(load_event("instance_state_change", instance_id=instance_id), lambda_context)
    warning = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)
    rebalance = handler.lambda_handler(load_event("rebalance_recommendation", instance_id=instance_id), lambda_context)
    assert [warning["results"][0]["outcome"], rebalance["results"][0]["outcome"]] == ["recorded", "duplicate"]
    record = _records(table)[instance_id]
    assert "terminated_at" in record, "DescribeInstances showed the instance gone"
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 1
    assert len(kubernetes.patches()) == 1


def test_scheduled_event_reconciles_every_generation(
    handler: Any, lambda_context: LambdaContext, table: Any, kubernetes: FakeKubernetes
) -> None:
    kubernetes.deployments[(NAMESPACE, "inf2-warm-spare")].replicas = 2  # left over from records now expired
    table.put_item(Item={"pk": "instance#i-0aaaaaaaaaaaaaaaa", "instance_id": "i-0aaaaaaaaaaaaaaaa", "generation": "inf2", "expires_at": 1000, "recorded_at": 0})
    result = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    reconciled = {r["generation"]: (r["previous_replicas"], r["replicas"]) for r in result["results"] if r["outcome"] == "reconciled"}
    assert reconciled == {"inf2": (2, 0), "g6e": (1, 1)}
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 0


def test_config_error_fails_every_invocation_with_its_reason(
    handler: Any, lambda_context: LambdaContext, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WARM_SPARES", "{}")
    with pytest.raises(InvocationFailed) as caught:
        handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert caught.value.reasons == ["config_error"]
    [error] = _errors(_lines(capsys.readouterr().out))
    assert "WARM_SPARES" in error["error"]


def test_dynamodb_failure_is_classified(
    handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes
) -> None:
    instance_id = launch("gen1-inf2-spot")
    boto3.client("dynamodb", region_name=REGION).delete_table(TableName="interruptions")
    with pytest.raises(InvocationFailed) as caught:
        handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)
    assert caught.value.reasons == ["dynamodb_error"]
    assert caught.value.failures[0].context["instance_id"] == instance_id
    assert kubernetes.requests == []
