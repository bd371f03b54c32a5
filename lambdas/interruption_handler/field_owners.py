"""Who owns a field of an object (its ``metadata.managedFields``), and handing a field back.

The move of return to spot (spot_move.py) merge-patches a ScaledObject's ``spec.minReplicaCount``.
Any write that changes a field takes it from the managers that owned it (structured-merge-diff
``merge.Updater.Update``, which the API server's field manager calls: k8s.io/apimachinery v0.36.3
``pkg/util/managedfields/internal/structuredmerge.go``). The serving chart is installed with Helm
4.2.3's server-side apply (manager ``helm``: helm v4.2.3 ``cmd/helm/helm.go`` sets
``kube.ManagedFieldsManager``), which does not force conflicts; so after the move's write, the next
``helm upgrade`` (a ``cdk deploy``, or its rollback) that sets the field would fail on a conflict.

So after each write of the minimum, the move hands the field back: its own entry gives the field up
and the entries that owned it before the write get it again. The API server takes managedFields
sent in an update as they are ("This is necessary to allow directly updating managed fields",
apimachinery v0.36.3 ``pkg/util/managedfields/internal/fieldmanager.go`` ``decodeLiveOrNew``), and an
update that changes no value gives its manager nothing. Where nobody else owned it, the field is
left unowned, which conflicts with nobody. Values are never changed here.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

FIELD_MANAGER = "gennstack-return-to-spot"  # the move's fieldManager (kube.py sends it)
MIN_REPLICA_COUNT = ("f:spec", "f:minReplicaCount")  # FieldsV1 path of a ScaledObject's minimum

# Before the move sent a fieldManager its patches carried none and no User-Agent, so the API server
# named their Update entry "" (apiserver v0.36.3 handlers/create.go managerOrUserAgent): the move's too.
UNNAMED = ""

Owner = tuple[str, str, str]  # manager, operation, subresource: an entry's identity (API version aside)


def identity(entry: dict[str, Any]) -> Owner:
    return (str(entry.get("manager") or ""), str(entry.get("operation") or ""), str(entry.get("subresource") or ""))


def is_move(owner: Owner, manager: str) -> bool:
    """The move's entry (``manager``), or an unnamed update's (the move's before it named itself)."""
    return owner[0] == manager or (owner[0] == UNNAMED and owner[1] == "Update")


def _owns(fields: Any, path: Sequence[str]) -> bool:
    """Whether ``fields`` (FieldsV1) holds ``path`` itself. A parent's ``{}`` owns only that node of a
    granular struct such as a ScaledObject's spec, not the fields in it (structured-merge-diff sets)."""
    node = fields
    for step in path:
        if not isinstance(node, dict) or step not in node:
            return False
        node = node[step]
    return True


def owners(managed_fields: Sequence[dict[str, Any]] | None, path: Sequence[str]) -> list[Owner]:
    """The entries that own ``path`` (a FieldsV1 path such as :data:`MIN_REPLICA_COUNT`)."""
    return [identity(e) for e in managed_fields or () if isinstance(e, dict) and _owns(e.get("fieldsV1"), path)]


def _remove(fields: dict[str, Any], path: Sequence[str]) -> None:
    """Remove ``path``'s leaf, then each parent left empty (an empty dict would be a leaf, owned whole)."""
    head, rest = path[0], path[1:]
    if head not in fields:
        return
    if rest:
        _remove(fields[head], rest)
        if fields[head]:
            return
    del fields[head]


def _add(fields: dict[str, Any], path: Sequence[str]) -> None:
    node = fields
    for step in path[:-1]:
        node = node.setdefault(step, {})
    node[path[-1]] = {}


def hand_back(managed_fields: Sequence[dict[str, Any]] | None, path: Sequence[str], *, manager: str,
              to: Sequence[Owner]) -> list[dict[str, Any]] | None:
    """``managed_fields`` with ``path`` taken from ``manager``'s entries and given to the entries
    ``to`` names (those that owned it before ``manager`` wrote it; ``manager``'s own are skipped).
    None when ``manager`` owns nothing there (nothing to send). An entry of ``manager`` left empty
    goes. Entries named in ``to`` that are gone stay gone: the field is then owned by the rest, or
    by nobody."""
    entries = [copy.deepcopy(e) for e in managed_fields or () if isinstance(e, dict)]
    ours = [e for e in entries if is_move(identity(e), manager) and _owns(e.get("fieldsV1"), path)]
    if not ours:
        return None
    for entry in ours:
        _remove(entry.setdefault("fieldsV1", {}), path)
    entries = [e for e in entries if not (is_move(identity(e), manager) and not e.get("fieldsV1"))]
    wanted = {owner for owner in to if not is_move(owner, manager)}
    for entry in entries:
        if identity(entry) in wanted and not _owns(entry.get("fieldsV1"), path):
            _add(entry.setdefault("fieldsV1", {}), path)
    if not entries:  # an empty list would reset every manager's ownership (isResetManagedFields): keep one
        return None
    return entries
