"""The contract between the handler's log lines and `gennstack drill`'s markers, with the real handler.

The handler (lambdas/interruption_handler, its Powertools logger) handles a drill's sequence for one
instance: rebalance recommendation, interruption warning (which drains), the instance shutting down,
then terminated. Its stdout lines, each wrapped as a CloudWatch Logs event at a later time, go
through gennstack.drill.handler_log as FilterLogEvents would hand them over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest

from gennstack.drill.handler_log import filter_patterns, markers_from_events
from tests.lambdas.fake_kubernetes import FakeKubernetes
from tests.lambdas.lambda_support import NAMESPACE, LambdaContext, load_event
from tests.lambdas.test_interruption_drain import doomed, drain_env  # noqa: F401  (doomed is a fixture)

T0 = 1_796_040_000_000  # epoch ms of the first line


def test_a_drill_sequence_gives_each_marker_once(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    capsys.readouterr()
    events: list[dict[str, Any]] = []
    steps: list[Callable[[], dict[str, Any]]] = [
        lambda: load_event("rebalance_recommendation", instance_id=doomed),
        lambda: load_event("spot_interruption_warning", instance_id=doomed),
        lambda: load_event("instance_state_change", instance_id=doomed, detail={"state": "shutting-down"}),
        lambda: load_event("instance_state_change", instance_id=doomed, detail={"state": "terminated"}),
    ]
    for step, event in enumerate(steps):
        handler.lambda_handler(event(), lambda_context)
        for line in capsys.readouterr().out.splitlines():  # what the function writes is what CloudWatch stores
            events.append({"timestamp": T0 + step * 60_000, "message": line + "\n"})
    assert any('"instance_id"' in e["message"] for e in events)
    # every line about the instance matches the pattern's one field: the lines carry instance_id
    assert filter_patterns([doomed]) == [f'{{ ($.instance_id = "{doomed}") }}']
    about = [json.loads(e["message"]) for e in events if e["message"].startswith("{") and doomed in e["message"]]
    assert all(line.get("instance_id") == doomed for line in about if "_aws" not in line)

    markers = markers_from_events(events, [doomed])
    assert [(m.event, int(m.time.timestamp() * 1000) - T0) for m in markers] == [
        ("rebalance_recommendation", 0),
        ("interruption_warning", 60_000),
        ("drained", 60_000),
        ("node_gone", 120_000),  # the first gone line; the "terminated" one after it is the same node
    ]
    assert markers[0].fields == {"signal": "rebalance_recommendation", "generation": "g6e", "nodepool": "gen3-g6e-spot",
                                 "handler_outcome": "recorded"}
    assert markers[1].fields["handler_outcome"] == "duplicate"
    assert markers[2].fields["pods"] == ["gen3-g6e-a", "gen3-g6e-b"] and markers[2].fields["node"] == "ip-10-0-1-1.ec2.internal"
    assert markers[3].fields == {"state": "shutting-down"}
    assert markers[3].time == datetime.fromtimestamp((T0 + 120_000) / 1000, tz=timezone.utc)
    assert kubernetes.pod_labels(NAMESPACE, "gen3-g6e-a")["gennstack.io/routable"] == "false"
