"""Return to spot's access to the cluster: get and patch of the generations' ScaledObjects only, and an
admission policy that lets the drain group change only ``spec.minReplicaCount`` (within the object's
maximum) and the move's state annotation.

Evaluated with cel-python as the API server evaluates a ValidatingAdmissionPolicy
(tests/serving/test_serving_availability.py ``admit``). The ScaledObject is the serving chart's
(templates/scaledobjects.yaml, KEDA v2.20.2 keda.sh/v1alpha1); the handler's patch is the one
lambdas/interruption_handler/kube.py ``patch_scaled_object`` sends.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gennstack.config import load_config
from gennstack_infra.components.interruption_handler import (
    DRAIN_GROUP,
    MOVE_STATE_ANNOTATION,
    SCALED_OBJECT_FIXED_FIELDS,
    return_to_spot,
    return_to_spot_rbac_manifests,
)
from lambdas.interruption_handler import return_to_spot as decision
from lambdas.interruption_handler.settings import parse_deletion_cost, parse_return_to_spot, parse_warm_spares
from lambdas.interruption_handler.spot_move import STATE_ANNOTATION
from tests.k8s_schema import validate
from tests.serving.conftest import NAMESPACE
from tests.serving.test_serving_availability import admit
from tests.test_drain_routing import HANDLER

SCALED_OBJECT = {
    "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
    "metadata": {"name": "gen3-g6e", "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "gennstack"},
                 "annotations": {"meta.helm.sh/release-name": "gennstack-serving"}},
    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gen3-g6e"},
             "minReplicaCount": 2, "maxReplicaCount": 4, "pollingInterval": 15,
             "triggers": [{"type": "prometheus", "metadata": {"threshold": "8"}}]},
}


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    found = return_to_spot_rbac_manifests(namespace=NAMESPACE, scaled_objects=["gen3-g6e", "gen2-trn2"])
    for manifest in found:
        validate(manifest)
    return found


@pytest.fixture(scope="module")
def policy(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return next(m for m in manifests if m["kind"] == "ValidatingAdmissionPolicy")


def test_the_role_names_only_the_generations_scaled_objects(manifests: list[dict[str, Any]]) -> None:
    [role] = [m for m in manifests if m["kind"] == "Role"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": ["keda.sh"], "resources": ["scaledobjects"],
                              "resourceNames": ["gen2-trn2", "gen3-g6e"], "verbs": ["get", "patch"]}]
    [binding] = [m for m in manifests if m["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DRAIN_GROUP}]
    [vap_binding] = [m for m in manifests if m["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert vap_binding["spec"]["validationActions"] == ["Deny"]


def test_the_policy_holds_every_spec_field_of_the_crd_but_the_minimum() -> None:
    """The ScaledObject CRD the tests validate against (KEDA v2.20.2, ../shared/crds/keda.sh)."""
    import yaml

    from tests.k8s_schema import crd_dir

    crd = yaml.safe_load((crd_dir() / "keda.sh" / "ScaledObject.yaml").read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    fields = set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
    assert fields - {"minReplicaCount"} == set(SCALED_OBJECT_FIXED_FIELDS)


def moved(min_replicas: int, state: str = '{"move":null}') -> dict[str, Any]:
    new = copy.deepcopy(SCALED_OBJECT)
    new["spec"]["minReplicaCount"] = min_replicas
    new["metadata"]["annotations"][MOVE_STATE_ANNOTATION] = state
    return new


def test_the_handler_may_move_the_minimum_and_its_state(policy: dict[str, Any]) -> None:
    assert MOVE_STATE_ANNOTATION == STATE_ANNOTATION
    assert admit(policy, HANDLER, SCALED_OBJECT, moved(3)) == []
    assert admit(policy, HANDLER, moved(3), moved(2, '{"move":null,"backoff":{}}')) == []
    assert admit(policy, HANDLER, moved(3), moved(4)) == []  # up to the maximum


def test_the_handler_may_hand_the_minimum_back(policy: dict[str, Any]) -> None:
    """The hand-back after a move's write (spot_move.py ``_hand_back``) changes only managedFields."""
    owned = [{"manager": "helm", "operation": "Apply", "apiVersion": "keda.sh/v1alpha1", "fieldsType": "FieldsV1",
              "fieldsV1": {"f:spec": {"f:maxReplicaCount": {}}}},
             {"manager": "gennstack-return-to-spot", "operation": "Update", "apiVersion": "keda.sh/v1alpha1",
              "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:minReplicaCount": {}}}}]
    old, new = moved(3), moved(3)
    old["metadata"]["managedFields"] = owned
    new["metadata"]["managedFields"] = [{**owned[0], "fieldsV1": {"f:spec": {"f:maxReplicaCount": {}, "f:minReplicaCount": {}}}}]
    assert admit(policy, HANDLER, old, new) == []


@pytest.mark.parametrize("change, message", [
    (lambda o: o["spec"].update(maxReplicaCount=10), "may change only spec.minReplicaCount"),
    (lambda o: o["spec"]["triggers"][0]["metadata"].update(threshold="1"), "may change only spec.minReplicaCount"),
    (lambda o: o["spec"].update(scaleTargetRef={"name": "other"}), "may change only spec.minReplicaCount"),
    (lambda o: o["spec"].update(minReplicaCount=5), "between 0 and spec.maxReplicaCount"),
    (lambda o: o["metadata"]["annotations"].update({"autoscaling.keda.sh/paused": "true"}), "may change only the gennstack.io/return-to-spot"),
    (lambda o: o["metadata"]["labels"].update(x="y"), "may not change a ScaledObject's labels"),
], ids=["max", "trigger", "target", "min-over-max", "pause-annotation", "label"])
def test_the_handler_may_not_change_anything_else(policy: dict[str, Any], change: Any, message: str) -> None:
    new = copy.deepcopy(SCALED_OBJECT)
    change(new)
    failures = admit(policy, HANDLER, SCALED_OBJECT, new)
    assert len(failures) == 1 and message in failures[0], failures


def test_others_are_not_limited(policy: dict[str, Any]) -> None:
    helm = {"userInfo": {"username": "helm", "groups": ["system:masters"]}, "namespace": NAMESPACE}
    new = copy.deepcopy(SCALED_OBJECT)
    new["spec"]["maxReplicaCount"] = 10
    assert admit(policy, helm, SCALED_OBJECT, new) == []


def test_on_by_default_for_the_deployment_generations_and_the_handler_accepts_it() -> None:
    config = load_config(None)
    moves = return_to_spot(config, namespace=NAMESPACE)
    assert moves["generations"] == {"g6e": {"namespace": NAMESPACE, "scaled_object": "gen3-g6e"},
                                    "trn2": {"namespace": NAMESPACE, "scaled_object": "gen2-trn2"}}
    spares = parse_warm_spares(json.dumps({"gen3-g6e": {"generation": "g6e", "namespace": NAMESPACE, "deployment": "a",
                                                        "baseline": 0, "cap": 1},
                                           "gen2-trn2": {"generation": "trn2", "namespace": NAMESPACE, "deployment": "b",
                                                         "baseline": 0, "cap": 1}}))
    from gennstack_infra.components.interruption_handler import deletion_cost
    costed = parse_deletion_cost(json.dumps(deletion_cost(config, namespace=NAMESPACE)), spares)
    _, policy = parse_return_to_spot(json.dumps(moves), costed)
    assert policy == decision.Policy()  # the config's defaults are the decision's
    interruptions = config.interruptions
    off = config.model_copy(update={"interruptions": interruptions.model_copy(
        update={"return_to_spot": interruptions.return_to_spot.model_copy(update={"enabled": False})})})
    assert return_to_spot(off, namespace=NAMESPACE) == {}
    no_order = config.model_copy(update={"interruptions": interruptions.model_copy(update={"scale_down_on_demand_first": False})})
    assert return_to_spot(no_order, namespace=NAMESPACE) == {}
