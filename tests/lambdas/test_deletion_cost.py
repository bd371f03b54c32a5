"""Scale-down takes on-demand replicas first: the reconciler keeps pod-deletion-cost by capacity type.

The handler end to end (moto for EC2 and DynamoDB, the local Kubernetes API of fake_kubernetes.py),
with nodes labelled as Karpenter labels them (``karpenter.sh/capacity-type``, kubernetes-sigs/karpenter
v1.14.1 pkg/apis/v1/labels.go) and as the NodePools' templates do (``gennstack.io/generation``).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from lambdas.interruption_handler.return_to_spot import DELETION_COST_ANNOTATION
from lambdas.interruption_handler.settings import ConfigError, parse_deletion_cost, parse_warm_spares
from tests.lambdas.fake_kubernetes import FakeKubernetes
from tests.lambdas.lambda_support import NAMESPACE, WARM_SPARES, LambdaContext, load_event

SERVER = {"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "server", "gennstack.io/routable": "true"}
SELECTOR = "app.kubernetes.io/name=gen3-g6e,app.kubernetes.io/component=server"


@pytest.fixture
def mixed(kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch) -> FakeKubernetes:
    """g6e replicas on a spot, an on-demand and a reserved node, one pod not scheduled yet, and a
    node of another generation that must not count."""
    monkeypatch.setenv("DELETION_COST", json.dumps({"g6e": {"namespace": NAMESPACE, "pods": SELECTOR}}))
    for name, pool, capacity in [("n-spot", "gen3-g6e", "spot"), ("n-od", "gen3-g6e-on-demand", "on-demand"),
                                 ("n-res", "gen3-g6e-reserved", "reserved")]:
        kubernetes.add_node(name, pool=pool, instance_id=f"i-0{name[2:]:0>16}"[:19],
                            labels={"gennstack.io/generation": "g6e", "karpenter.sh/capacity-type": capacity,
                                    "node.kubernetes.io/instance-type": "g6e.xlarge"})
    kubernetes.add_node("n-inf2", pool="gen1-inf2-on-demand", instance_id="i-0aaaaaaaaaaaaaaaa",
                        labels={"gennstack.io/generation": "inf2", "karpenter.sh/capacity-type": "on-demand",
                                "node.kubernetes.io/instance-type": "inf2.48xlarge"})
    kubernetes.add_pod(NAMESPACE, "g6e-spot", node="n-spot", labels=SERVER)
    kubernetes.add_pod(NAMESPACE, "g6e-od", node="n-od", labels=SERVER)
    kubernetes.add_pod(NAMESPACE, "g6e-res", node="n-res", labels=SERVER)
    kubernetes.add_pod(NAMESPACE, "g6e-inf2-node", node="n-inf2", labels=SERVER)  # no g6e node: no type
    return kubernetes


def costs(kubernetes: FakeKubernetes) -> dict[str, str | None]:
    return {name: (pod["metadata"].get("annotations") or {}).get(DELETION_COST_ANNOTATION)
            for (_, name), pod in sorted(kubernetes.pods.items())}


def test_reconcile_orders_scale_down_on_demand_first_reserved_last(
    handler: Any, lambda_context: LambdaContext, mixed: FakeKubernetes, capsys: pytest.CaptureFixture[str],
) -> None:
    result = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [capacity] = [r for r in result["results"] if r["outcome"] == "capacity"]
    assert capacity["generation"] == "g6e"
    assert capacity["capacity"] == {"on-demand": 1, "reserved": 1, "spot": 1}
    assert sorted(capacity["costed_pods"]) == ["g6e-od", "g6e-res", "g6e-spot"]
    assert costs(mixed) == {"g6e-inf2-node": None, "g6e-od": "-100", "g6e-res": "100", "g6e-spot": "0"}
    # The patches touch that one annotation and nothing else (the admission policy's terms).
    bodies = [r.body for r in mixed.pod_patches()]
    assert all(body == {"metadata": {"annotations": {DELETION_COST_ANNOTATION: body["metadata"]["annotations"][DELETION_COST_ANNOTATION]}}}
               for body in bodies)
    # ServingReplicas by capacity type, every type.
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    emitted = {(m["capacity_type"], m["ServingReplicas"] if not isinstance(m["ServingReplicas"], list) else m["ServingReplicas"][0])
               for m in lines if "_aws" in m and "ServingReplicas" in m}
    assert emitted == {("spot", 1), ("on-demand", 1), ("reserved", 1)}
    # Converged: the next run patches nothing.
    before = len(mixed.pod_patches())
    again = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [capacity] = [r for r in again["results"] if r["outcome"] == "capacity"]
    assert "costed_pods" not in capacity and len(mixed.pod_patches()) == before


def test_a_pod_whose_node_changes_capacity_type_is_recosted(
    handler: Any, lambda_context: LambdaContext, mixed: FakeKubernetes,
) -> None:
    handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    # The on-demand pod is gone and its replacement landed on spot; a new on-demand pod appeared.
    del mixed.pods[(NAMESPACE, "g6e-od")]
    mixed.add_pod(NAMESPACE, "g6e-od2", node="n-od", labels=SERVER)
    result = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [capacity] = [r for r in result["results"] if r["outcome"] == "capacity"]
    assert capacity["costed_pods"] == ["g6e-od2"] and costs(mixed)["g6e-od2"] == "-100"


def test_without_deletion_cost_nothing_is_patched(
    handler: Any, lambda_context: LambdaContext, mixed: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DELETION_COST")
    handler.runtime.cache_clear()
    result = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert not [r for r in result["results"] if r["outcome"] == "capacity"] and not mixed.pod_patches()


def test_deletion_cost_settings_are_validated() -> None:
    parse = functools.partial(parse_deletion_cost, warm_spares=parse_warm_spares(json.dumps(WARM_SPARES)))
    assert parse("{}") == {}
    assert parse(json.dumps({"g6e": {"namespace": NAMESPACE, "pods": SELECTOR}}))["g6e"].pods == SELECTOR
    for raw, message in [
        ("[", "DELETION_COST is not JSON"),
        ('{"trn2": {"namespace": "x", "pods": "a=b"}}', "not a generation of WARM_SPARES"),
        ('{"g6e": {"namespace": "x", "pods": "a in (b)"}}', "must be a label selector"),
        ('{"g6e": {"namespace": "X_", "pods": "a=b"}}', "namespace='X_'"),
        ('{"g6e": {"pods": "a=b"}}', "exactly the keys"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
            parse(raw)


def test_reconcile_counts_each_generations_nodes_by_capacity_and_instance_type(
    handler: Any, lambda_context: LambdaContext, mixed: FakeKubernetes, capsys: pytest.CaptureFixture[str],
) -> None:
    """AcceleratorNodes, what ``gennstack cost --live`` prices: every generation of WARM_SPARES, inf2's
    on-demand inf2.48xlarge included (its replicas are Ray's, but its node costs the same)."""
    mixed.add_node("n-od2", pool="gen3-g6e-on-demand", instance_id="i-0cccccccccccccccc",
                   labels={"gennstack.io/generation": "g6e", "karpenter.sh/capacity-type": "on-demand",
                           "node.kubernetes.io/instance-type": "g6e.12xlarge"})
    result = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    nodes = {r["generation"]: r["nodes"] for r in result["results"] if r["outcome"] == "nodes"}
    assert nodes == {"g6e": {"on-demand/g6e.12xlarge": 1, "on-demand/g6e.xlarge": 1, "reserved/g6e.xlarge": 1,
                             "spot/g6e.xlarge": 1},
                     "inf2": {"on-demand/inf2.48xlarge": 1}}
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    emitted = {(m["generation"], m["capacity_type"], m["instance_type"]) for m in lines if "_aws" in m and "AcceleratorNodes" in m}
    assert ("inf2", "on-demand", "inf2.48xlarge") in emitted and len(emitted) == 5
    # the dimensions gennstack cost --live queries (gennstack/cost/live.py fleet_queries): Powertools adds "service"
    from gennstack.observability.names import INTERRUPTION_SERVICE_NAME
    [dimensions] = {tuple(sorted(m["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0])) for m in lines
                    if "_aws" in m and "AcceleratorNodes" in m}
    assert dimensions == ("capacity_type", "generation", "instance_type", "service")
    assert {m["service"] for m in lines if "AcceleratorNodes" in m} == {INTERRUPTION_SERVICE_NAME}
