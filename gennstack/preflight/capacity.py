"""The EC2 vCPUs a config can launch, per vCPU quota, and the quota codes.

EC2 limits running instances per account and region in vCPUs, one quota per instance-family class
and purchase option. The codes come from the Service Quotas API itself: gruntwork-io/
terraform-aws-utilities ``docs/quotas.md`` at commit 04f58839c5610804899dfcd815df374aea681ffd is
a ``ListAWSDefaultServiceQuotas`` dump for service code ``ec2`` (us-east-1) with these names and
codes; the AWS CLI reference's ``get-aws-default-service-quota`` example shows L-1216C47A with the
same name. tests/test_preflight.py pins the table.

The worst case a config allows, per quota:

- each enabled generation's spot NodePool: ``max_nodes`` x the vCPUs of its largest configured
  type (the NodePool's ``cpu`` limit, ``gennstack_infra/components/node_pools.py``), on the family's spot quota;
  the on-demand fallback pool the same on the on-demand quota;
- its ``<pool>-reserved`` NodePool (``capacity_reservation_ids``) the same, also on the on-demand
  quota: the EC2 User Guide ("Create a Capacity Reservation") says a request fails when "the
  requested quantity exceeds your On-Demand Instance limit for the selected instance family", so
  reserved capacity is held out of the On-Demand quota. Its Need adds to the on-demand fallback
  pool's: both pools can be full at once (each has its own ``cpu`` limit);
- the system node group (on-demand): ``system_nodes_max`` x the largest system type;
- Karpenter's general pool (c, m, r; spot or on-demand): ``general_pool_max_vcpu``, counted on
  both Standard quotas because it may land on either.

The minimum to serve at all is one node of the generation's smallest type (and the system node
group's ``system_nodes_min`` nodes of its smallest type).
"""

from __future__ import annotations

from dataclasses import dataclass

from gennstack.config import GenNStackConfig
from gennstack.instances import INSTANCE_TYPES, pool_limits


@dataclass(frozen=True)
class Quota:
    code: str
    name: str


# (family class, purchase option) -> quota
QUOTAS: dict[tuple[str, str], Quota] = {
    ("standard", "on-demand"): Quota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("standard", "spot"): Quota("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
    ("g-vt", "on-demand"): Quota("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("g-vt", "spot"): Quota("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("inf", "on-demand"): Quota("L-1945791B", "Running On-Demand Inf instances"),
    ("inf", "spot"): Quota("L-B5D1601B", "All Inf Spot Instance Requests"),
    ("trn", "on-demand"): Quota("L-2C3B7624", "Running On-Demand Trn instances"),
    ("trn", "spot"): Quota("L-6B0D517C", "All Trn Spot Instance Requests"),
}

# The quota class of each generation's instance family.
GENERATION_CLASS: dict[str, str] = {"inf2": "inf", "trn2": "trn", "g6e": "g-vt"}


@dataclass(frozen=True)
class Need:
    """What one NodePool or node group can use of one quota."""

    what: str  # "g6e spot pool", "system node group", "general pool"
    max_vcpus: int
    min_vcpus: int  # one node of the smallest type (0: this user of the quota is optional)
    node_vcpus: int  # vCPUs of its largest node, to say how many nodes a quota fits
    max_nodes: int
    min_what: str = "one node"  # what min_vcpus buys


@dataclass(frozen=True)
class QuotaNeed:
    quota_class: str
    purchase: str
    needs: tuple[Need, ...]

    @property
    def quota(self) -> Quota:
        return QUOTAS[(self.quota_class, self.purchase)]

    @property
    def max_vcpus(self) -> int:
        return sum(need.max_vcpus for need in self.needs)

    @property
    def min_vcpus(self) -> int:
        return max((need.min_vcpus for need in self.needs), default=0)

    @property
    def min_what(self) -> str:
        return max(self.needs, key=lambda need: need.min_vcpus).min_what


def vcpu_needs(config: GenNStackConfig, system_type_vcpus: dict[str, int]) -> list[QuotaNeed]:
    """Every quota the config uses, with what each pool can launch, in a fixed order.

    ``system_type_vcpus``: vCPUs of each ``cluster.system_node_instance_types`` entry
    (``DescribeInstanceTypes``; they are not in the accelerator catalog).
    """
    cluster = config.cluster
    system_largest = max(system_type_vcpus[t] for t in cluster.system_node_instance_types)
    system_smallest = min(system_type_vcpus[t] for t in cluster.system_node_instance_types)
    general = Need("general pool", cluster.general_pool_max_vcpu, 0, 0, 0)
    standard_on_demand = QuotaNeed(
        "standard",
        "on-demand",
        (
            Need(
                "system node group",
                cluster.system_nodes_max * system_largest,
                cluster.system_nodes_min * system_smallest,
                system_largest,
                cluster.system_nodes_max,
                f"{cluster.system_nodes_min} system nodes",
            ),
            general,
        ),
    )
    out = [standard_on_demand, QuotaNeed("standard", "spot", (general,))]
    for name, generation in config.generations.enabled().items():
        vcpus = [INSTANCE_TYPES[t].vcpu for t in generation.instance_types]
        smallest = min(vcpus) if generation.max_nodes else 0
        most = pool_limits(generation.instance_types, generation.max_nodes)["cpu"]  # each NodePool's cpu limit
        kinds = {"spot": ("spot",), "on-demand": ("reserved",) * bool(generation.capacity_reservation_ids)
                 + ("on-demand",) * generation.on_demand_fallback}
        for purchase, pools in kinds.items():
            if pools:
                needs = tuple(Need(f"{name} {kind} pool", most, smallest, max(vcpus), generation.max_nodes) for kind in pools)
                out.append(QuotaNeed(GENERATION_CLASS[name], purchase, needs))
    return out
