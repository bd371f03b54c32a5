"""Karpenter EC2NodeClasses and NodePools: spot-first capacity for each enabled generation.

The manifests are built by plain functions (``node_class``, ``node_pools``) that tests call on
their own and validate against Karpenter's CRD schemas; the ``NodePools`` construct applies them.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_eks_v2 as eks

from constructs import Construct
from gennstack.config import GenerationConfig, GenNStackConfig
from gennstack.generations import ON_DEMAND_WEIGHT, RESERVED_WEIGHT, SPOT_WEIGHT
from gennstack.instances import INSTANCE_TYPES, NEURON, NVIDIA_GPU, ROOT_VOLUMES, pool_limits
from gennstack.node_config import ami_alias, user_data, uses_instance_store

# NodePool names by generation; the interruption handler and the serving charts refer to them.
POOL_NAMES = {"inf2": "gen1-inf2", "trn2": "gen2-trn2", "g6e": "gen3-g6e"}
GENERAL_POOL = "general"
# How long Karpenter v1.14.1 waits for a general node's pods once it deletes the node: its nodes
# expire after 720h, and expiry deletes the NodeClaim whatever its pods
# (pkg/controllers/nodeclaim/expiration/controller.go), but the drain never evicts a pod with
# karpenter.sh/do-not-disrupt (Prometheus, Alertmanager: gennstack/observability/values.py) and,
# without terminationGracePeriod, "the controller will wait indefinitely for pods to be drained"
# (pkg/apis/v1/nodepool.go): the node would stay tainted and terminating for ever. With it, those pods
# are deleted once it has passed, leaving each its own grace period (Prometheus Operator v0.93.0's
# default 600 s for Prometheus, 120 s for Alertmanager). It also makes drift an eventual disruption
# (pkg/controllers/disruption/types.go EventualDisruptionClass): a drifted general node now drains
# too, bounded the same way. Consolidation stays graceful: do-not-disrupt still blocks it.
GENERAL_TERMINATION_GRACE_PERIOD = "1h"
GENERATION_LABEL = "gennstack.io/generation"
ON_DEMAND_SUFFIX = "-on-demand"
RESERVED_SUFFIX = "-reserved"
# Karpenter prefers higher weights (1-100): capacity reservations first, then spot, on-demand only
# when neither can be had (gennstack/generations.py, where `gennstack simulate` reads them too).
# ON_DEMAND_WEIGHT, RESERVED_WEIGHT, SPOT_WEIGHT: imported above.


def node_class(
    *, name: str, generation: str | None, instance_types: tuple[str, ...], cluster_name: str, node_role: str,
    security_group_id: str, tags: dict[str, str], capacity_reservation_ids: tuple[str, ...] = (),
) -> dict[str, Any]:
    """An EC2NodeClass: AL2023 at a pinned AMI release (:func:`ami_alias`), IMDSv2 only, encrypted gp3 root volume.

    With the ``al2023`` alias Karpenter picks the NVIDIA or Neuron AMI variant for accelerated
    instance types by itself. ``instanceStorePolicy: RAID0`` turns local NVMe (trn2, g6e) into the
    node's ephemeral storage, where images and model copies go. ``userData`` is nodeadm's NodeConfig
    with fast image pull where the class's nodes can use it (:func:`gennstack.node_config.user_data`).
    """
    gib, iops, mbps = ROOT_VOLUMES[generation or "general"]  # gennstack/instances.py
    volume = {"volumeSize": f"{gib}Gi", "iops": iops, "throughput": mbps}
    discovery = {"karpenter.sh/discovery": cluster_name}
    spec: dict[str, Any] = {
        "role": node_role,
        "amiSelectorTerms": [{"alias": ami_alias(instance_types)}],
        "subnetSelectorTerms": [{"tags": discovery}],
        # The EKS-created cluster security group (nodes, pods and control plane talk through it).
        "securityGroupSelectorTerms": [{"id": security_group_id}],
        "metadataOptions": {
            "httpEndpoint": "enabled",
            "httpProtocolIPv6": "disabled",
            # Hop limit 1: pods cannot reach IMDS; they get AWS credentials from Pod Identity.
            "httpPutResponseHopLimit": 1,
            "httpTokens": "required",
        },
        "blockDeviceMappings": [
            {
                "deviceName": "/dev/xvda",
                "ebs": {"volumeType": "gp3", "encrypted": True, "deleteOnTermination": True, **volume},
            }
        ],
        "tags": {**tags, "gennstack.io/node-class": name},
    }
    if uses_instance_store(instance_types):
        spec["instanceStorePolicy"] = "RAID0"
    node_user_data = user_data(generation, instance_types)
    if node_user_data is not None:
        spec["userData"] = node_user_data
    if capacity_reservation_ids:
        # On-Demand Capacity Reservations and Capacity Blocks by ID; Karpenter 1.14's
        # reservedCapacity feature gate is on by default and offers them as capacity type "reserved".
        spec["capacityReservationSelectorTerms"] = [{"id": reservation} for reservation in capacity_reservation_ids]
    return {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name}, "spec": spec}


def _limits(generation: GenerationConfig) -> dict[str, str]:
    """Pool limits from ``max_nodes``: the largest configured instance type, that many times."""
    limits = pool_limits(generation.instance_types, generation.max_nodes)
    memory = limits.pop("memory_gib")
    return {"cpu": str(limits.pop("cpu")), "memory": f"{memory}Gi", **{k: str(v) for k, v in limits.items()}}


def _pool(
    *, name: str, node_class_name: str, requirements: list[dict[str, Any]], weight: int, limits: dict[str, str],
    labels: dict[str, str], taints: list[dict[str, str]], disruption: dict[str, Any],
    termination_grace_period: str | None = None,
) -> dict[str, Any]:
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": node_class_name},
        "requirements": requirements,
        "expireAfter": disruption.pop("expireAfter"),
    }
    if termination_grace_period is not None:
        template_spec["terminationGracePeriod"] = termination_grace_period
    if taints:
        template_spec["taints"] = taints
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "weight": weight,
            "limits": limits,
            "disruption": disruption,
            "template": {"metadata": {"labels": labels}, "spec": template_spec},
        },
    }


def _accelerator_disruption() -> dict[str, Any]:
    # Never consolidate a node a model serves on: only empty nodes are removed, nodes do not
    # expire on a timer, and at most one node of the pool is disrupted (e.g. for drift) at a time.
    return {
        "consolidationPolicy": "WhenEmpty",
        "consolidateAfter": "10m",
        "budgets": [{"nodes": "1"}],
        "expireAfter": "Never",
    }


def node_pools(config: GenNStackConfig) -> list[dict[str, Any]]:
    """The general CPU pool plus, for each enabled generation, a spot pool and optional reserved and on-demand pools.

    A generation with ``capacity_reservation_ids`` gets a ``<pool>-reserved`` NodePool (capacity
    type ``reserved``, the highest weight) over its EC2NodeClass's reservations: Karpenter fills
    the reservations first, then spot, then on-demand.
    """
    pools = [
        _pool(
            name=GENERAL_POOL,
            node_class_name=GENERAL_POOL,
            requirements=[
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m", "r"]},
                {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["5"]},
            ],
            weight=SPOT_WEIGHT,
            limits={"cpu": str(config.cluster.general_pool_max_vcpu)},
            labels={"gennstack.io/pool": GENERAL_POOL},
            taints=[],
            disruption={
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": "1m",
                "budgets": [{"nodes": "10%"}],
                "expireAfter": "720h",
            },
            termination_grace_period=GENERAL_TERMINATION_GRACE_PERIOD,
        )
    ]
    for generation_name, generation in config.generations.enabled().items():
        pool_name = POOL_NAMES[generation_name]
        resource = INSTANCE_TYPES[generation.instance_types[0]].accelerator_resource
        taint_key = NEURON if resource == NEURON else NVIDIA_GPU
        base_requirements = [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(generation.instance_types)},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        ]
        capacity_types = [("spot", pool_name, SPOT_WEIGHT)]
        if generation.capacity_reservation_ids:
            capacity_types.insert(0, ("reserved", pool_name + RESERVED_SUFFIX, RESERVED_WEIGHT))
        if generation.on_demand_fallback:
            capacity_types.append(("on-demand", pool_name + ON_DEMAND_SUFFIX, ON_DEMAND_WEIGHT))
        for capacity_type, name, weight in capacity_types:
            pools.append(
                _pool(
                    name=name,
                    node_class_name=pool_name,
                    requirements=[
                        *base_requirements,
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity_type]},
                    ],
                    weight=weight,
                    limits=_limits(generation),
                    labels={GENERATION_LABEL: generation_name, "gennstack.io/pool": name},
                    taints=[{"key": taint_key, "value": "true", "effect": "NoSchedule"}],
                    disruption=_accelerator_disruption(),
                )
            )
    return pools


def node_classes(config: GenNStackConfig, *, node_role: str, security_group_id: str) -> list[dict[str, Any]]:
    """One EC2NodeClass for the general pool and one per enabled generation."""
    tags = dict(config.tags)
    classes = [
        node_class(
            name=GENERAL_POOL, generation=None, instance_types=(), cluster_name=config.cluster_name,
            node_role=node_role, security_group_id=security_group_id, tags=tags,
        )
    ]
    for generation_name, generation in config.generations.enabled().items():
        classes.append(
            node_class(
                name=POOL_NAMES[generation_name],
                generation=generation_name,
                instance_types=generation.instance_types,
                cluster_name=config.cluster_name,
                node_role=node_role,
                security_group_id=security_group_id,
                tags=tags,
                capacity_reservation_ids=generation.capacity_reservation_ids,
            )
        )
    return classes


class NodePools(Construct):
    """Applies the EC2NodeClasses and NodePools to the cluster (after Karpenter's CRDs exist)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, config: GenNStackConfig, node_role_name: str
    ) -> None:
        super().__init__(scope, construct_id)
        manifests = node_classes(
            config, node_role=node_role_name, security_group_id=cluster.cluster_security_group_id
        )
        self.node_classes = eks.KubernetesManifest(self, "NodeClasses", cluster=cluster, manifest=manifests)
        self.node_pools = eks.KubernetesManifest(self, "Pools", cluster=cluster, manifest=node_pools(config))
        self.node_pools.node.add_dependency(self.node_classes)
