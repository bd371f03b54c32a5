"""Turn an EventBridge event into one thing to do, or say why it is not ours.

Handled (source / detail-type):

* ``aws.ec2`` / ``EC2 Instance Rebalance Recommendation`` and ``EC2 Spot Instance Interruption Warning``:
  one instance in ``detail.instance-id``.
* ``aws.health`` / ``AWS Health Event``: EC2 ``scheduledChange`` events; instances from
  ``detail.affectedEntities[].entityValue`` and ``resources`` (ids or instance ARNs).
* ``aws.ec2`` / ``EC2 Instance State-change Notification``: terminal states only.
* ``aws.events`` / ``Scheduled Event``: reconcile.

``aws.*`` sources cannot be put on a bus with PutEvents, so checking them here means the event came
from the AWS service (or from a principal allowed to invoke the function directly). An AWS service's
event carries the account it happened in; one from another account (a bus that other accounts may
send to, a rule that forwards them) is not ours: ``account`` must be the function's own.
Anything else is :class:`~.errors.Ignored`; an event of a handled type that does not have the
documented shape raises :class:`~.errors.HandlerError` with ``malformed_event``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import HandlerError, Ignored, Reason

INSTANCE_ID = re.compile(r"^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_INSTANCE_ARN = re.compile(r"^arn:aws[a-z-]*:ec2:[a-z0-9-]+:\d{12}:instance/(i-[0-9a-f]+)$")

EC2 = "aws.ec2"
HEALTH = "aws.health"
SCHEDULE = "aws.events"
TERMINAL_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
MAX_INSTANCES_PER_EVENT = 1000


class Signal(StrEnum):
    REBALANCE = "rebalance_recommendation"
    SPOT_WARNING = "spot_interruption_warning"
    SCHEDULED_CHANGE = "scheduled_change"


_INTERRUPTION_TYPES = {
    (EC2, "EC2 Instance Rebalance Recommendation"): Signal.REBALANCE,
    (EC2, "EC2 Spot Instance Interruption Warning"): Signal.SPOT_WARNING,
    (HEALTH, "AWS Health Event"): Signal.SCHEDULED_CHANGE,
}
STATE_CHANGE = (EC2, "EC2 Instance State-change Notification")
SCHEDULED = (SCHEDULE, "Scheduled Event")


@dataclass(frozen=True)
class Interruption:
    """Instances about to be interrupted (or that may be soon)."""

    signal: Signal
    instance_ids: tuple[str, ...]
    event_id: str
    event_time: datetime


@dataclass(frozen=True)
class StateChange:
    instance_id: str
    state: str
    event_id: str
    event_time: datetime


@dataclass(frozen=True)
class Reconcile:
    event_id: str
    event_time: datetime


@dataclass(frozen=True)
class NotOurs:
    reason: Ignored
    event_id: str | None
    detail: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", self.detail[:200])  # a hostile event's values stay short in the log


Classified = Interruption | StateChange | Reconcile | NotOurs


class _Detail(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class _InstanceDetail(_Detail):
    instance_id: str = Field(alias="instance-id")


class _StateDetail(_InstanceDetail):
    state: str


class _Entity(_Detail):
    entity_value: str | None = Field(default=None, alias="entityValue")


class _HealthDetail(_Detail):
    service: str
    event_type_category: str = Field(alias="eventTypeCategory")
    event_type_code: str = Field(default="", alias="eventTypeCode")
    status_code: str | None = Field(default=None, alias="statusCode")
    affected_entities: list[_Entity] = Field(default_factory=list, alias="affectedEntities")


def classify(event: Any, *, region: str, account: str) -> Classified:
    """Validate ``event`` and say what it asks for. Raises ``HandlerError(malformed_event)``.

    ``region`` and ``account`` are the function's own: an event from elsewhere is :class:`NotOurs`.
    """
    envelope = _envelope(event)
    event_id = envelope.id[:128]  # ids reach the logs: keep hostile ones short
    kind = (envelope.source, envelope.detail_type)
    known = kind in _INTERRUPTION_TYPES or kind in (STATE_CHANGE, SCHEDULED)
    if not known:
        return NotOurs(Ignored.FOREIGN_EVENT, event_id, f"source={envelope.source!r} detail-type={envelope.detail_type!r}")
    if envelope.account != account:
        return NotOurs(Ignored.FOREIGN_ACCOUNT, event_id, f"event account {envelope.account!r}, function account {account!r}")
    if envelope.region != region:
        return NotOurs(Ignored.FOREIGN_REGION, event_id, f"event region {envelope.region!r}, function region {region!r}")
    event_time = envelope.time if envelope.time.tzinfo else envelope.time.replace(tzinfo=UTC)
    if kind == SCHEDULED:
        return Reconcile(event_id, event_time)
    if kind == STATE_CHANGE:
        detail = _detail(_StateDetail, envelope, event_id)
        instance_id = _instance_id(detail.instance_id, event_id)
        if detail.state not in TERMINAL_STATES:
            return NotOurs(Ignored.NON_TERMINAL_STATE, event_id, f"{instance_id} is {detail.state!r}")
        return StateChange(instance_id, detail.state, event_id, event_time)
    signal = _INTERRUPTION_TYPES[kind]
    if signal is Signal.SCHEDULED_CHANGE:
        return _health(envelope, event_id, event_time)
    detail = _detail(_InstanceDetail, envelope, event_id)
    return Interruption(signal, (_instance_id(detail.instance_id, event_id),), event_id, event_time)


def _envelope(event: Any) -> EventBridgeModel:
    try:
        envelope = EventBridgeModel.model_validate(event)
    except ValidationError as exc:
        raise HandlerError(Reason.MALFORMED_EVENT, "not an EventBridge event", errors=_errors(exc)) from exc
    if not isinstance(envelope.detail, dict):
        raise HandlerError(Reason.MALFORMED_EVENT, "detail is not an object", event_id=envelope.id[:128])
    return envelope


def _detail(model: type[_Detail], envelope: EventBridgeModel, event_id: str) -> Any:
    try:
        return model.model_validate(envelope.detail)
    except ValidationError as exc:
        raise HandlerError(
            Reason.MALFORMED_EVENT,
            f"{envelope.detail_type} detail does not have the documented shape",
            event_id=event_id,
            errors=_errors(exc),
        ) from exc


def _instance_id(value: str, event_id: str) -> str:
    if not INSTANCE_ID.match(value):
        raise HandlerError(Reason.MALFORMED_EVENT, "instance-id is not an EC2 instance id", event_id=event_id, value=value[:64])
    return value


def _health(envelope: EventBridgeModel, event_id: str, event_time: datetime) -> Classified:
    detail = _detail(_HealthDetail, envelope, event_id)
    if detail.service != "EC2" or detail.event_type_category != "scheduledChange":
        return NotOurs(
            Ignored.NOT_SCHEDULED_CHANGE, event_id, f"service={detail.service!r} category={detail.event_type_category!r}"
        )
    if detail.status_code == "closed":
        return NotOurs(Ignored.HEALTH_EVENT_CLOSED, event_id, detail.event_type_code)
    candidates = [entity.entity_value for entity in detail.affected_entities if entity.entity_value]
    for resource in envelope.resources:
        arn = _INSTANCE_ARN.match(resource)
        candidates.append(arn.group(1) if arn else resource)
    # Health events name other entity types too (volumes, hosts): keep instance ids, in order, once.
    instance_ids = tuple(dict.fromkeys(c for c in candidates if INSTANCE_ID.match(c)))
    if not instance_ids:
        return NotOurs(Ignored.NO_INSTANCES, event_id, detail.event_type_code)
    if len(instance_ids) > MAX_INSTANCES_PER_EVENT:
        raise HandlerError(
            Reason.MALFORMED_EVENT, f"names {len(instance_ids)} instances, more than {MAX_INSTANCES_PER_EVENT}", event_id=event_id
        )
    return Interruption(Signal.SCHEDULED_CHANGE, instance_ids, event_id, event_time)


def _errors(exc: ValidationError) -> list[str]:
    """Pydantic's errors without the input values (a hostile event stays out of the log)."""
    return [f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors(include_input=False)[:10]]
