"""Records, the active count over time, the reconciler, and concurrent writers (logic functions, settable clock)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from lambdas.interruption_handler.errors import InvocationFailed, Reason
from lambdas.interruption_handler.events import Interruption, Reconcile, Signal, StateChange
from lambdas.interruption_handler.interruptions import (
    handle_interruption,
    handle_state_change,
    mark_terminated,
    reconcile,
    record_interruption,
)
from lambdas.interruption_handler.kube import KubeClient
from lambdas.interruption_handler.settings import Settings
from tests.lambdas.lambda_support import EVENTS, NAMESPACE, Clock, LambdaContext
from tests.lambdas.fake_kubernetes import FakeKubernetes, Seen

Launch = Callable[..., str]


def _warning(instance_id: str, clock: Clock, signal: Signal = Signal.SPOT_WARNING) -> Interruption:
    return Interruption(signal, (instance_id,), f"event-{instance_id}-{signal.value}", datetime.fromtimestamp(clock.now - 5, UTC))


def _tick(clock: Clock) -> Reconcile:
    return Reconcile("tick", datetime.fromtimestamp(clock.now, UTC))


@pytest.fixture
def deps(ec2: Any, table: Any, kube: KubeClient, settings: Settings, clock: Clock) -> dict[str, Any]:
    return {"ec2": ec2, "table": table, "kube": kube, "settings": settings, "clock": clock}


def test_spares_step_back_as_records_expire(deps: dict[str, Any], launch: Launch, kubernetes: FakeKubernetes, clock: Clock) -> None:
    first, second = launch("gen1-inf2-spot"), launch("gen1-inf2-spot")
    start = clock.now
    handle_interruption(_warning(first, clock), **deps)
    clock.now = start + 600
    handle_interruption(_warning(second, clock), **deps)
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 2

    clock.now = start + 1799
    assert not reconcile(_tick(clock), **deps).failures
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 2
    clock.now = start + 1800  # the first record's TTL: DynamoDB may not have deleted it yet, it no longer counts
    reconcile(_tick(clock), **deps)
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 1
    clock.now = start + 2400
    report = reconcile(_tick(clock), **deps)
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 0
    assert {(r.generation, r.replicas) for r in report.results if r.outcome == "reconciled"} == {("inf2", 0), ("g6e", 1)}
    assert kubernetes.replicas(NAMESPACE, "g6e-warm-spare") == 1, "baseline, never below"


def test_spare_stays_through_the_replacement_grace_then_goes(
    deps: dict[str, Any], launch: Launch, kubernetes: FakeKubernetes, clock: Clock, table: Any
) -> None:
    instance_id = launch("gen1-inf2-spot")
    start = clock.now
    handle_interruption(_warning(instance_id, clock), **deps)
    terminated = start + 120
    clock.now = terminated + 5
    change = StateChange(instance_id, "terminated", "state", datetime.fromtimestamp(terminated, UTC))
    assert handle_state_change(change, table=table, settings=deps["settings"], clock=clock).results[0].outcome == "terminated"
    clock.now = terminated + 599
    reconcile(_tick(clock), **deps)
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 1
    clock.now = terminated + 600  # replacement has had its grace period: well before the 1800 s TTL
    reconcile(_tick(clock), **deps)
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 0


def test_late_termination_extends_the_record(deps: dict[str, Any], launch: Launch, kubernetes: FakeKubernetes, clock: Clock, table: Any) -> None:
    instance_id = launch("gen1-inf2-spot")
    start = clock.now
    handle_interruption(_warning(instance_id, clock, Signal.REBALANCE), **deps)
    clock.now = start + 1700  # the rebalance recommendation came long before the interruption
    assert mark_terminated(table, instance_id, terminated_at=clock.now, now=clock.now, settings=deps["settings"])
    assert table.get_item(Key={"pk": f"instance#{instance_id}"})["Item"]["expires_at"] == int(start + 1700 + 600)
    clock.now = start + 1900
    reconcile(_tick(clock), **deps)
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 1


def test_reconciler_notices_terminations_whose_event_was_missed(
    deps: dict[str, Any], launch: Launch, kubernetes: FakeKubernetes, clock: Clock, table: Any, ec2: Any
) -> None:
    gone, forgotten, running = launch("gen1-inf2-spot"), "i-0fedcba9876543210", launch("gen3-g6e-spot")
    handle_interruption(_warning(gone, clock), **deps)
    handle_interruption(_warning(running, clock), **deps)
    record_interruption(
        table, instance_id=forgotten, nodepool="gen1-inf2-spot", spare=deps["settings"].warm_spares["gen1-inf2-spot"],
        signal=Signal.SPOT_WARNING, event_id="e", event_time=datetime.fromtimestamp(clock.now, UTC), now=clock.now, settings=deps["settings"],
    )
    ec2.terminate_instances(InstanceIds=[gone])
    report = reconcile(_tick(clock), **deps)
    assert {r.instance_id for r in report.results if r.outcome == "terminated"} == {gone, forgotten}
    items = {i["instance_id"]: i for i in table.scan()["Items"]}
    assert items[gone]["terminated_at"] == int(clock.now) and items[forgotten]["terminated_at"] == int(clock.now)
    assert "terminated_at" not in items[running]
    clock.now += 600
    reconcile(_tick(clock), **deps)
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 0
    assert kubernetes.replicas(NAMESPACE, "g6e-warm-spare") == 2, "the running instance's record still counts"


def test_one_failing_deployment_does_not_stop_the_others(deps: dict[str, Any], kubernetes: FakeKubernetes, clock: Clock) -> None:
    del kubernetes.deployments[(NAMESPACE, "g6e-warm-spare")]
    kubernetes.deployments[(NAMESPACE, "inf2-warm-spare")].replicas = 2
    report = reconcile(_tick(clock), **deps)
    [failure] = report.failures
    assert failure.reason is Reason.KUBE_NOT_FOUND
    assert failure.context["generation"] == "g6e" and failure.context["deployment"] == "g6e-warm-spare"
    assert [(r.generation, r.replicas) for r in report.results] == [("inf2", 0)]
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 0


def test_a_concurrent_writer_is_not_overwritten_with_a_stale_count(
    deps: dict[str, Any], launch: Launch, kubernetes: FakeKubernetes, clock: Clock, table: Any
) -> None:
    """Another invocation records a second interruption and patches to 2 between our read and our patch."""
    ours, theirs = launch("gen1-inf2-spot"), launch("gen1-inf2-spot")

    def concurrent_writer(fake: FakeKubernetes, seen: Seen) -> None:
        record_interruption(
            table, instance_id=theirs, nodepool="gen1-inf2-spot", spare=deps["settings"].warm_spares["gen1-inf2-spot"],
            signal=Signal.SPOT_WARNING, event_id="theirs", event_time=datetime.fromtimestamp(clock.now, UTC), now=clock.now,
            settings=deps["settings"],
        )
        deployment = fake.deployments[(NAMESPACE, "inf2-warm-spare")]
        deployment.replicas, deployment.resource_version = 2, deployment.resource_version + 1

    # our GET and scan see one interruption; their write lands just before our PATCH (which then gets 409)
    kubernetes.faults.extend([None, concurrent_writer])
    report = handle_interruption(_warning(ours, clock), **deps)
    assert not report.failures
    assert [(r.method, r.status) for r in kubernetes.requests] == [("GET", 200), ("PATCH", 409), ("GET", 200)]
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 2
    assert report.results[0].replicas == 2 and report.results[0].active == 2


def test_an_expired_record_lingering_before_ttl_deletion_is_replaced(deps: dict[str, Any], table: Any, clock: Clock) -> None:
    spare = deps["settings"].warm_spares["gen1-inf2-spot"]
    table.put_item(Item={"pk": "instance#i-0aaaaaaaaaaaaaaaa", "instance_id": "i-0aaaaaaaaaaaaaaaa", "generation": "inf2", "expires_at": int(clock.now) - 1})
    args = dict(
        instance_id="i-0aaaaaaaaaaaaaaaa", nodepool="gen1-inf2-spot", spare=spare, signal=Signal.REBALANCE, event_id="e",
        event_time=datetime.fromtimestamp(clock.now, UTC), now=clock.now, settings=deps["settings"],
    )
    assert record_interruption(table, **args) is True
    assert record_interruption(table, **args) is False
    assert not mark_terminated(table, "i-0bbbbbbbbbbbbbbbb", terminated_at=clock.now, now=clock.now, settings=deps["settings"])


def test_an_expired_record_is_not_revived_by_its_termination(deps: dict[str, Any], table: Any, clock: Clock) -> None:
    table.put_item(Item={"pk": "instance#i-0aaaaaaaaaaaaaaaa", "instance_id": "i-0aaaaaaaaaaaaaaaa", "generation": "inf2", "expires_at": int(clock.now) - 1})
    assert not mark_terminated(table, "i-0aaaaaaaaaaaaaaaa", terminated_at=clock.now, now=clock.now, settings=deps["settings"])
    assert "terminated_at" not in table.get_item(Key={"pk": "instance#i-0aaaaaaaaaaaaaaaa"})["Item"]


# --- hostile and reordered input through the whole handler -------------------------------------

@pytest.fixture
def instance_pool(launch: Launch) -> list[str]:
    """Shared by all examples: our spot node, an untagged instance, an unknown id, an invalid id."""
    return [launch("gen1-inf2-spot"), launch(None), "i-0000000000000000f", "i-zz"]


SAMPLES = {p.stem: json.loads(p.read_text()) for p in sorted(EVENTS.glob("*.json"))}
OUTCOMES = {"done", "ignored"}
REASONS = {r.value for r in Reason}


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_event_ends_in_a_classified_outcome(
    data: st.DataObject, handler: Any, lambda_context: LambdaContext, instance_pool: list[str], kubernetes: FakeKubernetes
) -> None:
    """Samples with their instance swapped for ours/theirs/unknown/invalid, one field clobbered, API faults injected."""
    instance_ids = data.draw(st.lists(st.sampled_from(instance_pool), min_size=1, max_size=3))
    name = data.draw(st.sampled_from(sorted(SAMPLES)))
    event = json.loads(json.dumps(SAMPLES[name]))
    if isinstance(event.get("detail"), dict) and "instance-id" in event["detail"]:
        event["detail"]["instance-id"] = instance_ids[0]
    elif name.startswith("health"):
        event["resources"] = instance_ids
    key = data.draw(st.sampled_from(["none", "time", "region", "detail", "source", "resources", "id"]))
    if key != "none" and isinstance(event, dict):
        event[key] = data.draw(st.none() | st.integers() | st.text(max_size=20) | st.lists(st.text(max_size=20), max_size=3) | st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3))
    kubernetes.faults.extend(data.draw(st.lists(st.sampled_from([None, 401, 403, 409, 500, 503]), max_size=4)))
    try:
        result = handler.lambda_handler(event, lambda_context)
    except InvocationFailed as failed:
        assert failed.reasons and set(failed.reasons) <= REASONS
    else:
        assert result["outcome"] in OUTCOMES
        if result["outcome"] == "ignored":
            assert result["reason"]
    finally:
        kubernetes.faults.clear()

