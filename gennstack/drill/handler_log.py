"""The interruption handler's log lines for a drill's instances, as timeline markers.

``gennstack drill`` asks FIS which instances the experiment interrupted
(``ListExperimentResolvedTargets``), reads the handler's lines about them from its log group
(``FilterLogEvents``) and turns each into a marker at the line's CloudWatch timestamp. The AWS calls
raise as botocore raises; the command decides what a failure means (a warning, never a failed drill).

Relies on:

* the handler's output (``lambdas/interruption_handler/handler.py`` ``_publish`` and
  ``interruptions.py`` ``Result.log_fields``): one Powertools JSON line per instance outcome, with
  ``outcome`` (recorded | duplicate | terminated | ...), ``instance_id``, and for recorded/duplicate
  ``signal``, ``nodepool``, ``generation``, and when drain routing took pods out ``node``,
  ``drained_pods``, ``drain_latency_ms``, and ``drained_groups`` (the multi-node groups it took out,
  by leader, once each); a terminated line's ``detail`` is the EC2 state (or "found by
  reconciler"). The function logs in Lambda's Text format, so a line's message is that JSON object.
  tests/lambdas/test_handler_lines_for_drill.py runs the real handler and feeds its lines here.
* botocore's FIS model: ``ResolvedTarget.targetInformation`` is a string-to-string map whose keys
  it does not name; any value that is an EC2 instance ARN or ID is taken.
* CloudWatch Logs (user guide, "Using filter patterns to match terms in JSON log events"):
  ``{ ($.instance_id = "i-...") || ($.instance_id = "i-...") }`` matches JSON events whose field
  equals one of the values; ``filterPattern`` holds at most 1024 characters (botocore's model), so
  more instances than fit are asked for in several calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gennstack.drill.templates import RESOURCE_TYPE

SOURCE = "interruption-handler"
MAX_FILTER_PATTERN = 1024
_INSTANCE = re.compile(r"(?:^|:instance/)(i-(?:[0-9a-f]{8}|[0-9a-f]{17}))$")
# the handler's Signal values -> marker names
SIGNAL_MARKERS = {
    "rebalance_recommendation": "rebalance_recommendation",
    "spot_interruption_warning": "interruption_warning",
    "scheduled_change": "scheduled_change",
}
NODE_GONE = "node_gone"
DRAINED = "drained"
_TEXT = {
    "rebalance_recommendation": "rebalance recommendation",
    "interruption_warning": "interruption warning",
    "scheduled_change": "scheduled change",
    DRAINED: "drained",
    NODE_GONE: "node gone",
}


@dataclass(frozen=True)
class Marker:
    """One handler line as a drill event: ``event`` at ``time``, with the line's fields."""

    time: datetime
    event: str
    instance_id: str
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        detail = ", ".join(f"{key} {value}" for key, value in (
            ("node", self.fields.get("node")),
            ("pods", " ".join(self.fields.get("pods") or []) or None),
            ("group", " ".join(self.fields.get("groups") or []) or None),
            ("state", self.fields.get("state")),
        ) if value)
        return f"handler: {self.instance_id} {_TEXT[self.event]}" + (f" ({detail})" if detail else "")


def instance_id_of(value: str) -> str | None:
    match = _INSTANCE.search(value)
    return match.group(1) if match else None


def resolved_instances(fis: Any, experiment_id: str) -> list[str]:
    """The spot instances the experiment's targets resolved to, in FIS's order."""
    found: list[str] = []
    for page in fis.get_paginator("list_experiment_resolved_targets").paginate(experimentId=experiment_id):
        for target in page.get("resolvedTargets", []):
            if target.get("resourceType") != RESOURCE_TYPE:
                continue
            for value in (target.get("targetInformation") or {}).values():
                instance = instance_id_of(value)
                if instance and instance not in found:
                    found.append(instance)
    return found


def filter_patterns(instances: Sequence[str]) -> list[str]:
    """JSON filter patterns matching lines about ``instances``, each within the 1024-character limit."""
    patterns: list[str] = []
    clauses: list[str] = []

    def pattern(parts: list[str]) -> str:
        return "{ " + " || ".join(parts) + " }"

    for instance in instances:
        if instance_id_of(instance) != instance:
            raise ValueError(f"not an EC2 instance ID: {instance!r}")
        clause = f'($.instance_id = "{instance}")'
        if clauses and len(pattern([*clauses, clause])) > MAX_FILTER_PATTERN:
            patterns.append(pattern(clauses))
            clauses = []
        clauses.append(clause)
    if clauses:
        patterns.append(pattern(clauses))
    return patterns


def handler_events(logs: Any, *, log_group: str, instances: Sequence[str], start_ms: int, end_ms: int) -> list[dict[str, Any]]:
    """Every log event of ``log_group`` in ``[start_ms, end_ms]`` about one of ``instances``."""
    events: list[dict[str, Any]] = []
    for pattern in filter_patterns(instances):
        paginator = logs.get_paginator("filter_log_events")
        for page in paginator.paginate(logGroupName=log_group, startTime=start_ms, endTime=end_ms, filterPattern=pattern):
            events.extend(page.get("events", []))
    return events


def _line(message: str) -> dict[str, Any] | None:
    start = message.find("{")
    if start < 0:
        return None
    try:
        line = json.loads(message[start:])
    except ValueError:
        return None
    return line if isinstance(line, dict) else None


def markers_from_events(events: Iterable[dict[str, Any]], instances: Iterable[str]) -> list[Marker]:
    """The markers in time order: each signal, each drain and the first gone line once per instance (the earliest)."""
    wanted = set(instances)
    first: dict[tuple[str, str, str], Marker] = {}
    for event in events:
        line = _line(str(event.get("message", "")))
        if line is None or line.get("instance_id") not in wanted or not isinstance(event.get("timestamp"), int):
            continue
        instance = str(line["instance_id"])
        at = datetime.fromtimestamp(event["timestamp"] / 1000, tz=timezone.utc)
        found: list[tuple[str, str, dict[str, Any]]] = []
        outcome = line.get("outcome")
        if outcome in ("recorded", "duplicate") and line.get("signal") in SIGNAL_MARKERS:
            signal = str(line["signal"])
            common = {"signal": signal, **{k: line[k] for k in ("generation", "nodepool") if line.get(k) is not None}}
            found.append((SIGNAL_MARKERS[signal], signal, {**common, "handler_outcome": outcome}))
            if line.get("drained_pods"):
                drained = {"pods": list(line["drained_pods"]), "node": line.get("node")}
                if line.get("drain_latency_ms") is not None:
                    drained["drain_latency_ms"] = line["drain_latency_ms"]
                if line.get("drained_groups"):
                    drained["groups"] = list(line["drained_groups"])
                found.append((DRAINED, signal, {**common, **drained}))
        elif outcome == "terminated":
            found.append((NODE_GONE, "", {"state": line.get("detail")}))
        for name, key, fields in found:
            marker = Marker(at, name, instance, {k: v for k, v in fields.items() if v is not None})
            seen = first.get((instance, name, key))
            if seen is None or marker.time < seen.time:
                first[(instance, name, key)] = marker
    order = {name: i for i, name in enumerate([*SIGNAL_MARKERS.values(), DRAINED, NODE_GONE])}
    return sorted(first.values(), key=lambda m: (m.time, m.instance_id, order[m.event]))


def gone(markers: Iterable[Marker]) -> set[str]:
    return {m.instance_id for m in markers if m.event == NODE_GONE}
