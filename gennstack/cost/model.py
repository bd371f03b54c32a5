"""The cost arithmetic: nodes per generation, dollars per hour, dollars per million tokens.

Pure functions over the typed config and a :class:`~gennstack.cost.prices.PriceTable` (no AWS, no
CDK), so ``gennstack cost``, ``gennstack summary``, the benchmark report and the README's
"What it costs" section all compute the same numbers.

How the config becomes nodes (what the serving chart and Karpenter do with it):

* Every generation runs ``serving.<gen>.min_replicas`` all the time and scales up to
  ``max_replicas`` under load (Ray Serve on inf2, KEDA on trn2 and g6e: docs/autoscaling.md);
  the always-on cost is that of ``min_replicas``, the ceiling that of the NodePool limits.
* A Neuron replica (inf2, trn2) takes every device of its node: one replica per node.
* A g6e replica takes ``serving.g6e.gpus_per_replica`` GPUs, so a node of G GPUs holds
  ``G // gpus_per_replica`` replicas (a g6e.12xlarge holds four one-GPU replicas).
* Warm spares (``serving.<gen>.warm_spare_replicas``) are shaped like a serving replica and land
  in the same NodePools, so they count like replicas.
* Karpenter launches the cheapest type that fits from ``generations.<gen>.instance_types``; the
  model prices every allowed type and takes the cheapest total for the replicas.
* Spot first; the on-demand column is what the same nodes cost from the on-demand pool. Spot
  prices never exceed on-demand (Karpenter sets no maximum price, so EC2's default, the
  on-demand price, caps them), so on-demand is also the worst case of a generation without
  fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gennstack.config import GenNStackConfig
from gennstack.cost.prices import HOURS_PER_MONTH, Price, PriceError, PriceTable
from gennstack.instances import (INSTANCE_TYPES, NEURON_CORES_PER_DEVICE, ROOT_VOLUMES, SYSTEM_ROOT_VOLUME_GIB, family,
                                 pool_limits)
from gennstack.serving.fit import layout as serving_layout

# gen1-inf2's Ray head and its GCS Redis run on one on-demand general-pool node: requests of
# 2 + 0.5 (autoscaler) + 0.25 (Redis) = 2.75 vCPU and 8 + 0.5 + 1 = 9.5 GiB (the serving chart's
# values), so a 4 vCPU / 16 GiB size; Karpenter picks the cheapest that fits, priced as m7i.xlarge.
RAY_HEAD_INSTANCE_TYPE = "m7i.xlarge"
# Customer-managed KMS keys: the models and compile cache buckets', and the EKS secrets envelope key.
KMS_KEYS = 2


@dataclass(frozen=True)
class NodeLayout:
    """``nodes`` x ``instance_type`` running ``replicas`` serving replicas plus ``spares`` warm spares."""

    instance_type: str
    replicas_per_node: int
    replicas: int
    spares: int

    @property
    def nodes(self) -> int:
        return math.ceil((self.replicas + self.spares) / self.replicas_per_node) if self.replicas + self.spares else 0

    @property
    def idle_slots(self) -> int:
        """Replica slots paid for and unused (e.g. two one-GPU replicas on a four-GPU node: 2)."""
        return self.nodes * self.replicas_per_node - self.replicas - self.spares


@dataclass(frozen=True)
class LineItem:
    """One always-on item: its quantity and dollars per hour at spot (estimate or observed) and on-demand."""

    name: str
    quantity: float
    spot_usd_per_hour: float
    on_demand_usd_per_hour: float
    prices: tuple[Price, ...]
    note: str = ""


@dataclass
class Breakdown:
    """Everything that runs all the time, per group ("platform" or a generation), with the prices used."""

    region: str
    groups: dict[str, list[LineItem]] = field(default_factory=dict)
    layouts: dict[str, NodeLayout] = field(default_factory=dict)
    # (what, why) for each item that could not be priced: totals exclude it.
    unpriced: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def total(self, group: str | None = None) -> tuple[float, float]:
        items = [i for g, items in self.groups.items() if group in (None, g) for i in items]
        return sum(i.spot_usd_per_hour for i in items), sum(i.on_demand_usd_per_hour for i in items)

    def prices(self) -> list[Price]:
        return [p for items in self.groups.values() for i in items for p in i.prices]


def replicas_per_node(generation: str, instance_type: str, width: int = 1) -> int:
    """Serving replicas one node holds. Neuron: 1 when its cores hold the ``width`` (TP degree) ranks, else 0 (a
    replica takes every device of its node). g6e: GPUs // ``width`` (GPUs per replica)."""
    devices = INSTANCE_TYPES[instance_type].accelerators
    if generation in NEURON_CORES_PER_DEVICE:
        return 1 if devices * NEURON_CORES_PER_DEVICE[generation] >= width else 0
    return devices // width


def serving_replicas(config: GenNStackConfig, generation: str) -> tuple[int, int]:
    """(replicas, warm spares) the config runs for ``generation`` all the time."""
    section = getattr(config.serving, generation)
    return section.min_replicas, section.warm_spare_replicas


def candidate_layouts(config: GenNStackConfig, generation: str) -> list[NodeLayout]:
    """One layout per allowed instance type that holds at least one replica."""
    replicas, spares = serving_replicas(config, generation)
    width = serving_layout(generation, config.serving).tensor_parallel_size
    layouts = []
    for instance_type in getattr(config.generations, generation).instance_types:
        per_node = replicas_per_node(generation, instance_type, width)
        if per_node:
            layouts.append(NodeLayout(instance_type, per_node, replicas, spares))
    return layouts


def gp3_month(table: PriceTable, gib: int, iops: int, mbps: int) -> tuple[float, tuple[Price, ...]]:
    """Dollars per month of one gp3 volume, and the prices used."""
    size, extra_iops, extra_mbps = (table.service(k) for k in (
        "gp3_per_gb_month", "gp3_per_iops_month_over_3000", "gp3_per_mbps_month_over_125"))
    usd = gib * size.usd + max(0, iops - 3000) * extra_iops.usd + max(0, mbps - 125) * extra_mbps.usd
    return usd, (size, extra_iops, extra_mbps)


def _fixed(name: str, quantity: float, price: Price, *, monthly: bool = False, note: str = "") -> LineItem:
    usd = quantity * price.usd / (HOURS_PER_MONTH if monthly else 1)
    return LineItem(name, quantity, usd, usd, (price,), note)


def secrets_created(config: GenNStackConfig) -> int:
    """Secrets Manager secrets the stack creates (tests/cost compare it with the synthesized template):
    the Hugging Face token; the gateway's API keys unless ``gateway.api_keys_secret_name`` names yours;
    the rate-limit Redis password while ``gateway.rate_limit.enabled``."""
    gateway = config.gateway
    return 1 + (gateway.api_keys_secret_name is None) + gateway.rate_limit.enabled


def platform_items(config: GenNStackConfig, table: PriceTable) -> list[LineItem]:
    """The always-on items outside the generations (the README's cost table)."""
    system_type = config.cluster.system_node_instance_types[0]
    system = table.on_demand_price(system_type)
    system_volume, volume_prices = gp3_month(table, SYSTEM_ROOT_VOLUME_GIB, 3000, 125)
    nodes = config.cluster.system_nodes_min
    endpoints = len(config.network.interface_endpoints) * config.network.az_count
    secrets = secrets_created(config)
    items = [
        _fixed("EKS control plane (standard support)", 1, table.service("eks_cluster_per_hour")),
        LineItem(f"system nodes ({nodes} x {system_type}, on-demand, + {SYSTEM_ROOT_VOLUME_GIB} GiB gp3 each)", nodes,
                 nodes * (system.usd + system_volume / HOURS_PER_MONTH), nodes * (system.usd + system_volume / HOURS_PER_MONTH),
                 (system, *volume_prices), "the node group's first type; nothing autoscales it: it runs system_nodes_min nodes"),
        _fixed(f"NAT gateways ({config.network.nat_gateways})", config.network.nat_gateways,
               table.service("nat_gateway_per_hour"), note="plus $/GB processed"),
        _fixed(f"interface endpoints ({len(config.network.interface_endpoints)} x {config.network.az_count} AZs)", endpoints,
               table.service("interface_endpoint_per_az_hour"), note="plus $/GB processed"),
        _fixed("gateway NLB", 1, table.service("nlb_per_hour"), note="plus NLCU-hours by traffic"),
        _fixed(f"KMS keys ({KMS_KEYS})", KMS_KEYS, table.service("kms_key_per_month"), monthly=True, note="plus requests"),
        _fixed(f"Secrets Manager secrets ({secrets})", secrets, table.service("secret_per_month"), monthly=True),
    ]
    items.append(monitoring_volumes_item(config, table))
    return items


def monitoring_volumes_item(config: GenNStackConfig, table: PriceTable) -> LineItem:
    """The monitoring stack's three gp3 volumes (gennstack_infra/components/monitoring.py; baseline IOPS and
    throughput). Its pods run on nodes priced elsewhere: the system nodes or an on-demand
    general-pool node Karpenter sizes to their requests (a note, not a line: its type is Karpenter's choice)."""
    monitoring = config.monitoring
    sizes = (monitoring.prometheus_storage_gib, monitoring.alertmanager_storage_gib, monitoring.grafana_storage_gib)
    usd, prices = 0.0, ()
    for gib in sizes:
        month, prices = gp3_month(table, gib, 3000, 125)
        usd += month
    where = ("on the system nodes" if monitoring.placement == "system"
             else "pods on an on-demand general-pool node Karpenter sizes to their requests, not priced here")
    return LineItem(f"monitoring volumes (gp3 {' + '.join(map(str, sizes))} GiB: Prometheus, Alertmanager, Grafana)", len(sizes),
                    usd / HOURS_PER_MONTH, usd / HOURS_PER_MONTH, prices, where)


def generation_items(config: GenNStackConfig, generation: str, table: PriceTable) -> tuple[NodeLayout | None, list[LineItem]]:
    """The cheapest layout of ``generation``'s replicas and spares, and its line items (nodes, root volumes, Ray head)."""
    priced = []
    for layout in candidate_layouts(config, generation):
        try:
            priced.append((layout.nodes * table.on_demand_price(layout.instance_type).usd, layout))
        except PriceError:
            continue
    if not priced:
        return None, []
    layout = min(priced, key=lambda pair: (pair[0], pair[1].instance_type))[1]
    spot, od = table.price(layout.instance_type, "spot"), table.on_demand_price(layout.instance_type)
    gen = getattr(config.generations, generation)
    fallback = "" if gen.on_demand_fallback else "no on-demand fallback pool: spot only, up to the on-demand price"
    spares = f" + {layout.spares} warm spare(s)" if layout.spares else ""
    items = [LineItem(
        f"{layout.nodes} x {layout.instance_type} ({layout.replicas} replica(s){spares}, {layout.replicas_per_node} per node)",
        layout.nodes, layout.nodes * spot.usd, layout.nodes * od.usd, (spot, od), fallback)]
    volume, volume_prices = gp3_month(table, *ROOT_VOLUMES[generation])
    items.append(LineItem(f"{layout.nodes} x root volume (gp3 {'/'.join(map(str, ROOT_VOLUMES[generation]))} GiB/IOPS/MB/s)",
                          layout.nodes, layout.nodes * volume / HOURS_PER_MONTH, layout.nodes * volume / HOURS_PER_MONTH,
                          volume_prices))
    if generation == "inf2":
        head = table.on_demand_price(RAY_HEAD_INSTANCE_TYPE)
        head_volume, head_volume_prices = gp3_month(table, *ROOT_VOLUMES["general"])
        usd = head.usd + head_volume / HOURS_PER_MONTH
        items.append(LineItem(f"Ray head + GCS Redis (1 x {RAY_HEAD_INSTANCE_TYPE}-sized node, on-demand, + root volume)", 1,
                              usd, usd, (head, *head_volume_prices), "Karpenter picks the cheapest 4 vCPU / 16 GiB type"))
    return layout, items


def multi_node_items(config: GenNStackConfig, table: PriceTable) -> list[LineItem]:
    """serving.multi_node's groups: every member is a whole node of its instance type, all the time
    (replicas is a fixed count), plus each node's root volume. Warm-spare groups
    (``warm_spare_replicas``) are shaped like a serving group and hold their nodes too, so they
    count like groups, as single-node spares count like replicas."""
    section = config.serving.multi_node
    groups = section.replicas + section.warm_spare_replicas
    nodes = groups * section.nodes_per_replica
    spot, od = table.price(section.instance_type, "spot"), table.on_demand_price(section.instance_type)
    volume, volume_prices = gp3_month(table, *ROOT_VOLUMES[section.generation])
    spares = f" + {section.warm_spare_replicas} warm spare group(s)" if section.warm_spare_replicas else ""
    return [
        LineItem(f"{nodes} x {section.instance_type} ({section.replicas} group(s){spares} of {section.nodes_per_replica}: "
                 f"{section.served_model_name}, TP {section.tensor_parallel_size} x PP {section.pipeline_parallel_size})",
                 nodes, nodes * spot.usd, nodes * od.usd, (spot, od), "a group is one replica"),
        LineItem(f"{nodes} x root volume (gp3 {'/'.join(map(str, ROOT_VOLUMES[section.generation]))} GiB/IOPS/MB/s)",
                 nodes, nodes * volume / HOURS_PER_MONTH, nodes * volume / HOURS_PER_MONTH, volume_prices),
    ]


def hourly_cost(config: GenNStackConfig, table: PriceTable) -> Breakdown:
    """What the config runs all the time, per hour, at spot (first choice) and on-demand."""
    breakdown = Breakdown(table.region)
    breakdown.groups["platform"] = platform_items(config, table)
    for name, gen in config.generations.enabled().items():
        layout, items = generation_items(config, name, table)
        if layout is None:
            types = ", ".join(gen.instance_types)
            breakdown.unpriced.append((f"generation {name} ({types})",
                                       f"no on-demand price for {types} in {table.region}; price it with "
                                       f"`gennstack cost --price {gen.instance_types[0]}=USD_PER_HOUR`"))
            continue
        breakdown.layouts[name] = layout
        breakdown.groups[name] = items
        top = ceiling(config, name, table)
        if top is not None:
            pools = "spot and on-demand pools" if top.pools == 2 else "the spot pool"
            breakdown.notes.append(
                f"ceiling {name}: its NodePool limits (max_nodes {config.generations.enabled()[name].max_nodes}) allow "
                f"{top.nodes_per_pool} x {top.instance_type} per pool, {top.on_demand_usd_per_hour_per_pool:,.2f} $/h at "
                f"on-demand each; {pools}: at most {top.on_demand_usd_per_hour:,.2f} $/h")
        if gen.capacity_reservation_ids:
            breakdown.notes.append(f"{name}: capacity reservations ({', '.join(gen.capacity_reservation_ids)}) bill at their own "
                                   "rate whether used or not; not included")
    if config.serving.multi_node.enabled:
        breakdown.groups["multi_node"] = multi_node_items(config, table)
    monitoring_node = ("the on-demand general-pool node(s) the monitoring pods run on (Karpenter sizes them to the pods' "
                       "requests; monitoring.placement: system puts them on the system nodes instead), "
                       if config.monitoring.placement == "on-demand" else "")
    breakdown.notes.append("not included: " + monitoring_node + "traffic (NAT and endpoint $/GB, NLCUs, data transfer), "
                           "S3 storage and requests, flow logs, CloudWatch (and YACE's GetMetricData calls), Lambda and "
                           "DynamoDB requests, staging and compile Jobs while they run")
    if config.monitoring.managed_prometheus.enabled:
        breakdown.notes.append("not included: Amazon Managed Service for Prometheus, which monitoring.managed_prometheus "
                               "remote-writes every scraped sample to (billed per million samples ingested, per GB-month "
                               "stored and per query; it grows with the number of series and the 15 s scrape)")
    return breakdown


@dataclass(frozen=True)
class Ceiling:
    """The most a generation's NodePools can cost: each pool full of the type whose fill costs most."""

    instance_type: str
    nodes_per_pool: int
    pools: int
    on_demand_usd_per_hour_per_pool: float

    @property
    def on_demand_usd_per_hour(self) -> float:
        return self.pools * self.on_demand_usd_per_hour_per_pool


def ceiling(config: GenNStackConfig, generation: str, table: PriceTable) -> Ceiling | None:
    """Worst case the NodePool limits allow (gennstack.instances.pool_limits, the same limits Karpenter enforces): per
    priced type, the nodes that fit every limit, at on-demand; the spot pool and the on-demand fallback pool each have
    their own limits, so both can fill. Reserved pools bill at their reservation's rate and are left out."""
    gen = getattr(config.generations, generation)
    limits = pool_limits(gen.instance_types, gen.max_nodes)
    best = None
    for instance_type in gen.instance_types:
        spec = INSTANCE_TYPES[instance_type]
        nodes = min(limits["cpu"] // spec.vcpu, limits["memory_gib"] // spec.memory_gib,
                    limits[spec.accelerator_resource] // spec.accelerators)
        try:
            usd = nodes * table.on_demand_price(instance_type).usd
        except PriceError:
            continue
        if best is None or usd > best.on_demand_usd_per_hour_per_pool:
            best = Ceiling(instance_type, nodes, 1 + gen.on_demand_fallback, usd)
    return best


def per_million(usd_per_hour: float, tokens_per_s: float) -> float:
    """Dollars per million tokens: ``usd_per_hour / (tokens_per_s x 3600) x 1e6``."""
    if tokens_per_s <= 0:
        raise ValueError(f"tokens per second: got {tokens_per_s!r}; allowed: more than 0")
    return usd_per_hour / (tokens_per_s * 3600) * 1_000_000


def node_layouts(generation: str, instance_types: list[str], gpu_options: list[int], replicas: int) -> list[tuple[int, NodeLayout]]:
    """(gpus_per_replica, layout) for every type of ``generation``'s family and GPU count that fits on it."""
    out = []
    for instance_type in instance_types:
        if family(instance_type) != generation:  # generations are named after their instance family
            continue
        for gpus in gpu_options:
            per_node = replicas_per_node(generation, instance_type, gpus)
            if per_node:
                out.append((gpus, NodeLayout(instance_type, per_node, replicas, 0)))
    return out
