"""Handing spec.minReplicaCount back (lambdas/interruption_handler/field_owners.py), on hand-written
managedFields in the API server's FieldsV1 form; what the upstream library makes of the result is
tests/lambdas/test_spot_move.py's."""

from __future__ import annotations

from lambdas.interruption_handler.field_owners import FIELD_MANAGER, MIN_REPLICA_COUNT, hand_back, owners

HELM = {"manager": "helm", "operation": "Apply", "apiVersion": "keda.sh/v1alpha1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {".": {}, "f:maxReplicaCount": {}}}}
OURS = {"manager": FIELD_MANAGER, "operation": "Update", "apiVersion": "keda.sh/v1alpha1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {"f:gennstack.io/return-to-spot": {}}},
                     "f:spec": {"f:minReplicaCount": {}}}}


def test_the_field_goes_back_to_its_owners_and_the_rest_stays() -> None:
    handed = hand_back([HELM, OURS], MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[("helm", "Apply", "")])
    assert handed == [
        {**HELM, "fieldsV1": {"f:spec": {".": {}, "f:maxReplicaCount": {}, "f:minReplicaCount": {}}}},
        {**OURS, "fieldsV1": {"f:metadata": {"f:annotations": {"f:gennstack.io/return-to-spot": {}}}}},
    ]
    assert owners(handed, MIN_REPLICA_COUNT) == [("helm", "Apply", "")]
    assert HELM["fieldsV1"] == {"f:spec": {".": {}, "f:maxReplicaCount": {}}}  # the input is not changed


def test_nothing_to_send_when_the_move_owns_nothing_there() -> None:
    assert hand_back([HELM], MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[("helm", "Apply", "")]) is None
    assert hand_back(None, MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[]) is None


def test_an_entry_left_empty_goes_and_with_no_owner_named_the_field_is_unowned() -> None:
    only_min = {**OURS, "fieldsV1": {"f:spec": {"f:minReplicaCount": {}}}}
    handed = hand_back([HELM, only_min], MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[(FIELD_MANAGER, "Update", "")])
    assert handed == [HELM] and owners(handed, MIN_REPLICA_COUNT) == []


def test_a_parent_owned_as_a_member_is_kept_and_a_whole_leaf_counts_as_owning() -> None:
    member = {**OURS, "fieldsV1": {"f:spec": {".": {}, "f:minReplicaCount": {}}}}
    [handed] = hand_back([member], MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[])
    assert handed["fieldsV1"] == {"f:spec": {".": {}}}
    whole = {**HELM, "fieldsV1": {"f:spec": {}}}  # spec owned whole (atomic): its minimum with it
    assert owners([whole], MIN_REPLICA_COUNT) == [("helm", "Apply", "")]
    handed = hand_back([whole, OURS], MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[("helm", "Apply", "")])
    assert handed is not None and handed[0]["fieldsV1"] == {"f:spec": {}}
