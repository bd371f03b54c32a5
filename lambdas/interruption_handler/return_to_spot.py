"""Return to spot: the pure decision of what a generation's on-demand fallback does next.

Standard library only, no I/O, no clock: the reconciler (``interruptions.reconcile``) reads the
generation's serving pods and the move's state, calls :func:`decide`, and carries out the one
action it returns (``spot_move.py``); the simulator (``gennstack simulate``) calls the same function on a replayed
trace. Everything the decision needs comes in as arguments, everything it changes goes out in the
:class:`Decision` (the next :class:`Move` and :class:`Backoff` to store).

A move, one per generation at a time:

1. ``START``: an on-demand replica (``karpenter.sh/capacity-type=on-demand``; ``reserved`` stays
   first and never moves) that has served at least ``Policy.settle_s`` gets a replacement started,
   which must land on ``capacity-type=spot`` (for the HPA-scaled Deployments, ``spot_move.py``: one
   more replica through the ScaledObject's minimum, placed by NodePool weight, spot first): trying
   is how spot availability is found out.
2. The replacement must be scheduled within ``Policy.pending_bound_s`` and Ready within
   ``Policy.ready_bound_s`` of the start. A capacity error seen for it (``capacity_error``: the
   NodeClaim's launch failed with insufficient capacity), a pod still unscheduled past the bound,
   or one on another capacity type: ``CANCEL`` the replacement and back off,
   ``min(backoff_cap_s, backoff_base_s * 2 ** (failures - 1))`` from now. Capacity errors are normal.
3. Replacement Ready: ``DRAIN`` the on-demand pod (routing label ``"false"``) only if the serving
   replicas left without it are at least ``ready_minimum``; otherwise ``WAIT``.
4. Drained: ``DELETE`` it once its streams are done (``in_flight == 0`` after ``drain_settle_s``,
   the time for the gateway to stop sending it new requests) or ``drain_grace_s`` after the drain,
   whichever comes first (the move's ``released_at``: for the HPA-scaled Deployments the delete is
   the raised minimum put back, and the HPA and the ReplicaSet remove the pod, ``spot_move.py``).
   If the serving replicas drop below ``ready_minimum`` before that (another replica lost),
   ``RESTORE`` it to routing and wait. Released and still there after ``release_bound_s`` (the load
   keeps it), or the generation below its minimum: ``RESTORE`` it and the move ends (no backoff).
5. The on-demand pod gone: ``COMPLETE`` (the backoff resets). Karpenter then removes its empty
   node (the accelerator NodePools consolidate ``WhenEmpty``).

Nothing starts while the generation is below its ready minimum, while any interruption of it is
active (spot is being reclaimed: a new spot node would likely go the same way), while disabled, or
before the backoff's ``retry_at``.

:func:`deletion_costs` is the other half: the ``controller.kubernetes.io/pod-deletion-cost`` each
serving pod should carry so that a ReplicaSet scale-down takes on-demand replicas first.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

SPOT = "spot"
ON_DEMAND = "on-demand"
RESERVED = "reserved"
CAPACITY_TYPES = (SPOT, ON_DEMAND, RESERVED)

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
# The move's drained on-demand pod: below every capacity type's, so the ReplicaSet removes it first
# when the HPA takes the raised replica back (spot_move.py).
MOVE_OUT_DELETION_COST = -200
# Lower is deleted first (kubernetes/kubernetes pkg/controller/controller_utils.go ActivePodsWithRanks,
# after unscheduled < scheduled, pending < running, not ready < ready). Unannotated pods count as 0.
DELETION_COST = {ON_DEMAND: -100, SPOT: 0, RESERVED: 100}


class Action(enum.StrEnum):
    NONE = "none"  # nothing to do (no on-demand replica, or disabled with no move in progress)
    WAIT = "wait"  # a condition is not met yet (see reason, retry_at)
    START = "start"  # start a replacement required onto spot for ``pod``
    CANCEL = "cancel"  # remove the replacement (capacity error, stuck Pending, never Ready); backed off
    DRAIN = "drain"  # take ``pod`` (on-demand) out of routing
    RESTORE = "restore"  # put ``pod`` back into routing (the generation fell below its minimum)
    DELETE = "delete"  # delete ``pod`` (drained, streams done or grace over)
    COMPLETE = "complete"  # the on-demand pod is gone: the move is over, forget it


@dataclass(frozen=True)
class Replica:
    """One serving pod of the generation as the reconciler saw it."""

    pod: str
    node: str | None  # spec.nodeName; None while unscheduled
    capacity_type: str | None  # the node's karpenter.sh/capacity-type label; None while unscheduled
    ready: bool  # condition Ready "True"
    routable: bool  # gennstack.io/routable "true" (in routing)
    deleting: bool = False  # metadata.deletionTimestamp set
    started_at: float | None = None  # when it became Ready (or was created), epoch seconds
    in_flight: int | None = None  # requests it is serving, where known
    # what it costs per hour more than the same capacity at spot, where known: moved first
    premium_usd_per_hour: float | None = None

    @property
    def serving(self) -> bool:
        return self.ready and self.routable and not self.deleting


@dataclass(frozen=True)
class Move:
    """A move in progress: ``pod`` (on-demand) is being replaced by ``replacement`` on spot."""

    pod: str
    started_at: float
    replacement: str | None = None  # the replacement pod's name once known
    drained_at: float | None = None
    # when the raised minimum was put back (Action.DELETE carried out by the HPA and the ReplicaSet:
    # spot_move.py); None while it is raised
    released_at: float | None = None


@dataclass(frozen=True)
class Backoff:
    """Failed spot attempts in a row and when the next may start."""

    failures: int = 0
    last_failure_at: float | None = None
    retry_at: float = 0.0


# aws/karpenter-provider-aws v1.14.1 pkg/cache/cache.go: an offering that failed with insufficient
# capacity is marked unavailable for UnavailableOfferingsTTL = 3 * time.Minute; Karpenter retries it
# only after that, so a spot attempt sooner than this after a failure would only hit the same mark.
KARPENTER_UNAVAILABLE_OFFERINGS_TTL_S = 180.0


@dataclass(frozen=True)
class Policy:
    """Bounds of a move. Defaults: the first retry after a failed attempt comes after Karpenter's own
    unavailable-offering mark has expired (``KARPENTER_UNAVAILABLE_OFFERINGS_TTL_S``), and a
    replacement may stay unscheduled while Karpenter tries the other spot offerings meanwhile."""

    enabled: bool = True
    settle_s: float = 600.0  # an on-demand replica serves this long before a move is tried
    pending_bound_s: float = 600.0  # the replacement must be scheduled (a spot node launched) by then
    ready_bound_s: float = 2400.0  # and Ready (image pulled, model loaded) by then
    drain_settle_s: float = 30.0  # after the drain, before an idle pod may go (the gateway re-resolves)
    drain_grace_s: float = 600.0  # after the drain, the pod goes whatever its streams
    backoff_base_s: float = 300.0
    backoff_cap_s: float = 3600.0
    # after the raised minimum is put back, how long the HPA may keep the drained pod before it goes
    # back into routing (the load wants it): the HPA's scale-down stabilization window (the chart's
    # scaleDownDelaySeconds, 1800 s for trn2) plus its sync and KEDA's poll (spot_move.py)
    release_bound_s: float = 1900.0

    def __post_init__(self) -> None:
        for name in ("settle_s", "pending_bound_s", "ready_bound_s", "drain_settle_s", "drain_grace_s",
                     "backoff_base_s", "backoff_cap_s", "release_bound_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"Policy.{name}={value!r} must be >= 0")
        if self.backoff_cap_s < self.backoff_base_s:
            raise ValueError(f"Policy.backoff_cap_s={self.backoff_cap_s} is below backoff_base_s={self.backoff_base_s}")
        if self.drain_grace_s < self.drain_settle_s:
            raise ValueError(f"Policy.drain_grace_s={self.drain_grace_s} is below drain_settle_s={self.drain_settle_s}")
        if self.ready_bound_s < self.pending_bound_s:
            raise ValueError(f"Policy.ready_bound_s={self.ready_bound_s} is below pending_bound_s={self.pending_bound_s}")


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    move: Move | None  # the move to store after the action (None: no move)
    backoff: Backoff  # the backoff to store
    pod: str | None = None  # the on-demand pod acted on
    replacement: str | None = None  # the replacement acted on (CANCEL) or waited for
    retry_at: float | None = None  # WAIT: when waiting can end at the earliest, where known
    # CANCEL and RESTORE: a short code of why, for the metrics (on_demand, unscheduled, not_ready,
    # replacement_deleted, capacity_error; below_minimum, kept)
    cause: str | None = None


def backoff_after_failure(backoff: Backoff, *, now: float, policy: Policy) -> Backoff:
    """One more failed attempt: wait ``min(cap, base * 2 ** (failures - 1))`` from ``now``."""
    failures = backoff.failures + 1
    delay = min(policy.backoff_cap_s, policy.backoff_base_s * 2 ** min(failures - 1, 32))
    return Backoff(failures=failures, last_failure_at=now, retry_at=now + delay)


def serving_count(replicas: Iterable[Replica], *, without: str | None = None) -> int:
    return sum(1 for r in replicas if r.serving and r.pod != without)


def pick_target(replicas: Sequence[Replica], *, now: float, policy: Policy) -> Replica | None:
    """The on-demand replica to move first: serving, settled; the largest known premium over spot,
    then the longest-serving, then by name."""
    candidates = [
        r for r in replicas
        if r.capacity_type == ON_DEMAND and r.serving
        and (r.started_at is None or now - r.started_at >= policy.settle_s)
    ]
    if not candidates:
        return None
    return min(candidates, key=lambda r: (-(r.premium_usd_per_hour or 0.0),
                                          r.started_at if r.started_at is not None else float("-inf"), r.pod))


def decide(
    replicas: Sequence[Replica],
    *,
    ready_minimum: int,
    move: Move | None,
    backoff: Backoff,
    now: float,
    policy: Policy = Policy(),
    capacity_error: bool = False,
    interruptions_active: int = 0,
) -> Decision:
    """The next action for one generation (see the module doc). ``capacity_error``: a launch for the
    move's replacement failed for lack of capacity since the last call."""
    if ready_minimum < 0:
        raise ValueError(f"ready_minimum={ready_minimum} must be >= 0")
    by_name = {r.pod: r for r in replicas}
    if move is None:
        return _maybe_start(replicas, ready_minimum=ready_minimum, backoff=backoff, now=now, policy=policy,
                            interruptions_active=interruptions_active)
    target = by_name.get(move.pod)
    if target is None:
        return Decision(Action.COMPLETE, "the on-demand pod is gone", None, Backoff(), pod=move.pod,
                        replacement=move.replacement)
    if move.drained_at is None:
        return _before_drain(replicas, target, move, ready_minimum=ready_minimum, backoff=backoff, now=now,
                             policy=policy, capacity_error=capacity_error)
    return _after_drain(replicas, target, move, ready_minimum=ready_minimum, backoff=backoff, now=now, policy=policy)


def _maybe_start(replicas: Sequence[Replica], *, ready_minimum: int, backoff: Backoff, now: float, policy: Policy,
                 interruptions_active: int) -> Decision:
    if not any(r.capacity_type == ON_DEMAND for r in replicas):
        return Decision(Action.NONE, "no on-demand replica", None, backoff)
    if not policy.enabled:
        return Decision(Action.NONE, "return to spot is disabled", None, backoff)
    if interruptions_active > 0:
        return Decision(Action.WAIT, "an interruption of this generation is active", None, backoff)
    if now < backoff.retry_at:
        return Decision(Action.WAIT, f"backing off after {backoff.failures} failed spot attempt(s)", None, backoff,
                        retry_at=backoff.retry_at)
    if serving_count(replicas) < ready_minimum:
        return Decision(Action.WAIT, "the generation is below its ready minimum", None, backoff)
    target = pick_target(replicas, now=now, policy=policy)
    if target is None:
        settling = [r.started_at + policy.settle_s for r in replicas
                    if r.capacity_type == ON_DEMAND and r.serving and r.started_at is not None]
        return Decision(Action.WAIT, "no settled serving on-demand replica", None, backoff,
                        retry_at=min(settling) if settling else None)
    return Decision(Action.START, "try spot for an on-demand replica", Move(pod=target.pod, started_at=now), backoff,
                    pod=target.pod)


def _replacement_of(replicas: Sequence[Replica], move: Move) -> Replica | None:
    if move.replacement is None:
        return None
    return next((r for r in replicas if r.pod == move.replacement), None)


def _cancel(move: Move, reason: str, *, backoff: Backoff, now: float, policy: Policy, cause: str) -> Decision:
    after = backoff_after_failure(backoff, now=now, policy=policy)
    return Decision(Action.CANCEL, reason, None, after, pod=move.pod, replacement=move.replacement,
                    retry_at=after.retry_at, cause=cause)


def _before_drain(replicas: Sequence[Replica], target: Replica, move: Move, *, ready_minimum: int, backoff: Backoff,
                  now: float, policy: Policy, capacity_error: bool) -> Decision:
    replacement = _replacement_of(replicas, move)
    waited = now - move.started_at
    if capacity_error:
        return _cancel(move, "no spot capacity for the replacement", backoff=backoff, now=now, policy=policy,
                       cause="capacity_error")
    if replacement is not None and replacement.capacity_type not in (None, SPOT):
        return _cancel(move, f"the replacement landed on {replacement.capacity_type}", backoff=backoff, now=now,
                       policy=policy, cause=str(replacement.capacity_type).replace("-", "_"))
    if replacement is None or replacement.node is None:
        if waited >= policy.pending_bound_s:
            return _cancel(move, f"the replacement was not scheduled within {policy.pending_bound_s:g}s",
                           backoff=backoff, now=now, policy=policy, cause="unscheduled")
        return Decision(Action.WAIT, "the replacement is pending", move, backoff, pod=move.pod,
                        replacement=move.replacement, retry_at=move.started_at + policy.pending_bound_s)
    if replacement.deleting:
        return _cancel(move, "the replacement is being deleted", backoff=backoff, now=now, policy=policy,
                       cause="replacement_deleted")
    if not replacement.ready:
        if waited >= policy.ready_bound_s:
            return _cancel(move, f"the replacement was not Ready within {policy.ready_bound_s:g}s",
                           backoff=backoff, now=now, policy=policy, cause="not_ready")
        return Decision(Action.WAIT, "the replacement is loading", move, backoff, pod=move.pod,
                        replacement=move.replacement, retry_at=move.started_at + policy.ready_bound_s)
    if not target.serving:
        # Already out of routing (an interruption drain, someone else): nothing to drain, go on.
        return Decision(Action.DRAIN, "the on-demand pod is not serving; the move goes on", replace(move, drained_at=now),
                        backoff, pod=move.pod, replacement=move.replacement)
    if serving_count(replicas, without=target.pod) < ready_minimum:
        return Decision(Action.WAIT, "draining it would go below the ready minimum", move, backoff, pod=move.pod,
                        replacement=move.replacement)
    return Decision(Action.DRAIN, "the spot replacement is Ready", replace(move, drained_at=now), backoff, pod=move.pod,
                    replacement=move.replacement)


def _after_drain(replicas: Sequence[Replica], target: Replica, move: Move, *, ready_minimum: int, backoff: Backoff,
                 now: float, policy: Policy) -> Decision:
    assert move.drained_at is not None
    if target.deleting:
        return Decision(Action.WAIT, "the on-demand pod is terminating", move, backoff, pod=move.pod)
    if move.released_at is not None:
        return _after_release(replicas, target, move, ready_minimum=ready_minimum, backoff=backoff, now=now,
                              policy=policy)
    if serving_count(replicas, without=target.pod) < ready_minimum:
        if target.ready and not target.routable:
            return Decision(Action.RESTORE, "the generation fell below its ready minimum", replace(move, drained_at=None),
                            backoff, pod=move.pod, replacement=move.replacement, cause="below_minimum")
        return Decision(Action.WAIT, "deleting it would go below the ready minimum", move, backoff, pod=move.pod)
    since = now - move.drained_at
    if since >= policy.drain_grace_s:
        return Decision(Action.DELETE, f"drained {policy.drain_grace_s:g}s ago (the grace)", replace(move, released_at=now),
                        backoff, pod=move.pod)
    if target.in_flight == 0 and since >= policy.drain_settle_s:
        return Decision(Action.DELETE, "drained and idle", replace(move, released_at=now), backoff, pod=move.pod)
    settle_at = move.drained_at + policy.drain_settle_s
    return Decision(Action.WAIT, "its streams are finishing", move, backoff, pod=move.pod,
                    retry_at=settle_at if target.in_flight == 0 else move.drained_at + policy.drain_grace_s)


def _after_release(replicas: Sequence[Replica], target: Replica, move: Move, *, ready_minimum: int, backoff: Backoff,
                   now: float, policy: Policy) -> Decision:
    """The raised minimum is back where it was: the HPA scales down and the ReplicaSet deletes the
    drained pod (the lowest pod-deletion-cost), or the load keeps it: after ``release_bound_s`` (or at
    once when the generation falls below its minimum) it goes back into routing and the move ends."""
    assert move.released_at is not None
    if serving_count(replicas, without=target.pod) < ready_minimum and target.ready:
        return Decision(Action.RESTORE, "the generation fell below its ready minimum after the release", None, backoff,
                        pod=move.pod, replacement=move.replacement, cause="below_minimum")
    if now - move.released_at >= policy.release_bound_s:
        return Decision(Action.RESTORE, f"the HPA kept it {policy.release_bound_s:g}s after the release (load)", None,
                        backoff, pod=move.pod, replacement=move.replacement, cause="kept")
    return Decision(Action.WAIT, "the HPA takes the raised replica back", move, backoff, pod=move.pod,
                    replacement=move.replacement, retry_at=move.released_at + policy.release_bound_s)


def deletion_costs(replicas: Iterable[Replica]) -> dict[str, int]:
    """``{pod: pod-deletion-cost}`` by capacity type: on-demand below spot below reserved, so a
    ReplicaSet scale-down removes on-demand replicas first and reserved ones last. Unscheduled pods
    (no capacity type yet) get none: the ReplicaSet already deletes unscheduled pods first."""
    return {r.pod: DELETION_COST[r.capacity_type] for r in replicas if r.capacity_type in DELETION_COST}
