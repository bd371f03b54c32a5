"""Every way the handler can end, named once.

An :class:`Ignored` outcome is an event that is definitively not ours: it is logged with its reason
and the invocation succeeds. A :class:`HandlerError` is a failure: it is logged with its reason and
context and raised, so Lambda retries the event and then sends it to the dead-letter destination.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Ignored(StrEnum):
    """Reasons an event is not ours (no retry, nothing to do)."""

    FOREIGN_EVENT = "foreign_event"  # a source/detail-type this function does not handle
    FOREIGN_REGION = "foreign_region"  # an event from another region
    FOREIGN_ACCOUNT = "foreign_account"  # an event whose account is not the function's (another account's bus)
    NOT_SCHEDULED_CHANGE = "not_ec2_scheduled_change"  # an AWS Health event that is not an EC2 scheduled change
    HEALTH_EVENT_CLOSED = "health_event_closed"  # a Health event whose change is over
    NO_INSTANCES = "no_instances"  # a Health event that names no EC2 instance
    NON_TERMINAL_STATE = "non_terminal_state"  # a state change to pending/running
    OTHER_CLUSTER = "other_cluster"  # the instance belongs to no cluster or another one
    NOT_KARPENTER = "not_karpenter"  # this cluster's instance without a karpenter.sh/nodepool tag
    NOT_SPOT = "not_spot"  # on-demand (or reserved) capacity: only spot nodes pre-warm
    UNKNOWN_POOL = "unknown_pool"  # a NodePool with no warm spare configured
    NO_RECORD = "no_record"  # a terminal state change for an instance never recorded as interrupted


class Reason(StrEnum):
    """Reasons an invocation fails (retried, then dead-lettered)."""

    CONFIG = "config_error"
    MALFORMED_EVENT = "malformed_event"
    UNKNOWN_INSTANCE = "unknown_instance"
    EC2 = "ec2_error"
    DYNAMODB = "dynamodb_error"
    CREDENTIALS = "no_credentials"
    KUBE_UNAUTHORIZED = "kube_unauthorized"  # 401: token rejected (access entry, clock, cluster name)
    KUBE_FORBIDDEN = "kube_forbidden"  # 403: RBAC (or the drain policy) does not allow the call
    KUBE_NOT_FOUND = "kube_not_found"  # 404: the warm-spare Deployment does not exist
    KUBE_CONFLICT = "kube_conflict"  # 409 on every attempt: the scale kept changing under us
    KUBE_SERVER_ERROR = "kube_server_error"  # 429/5xx on every attempt
    KUBE_TIMEOUT = "kube_timeout"
    KUBE_UNREACHABLE = "kube_unreachable"  # connection refused/reset, DNS, TLS verification
    KUBE_BAD_RESPONSE = "kube_bad_response"  # any other status, or a body that is not a Scale


class HandlerError(Exception):
    """A classified failure with structured context for the log."""

    def __init__(self, reason: Reason, message: str, **context: Any) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message
        self.context = context

    def log_fields(self) -> dict[str, Any]:
        return {"reason": self.reason.value, "error": self.message, **self.context}


class InvocationFailed(Exception):
    """Raised by the handler after logging every failure of one event, so the event is retried."""

    def __init__(self, failures: list[HandlerError]) -> None:
        self.failures = failures
        self.reasons = sorted({failure.reason.value for failure in failures})
        super().__init__("; ".join(str(failure) for failure in failures))
