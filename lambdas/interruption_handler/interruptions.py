"""What the handler does with an interruption, a terminal state change, or a reconcile tick.

Records
    One DynamoDB item per interrupted instance, ``pk = "instance#<id>"``, written with a conditional
    put (``attribute_not_exists(pk) OR expires_at <= now``). A second delivery of the same event, or a
    rebalance recommendation followed by a spot warning (or a Health scheduled change) for the same
    instance, fails the condition and counts nothing twice; it only adds its signal to the record's
    ``signals`` set. ``expires_at`` (the table's TTL attribute) is ``now + RECORD_TTL_SECONDS``.

Active interruptions
    A record is *active* while ``expires_at > now`` and, once its instance is known to be gone
    (``terminated_at``, from a terminal state-change event or found by the reconciler), for
    ``REPLACEMENT_GRACE_SECONDS`` more: long enough for Karpenter's replacement node to join and the
    model server on it to load and serve. DynamoDB deletes expired items lazily (often hours later),
    so activity is decided from the attributes, never from the item's presence. When an instance
    terminates, ``expires_at`` is raised to ``terminated_at + grace`` if that is later, so a
    rebalance recommendation that came long before the termination still covers the replacement.

Replica count
    For a generation, ``min(cap, baseline + active interruptions of that generation)``, set as an
    absolute value so retries are safe. Each attempt reads the ``scale`` (replicas, resourceVersion),
    then counts records, then patches with that ``resourceVersion``: two concurrent invocations cannot
    leave a stale, lower count behind, because the later patch of a stale read gets 409 and is redone
    (at most ``CONFLICT_ATTEMPTS`` times). No patch is sent when the count is already right.

Warm-spare groups (multi-node replicas, ``WARM_SPARES[pool].groups``)
    A LeaderWorkerSet whose ``spec.replicas`` counts groups, set through its ``scale`` like a
    Deployment's, to ``min(cap, baseline + doomed groups)``: the distinct serving groups with a member
    on an instance with an active record, however many of their members are interrupted. The record
    keeps the group keys it found on its instance's node (``groups``, a string set, added at the
    signal and at every reconcile while the node is there), so a group still counts while its
    replacement forms after the node has gone; LWS names a group's key after its leader pod
    (``genGroupUniqueKey(namespace, leader name)``, pkg/webhooks/pod_webhook.go at v0.10.0), so the
    recreated group has the same key.

Reconciler (the scheduled event)
    Marks records whose instance has terminated (or is no longer known to EC2) but whose state-change
    event never arrived, then sets every generation's Deployment to its count. As records go inactive,
    each Deployment steps back to its baseline. A failure on one Deployment does not stop the others;
    all failures are raised together afterwards.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from boto3.dynamodb.conditions import Attr
from botocore.exceptions import BotoCoreError, ClientError

from .drain import converge_pool, drain_instance, group_keys_on
from .errors import HandlerError, Ignored, Reason
from .events import Interruption, Reconcile, Signal, StateChange
from .kube import KubeClient
from .settings import GroupSpare, Settings, WarmSpare
from .spot_move import step as move_step
from .spot_return import converge_deletion_costs, node_census

NODEPOOL_TAG = "karpenter.sh/nodepool"
CLUSTER_NAME_TAG = "eks:eks-cluster-name"
CONFLICT_ATTEMPTS = 3
GONE_STATES = frozenset({"shutting-down", "terminated"})
_DESCRIBE_CHUNK = 200  # DescribeInstances filter values per call

Clock = Callable[[], float]


@dataclass
class Result:
    """One outcome for the log and the metrics (one per instance or per Deployment)."""

    outcome: str  # recorded | duplicate | terminated | reconciled | ignored
    reason: str | None = None
    instance_id: str | None = None
    nodepool: str | None = None
    generation: str | None = None
    replicas: int | None = None
    previous_replicas: int | None = None
    active: int | None = None
    signal: str | None = None
    prewarm_latency_ms: float | None = None
    detail: str | None = None
    # drain routing: the node, and the serving pods taken out of (or put back into) load balancing,
    # or left in it because no other serving pod of the generation would remain (drain.py)
    node: str | None = None
    drained_pods: list[str] | None = None
    restored_pods: list[str] | None = None
    kept_pods: list[str] | None = None
    # multi-node replicas (LeaderWorkerSet groups, by leader) this drain took out of routing, each once
    drained_groups: list[str] | None = None
    drain_latency_ms: float | None = None
    # warm-spare groups (a LeaderWorkerSet, counted in groups): its count after and before this call,
    # and the serving groups with a doomed member that it covers
    spare_groups: int | None = None
    previous_spare_groups: int | None = None
    doomed_groups: int | None = None
    # scale-down order (spot_return.py): the generation's serving replicas by capacity type, and the
    # pods whose pod-deletion-cost this call set
    capacity: dict[str, int] | None = None
    costed_pods: list[str] | None = None
    # the generation's nodes by "<capacity type>/<instance type>" (metric AcceleratorNodes)
    nodes: dict[str, int] | None = None
    # return to spot (spot_move.py): the step's action, why (a short cause for cancel/restore), the
    # on-demand pod and its replacement, the minimum it set
    move: str | None = None
    move_cause: str | None = None
    pod: str | None = None
    replacement: str | None = None
    min_replicas: int | None = None
    handed_back: bool | None = None  # spec.minReplicaCount given back to its owners (field_owners.py)

    def log_fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    failures: list[HandlerError] = field(default_factory=list)


@dataclass(frozen=True)
class ScaleOutcome:
    previous: int
    replicas: int
    active: int
    changed: bool


# --- interruption signals ---------------------------------------------------------------------


def handle_interruption(
    interruption: Interruption, *, ec2: Any, table: Any, kube: KubeClient, settings: Settings, clock: Clock = time.time
) -> Report:
    """Record each of this cluster's Karpenter spot instances named by ``interruption`` and pre-warm."""
    report = Report()
    try:
        instances = describe_instances(ec2, interruption.instance_ids)
    except HandlerError as error:
        report.failures.append(error)
        return report
    touched: dict[str, WarmSpare] = {}
    for instance_id in interruption.instance_ids:
        instance = instances.get(instance_id)
        if instance is None:
            report.failures.append(
                HandlerError(Reason.UNKNOWN_INSTANCE, "DescribeInstances does not know the instance", instance_id=instance_id)
            )
            continue
        owner = owner_of(instance, settings)
        if isinstance(owner, Result):
            owner.instance_id = instance_id
            owner.signal = interruption.signal.value
            report.results.append(owner)
            continue
        pool, spare = owner
        now = clock()
        gone = instance.get("State", {}).get("Name") in GONE_STATES
        try:
            new = record_interruption(
                table,
                instance_id=instance_id,
                nodepool=pool,
                spare=spare,
                signal=interruption.signal,
                event_id=interruption.event_id,
                event_time=interruption.event_time,
                now=now,
                settings=settings,
                terminated_at=now if gone else None,
            )
        except HandlerError as error:
            error.context.update(instance_id=instance_id, generation=spare.generation)
            report.failures.append(error)
            continue
        result = Result(
            outcome="recorded" if new else "duplicate",
            instance_id=instance_id,
            nodepool=pool,
            generation=spare.generation,
            signal=interruption.signal.value,
        )
        report.results.append(result)
        drain = settings.drain_on.get(pool)
        # Routing first: it is what users feel within seconds. A duplicate record still drains (a
        # warning after a rebalance that did not drain; a redelivery is a no-op: labels are absolute).
        if drain is not None and interruption.signal.value in drain.signals:
            try:
                node, routing = drain_instance(kube, pool=pool, namespace=spare.namespace, drain=drain, instance_id=instance_id)
            except HandlerError as error:
                error.context.update(instance_id=instance_id, generation=spare.generation, namespace=spare.namespace)
                report.failures.append(error)
            else:
                result.node = node
                result.drained_pods = routing.changed
                result.kept_pods = routing.kept
                if routing.groups:
                    result.drained_groups = routing.groups
                result.drain_latency_ms = round(max(0.0, clock() - interruption.event_time.timestamp()) * 1000, 1)
        if spare.groups is not None:
            try:
                note_groups(kube, table, pool=pool, spare=spare, settings=settings, instance_ids={instance_id})
            except HandlerError as error:
                error.context.update(instance_id=instance_id, generation=spare.generation, namespace=spare.namespace)
                report.failures.append(error)
        touched[spare.generation] = spare
    # Scale after recording every instance, once per generation (a Health event may name several).
    for generation, spare in touched.items():
        if spare.groups is not None:  # its own count, whatever becomes of the Deployment's
            _converge_groups_into(report, kube, table, generation, spare, settings=settings, clock=clock,
                                  results=[r for r in report.results if r.generation == generation and r.outcome in ("recorded", "duplicate")])
        try:
            outcome = converge(kube, table, spare, settings=settings, clock=clock)
        except HandlerError as error:
            error.context.update(generation=generation, namespace=spare.namespace, deployment=spare.deployment)
            report.failures.append(error)
            continue
        latency = max(0.0, clock() - interruption.event_time.timestamp()) * 1000
        for result in report.results:
            if result.generation == generation and result.outcome in ("recorded", "duplicate"):
                result.replicas = outcome.replicas
                result.previous_replicas = outcome.previous
                result.active = outcome.active
                if result.outcome == "recorded":
                    result.prewarm_latency_ms = round(latency, 1)
    return report


def _converge_groups_into(report: Report, kube: KubeClient, table: Any, generation: str, spare: WarmSpare, *,
                          settings: Settings, clock: Clock, results: list[Result]) -> None:
    assert spare.groups is not None
    try:
        outcome = converge_groups(kube, table, generation, spare.groups, settings=settings, clock=clock)
    except HandlerError as error:
        error.context.update(generation=generation, namespace=spare.groups.namespace, leaderworkerset=spare.groups.leaderworkerset)
        report.failures.append(error)
        return
    for result in results:
        result.spare_groups = outcome.replicas
        result.previous_spare_groups = outcome.previous
        result.doomed_groups = outcome.active


def describe_instances(ec2: Any, instance_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Instances by id. A filter (not ``InstanceIds``) so one unknown id does not fail the whole call."""
    ids = list(dict.fromkeys(instance_ids))
    found: dict[str, dict[str, Any]] = {}
    try:
        for start in range(0, len(ids), _DESCRIBE_CHUNK):
            chunk = ids[start : start + _DESCRIBE_CHUNK]
            paginator = ec2.get_paginator("describe_instances")
            for page in paginator.paginate(Filters=[{"Name": "instance-id", "Values": chunk}]):
                for reservation in page.get("Reservations", []):
                    for instance in reservation.get("Instances", []):
                        found[instance["InstanceId"]] = instance
    except (ClientError, BotoCoreError) as exc:
        raise HandlerError(Reason.EC2, f"DescribeInstances failed: {exc}", instance_ids=ids[:20]) from exc
    return found


def owner_of(instance: dict[str, Any], settings: Settings) -> tuple[str, WarmSpare] | Result:
    """``(nodepool, warm spare)`` for this cluster's Karpenter spot node, else an ignored Result."""
    tags = {tag.get("Key"): tag.get("Value") for tag in instance.get("Tags", [])}
    cluster = tags.get(CLUSTER_NAME_TAG)
    owned = tags.get(f"kubernetes.io/cluster/{settings.cluster_name}") in ("owned", "shared")
    if cluster != settings.cluster_name and not (cluster is None and owned):
        return Result("ignored", Ignored.OTHER_CLUSTER.value, detail=f"{CLUSTER_NAME_TAG}={cluster!r}")
    pool = tags.get(NODEPOOL_TAG)
    if not pool:
        return Result("ignored", Ignored.NOT_KARPENTER.value, detail=f"no {NODEPOOL_TAG} tag")
    if instance.get("InstanceLifecycle") != "spot":
        return Result("ignored", Ignored.NOT_SPOT.value, nodepool=pool, detail=f"lifecycle={instance.get('InstanceLifecycle', 'on-demand')}")
    spare = settings.warm_spares.get(pool)
    if spare is None:
        return Result("ignored", Ignored.UNKNOWN_POOL.value, nodepool=pool, detail="no WARM_SPARES entry")
    return pool, spare


# --- records ----------------------------------------------------------------------------------


def record_key(instance_id: str) -> str:
    return f"instance#{instance_id}"


def record_interruption(
    table: Any,
    *,
    instance_id: str,
    nodepool: str,
    spare: WarmSpare,
    signal: Signal,
    event_id: str,
    event_time: datetime,
    now: float,
    settings: Settings,
    terminated_at: float | None = None,
) -> bool:
    """Write the record once. True if this call created it; False if it was already there."""
    item: dict[str, Any] = {
        "pk": record_key(instance_id),
        "instance_id": instance_id,
        "nodepool": nodepool,
        "generation": spare.generation,
        "signal": signal.value,
        "signals": {signal.value},
        "event_id": event_id[:128],
        "event_time": event_time.isoformat(),
        "recorded_at": int(now),
        "expires_at": int(now) + settings.record_ttl_seconds,
    }
    if terminated_at is not None:
        item["terminated_at"] = int(terminated_at)
        item["expires_at"] = max(item["expires_at"], int(terminated_at) + settings.replacement_grace_seconds)
    try:
        table.put_item(
            Item=item,
            ConditionExpression="attribute_not_exists(pk) OR expires_at <= :now",
            ExpressionAttributeValues={":now": int(now)},
        )
        return True
    except ClientError as exc:
        if _code(exc) != "ConditionalCheckFailedException":
            raise _dynamodb("PutItem", exc, instance_id) from exc
    except BotoCoreError as exc:
        raise _dynamodb("PutItem", exc, instance_id) from exc
    try:  # already recorded: remember that this signal came too (idempotent set union)
        table.update_item(
            Key={"pk": record_key(instance_id)},
            UpdateExpression="ADD signals :s",
            ExpressionAttributeValues={":s": {signal.value}},
        )
    except (ClientError, BotoCoreError) as exc:
        raise _dynamodb("UpdateItem", exc, instance_id) from exc
    return False


def mark_terminated(table: Any, instance_id: str, *, terminated_at: float, now: float, settings: Settings) -> bool:
    """Set ``terminated_at`` on an unexpired record (first time wins). False if there is none.

    An expired record is left alone: its spare has already been given back, and reviving it now
    would pre-warm after the fact.
    """
    keep_until = int(terminated_at) + settings.replacement_grace_seconds
    try:
        table.update_item(
            Key={"pk": record_key(instance_id)},
            UpdateExpression="SET terminated_at = if_not_exists(terminated_at, :t)",
            ConditionExpression="attribute_exists(pk) AND expires_at > :now",
            ExpressionAttributeValues={":t": int(terminated_at), ":now": int(now)},
        )
    except ClientError as exc:
        if _code(exc) == "ConditionalCheckFailedException":
            return False
        raise _dynamodb("UpdateItem", exc, instance_id) from exc
    except BotoCoreError as exc:
        raise _dynamodb("UpdateItem", exc, instance_id) from exc
    try:  # keep the record at least through the replacement's grace period
        table.update_item(
            Key={"pk": record_key(instance_id)},
            UpdateExpression="SET expires_at = :e",
            ConditionExpression="expires_at < :e",
            ExpressionAttributeValues={":e": keep_until},
        )
    except ClientError as exc:
        if _code(exc) != "ConditionalCheckFailedException":
            raise _dynamodb("UpdateItem", exc, instance_id) from exc
    except BotoCoreError as exc:
        raise _dynamodb("UpdateItem", exc, instance_id) from exc
    return True


def load_records(table: Any) -> list[dict[str, Any]]:
    """Every record (a strongly consistent scan: the table only holds recent interruptions)."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"ConsistentRead": True, "FilterExpression": Attr("pk").begins_with("instance#")}
    try:
        while True:
            page = table.scan(**kwargs)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    except (ClientError, BotoCoreError) as exc:
        raise HandlerError(Reason.DYNAMODB, f"Scan failed: {exc}") from exc


def is_active(record: dict[str, Any], *, now: float, settings: Settings) -> bool:
    if _number(record.get("expires_at")) <= now:
        return False
    terminated_at = record.get("terminated_at")
    return terminated_at is None or _number(terminated_at) + settings.replacement_grace_seconds > now


def active_by_generation(records: Iterable[dict[str, Any]], *, now: float, settings: Settings) -> Counter[str]:
    return Counter(r.get("generation") for r in records if is_active(r, now=now, settings=settings))


# --- scaling ----------------------------------------------------------------------------------


def _converge_scale(kube: KubeClient, namespace: str, name: str, resource: str,
                    desired_for: Callable[[], tuple[int, int]]) -> ScaleOutcome:
    """Read the scale of ``resource``/``name``, patch it to ``desired_for()``'s count at that read's
    resourceVersion, and redo both on 409 (see module doc), ``CONFLICT_ATTEMPTS`` times at most.
    ``desired_for`` returns ``(desired, counted)``: the replicas and the interruptions or doomed groups
    they were computed from, read again on each attempt."""
    conflict: HandlerError | None = None
    for _ in range(CONFLICT_ATTEMPTS):
        current = kube.get_scale(namespace, name, resource)
        desired, counted = desired_for()
        if current.replicas == desired:
            return ScaleOutcome(current.replicas, desired, counted, changed=False)
        try:
            kube.patch_scale(namespace, name, desired, current.resource_version, resource)
        except HandlerError as error:
            if error.reason is not Reason.KUBE_CONFLICT:
                raise
            conflict = error
            continue
        return ScaleOutcome(current.replicas, desired, counted, changed=True)
    assert conflict is not None
    conflict.context["attempts"] = CONFLICT_ATTEMPTS
    raise conflict


def converge(kube: KubeClient, table: Any, spare: WarmSpare, *, settings: Settings, clock: Clock) -> ScaleOutcome:
    """Set ``spare``'s Deployment to ``min(cap, baseline + active)``; redo on 409 (see module doc)."""
    def desired_for() -> tuple[int, int]:
        active = active_by_generation(load_records(table), now=clock(), settings=settings)[spare.generation]
        return spare.desired_replicas(active), active

    return _converge_scale(kube, spare.namespace, spare.deployment, "deployments", desired_for)


def note_groups(kube: KubeClient, table: Any, *, pool: str, spare: WarmSpare, settings: Settings, instance_ids: set[str]) -> None:
    """Add to each instance's record the keys of the serving groups with a member on its node."""
    drain = settings.drain_on[pool]  # Settings.from_env: a NodePool with warm-spare groups has DRAIN_ON groups
    assert drain.groups is not None
    found = group_keys_on(kube, pool=pool, namespace=spare.namespace, selector=drain.groups, instance_ids=instance_ids)
    for instance_id, keys in sorted(found.items()):
        try:  # a set union: repeating it is harmless; only existing records (the condition)
            table.update_item(
                Key={"pk": record_key(instance_id)},
                UpdateExpression="ADD #groups :g",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeNames={"#groups": "groups"},
                ExpressionAttributeValues={":g": set(keys)},
            )
        except ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":
                raise _dynamodb("UpdateItem", exc, instance_id) from exc
        except BotoCoreError as exc:
            raise _dynamodb("UpdateItem", exc, instance_id) from exc


def doomed_groups_by_generation(records: Iterable[dict[str, Any]], *, now: float, settings: Settings) -> dict[str, set[str]]:
    """The distinct serving-group keys of each generation's active records."""
    found: dict[str, set[str]] = {}
    for record in records:
        if is_active(record, now=now, settings=settings):
            found.setdefault(str(record.get("generation")), set()).update(str(k) for k in record.get("groups") or ())
    return found


def converge_groups(kube: KubeClient, table: Any, generation: str, groups: GroupSpare, *, settings: Settings,
                    clock: Clock) -> ScaleOutcome:
    """Set the warm-spare LeaderWorkerSet to ``min(cap, baseline + doomed groups)`` groups; redo on 409."""
    def desired_for() -> tuple[int, int]:
        doomed = len(doomed_groups_by_generation(load_records(table), now=clock(), settings=settings).get(generation, ()))
        return groups.desired_replicas(doomed), doomed

    return _converge_scale(kube, groups.namespace, groups.leaderworkerset, "leaderworkersets", desired_for)


# --- state changes and reconcile --------------------------------------------------------------


def handle_state_change(change: StateChange, *, table: Any, settings: Settings, clock: Clock = time.time) -> Report:
    """Note that a recorded instance is gone; its spare stays for the replacement's grace period."""
    report = Report()
    try:
        marked = mark_terminated(
            table, change.instance_id, terminated_at=change.event_time.timestamp(), now=clock(), settings=settings
        )
    except HandlerError as error:
        report.failures.append(error)
        return report
    if marked:
        report.results.append(Result("terminated", instance_id=change.instance_id, detail=change.state))
    else:
        report.results.append(Result("ignored", Ignored.NO_RECORD.value, instance_id=change.instance_id, detail=change.state))
    return report


def reconcile(
    tick: Reconcile, *, ec2: Any, table: Any, kube: KubeClient, settings: Settings, clock: Clock = time.time
) -> Report:
    report = Report()
    try:
        records = load_records(table)
        now = clock()
        unmarked = [r for r in records if is_active(r, now=now, settings=settings) and r.get("terminated_at") is None]
        if unmarked:
            instances = describe_instances(ec2, [r["instance_id"] for r in unmarked])
            for record in unmarked:
                instance = instances.get(record["instance_id"])
                # EC2 forgets terminated instances after about an hour: unknown means gone.
                if instance is None or instance.get("State", {}).get("Name") in GONE_STATES:
                    mark_terminated(table, record["instance_id"], terminated_at=now, now=now, settings=settings)
                    report.results.append(
                        Result("terminated", instance_id=record["instance_id"], generation=record.get("generation"), detail="found by reconciler")
                    )
    except HandlerError as error:
        report.failures.append(error)  # still converge: the counts are right without the marks
    _note_active_groups(kube, report, table, settings=settings, now=clock())
    held, move_out = _return_to_spot(kube, report, table, settings=settings, clock=clock)
    if settings.drain_on:
        report.results.extend(_converge_drains(kube, report, records_or_none(report, table), settings=settings, now=clock(),
                                               reload=lambda: load_records(table), held=held))
    if settings.deletion_cost or settings.drain_on:  # the drain group's node access is bound
        for generation in sorted(settings.generations):
            try:
                census = node_census(kube, generation)
            except HandlerError as error:
                error.context.update(generation=generation)
                report.failures.append(error)
            else:
                report.results.append(Result("nodes", generation=generation,
                                             nodes={f"{c}/{t}": n for (c, t), n in sorted(census.items())}))
    for generation, costed in sorted(settings.deletion_cost.items()):
        try:
            costing = converge_deletion_costs(kube, generation=generation, costed=costed, skip=move_out)
        except HandlerError as error:
            error.context.update(generation=generation, namespace=costed.namespace)
            report.failures.append(error)
        else:
            report.results.append(Result("capacity", generation=generation, capacity=costing.by_capacity,
                                         costed_pods=costing.changed or None))
    for generation, spare in sorted(settings.generations.items()):
        reconciled = Result("reconciled", generation=generation)
        try:
            outcome = converge(kube, table, spare, settings=settings, clock=clock)
        except HandlerError as error:
            error.context.update(generation=generation, namespace=spare.namespace, deployment=spare.deployment)
            report.failures.append(error)
        else:
            reconciled.replicas, reconciled.previous_replicas, reconciled.active = outcome.replicas, outcome.previous, outcome.active
            report.results.append(reconciled)
        if spare.groups is not None:  # its own count, whatever becomes of the Deployment's
            _converge_groups_into(report, kube, table, generation, spare, settings=settings, clock=clock, results=[reconciled])
            if reconciled.replicas is None and reconciled.spare_groups is not None:
                report.results.append(reconciled)
    return report


def _return_to_spot(kube: KubeClient, report: Report, table: Any, *, settings: Settings,
                    clock: Clock) -> tuple[set[str], set[str]]:
    """One step of each generation's move (spot_move.py). Returns the pods the moves keep out of
    routing and those at the move-out cost, for the drain and cost passes to leave alone. A generation
    whose records cannot be read starts nothing (an interruption may be active); a 409 is another
    invocation's step: nothing done, logged."""
    held: set[str] = set()
    move_out: set[str] = set()
    if not settings.return_to_spot:
        return held, move_out
    try:
        active = active_by_generation(load_records(table), now=clock(), settings=settings)
    except HandlerError as error:
        report.failures.append(error)
        return held, move_out
    for generation, target in sorted(settings.return_to_spot.items()):
        try:
            stepped = move_step(kube, generation=generation, target=target, policy=settings.return_to_spot_policy,
                                interruptions_active=active[generation], now=clock())
        except HandlerError as error:
            error.context.update(generation=generation, namespace=target.namespace, scaled_object=target.scaled_object)
            report.failures.append(error)
            continue
        held |= stepped.held
        move_out |= stepped.move_out
        decision = stepped.decision
        report.results.append(Result(
            "move", "conflict: another invocation stepped first" if stepped.conflict else decision.reason,
            generation=generation, move="conflict" if stepped.conflict else decision.action.value,
            move_cause=decision.cause, pod=decision.pod, replacement=decision.replacement,
            min_replicas=stepped.min_replica_count, restored_pods=stepped.restored or None,
            handed_back=stepped.handed_back or None))
    return held, move_out


def _note_active_groups(kube: KubeClient, report: Report, table: Any, *, settings: Settings, now: float) -> None:
    """For NodePools with warm-spare groups: note the groups on the nodes of active records not yet
    known to be gone (a signal whose note failed, a group placed on a doomed node since)."""
    pools = {pool: spare for pool, spare in settings.warm_spares.items() if spare.groups is not None}
    if not pools:
        return
    try:
        records = load_records(table)
        for pool, spare in sorted(pools.items()):
            instances = {str(r["instance_id"]) for r in records if r.get("nodepool") == pool
                         and is_active(r, now=now, settings=settings) and r.get("terminated_at") is None}
            if instances:
                note_groups(kube, table, pool=pool, spare=spare, settings=settings, instance_ids=instances)
    except HandlerError as error:
        report.failures.append(error)


def records_or_none(report: Report, table: Any) -> list[dict[str, Any]] | None:
    """The records for the drain pass; None (skip it) when they cannot be read (already reported)."""
    try:
        return load_records(table)
    except HandlerError as error:
        report.failures.append(error)
        return None


def _doomed(records: list[dict[str, Any]], *, pool: str, signals: set[str] | frozenset[str], now: float,
            settings: Settings) -> set[str]:
    """Instances of ``pool`` with an active record of a signal that drains it."""
    return {
        str(r["instance_id"]) for r in records
        if r.get("nodepool") == pool and is_active(r, now=now, settings=settings) and set(r.get("signals") or ()) & signals
    }


def _converge_drains(kube: KubeClient, report: Report, records: list[dict[str, Any]] | None, *, settings: Settings,
                     now: float, reload: Callable[[], list[dict[str, Any]]],
                     held: set[str] | frozenset[str] = frozenset()) -> list[Result]:
    """Per draining NodePool: drain the nodes of active records whose signals drain it, restore the rest.
    A NodePool whose doomed pods are kept (its generation's last serving pods) reports them every run.

    ``reload`` reads the records again just before pods are restored: an interruption handled
    between the first read and the pod listing has drained its node, and restoring those pods would
    route new requests to it again until the next reconcile."""
    if records is None or not settings.drain_on:
        return []
    results = []
    for pool, drain in sorted(settings.drain_on.items()):
        spare = settings.warm_spares[pool]
        doomed = _doomed(records, pool=pool, signals=drain.signals, now=now, settings=settings)

        def recheck(pool: str = pool, signals: frozenset[str] | set[str] = drain.signals) -> set[str]:
            return _doomed(reload(), pool=pool, signals=signals, now=now, settings=settings)

        try:
            drained, restored = converge_pool(kube, pool=pool, namespace=spare.namespace, drain=drain, doomed_instances=doomed,
                                              recheck=recheck, held=held)
        except HandlerError as error:
            error.context.update(nodepool=pool, generation=spare.generation, namespace=spare.namespace)
            report.failures.append(error)
            continue
        if drained.changed or restored.changed or drained.kept:
            results.append(Result("routing", nodepool=pool, generation=spare.generation,
                                  drained_pods=drained.changed, restored_pods=restored.changed, kept_pods=drained.kept,
                                  drained_groups=drained.groups or None))
    return results


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _dynamodb(operation: str, exc: Exception, instance_id: str) -> HandlerError:
    return HandlerError(Reason.DYNAMODB, f"{operation} failed: {exc}", instance_id=instance_id)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
