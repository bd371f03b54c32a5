"""Multi-node replicas through the interruption handler: a doomed node holding any member of a
LeaderWorkerSet group drains the whole group, counted once, and the group comes back whole.

The fake Kubernetes API (tests/lambdas/fake_kubernetes.py) holds the pods the serving chart's
templates/multinode-lws.yaml makes, labelled as LWS v0.10.0 labels them: every pod of a group shares
``leaderworkerset.sigs.k8s.io/group-key`` (api/leaderworkerset/v1/leaderworkerset_types.go
GroupUniqueHashLabelKey: the leader's, set by pkg/webhooks/pod_webhook.go, copied onto the workers'
StatefulSet template by pkg/controllers/pod_controller.go constructWorkerStatefulSetApplyConfiguration),
and ``leaderworkerset.sigs.k8s.io/worker-index`` is "0" on the leader, whose name is the group's
(``<lws>-<group index>``; workers ``<lws>-<group index>-<worker index>``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from lambdas.interruption_handler.settings import ConfigError, parse_drain_on, parse_warm_spares
from tests.lambdas.fake_kubernetes import FakeKubernetes
from tests.lambdas.lambda_support import NAMESPACE, WARM_SPARES, LambdaContext, load_event

Launch = Callable[..., str]
SERVER = {"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "server"}
SELECTOR = "app.kubernetes.io/name=gen3-g6e,app.kubernetes.io/component=server"
GROUP = {"app.kubernetes.io/name": "gen3-g6e-multinode", "app.kubernetes.io/component": "server"}
GROUPS = "app.kubernetes.io/name=gen3-g6e-multinode,app.kubernetes.io/component=server"
ROUTABLE = "gennstack.io/routable"
KEY = "leaderworkerset.sigs.k8s.io/group-key"
INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS = "gen3-g6e-multinode"


def drain_env(monkeypatch: pytest.MonkeyPatch, signals: list[str]) -> None:
    monkeypatch.setenv("DRAIN_ON", json.dumps({"gen3-g6e-spot": {"signals": signals, "pods": SELECTOR, "groups": GROUPS}}))


def add_group(kubernetes: FakeKubernetes, index: int, nodes: list[str]) -> None:
    for worker, node in enumerate(nodes):
        name = f"{LWS}-{index}" + (f"-{worker}" if worker else "")
        kubernetes.add_pod(NAMESPACE, name, node=node, labels={**GROUP, ROUTABLE: "true", KEY: f"key{index}", INDEX: str(worker)})


@pytest.fixture
def fleet(launch: Launch, kubernetes: FakeKubernetes) -> dict[str, str]:
    """Two groups of two g6e.12xlarge (0 on nodes a, b; 1 on c, d) and a gen3-g6e server on e."""
    return launch_fleet(launch, kubernetes)


def launch_fleet(launch: Launch, kubernetes: FakeKubernetes) -> dict[str, str]:
    """The instances and pods of ``fleet``: node letter -> instance id."""
    instances = {}
    for node in "abcde":
        instances[node] = launch("gen3-g6e-spot", instance_type="g6e.12xlarge")
        kubernetes.add_node(f"ip-{node}.ec2.internal", pool="gen3-g6e-spot", instance_id=instances[node])
    add_group(kubernetes, 0, ["ip-a.ec2.internal", "ip-b.ec2.internal"])
    add_group(kubernetes, 1, ["ip-c.ec2.internal", "ip-d.ec2.internal"])
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-x", node="ip-e.ec2.internal", labels={**SERVER, ROUTABLE: "true"})
    return instances


def routable(kubernetes: FakeKubernetes) -> dict[str, str | None]:
    return {name: pod["metadata"]["labels"].get(ROUTABLE) for (_, name), pod in sorted(kubernetes.pods.items())}


def metric(out: str, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if f'"{name}"' in line]


def test_a_warning_for_a_worker_drains_its_whole_group_once(
    handler: Any, lambda_context: LambdaContext, fleet: dict[str, str], kubernetes: FakeKubernetes,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["b"]), lambda_context)
    [entry] = result["results"]
    assert entry["node"] == "ip-b.ec2.internal"
    # The worker's node is doomed: the leader (on a node that lives) leaves routing with it.
    assert entry["drained_pods"] == [f"{LWS}-0", f"{LWS}-0-1"]
    assert entry["drained_groups"] == [f"{LWS}-0"]
    assert routable(kubernetes) == {f"{LWS}-0": "false", f"{LWS}-0-1": "false", f"{LWS}-1": "true", f"{LWS}-1-1": "true",
                                    "gen3-g6e-x": "true"}
    [groups] = metric(capsys.readouterr().out, "DrainedGroups")
    assert groups["DrainedGroups"] == [1.0] and groups["generation"] == "g6e"

    # The leader's own warning next (its node is reclaimed too): the group is already out, it counts no more.
    again = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["a"]), lambda_context)
    [entry] = again["results"]
    assert entry["drained_pods"] == [] and "drained_groups" not in entry
    assert metric(capsys.readouterr().out, "DrainedGroups") == []
    # The reconciler agrees: nothing to change, no group counted again.
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert not [r for r in tick["results"] if r["outcome"] == "routing"]


def test_the_group_comes_back_whole_when_the_rebalance_expires(
    handler: Any, lambda_context: LambdaContext, fleet: dict[str, str], kubernetes: FakeKubernetes,
    monkeypatch: pytest.MonkeyPatch, table: Any,
) -> None:
    drain_env(monkeypatch, ["rebalance_recommendation"])
    handler.lambda_handler(load_event("rebalance_recommendation", instance_id=fleet["c"]), lambda_context)
    assert routable(kubernetes)[f"{LWS}-1"] == "false" and routable(kubernetes)[f"{LWS}-1-1"] == "false"
    # A member that lost its label some other way (here: set by hand) is drained back by the reconciler.
    kubernetes.pod_labels(NAMESPACE, f"{LWS}-1-1")[ROUTABLE] = "true"
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routing["drained_pods"] == [f"{LWS}-1-1"] and "drained_groups" in routing
    # The rebalance never became an interruption: its record expires and the group is put back whole.
    table.update_item(Key={"pk": f"instance#{fleet['c']}"}, UpdateExpression="SET expires_at = :e",
                      ExpressionAttributeValues={":e": int(time.time()) - 1})
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routing["restored_pods"] == [f"{LWS}-1", f"{LWS}-1-1"]
    assert set(routable(kubernetes).values()) == {"true"}


def test_the_last_serving_group_is_kept(
    handler: Any, lambda_context: LambdaContext, fleet: dict[str, str], kubernetes: FakeKubernetes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Group 1 is still loading (its leader not Ready): group 0 is the model's only serving replica.
    kubernetes.set_ready(NAMESPACE, f"{LWS}-1", False)
    drain_env(monkeypatch, ["spot_interruption_warning"])
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["a"]), lambda_context)
    [entry] = result["results"]
    assert entry["kept_pods"] == [f"{LWS}-0", f"{LWS}-0-1"] and "drained_groups" not in entry
    assert routable(kubernetes)[f"{LWS}-0"] == "true"
    # Once group 1 serves, the reconciler drains group 0 whole.
    kubernetes.set_ready(NAMESPACE, f"{LWS}-1", True)
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routing["drained_pods"] == [f"{LWS}-0", f"{LWS}-0-1"] and routing["drained_groups"] == [f"{LWS}-0"]


def test_drain_on_accepts_a_groups_selector_and_checks_it() -> None:
    spares = parse_warm_spares(json.dumps(WARM_SPARES))
    [drain] = parse_drain_on(json.dumps({"gen3-g6e-spot": {"signals": ["spot_interruption_warning"], "pods": SELECTOR,
                                                           "groups": GROUPS}}), spares).values()
    assert drain.groups == GROUPS
    [drain] = parse_drain_on(json.dumps({"gen3-g6e-spot": {"signals": [], "pods": SELECTOR}}), spares).values()
    assert drain.groups is None
    with pytest.raises(ConfigError, match="groups='not a selector'"):
        parse_drain_on(json.dumps({"gen3-g6e-spot": {"signals": [], "pods": SELECTOR, "groups": "not a selector"}}), spares)
    with pytest.raises(ConfigError, match="optionally 'groups'"):
        parse_drain_on(json.dumps({"gen3-g6e-spot": {"signals": [], "pods": SELECTOR, "group": GROUPS}}), spares)
