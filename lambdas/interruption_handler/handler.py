"""Lambda entry point: parse, dispatch, log, emit metrics; the logic lives in ``interruptions``.

Settings and clients are built on the first invocation and reused while the environment is warm.
Events that are not ours return ``{"outcome": "ignored", ...}``; any failure is logged with its
reason and context, counted in the ``Errors`` metric, and raised as ``InvocationFailed`` so Lambda
retries the event and then hands it to the dead-letter destination.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any

import boto3
from aws_lambda_powertools import Logger, single_metric
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from .eks_auth import eks_token
from .errors import HandlerError, Ignored, InvocationFailed, Reason
from .events import Interruption, NotOurs, Reconcile, StateChange, classify
from .interruptions import Report, handle_interruption, handle_state_change, reconcile
from .kube import KubeClient
from .settings import ConfigError, Settings

logger = Logger()
# Leave the kube calls a margin before Lambda's own timeout, so a failure is logged, not cut off.
DEADLINE_MARGIN_S = 2.0
# Ignored outcomes that are also counted (metric ForeignEvents) and logged at WARNING.
FOREIGN = frozenset({Ignored.FOREIGN_ACCOUNT, Ignored.FOREIGN_REGION})
# return-to-spot actions counted in SpotMoves, by their outcome dimension (the others only log)
MOVE_METRICS = {"start": "started", "complete": "completed", "cancel": "cancelled", "restore": "restored"}
_AWS_CONFIG = Config(connect_timeout=3, read_timeout=5, retries={"mode": "standard", "max_attempts": 3})


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    session: boto3.Session
    ec2: Any
    table: Any


@functools.cache
def runtime() -> Runtime:
    settings = Settings.from_env(os.environ)
    session = boto3.Session(region_name=settings.region)
    return Runtime(
        settings=settings,
        session=session,
        ec2=session.client("ec2", config=_AWS_CONFIG),
        table=session.resource("dynamodb", config=_AWS_CONFIG).Table(settings.table_name),
    )


def kube_client(rt: Runtime, context: LambdaContext) -> KubeClient:
    settings = rt.settings
    return KubeClient(
        endpoint=settings.cluster_endpoint,
        ca_pem=settings.cluster_ca_pem,
        token=lambda: eks_token(rt.session.get_credentials(), region=settings.region, cluster_name=settings.cluster_name),
        timeout=settings.kube_timeout_seconds,
        deadline=lambda: context.get_remaining_time_in_millis() / 1000 - DEADLINE_MARGIN_S,
    )


@logger.inject_lambda_context(log_event=False, clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    started = time.monotonic()
    try:
        rt = runtime()
    except ConfigError as exc:
        failure = HandlerError(Reason.CONFIG, str(exc))
        _fail([failure], namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE"))
        raise InvocationFailed([failure]) from exc
    namespace = rt.settings.metrics_namespace
    try:
        classified = classify(event, region=rt.settings.region, account=rt.settings.account_id)
    except HandlerError as failure:
        _fail([failure], namespace=namespace)
        raise InvocationFailed([failure]) from failure

    if isinstance(classified, NotOurs):
        fields = {"outcome": "ignored", "reason": classified.reason.value, "event_id": classified.event_id, "detail": classified.detail}
        if classified.reason in FOREIGN:
            # Not a kind of event to ignore quietly: the rules match this account's and region's
            # events only, so one from elsewhere came by another path (a shared bus, a direct invoke).
            logger.warning("event from another account or region dropped", extra=fields)
            _metric("ForeignEvents", MetricUnit.Count, 1, namespace, reason=classified.reason.value)
        else:
            logger.info("event is not ours", extra=fields)
        return fields
    logger.append_keys(event_id=classified.event_id)
    if isinstance(classified, Interruption):
        report = handle_interruption(classified, ec2=rt.ec2, table=rt.table, kube=kube_client(rt, context), settings=rt.settings)
    elif isinstance(classified, StateChange):
        report = handle_state_change(classified, table=rt.table, settings=rt.settings)
    else:
        assert isinstance(classified, Reconcile)
        report = reconcile(classified, ec2=rt.ec2, table=rt.table, kube=kube_client(rt, context), settings=rt.settings)
    _publish(report, namespace=namespace, handler_ms=(time.monotonic() - started) * 1000)
    if report.failures:
        _fail(report.failures, namespace=namespace)
        raise InvocationFailed(report.failures)
    return {"outcome": "done", "results": [result.log_fields() for result in report.results]}


def _publish(report: Report, *, namespace: str, handler_ms: float) -> None:
    for result in report.results:
        fields = result.log_fields()
        if result.outcome == "ignored":
            logger.info("instance is not ours", extra=fields)
            continue
        subject = ("instance" if result.instance_id else "serving pods" if result.outcome in ("routing", "capacity", "nodes", "move")
                   else "warm spare")
        logger.info(f"{subject} {result.outcome}", extra=fields)
        if result.drain_latency_ms is not None and result.generation:
            _metric("DrainLatency", MetricUnit.Milliseconds, result.drain_latency_ms, namespace, generation=result.generation)
        if result.drained_pods and result.generation:
            _metric("DrainedPods", MetricUnit.Count, len(result.drained_pods), namespace, generation=result.generation)
        if result.restored_pods and result.generation:
            _metric("RestoredPods", MetricUnit.Count, len(result.restored_pods), namespace, generation=result.generation)
        if result.kept_pods and result.generation:
            _metric("KeptPods", MetricUnit.Count, len(result.kept_pods), namespace, generation=result.generation)
        if result.drained_groups and result.generation:
            # One per multi-node replica, however many of its members' nodes are doomed.
            _metric("DrainedGroups", MetricUnit.Count, len(result.drained_groups), namespace, generation=result.generation)
        if result.outcome == "recorded" and result.generation:
            _metric("Interruptions", MetricUnit.Count, 1, namespace, generation=result.generation, signal=result.signal or "")
            if result.prewarm_latency_ms is not None:
                _metric("PrewarmLatency", MetricUnit.Milliseconds, result.prewarm_latency_ms, namespace, generation=result.generation)
                _metric("HandlerLatency", MetricUnit.Milliseconds, round(handler_ms, 1), namespace, generation=result.generation)
        elif result.outcome == "duplicate" and result.generation:
            _metric("DuplicateSignals", MetricUnit.Count, 1, namespace, generation=result.generation)
        elif result.outcome == "reconciled" and result.generation and result.replicas is not None:
            _metric("WarmSpareReplicas", MetricUnit.Count, result.replicas, namespace, generation=result.generation)
        if result.outcome == "capacity" and result.generation and result.capacity is not None:
            # Serving replicas by the capacity type of their node, every type every run (0 included).
            for capacity_type, count in sorted(result.capacity.items()):
                _metric("ServingReplicas", MetricUnit.Count, count, namespace, generation=result.generation,
                        capacity_type=capacity_type)
        if result.outcome == "nodes" and result.generation and result.nodes is not None:
            # The generation's accelerator nodes by capacity type and instance type (gennstack cost --live).
            for key, count in sorted(result.nodes.items()):
                capacity_type, instance_type = key.split("/", 1)
                _metric("AcceleratorNodes", MetricUnit.Count, count, namespace, generation=result.generation,
                        capacity_type=capacity_type, instance_type=instance_type)
        if result.outcome == "move" and result.generation and result.move in MOVE_METRICS:
            # Return to spot (spot_move.py): moves started, completed, cancelled (by cause), restored.
            _metric("SpotMoves", MetricUnit.Count, 1, namespace, generation=result.generation,
                    outcome=MOVE_METRICS[result.move], cause=result.move_cause or "none")
        if result.outcome == "reconciled" and result.generation and result.spare_groups is not None:
            # Warm-spare groups of the multi-node replicas, in groups (each nodes_per_replica nodes).
            _metric("WarmSpareGroups", MetricUnit.Count, result.spare_groups, namespace, generation=result.generation)


def _fail(failures: list[HandlerError], *, namespace: str | None) -> None:
    for failure in failures:
        logger.error("interruption handling failed", extra=failure.log_fields())
        if namespace:
            _metric("Errors", MetricUnit.Count, 1, namespace, reason=failure.reason.value)


def _metric(name: str, unit: MetricUnit, value: float, namespace: str, **dimensions: str) -> None:
    # single_metric: each metric carries its own dimensions (generation, reason).
    with single_metric(name=name, unit=unit, value=value, namespace=namespace) as metric:
        for key, dim in dimensions.items():
            metric.add_dimension(name=key, value=dim)
