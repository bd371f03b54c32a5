"""Drain routing: take a doomed node's serving pods out of load balancing; bring them back if it lives.

Mechanism: the serving chart's Services select ``gennstack.io/routable: "true"`` besides the pods'
app labels, and its Deployments' selectors do not include that label. Setting it to ``"false"`` on a
pod takes the pod out of its Service's EndpointSlices (and out of the headless Service's DNS answer)
while the pod keeps running and its ReplicaSet keeps owning it: streams in flight go on, new
requests go to the other replicas once the gateway's Envoy re-resolves the Service (see
docs/spot-drills.md for how long that takes). The pod stays Ready, so PodDisruptionBudgets and the
Deployment's rollout see no change.

Which node: Karpenter (aws/karpenter-provider-aws v1.14.1, ``pkg/cloudprovider/cloudprovider.go``)
gives every node it launches ``spec.providerID = aws:///<zone>/<instance-id>`` and the label
``karpenter.sh/nodepool``; the handler lists that NodePool's nodes and matches the instance id.

Identity: the handler's access entry maps to a group that may list nodes (read-only), list pods and
patch pods in the serving namespace; a ValidatingAdmissionPolicy (``gennstack_infra/components/interruption_handler.py``)
limits its pod patches to this one label, ``"true"`` or ``"false"``.

Converging: the reconciler drains every node of an active record whose signals drain its NodePool
(pods that arrived after the first drain included) and sets ``"true"`` on every other serving pod
that is not so: drained pods whose node has no such record any more (a rebalance recommendation that
never became an interruption gives its capacity back when its record expires, ``RECORD_TTL_SECONDS``)
and pods without the label (created before the chart had it; the Service would skip them).

The last replica stays: a drain never leaves a generation's Service without a serving pod, one that
is routable, Ready, not being deleted and not on a node being drained (``is_serving``). Without one
the doomed node's pods are left routable and reported as ``kept``, and the reconciler drains them at
a later run, once another replica is Ready. Draining the last one would not move its requests
anywhere: CoreDNS (coredns v1.14.7 ``plugin/kubernetes/kubernetes.go``) answers a headless Service
with no ready endpoint NXDOMAIN, Envoy's c-ares resolver takes NXDOMAIN as a successful empty answer
and removes every host, and its STRICT_DNS cluster re-resolves an empty answer only after
``dns_refresh_rate`` (5 s from the gateway chart's BackendTrafficPolicy, Envoy Gateway's default 30 s;
the record TTL applies to non-empty answers only,
``source/extensions/clusters/strict_dns/strict_dns_cluster.cc``): the model would answer 503 until
then, or until the record expires for a rebalance that never became an interruption.

One pod list per drain: the generation's serving pods (the ``DRAIN_ON`` selector, no field
selector), split by ``spec.nodeName`` here.

Multi-node replicas (``DRAIN_ON``'s ``groups`` selector: the serving chart's LeaderWorkerSet pods) are
drained a group at a time: a doomed node holding any member takes every pod of that member's group
out of routing (the Service selects the leaders, worker index 0; the label goes on every member so
that the group reads as one state), and the group counts once in ``Routing.groups`` however many of
its members are doomed, and only when this call changed it. A group is the pods sharing LWS v0.10.0's
``leaderworkerset.sigs.k8s.io/group-key`` label (api/leaderworkerset/v1/leaderworkerset_types.go
GroupUniqueHashLabelKey; set on the leader by pkg/webhooks/pod_webhook.go and copied to the workers'
StatefulSet by pkg/controllers/pod_controller.go), named by its leader (``leaderworkerset.sigs.k8s.io/
worker-index`` "0"). The last serving group stays, as the last replica does. A group is restored
whole once none of its members is on a doomed node; one that loses a member is recreated by LWS
(RecreateGroupOnPodRestart) with the chart's ``"true"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import HandlerError, Reason
from .kube import KubeClient
from .settings import Drain

ROUTABLE_LABEL = "gennstack.io/routable"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
NODES_PATH = "/api/v1/nodes"
READY = "Ready"  # the pod condition (k8s.io/api core/v1 PodReady)


@dataclass
class Routing:
    """What one call changed: pods set to ``value``, pods already so, pods gone meanwhile, and pods
    a drain left as they were (``kept``) because draining them would have left their Service with no
    serving pod."""

    value: str
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    # Multi-node groups (by leader pod name) this call took out of routing: each once.
    groups: list[str] = field(default_factory=list)

    def add(self, other: Routing) -> Routing:
        return Routing(self.value, self.changed + other.changed, self.unchanged + other.unchanged,
                       self.gone + other.gone, self.kept + other.kept, self.groups + other.groups)


def pods_path(namespace: str) -> str:
    return KubeClient.pod_path(namespace, "x").rsplit("/", 1)[0]


def instance_of(node: dict[str, Any]) -> str | None:
    provider_id = (node.get("spec") or {}).get("providerID") or ""
    if not provider_id.startswith("aws:///"):
        return None
    return provider_id.rsplit("/", 1)[-1] or None


def pool_nodes(kube: KubeClient, pool: str) -> dict[str, str]:
    """``{node name: instance id}`` of the NodePool's registered nodes."""
    nodes = kube.list_items(NODES_PATH, label_selector=f"{NODEPOOL_LABEL}={pool}")
    found = {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name")
        instance = instance_of(node)
        if isinstance(name, str) and instance:
            found[name] = instance
    return found


def node_of(pod: dict[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def is_serving(pod: dict[str, Any]) -> bool:
    """In its Service's DNS answer: routable, Ready and not being deleted.

    The EndpointSlice controller marks a pod's endpoint ready only when its ``Ready`` condition is
    ``"True"`` and it has no ``deletionTimestamp`` (the serving Services do not publish not-ready
    addresses), and CoreDNS answers a headless Service with its ready endpoints only."""
    metadata = pod.get("metadata") or {}
    if (metadata.get("labels") or {}).get(ROUTABLE_LABEL) != "true" or metadata.get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == READY and c.get("status") == "True" for c in conditions)


def drain_nodes(kube: KubeClient, *, namespace: str, pods: list[dict[str, Any]], nodes: set[str]) -> Routing:
    """Drain the serving pods on ``nodes`` (``pods``: all the generation's serving pods) unless that
    would leave the Service without a serving pod: then the pods on ``nodes`` stay, or become again,
    routable, and are reported ``kept``. Becoming again: two invocations draining two nodes at once
    can each see the other's pod still serving and together drain the last ones; the next drain or
    reconcile (within a minute) puts them back."""
    doomed = [pod for pod in pods if node_of(pod) in nodes]
    where = ",".join(sorted(nodes))
    if any(is_serving(pod) for pod in pods if node_of(pod) not in nodes):
        return set_routing(kube, namespace=namespace, node=where, routable=False, pods=doomed)
    restored = set_routing(kube, namespace=namespace, node=where, routable=True, pods=doomed)
    return Routing("false", gone=restored.gone, kept=restored.unchanged + restored.changed)


def undo_if_last(kube: KubeClient, *, namespace: str, drain: Drain, routing: Routing, node: str) -> Routing:
    """After a drain: when the generation has no serving pod left (another invocation drained the
    others meanwhile), put back what this drain took out and report it ``kept``."""
    if not routing.changed:
        return routing
    pods = kube.list_items(pods_path(namespace), label_selector=drain.pods)
    if any(is_serving(pod) for pod in pods):
        return routing
    mine = [pod for pod in pods if _name(pod, namespace=namespace, node=node) in set(routing.changed)]
    back = set_routing(kube, namespace=namespace, node=node, routable=True, pods=mine)
    return Routing("false", unchanged=routing.unchanged, gone=routing.gone + back.gone,
                   kept=routing.kept + back.changed + back.unchanged)


def set_routing(kube: KubeClient, *, namespace: str, node: str, routable: bool, pods: Iterable[dict[str, Any]]) -> Routing:
    """Set ``gennstack.io/routable`` on ``pods`` (``node``: for error context); idempotent."""
    value = "true" if routable else "false"
    result = Routing(value)
    for pod in pods:
        metadata = pod.get("metadata") or {}
        name = _name(pod, namespace=namespace, node=node)
        if (metadata.get("labels") or {}).get(ROUTABLE_LABEL) == value:
            result.unchanged.append(name)
            continue
        try:
            kube.patch_pod_labels(namespace, name, {ROUTABLE_LABEL: value})
        except HandlerError as error:
            if error.reason is Reason.KUBE_NOT_FOUND:  # deleted between the list and the patch
                result.gone.append(name)
                continue
            error.context.update(pod=name, node=node_of(pod) or node)
            raise
        result.changed.append(name)
    return result


def group_key(pod: dict[str, Any]) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(GROUP_KEY_LABEL)


def _leader(members: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((p for p in members if ((p.get("metadata") or {}).get("labels") or {}).get(WORKER_INDEX_LABEL) == "0"), None)


def groups_of(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``{group key: its pods}`` of LeaderWorkerSet pods (pods without the key belong to no group)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        if (key := group_key(pod)) is not None:
            found.setdefault(key, []).append(pod)
    return found


def _group_name(key: str, members: list[dict[str, Any]], namespace: str) -> str:
    leader = _leader(members)
    return _name(leader, namespace=namespace, node=None) if leader is not None else key


def drain_groups(kube: KubeClient, *, namespace: str, pods: list[dict[str, Any]], nodes: set[str]) -> Routing:
    """Drain every group with a member on ``nodes`` (``pods``: all the groups' pods), whole, unless no
    other group's leader would still serve: then the doomed groups stay routable and are ``kept``."""
    groups = groups_of(pods)
    doomed = {key: members for key, members in groups.items() if any(node_of(p) in nodes for p in members)}
    where = ",".join(sorted(nodes))
    if not doomed:
        return Routing("false")
    others = [_leader(members) for key, members in groups.items() if key not in doomed]
    if not any(leader is not None and is_serving(leader) for leader in others):
        restored = set_routing(kube, namespace=namespace, node=where, routable=True,
                               pods=[p for members in doomed.values() for p in members])
        return Routing("false", gone=restored.gone, kept=restored.unchanged + restored.changed)
    result = Routing("false")
    for key, members in sorted(doomed.items()):
        routing = set_routing(kube, namespace=namespace, node=where, routable=False, pods=members)
        if routing.changed:
            routing.groups.append(_group_name(key, members, namespace))
        result = result.add(routing)
    return result


def restore_groups(kube: KubeClient, *, namespace: str, pods: list[dict[str, Any]], doomed_nodes: set[str]) -> Routing:
    """Put back, whole, every group none of whose members is on ``doomed_nodes``."""
    stale = [
        p for members in groups_of(pods).values() if not any(node_of(m) in doomed_nodes for m in members)
        for p in members
        if ((p.get("metadata") or {}).get("labels") or {}).get(ROUTABLE_LABEL) != "true"
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    return set_routing(kube, namespace=namespace, node="(not doomed)", routable=True, pods=stale)


def group_keys_on(kube: KubeClient, *, pool: str, namespace: str, selector: str, instance_ids: set[str]) -> dict[str, set[str]]:
    """``{instance id: group keys}``: the multi-node groups (``selector``'s pods) with a member on each
    of ``instance_ids``' nodes; an instance whose node is not (or no longer) registered holds none."""
    nodes = {name: instance for name, instance in pool_nodes(kube, pool).items() if instance in instance_ids}
    if not nodes:
        return {}
    found: dict[str, set[str]] = {}
    for key, members in groups_of(kube.list_items(pods_path(namespace), label_selector=selector)).items():
        for pod in members:
            if node_of(pod) in nodes:
                found.setdefault(nodes[node_of(pod)], set()).add(key)
    return found


def drain_instance(kube: KubeClient, *, pool: str, namespace: str, drain: Drain, instance_id: str) -> tuple[str | None, Routing]:
    """Take the serving pods on ``instance_id``'s node out of load balancing, unless they are the
    generation's last serving pods (then ``kept``); with ``drain.groups``, the whole multi-node group
    of a member on it. ``(None, empty)``: no node."""
    node = next((name for name, instance in pool_nodes(kube, pool).items() if instance == instance_id), None)
    if node is None:
        return None, Routing("false")
    pods = kube.list_items(pods_path(namespace), label_selector=drain.pods)
    routing = drain_nodes(kube, namespace=namespace, pods=pods, nodes={node})
    routing = undo_if_last(kube, namespace=namespace, drain=drain, routing=routing, node=node)
    if drain.groups is not None:
        members = kube.list_items(pods_path(namespace), label_selector=drain.groups)
        routing = routing.add(drain_groups(kube, namespace=namespace, pods=members, nodes={node}))
    return node, routing


def converge_pool(kube: KubeClient, *, pool: str, namespace: str, drain: Drain, doomed_instances: set[str],
                  recheck: Callable[[], set[str]] | None = None,
                  held: frozenset[str] | set[str] = frozenset()) -> tuple[Routing, Routing]:
    """Drain every node of ``doomed_instances`` (unless no serving pod would remain elsewhere: then
    ``kept``); restore drained pods on any other node. (drained, restored).

    ``recheck`` returns the doomed instances again, read just before restoring: pods on a node doomed
    since ``doomed_instances`` was read stay drained. ``held``: pods a return-to-spot move keeps out of
    routing (spot_move.py), never restored here."""
    nodes = pool_nodes(kube, pool)
    doomed_nodes = {name for name, instance in nodes.items() if instance in doomed_instances}
    pods = kube.list_items(pods_path(namespace), label_selector=drain.pods)
    drained = drain_nodes(kube, namespace=namespace, pods=pods, nodes=doomed_nodes)
    # Every serving pod not on a doomed node should be routable: drained pods whose node lives on, and
    # pods without the label (created before the chart had it, which the Service would otherwise skip).
    stale = [
        pod for pod in pods
        if ((pod.get("metadata") or {}).get("labels") or {}).get(ROUTABLE_LABEL) != "true"
        and node_of(pod) not in doomed_nodes
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
        and (pod.get("metadata") or {}).get("name") not in held
    ]
    if stale and recheck is not None:
        newly = {name for name, instance in nodes.items() if instance in recheck()} - doomed_nodes
        stale = [pod for pod in stale if node_of(pod) not in newly]
    restored = set_routing(kube, namespace=namespace, node="(not doomed)", routable=True, pods=stale)
    if drain.groups is not None:
        members = kube.list_items(pods_path(namespace), label_selector=drain.groups)
        drained = drained.add(drain_groups(kube, namespace=namespace, pods=members, nodes=doomed_nodes))
        keep = set(doomed_nodes)
        if recheck is not None and any(((p.get("metadata") or {}).get("labels") or {}).get(ROUTABLE_LABEL) != "true"
                                       for p in members):
            keep |= {name for name, instance in nodes.items() if instance in recheck()}
        restored = restored.add(restore_groups(kube, namespace=namespace, pods=members, doomed_nodes=keep))
    return drained, restored


def _name(pod: dict[str, Any], *, namespace: str, node: str | None) -> str:
    name = (pod.get("metadata") or {}).get("name")
    if not isinstance(name, str):
        raise HandlerError(Reason.KUBE_BAD_RESPONSE, "a pod without metadata.name", namespace=namespace, node=node)
    return name
