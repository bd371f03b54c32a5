"""The drain group may set pod-deletion-cost (the reconciler's scale-down order) and nothing else new.

The admission policy of gennstack_infra/components/interruption_handler.py, evaluated with cel-python
as the API server evaluates it (tests/serving/test_serving_availability.py ``admit``). The annotation's
meaning: the ReplicaSet controller deletes the lower cost first among pods alike in being scheduled,
running and Ready (kubernetes/kubernetes pkg/controller/controller_utils.go ActivePodsWithRanks.Less
step 4; the website's concepts/workloads/controllers/replicaset.md "Pod deletion cost").
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gennstack.config import load_config
from gennstack_infra.components.interruption_handler import (
    DELETION_COST_ANNOTATION,
    DELETION_COSTS,
    deletion_cost,
    drain_rbac_manifests,
)
from lambdas.interruption_handler import return_to_spot
from tests.k8s_schema import validate
from tests.serving.conftest import NAMESPACE
from tests.serving.test_serving_availability import admit
from tests.test_drain_routing import HANDLER, POD, ROUTABLE


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    manifests = drain_rbac_manifests(namespace=NAMESPACE)
    for manifest in manifests:
        validate(manifest)
    return next(m for m in manifests if m["kind"] == "ValidatingAdmissionPolicy")


def costed(value: str | None, pod: dict[str, Any] = POD) -> dict[str, Any]:
    new = copy.deepcopy(pod)
    if value is None:
        new["metadata"]["annotations"].pop(DELETION_COST_ANNOTATION, None)
    else:
        new["metadata"]["annotations"][DELETION_COST_ANNOTATION] = value
    return new


def test_the_policy_allows_exactly_the_handlers_costs() -> None:
    assert return_to_spot.DELETION_COST_ANNOTATION == DELETION_COST_ANNOTATION
    # by capacity type, and a return-to-spot move's drained pod (spot_move.py), below them all
    handlers = [*return_to_spot.DELETION_COST.values(), return_to_spot.MOVE_OUT_DELETION_COST]
    assert sorted(str(v) for v in handlers) == sorted(DELETION_COSTS)
    assert return_to_spot.MOVE_OUT_DELETION_COST < min(return_to_spot.DELETION_COST.values())


@pytest.mark.parametrize("value", DELETION_COSTS)
def test_the_handler_may_set_a_deletion_cost(policy: dict[str, Any], value: str) -> None:
    assert admit(policy, HANDLER, POD, costed(value)) == []
    assert admit(policy, HANDLER, costed("0"), costed(value)) == []


def test_a_pod_without_the_routing_label_may_still_be_costed(policy: dict[str, Any]) -> None:
    bare = copy.deepcopy(POD)
    bare["metadata"]["labels"].pop(ROUTABLE)
    assert admit(policy, HANDLER, bare, costed("-100", bare)) == []


@pytest.mark.parametrize("change, message", [
    (lambda p: p["metadata"]["annotations"].update({DELETION_COST_ANNOTATION: "-2147483647"}), "may only be set to one of"),
    (lambda p: p["metadata"]["annotations"].update({DELETION_COST_ANNOTATION: "cheap"}), "may only be set to one of"),
    (lambda p: p["metadata"]["annotations"].update({DELETION_COST_ANNOTATION: "0", "karpenter.sh/do-not-disrupt": "false"}),
     "may change only the controller.kubernetes.io/pod-deletion-cost annotation"),
    (lambda p: p["metadata"]["annotations"].pop("checksum/scripts"), "may change only the controller.kubernetes.io"),
], ids=["out-of-range", "not-a-number", "with-another-annotation", "annotation-removed"])
def test_the_handler_may_not_set_anything_else(policy: dict[str, Any], change: Any, message: str) -> None:
    new = copy.deepcopy(POD)
    change(new)
    failures = admit(policy, HANDLER, POD, new)
    assert len(failures) == 1 and message in failures[0], failures


def test_deletion_cost_is_on_by_default_for_the_deployment_generations() -> None:
    config = load_config(None)
    assert deletion_cost(config, namespace=NAMESPACE) == {
        "g6e": {"namespace": NAMESPACE, "pods": "app.kubernetes.io/name=gen3-g6e,app.kubernetes.io/component=server"},
        "trn2": {"namespace": NAMESPACE, "pods": "app.kubernetes.io/name=gen2-trn2,app.kubernetes.io/component=server"},
    }
    off = config.model_copy(update={"interruptions": config.interruptions.model_copy(update={"scale_down_on_demand_first": False})})
    assert deletion_cost(off, namespace=NAMESPACE) == {}
