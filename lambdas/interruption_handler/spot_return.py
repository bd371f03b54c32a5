"""Scale-down takes on-demand replicas first: the reconciler keeps ``pod-deletion-cost`` by capacity type.

For each generation of ``DELETION_COST`` (the ReplicaSet-managed serving pods: gen2-trn2's and
gen3-g6e's Deployments), every reconcile lists the generation's nodes (``gennstack.io/generation``,
the NodePools' template label) and its serving pods, reads each pod's node's
``karpenter.sh/capacity-type`` (kubernetes-sigs/karpenter v1.14.1 ``pkg/apis/v1/labels.go``:
``spot``, ``on-demand``, ``reserved``), and merge-patches the annotation
``controller.kubernetes.io/pod-deletion-cost`` to ``return_to_spot.DELETION_COST`` of that type
where it differs: on-demand -100, spot 0, reserved 100.

Why it orders scale-down: the ReplicaSet controller deletes, among its pods, first the unscheduled,
then pending, then not-ready ones, and then the *lower* pod-deletion-cost first
(kubernetes/kubernetes ``pkg/controller/controller_utils.go`` ``ActivePodsWithRanks.Less``, step 4;
feature ``PodDeletionCost``, beta and on by default since v1.22; an absent annotation counts 0). So
when KEDA's HPA lowers a Deployment's replicas, its on-demand replicas go before its spot ones and
reserved ones last; Karpenter then removes the emptied on-demand node (``WhenEmpty``). It only
orders, it never deletes, and it is best-effort between reconciles: a pod scheduled since the last
run counts 0 until the next (within a minute). Karpenter v1.14.1 reads the annotation too, as a part of
a pod's eviction cost for ranking consolidation candidates, divided by 2^27
(``pkg/utils/disruption/disruption.go`` ``EvictionCost``): these values move that by under 1e-6, and the
accelerator NodePools consolidate only empty nodes anyway.

Access: the drain group's ``pods`` ``list``/``patch`` and ``nodes`` ``list``; the admission policy
(``gennstack_infra/components/interruption_handler.py``) lets that group change only this
annotation, to one of those three values, besides the routing label.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .drain import NODES_PATH, ROUTABLE_LABEL, node_of, pods_path
from .errors import HandlerError, Reason
from .kube import KubeClient
from .return_to_spot import CAPACITY_TYPES, DELETION_COST, DELETION_COST_ANNOTATION, Replica, deletion_costs
from .settings import CostedPods

GENERATION_LABEL = "gennstack.io/generation"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
READY = "Ready"


@dataclass
class Costing:
    """One generation's pass: its replicas by capacity type and the pods whose cost this call set."""

    by_capacity: dict[str, int] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


def node_census(kube: KubeClient, generation: str) -> dict[tuple[str, str], int]:
    """``{(capacity type, instance type): nodes}`` of the generation's registered nodes (every
    NodePool of it: reserved, spot, on-demand), for the ``AcceleratorNodes`` metric that
    ``gennstack cost --live`` prices."""
    found: Counter[tuple[str, str]] = Counter()
    for node in kube.list_items(NODES_PATH, label_selector=f"{GENERATION_LABEL}={generation}"):
        labels = (node.get("metadata") or {}).get("labels") or {}
        capacity, instance_type = labels.get(CAPACITY_TYPE_LABEL), labels.get(INSTANCE_TYPE_LABEL)
        if capacity in DELETION_COST and isinstance(instance_type, str):
            found[(capacity, instance_type)] += 1
    return dict(found)


def node_capacity_types(kube: KubeClient, generation: str) -> dict[str, str | None]:
    """``{node name: karpenter.sh/capacity-type}`` of the generation's nodes."""
    found: dict[str, str | None] = {}
    for node in kube.list_items(NODES_PATH, label_selector=f"{GENERATION_LABEL}={generation}"):
        metadata = node.get("metadata") or {}
        if isinstance(metadata.get("name"), str):
            found[metadata["name"]] = (metadata.get("labels") or {}).get(CAPACITY_TYPE_LABEL)
    return found


def replicas_of(pods: list[dict[str, Any]], nodes: dict[str, str | None]) -> list[Replica]:
    """The decision module's view of serving pods (``return_to_spot.Replica``)."""
    replicas = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        node = node_of(pod)
        conditions = (pod.get("status") or {}).get("conditions") or []
        replicas.append(Replica(
            pod=str(metadata.get("name")),
            node=node,
            capacity_type=nodes.get(node) if node else None,
            ready=any(isinstance(c, dict) and c.get("type") == READY and c.get("status") == "True" for c in conditions),
            routable=(metadata.get("labels") or {}).get(ROUTABLE_LABEL) == "true",
            deleting=bool(metadata.get("deletionTimestamp")),
        ))
    return replicas


def converge_deletion_costs(kube: KubeClient, *, generation: str, costed: CostedPods,
                            skip: frozenset[str] | set[str] = frozenset()) -> Costing:
    """Set each serving pod's pod-deletion-cost to its capacity type's; count replicas by capacity type.
    ``skip``: pods a return-to-spot move holds at its own, lower cost (spot_move.py)."""
    nodes = node_capacity_types(kube, generation)
    pods = kube.list_items(pods_path(costed.namespace), label_selector=costed.pods)
    replicas = replicas_of(pods, nodes)
    result = Costing(by_capacity={kind: 0 for kind in CAPACITY_TYPES})
    counted = Counter(r.capacity_type for r in replicas if r.capacity_type in DELETION_COST and not r.deleting)
    result.by_capacity.update(counted)
    wanted = deletion_costs(r for r in replicas if not r.deleting)
    for pod in pods:
        metadata = pod.get("metadata") or {}
        name = metadata.get("name")
        if name not in wanted or name in skip:
            continue
        value = str(wanted[name])
        if (metadata.get("annotations") or {}).get(DELETION_COST_ANNOTATION) == value:
            continue
        try:
            kube.patch_pod_annotations(costed.namespace, name, {DELETION_COST_ANNOTATION: value})
        except HandlerError as error:
            if error.reason is Reason.KUBE_NOT_FOUND:  # deleted between the list and the patch
                result.gone.append(name)
                continue
            error.context.update(pod=name, generation=generation)
            raise
        result.changed.append(name)
    return result
