"""Return to spot, carried out: one reconcile step of a generation's move (``return_to_spot.decide``).

For gen2-trn2 and gen3-g6e, whose server Deployments KEDA scales: the HPA that KEDA makes owns
``spec.replicas``, so the move never touches the Deployment. It moves the *minimum* instead:

- ``START``: the generation's ScaledObject ``spec.minReplicaCount`` goes to (its pods + 1; or the
  minimum + 1 while the HPA has not reached the minimum yet). KEDA
  v2.20.2 reconciles a ScaledObject on a generation change (``controllers/keda/scaledobject_controller.go``,
  ``predicate.GenerationChangedPredicate``) and sets the HPA's ``minReplicas`` from it
  (``apis/keda/v1alpha1/scaledobject_types.go`` ``GetHPAMinReplicas``, ``controllers/keda/hpa.go``
  ``updateHPAIfNeeded``); the HPA, below its minimum, scales up to it at its next sync with no
  stabilization (kubernetes ``pkg/controller/podautoscaler/horizontal.go``: "Current number of
  replicas below Spec.MinReplicas"). The ReplicaSet's new pod is placed by Karpenter by NodePool
  weight (spot 50 over on-demand 10): it lands on spot if spot can be had. On on-demand, or still
  unscheduled after ``pending_bound_s``, or not Ready after ``ready_bound_s``: ``CANCEL``, the
  minimum goes back and ``decide`` backs off. The replacement is the pod that was not there at the
  start (``pods_at_start``).
- ``DRAIN``: once it is Ready on spot, the on-demand pod leaves routing (``gennstack.io/routable``
  ``"false"``, drain.py) and gets ``MOVE_OUT_DELETION_COST`` (-200, below on-demand's -100), so it is
  the ReplicaSet's first to delete (``ActivePodsWithRanks`` step 4; it stays Ready).
- ``DELETE``: after its streams (``drain_grace_s``, the in-flight count is not known here) the
  minimum goes back. The HPA's scale-down stabilization keeps the highest *metric* recommendation of
  its window (``stabilizeRecommendationWithBehaviors`` stores the recommendation before the minimum
  is applied), so the raised replica goes at the next sync if the load of the last
  ``scaleDownDelaySeconds`` did not want it, else at most that window later; the ReplicaSet deletes
  the drained pod; Karpenter removes its empty node (``WhenEmpty``). Still there after
  ``release_bound_s``: the load keeps it, ``RESTORE`` (back into routing, the usual cost).
- ``COMPLETE``: the on-demand pod is gone.

State: the annotation ``gennstack.io/return-to-spot`` on the ScaledObject (JSON: the Move, the
Backoff, the original and the raised minimum, the pods at the start; KEDA v2.20.2 copies a
ScaledObject's annotations onto its HPA, ``controllers/keda/hpa.go`` ``newHPAForScaledObject``,
so the HPA shows it too, eventually: KEDA reconciles a ScaledObject on a spec change
(``GenerationChangedPredicate``, ``controllers/keda/scaledobject_controller.go``), so a step that writes
only the state reaches the HPA at the next one that changes the minimum). Each step reads the
ScaledObject, decides, and writes the new state *and* the minimum in one merge patch conditional on
the read's ``resourceVersion``: a concurrent step's patch makes this one 409 and it does nothing
(the next reconcile goes on from the stored state), so two moves of one generation never run at once
and a restarted Lambda loses nothing. Pod labels and costs are converged from the stored state after
the patch, so a step cut off between the two is healed by the next.

A helm upgrade that resets ``minReplicaCount`` during a move: the live value becomes the original
and the move's raised value is re-applied above it; after the release, the live value is simply the
original. The pinned Helm 4.2.3 installs the chart with server-side apply, without forcing
conflicts: a write of the minimum takes the field from ``helm``, so after each write the move hands
it back (``_hand_back``, field_owners.py) and the next upgrade or rollback applies without a
conflict. Between the write and the hand-back (one request) an upgrade could still conflict; its
rollback, seconds later, finds the field handed back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from .drain import pods_path, set_routing
from .errors import HandlerError, Reason
from .field_owners import FIELD_MANAGER, MIN_REPLICA_COUNT, Owner, hand_back, is_move, owners
from .kube import KubeClient
from .return_to_spot import (
    DELETION_COST_ANNOTATION,
    MOVE_OUT_DELETION_COST,
    SPOT,
    Action,
    Backoff,
    Decision,
    Move,
    Policy,
    Replica,
    decide,
)
from .settings import MovedGeneration
from .spot_return import node_capacity_types, replicas_of

STATE_ANNOTATION = "gennstack.io/return-to-spot"
HAND_BACK_ATTEMPTS = 3  # a 409 on the hand-back: read again and retry (KEDA's status writes race it)
KEDA_DEFAULT_MAX_REPLICAS = 100  # apis/keda/v1alpha1/scaledobject_types.go defaultHPAMaxReplicas (v2.20.2)


@dataclass(frozen=True)
class MoveState:
    move: Move | None = None
    backoff: Backoff = Backoff()
    original_min: int | None = None  # the chart's minReplicaCount, while a move has it raised or released
    raised_min: int | None = None
    pods_at_start: tuple[str, ...] = ()

    def dump(self) -> str:
        return json.dumps({
            "move": asdict(self.move) if self.move else None,
            "backoff": asdict(self.backoff),
            "original_min": self.original_min,
            "raised_min": self.raised_min,
            "pods_at_start": list(self.pods_at_start),
        }, sort_keys=True, separators=(",", ":"))

    @classmethod
    def load(cls, raw: str | None) -> MoveState:
        """The stored state; absent: none. Unreadable (edited by hand): :class:`HandlerError`, never a guess."""
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            move = Move(**data["move"]) if data.get("move") else None
            return cls(move=move, backoff=Backoff(**data["backoff"]), original_min=data.get("original_min"),
                       raised_min=data.get("raised_min"), pods_at_start=tuple(data.get("pods_at_start") or ()))
        except (ValueError, TypeError, KeyError) as exc:
            raise HandlerError(Reason.KUBE_BAD_RESPONSE, f"annotation {STATE_ANNOTATION} is not a move state: {exc}") from exc


@dataclass
class Stepped:
    """One step's outcome for the log and the metrics."""

    decision: Decision
    state: MoveState
    conflict: bool = False  # another invocation wrote first: nothing done
    min_replica_count: int | None = None  # the minimum this step set, if it set one
    held: set[str] = field(default_factory=set)  # pods the move keeps out of routing (drain converge skips them)
    move_out: set[str] = field(default_factory=set)  # pods at MOVE_OUT_DELETION_COST (cost converge skips them)
    restored: list[str] = field(default_factory=list)
    handed_back: bool = False  # spec.minReplicaCount given back to its owners (field_owners.py)


def started_at(pod: dict[str, Any]) -> float | None:
    """When the pod's Ready condition last changed (it became Ready), else its creation."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "Ready" and condition.get("lastTransitionTime"):
            return _epoch(condition["lastTransitionTime"])
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    return _epoch(created) if created else None


def _epoch(value: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def find_replacement(replicas: Sequence[Replica], state: MoveState) -> str | None:
    """The pod the raised minimum made: one that was not there at the start, spot first, then by name."""
    new = [r for r in replicas if r.pod not in state.pods_at_start and not r.deleting]
    if not new:
        return None
    return min(new, key=lambda r: (r.capacity_type != SPOT, r.pod)).pod


def step(kube: KubeClient, *, generation: str, target: MovedGeneration, policy: Policy, interruptions_active: int,
         now: float) -> Stepped:
    obj = kube.get_scaled_object(target.namespace, target.scaled_object)
    metadata, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    version = metadata["resourceVersion"]
    raw = (metadata.get("annotations") or {}).get(STATE_ANNOTATION)
    state = MoveState.load(raw)
    live_min = int(spec.get("minReplicaCount") or 0)
    max_replicas = int(spec.get("maxReplicaCount") or KEDA_DEFAULT_MAX_REPLICAS)
    want_min: int | None = None
    if state.move is not None and state.original_min is not None:
        if state.move.released_at is None and state.raised_min is not None and live_min != state.raised_min:
            # The chart changed the minimum under the move: that is the original now; raise above it again.
            extra = state.raised_min - state.original_min
            state = replace(state, original_min=live_min, raised_min=min(max_replicas, live_min + extra))
            want_min = state.raised_min
        elif state.move.released_at is not None and live_min != state.original_min:
            state = replace(state, original_min=live_min)
    pods = kube.list_items(pods_path(target.namespace), label_selector=target.pods)
    replicas = [replace(r, started_at=started_at(pod)) for r, pod in
                zip(replicas_of(pods, node_capacity_types(kube, generation)), pods, strict=True)]
    if state.move is not None and state.move.replacement is None:
        found = find_replacement(replicas, state)
        if found is not None:
            state = replace(state, move=replace(state.move, replacement=found))
    original = state.original_min if state.move is not None and state.original_min is not None else live_min
    decision = decide(replicas, ready_minimum=max(1, original), move=state.move, backoff=state.backoff, now=now,
                      policy=policy, interruptions_active=interruptions_active)
    # One above what runs (or what the minimum already asks for, while the HPA catches up with it).
    raised = max(sum(1 for r in replicas if not r.deleting), live_min) + 1
    if decision.action is Action.START and raised > max_replicas:
        decision = Decision(Action.WAIT, f"the generation is at its maxReplicaCount {max_replicas}", None, state.backoff)
    new, want = _next_state(decision, state, live_min=live_min, raised=raised, replicas=replicas)
    want_min = want if want is not None else want_min
    if want_min == live_min:
        want_min = None
    stepped = Stepped(decision, new, min_replica_count=want_min)
    written = obj
    if new.dump() != (raw or MoveState().dump()) or want_min is not None:
        try:
            written = kube.patch_scaled_object(target.namespace, target.scaled_object, resource_version=version,
                                               annotations={STATE_ANNOTATION: new.dump()}, min_replica_count=want_min)
        except HandlerError as error:
            if error.reason is not Reason.KUBE_CONFLICT:
                raise
            # Another invocation wrote first: nothing done; the stored move's pod stays held (it was
            # drained at the read), so this run's drain and cost passes do not undo it.
            held = {state.move.pod} if state.move is not None and state.move.drained_at is not None else set()
            return Stepped(decision, state, conflict=True, held=held, move_out=set(held))
    stepped.handed_back = _hand_back(kube, target, written, before=owners(metadata.get("managedFields"), MIN_REPLICA_COUNT))
    _converge_pods(kube, target, pods, new, decision, stepped)
    return stepped


def _hand_back(kube: KubeClient, target: MovedGeneration, obj: dict[str, Any], *, before: list[Owner]) -> bool:
    """Give ``spec.minReplicaCount`` back to the managers that owned it at this step's read (helm),
    or to nobody, so that the chart's next server-side apply does not conflict (field_owners.py).
    Also heals a step cut off between its write and its hand-back. A 409 (KEDA writes the status
    every poll): read again and retry, a few times; any other failure leaves it to the next step and
    never stops this one (its pods' routing and costs still converge). True when the server's
    answer no longer names the move as an owner."""
    for _ in range(HAND_BACK_ATTEMPTS):
        metadata = obj.get("metadata") or {}
        handed = hand_back(metadata.get("managedFields"), MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=before)
        if handed is None:
            return False
        try:
            answer = kube.put_scaled_object_managed_fields(target.namespace, target.scaled_object,
                                                           resource_version=metadata["resourceVersion"],
                                                           managed_fields=handed)
        except HandlerError as error:
            if error.reason is not Reason.KUBE_CONFLICT:
                return False
            try:
                obj = kube.get_scaled_object(target.namespace, target.scaled_object)
            except HandlerError:
                return False
            continue
        # The server keeps the live list if a sent entry does not decode (decodeLiveOrNew): check.
        return not any(is_move(o, FIELD_MANAGER) for o in owners(answer["metadata"].get("managedFields"), MIN_REPLICA_COUNT))
    return False


def _next_state(decision: Decision, state: MoveState, *, live_min: int, raised: int,
                replicas: list[Replica]) -> tuple[MoveState, int | None]:
    """The state to store after ``decision`` and the minimum to set (None: leave it)."""
    action = decision.action
    if action is Action.START:
        return MoveState(decision.move, decision.backoff, original_min=live_min, raised_min=raised,
                         pods_at_start=tuple(sorted(r.pod for r in replicas))), raised
    if decision.move is None:  # CANCEL, COMPLETE, RESTORE after the release, NONE/WAIT without a move
        back = state.original_min if state.move is not None and state.move.released_at is None else None
        return MoveState(None, decision.backoff), back
    if action is Action.DELETE:
        return replace(state, move=decision.move, backoff=decision.backoff), state.original_min
    return replace(state, move=decision.move, backoff=decision.backoff), None


def _converge_pods(kube: KubeClient, target: MovedGeneration, pods: list[dict[str, Any]], state: MoveState,
                   decision: Decision, stepped: Stepped) -> None:
    """Routing and cost from the stored state: the move's drained pod out of routing at the lowest
    cost; a restored (or no longer moving) pod back in; a cancelled replacement first to go."""
    by_name = {str((p.get("metadata") or {}).get("name")): p for p in pods}
    move = state.move
    if move is not None and move.drained_at is not None and move.pod in by_name:
        stepped.held.add(move.pod)
        pod = by_name[move.pod]
        set_routing(kube, namespace=target.namespace, node="(return to spot)", routable=False, pods=[pod])
        _cost(kube, target.namespace, pod, MOVE_OUT_DELETION_COST)
        stepped.move_out.add(move.pod)
    if decision.action is Action.RESTORE and decision.pod in by_name and decision.pod not in stepped.held:
        stepped.restored = set_routing(kube, namespace=target.namespace, node="(return to spot)", routable=True,
                                       pods=[by_name[decision.pod]]).changed
    if decision.action is Action.CANCEL and decision.replacement in by_name:
        _cost(kube, target.namespace, by_name[decision.replacement], MOVE_OUT_DELETION_COST)
        stepped.move_out.add(decision.replacement)


def _cost(kube: KubeClient, namespace: str, pod: dict[str, Any], cost: int) -> None:
    metadata = pod.get("metadata") or {}
    if (metadata.get("annotations") or {}).get(DELETION_COST_ANNOTATION) == str(cost):
        return
    try:
        kube.patch_pod_annotations(namespace, str(metadata.get("name")), {DELETION_COST_ANNOTATION: str(cost)})
    except HandlerError as error:
        if error.reason is not Reason.KUBE_NOT_FOUND:
            raise

