"""Event classification: every documented trigger, the ones that are not ours, and malformed or hostile input."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lambdas.interruption_handler.errors import HandlerError, Ignored, Reason
from lambdas.interruption_handler.events import Interruption, NotOurs, Reconcile, Signal, StateChange, classify
from tests.lambdas.lambda_support import ACCOUNT, EVENTS, REGION, load_event

ID = "i-1234567890abcdef0"
OTHER_ACCOUNT = "210987654321"


def test_spot_interruption_warning() -> None:
    result = classify(load_event("spot_interruption_warning"), region=REGION, account=ACCOUNT)
    assert result == Interruption(
        Signal.SPOT_WARNING, (ID,), "12345678-1234-1234-1234-123456789012", datetime(2026, 3, 2, 10, 15, tzinfo=UTC)
    )


def test_rebalance_recommendation() -> None:
    result = classify(load_event("rebalance_recommendation"), region=REGION, account=ACCOUNT)
    assert isinstance(result, Interruption)
    assert (result.signal, result.instance_ids) == (Signal.REBALANCE, (ID,))


def test_health_scheduled_change_takes_instances_from_entities_and_resources_once() -> None:
    event = load_event("health_scheduled_change")
    event["resources"] = [ID, "arn:aws:ec2:us-east-1:123456789012:instance/i-0aaaaaaaaaaaaaaaa", "vol-0123456789abcdef0"]
    event["detail"]["affectedEntities"].append({"entityValue": "vol-0123456789abcdef0"})
    result = classify(event, region=REGION, account=ACCOUNT)
    assert isinstance(result, Interruption)
    assert result.signal is Signal.SCHEDULED_CHANGE
    assert result.instance_ids == (ID, "i-0aaaaaaaaaaaaaaaa")


@pytest.mark.parametrize("state", ["shutting-down", "terminated", "stopping", "stopped"])
def test_terminal_state_change(state: str) -> None:
    result = classify(load_event("instance_state_change", detail={"state": state}), region=REGION, account=ACCOUNT)
    assert result == StateChange(ID, state, "7bf73129-1428-4cd3-a780-95db273d1602", datetime(2026, 3, 2, 10, 17, 5, tzinfo=UTC))


def test_scheduled_event_reconciles() -> None:
    assert classify(load_event("scheduled_event"), region=REGION, account=ACCOUNT) == Reconcile(
        "89d1a02d-5ec7-412e-82f5-13505f849b41", datetime(2026, 3, 2, 10, 20, tzinfo=UTC)
    )


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (load_event("foreign_s3_object_created"), Ignored.FOREIGN_EVENT),
        (load_event("spot_interruption_warning", fields={"source": "custom.ec2"}), Ignored.FOREIGN_EVENT),
        (load_event("spot_interruption_warning", fields={"detail-type": "EC2 Spot Fleet Error"}), Ignored.FOREIGN_EVENT),
        (load_event("scheduled_event", fields={"source": "aws.scheduler"}), Ignored.FOREIGN_EVENT),
        (load_event("spot_interruption_warning", fields={"region": "eu-west-1"}), Ignored.FOREIGN_REGION),
        # Another account's events, of every kind the function acts on (a bus others may send to).
        (load_event("spot_interruption_warning", fields={"account": OTHER_ACCOUNT}), Ignored.FOREIGN_ACCOUNT),
        (load_event("rebalance_recommendation", fields={"account": OTHER_ACCOUNT}), Ignored.FOREIGN_ACCOUNT),
        (load_event("health_scheduled_change", fields={"account": OTHER_ACCOUNT}), Ignored.FOREIGN_ACCOUNT),
        (load_event("instance_state_change", detail={"state": "terminated"}, fields={"account": OTHER_ACCOUNT}), Ignored.FOREIGN_ACCOUNT),
        (load_event("scheduled_event", fields={"account": OTHER_ACCOUNT}), Ignored.FOREIGN_ACCOUNT),
        (load_event("instance_state_change", detail={"state": "running"}), Ignored.NON_TERMINAL_STATE),
        (load_event("instance_state_change", detail={"state": "pending"}), Ignored.NON_TERMINAL_STATE),
        (load_event("health_scheduled_change", detail={"service": "RDS"}), Ignored.NOT_SCHEDULED_CHANGE),
        (load_event("health_scheduled_change", detail={"eventTypeCategory": "issue"}), Ignored.NOT_SCHEDULED_CHANGE),
        (load_event("health_scheduled_change", detail={"statusCode": "closed"}), Ignored.HEALTH_EVENT_CLOSED),
        (load_event("health_scheduled_change", instance_ids=[], detail={"affectedEntities": [{"entityValue": "vol-0123456789abcdef0"}]}), Ignored.NO_INSTANCES),
    ],
)
def test_events_that_are_not_ours(event: dict[str, Any], reason: Ignored) -> None:
    result = classify(event, region=REGION, account=ACCOUNT)
    assert isinstance(result, NotOurs)
    assert result.reason is reason


@pytest.mark.parametrize("path", sorted(EVENTS.glob("malformed_*.json")), ids=lambda p: p.stem)
def test_malformed_samples(path: Any) -> None:
    with pytest.raises(HandlerError) as caught:
        classify(json.loads(path.read_text()), region=REGION, account=ACCOUNT)
    assert caught.value.reason is Reason.MALFORMED_EVENT


@pytest.mark.parametrize(
    "event",
    [
        None,
        [],
        "EC2 Spot Instance Interruption Warning",
        42,
        {},
        load_event("spot_interruption_warning", fields={"time": "yesterday"}),
        load_event("spot_interruption_warning", fields={"resources": "arn"}),
        load_event("instance_state_change", detail={"state": ["terminated"]}),
        load_event("health_scheduled_change", detail={"affectedEntities": "i-1234567890abcdef0"}),
        load_event("health_scheduled_change", instance_ids=[f"i-{n:017x}" for n in range(1001)]),
    ],
    ids=["none", "list", "str", "int", "empty", "bad-time", "resources-str", "state-list", "entities-str", "too-many"],
)
def test_malformed_values(event: Any) -> None:
    with pytest.raises(HandlerError) as caught:
        classify(event, region=REGION, account=ACCOUNT)
    assert caught.value.reason is Reason.MALFORMED_EVENT


def test_malformed_log_fields_leave_out_the_input() -> None:
    secret = "x" * 50 + "-do-not-log"
    event = load_event("spot_interruption_warning", detail={"instance-id": {"nested": secret}})
    with pytest.raises(HandlerError) as caught:
        classify(event, region=REGION, account=ACCOUNT)
    assert secret not in json.dumps(caught.value.log_fields())


def test_hostile_values_stay_short_in_the_log() -> None:
    result = classify(load_event("foreign_s3_object_created", fields={"id": "x" * 10_000, "source": "y" * 10_000}), region=REGION, account=ACCOUNT)
    assert isinstance(result, NotOurs)
    assert len(result.event_id or "") <= 128 and len(result.detail) <= 200


# --- hostile input: whatever comes in, classify ends in a result or a classified malformed_event ----

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
SAMPLES = [json.loads(p.read_text()) for p in sorted(EVENTS.glob("*.json")) if not p.stem.startswith("malformed_")]
FIELDS = ["version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail"]
DETAIL_FIELDS = ["instance-id", "instance-action", "state", "service", "eventTypeCategory", "statusCode", "affectedEntities"]


@st.composite
def mutated_events(draw: st.DrawFn) -> Any:
    event = json.loads(json.dumps(draw(st.sampled_from(SAMPLES))))
    for _ in range(draw(st.integers(1, 4))):
        target = event
        if isinstance(event.get("detail"), dict) and draw(st.booleans()):
            target, key = event["detail"], draw(st.sampled_from(DETAIL_FIELDS))
        else:
            key = draw(st.sampled_from(FIELDS))
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(
                json_values
                | st.sampled_from(["i-1234567890abcdef0", "i-../../x", "aws.ec2", "aws.health", "us-east-1", "2026-03-02T10:15:00Z"])
            )
    return event


def _assert_classified(event: Any) -> None:
    try:
        result = classify(event, region=REGION, account=ACCOUNT)
    except HandlerError as error:
        assert error.reason is Reason.MALFORMED_EVENT
        json.dumps(error.log_fields())  # loggable
        return
    assert isinstance(result, Interruption | StateChange | Reconcile | NotOurs)
    if isinstance(result, Interruption):
        assert result.instance_ids and all(i.startswith("i-") and i.isascii() and "/" not in i for i in result.instance_ids)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_json_is_classified(event: Any) -> None:
    _assert_classified(event)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_events())
def test_mutated_samples_are_classified(event: Any) -> None:
    _assert_classified(event)
