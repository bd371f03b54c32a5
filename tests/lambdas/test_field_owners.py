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


def test_a_parent_owned_as_a_member_is_kept_and_owning_the_parent_node_is_not_owning_the_field() -> None:
    member = {**OURS, "fieldsV1": {"f:spec": {".": {}, "f:minReplicaCount": {}}}}
    [handed] = hand_back([member], MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[])
    assert handed["fieldsV1"] == {"f:spec": {".": {}}}
    node_only = {**HELM, "fieldsV1": {"f:spec": {}}}  # the .spec node of a granular struct, not its fields
    assert owners([node_only], MIN_REPLICA_COUNT) == []


def test_the_unnamed_update_of_the_move_before_it_named_itself_is_taken_as_its_own() -> None:
    unnamed = {**OURS, "manager": ""}
    handed = hand_back([HELM, unnamed], MIN_REPLICA_COUNT, manager=FIELD_MANAGER,
                       to=[("helm", "Apply", ""), ("", "Update", "")])
    assert owners(handed, MIN_REPLICA_COUNT) == [("helm", "Apply", "")]


def test_never_an_empty_list_which_would_reset_every_owner() -> None:
    only_min = {**OURS, "fieldsV1": {"f:spec": {"f:minReplicaCount": {}}}}
    assert hand_back([only_min], MIN_REPLICA_COUNT, manager=FIELD_MANAGER, to=[]) is None
