"""The hourly arithmetic and $ per 1M tokens, against figures computed by hand in each docstring."""

from __future__ import annotations

import pytest

from gennstack.config import load_config
from gennstack.cost.model import hourly_cost, per_million
from gennstack.instances import ROOT_VOLUMES, SYSTEM_ROOT_VOLUME_GIB
from gennstack.cost.prices import load_table
from gennstack.cost.report import seed_baseline
from tests.support import _merged_defaults

TABLE = load_table("us-east-1")


def config(overrides: dict | None = None):
    return load_config(_merged_defaults(overrides or {}))


def item(breakdown, group: str, prefix: str):
    return next(i for i in breakdown.groups[group] if i.name.startswith(prefix))


def test_platform_items_of_the_default_config() -> None:
    """EKS 0.10; 4 x m7i.large 0.1008 + 20 GiB gp3 (20 x 0.08 / 730 = 0.0021918) each = 0.4119672;
    NAT 1 x 0.045; endpoints 6 x 3 AZs x 0.01 = 0.18; NLB 0.0225; KMS 2 x 1/730; 3 secrets (token, API keys, Redis password) x 0.40/730;
    monitoring volumes (100 + 5 + 10) GiB gp3 x 0.08 / 730 = 0.0126027."""
    b = hourly_cost(config(), TABLE)
    assert item(b, "platform", "EKS").on_demand_usd_per_hour == pytest.approx(0.10)
    assert item(b, "platform", "system nodes (4 x m7i.large").spot_usd_per_hour == pytest.approx(0.4119672, abs=1e-7)
    assert item(b, "platform", "NAT gateways (1)").on_demand_usd_per_hour == pytest.approx(0.045)
    assert item(b, "platform", "interface endpoints (6 x 3 AZs)").on_demand_usd_per_hour == pytest.approx(0.18)
    assert item(b, "platform", "gateway NLB").on_demand_usd_per_hour == pytest.approx(0.0225)
    assert item(b, "platform", "KMS").on_demand_usd_per_hour == pytest.approx(2 / 730)
    assert item(b, "platform", "Secrets").on_demand_usd_per_hour == pytest.approx(1.2 / 730)
    assert item(b, "platform", "monitoring volumes").on_demand_usd_per_hour == pytest.approx(115 * 0.08 / 730)
    assert b.total("platform") == pytest.approx((0.7764535, 0.7764535), abs=1e-6)


def test_generations_of_the_default_config() -> None:
    """inf2: 1 x 12.98127 on demand, 60% off = 5.192508 at spot; root volume 600 x 0.08 + 13,000 x 0.005 +
    875 x 0.04 = 148 $/month = 0.2027397 $/h; Ray head m7i.xlarge 0.2016 + 100 GiB x 0.08 / 730 = 0.2125589.
    g6e: 2 one-GPU replicas, cheapest as 2 x g6e.xlarge (3.722) rather than 1 x g6e.12xlarge (10.49264);
    each root volume 200 x 0.08 + 3,000 x 0.005 + 375 x 0.04 = 46 $/month. trn2 has no us-east-1 price."""
    b = hourly_cost(config(), TABLE)
    assert item(b, "inf2", "1 x inf2.48xlarge").spot_usd_per_hour == pytest.approx(5.192508)
    assert item(b, "inf2", "1 x inf2.48xlarge").on_demand_usd_per_hour == pytest.approx(12.98127)
    assert item(b, "inf2", "1 x root volume").on_demand_usd_per_hour == pytest.approx(148 / 730)
    assert item(b, "inf2", "Ray head").on_demand_usd_per_hour == pytest.approx(0.2016 + 8 / 730)
    layout = b.layouts["g6e"]
    assert (layout.instance_type, layout.nodes, layout.idle_slots) == ("g6e.xlarge", 2, 0)
    assert b.total("g6e") == pytest.approx((2 * 1.861 * 0.4 + 2 * 46 / 730, 2 * 1.861 + 2 * 46 / 730))
    assert "trn2" not in b.groups
    assert b.unpriced == [("generation trn2 (trn2.48xlarge)",
                           "no on-demand price for trn2.48xlarge in us-east-1; "
                           "price it with `gennstack cost --price trn2.48xlarge=USD_PER_HOUR`")]


def test_one_gpu_replicas_pack_onto_a_four_gpu_node_with_warm_spares() -> None:
    """Only g6e.12xlarge allowed (4 GPUs): 6 replicas + 1 warm spare = 7 one-GPU slots -> ceil(7 / 4) = 2 nodes,
    1 slot idle; 2 x 10.49264 = 20.98528 on demand."""
    c = config({"generations": {"g6e": {"instance_types": ["g6e.12xlarge"]}},
                "serving": {"g6e": {"min_replicas": 6, "max_replicas": 6, "warm_spare_replicas": 1}}})
    b = hourly_cost(c, TABLE)
    layout = b.layouts["g6e"]
    assert (layout.nodes, layout.replicas_per_node, layout.idle_slots) == (2, 4, 1)
    assert item(b, "g6e", "2 x g6e.12xlarge (6 replica(s) + 1 warm spare(s), 4 per node)").on_demand_usd_per_hour == \
        pytest.approx(20.98528)


def test_tensor_parallel_4_takes_a_whole_node_per_replica() -> None:
    """The seed layout: gpus_per_replica 4 on g6e.12xlarge, 8 replicas -> 8 nodes = 83.94112 $/h on demand."""
    c = config({"generations": {"g6e": {"instance_types": ["g6e.12xlarge"]}}, "serving": {"g6e": {"min_replicas": 8, "max_replicas": 8, "gpus_per_replica": 4}}})
    assert hourly_cost(c, TABLE).groups["g6e"][0].on_demand_usd_per_hour == pytest.approx(83.94112)


def test_warm_spares_on_neuron_add_whole_nodes() -> None:
    """inf2 with 2 warm spares: 1 + 2 = 3 x inf2.48xlarge = 38.94381 $/h on demand."""
    c = config({"serving": {"inf2": {"warm_spare_replicas": 2}}})
    assert item(hourly_cost(c, TABLE), "inf2", "3 x inf2.48xlarge").on_demand_usd_per_hour == pytest.approx(38.94381)


def test_without_on_demand_fallback_the_worst_case_is_still_on_demand_and_says_why() -> None:
    """Spot is capped at the on-demand price (Karpenter sets no max price), so the range keeps its top; the item says it."""
    b = hourly_cost(config({"generations": {"g6e": {"on_demand_fallback": False}}}), TABLE)
    nodes = b.groups["g6e"][0]
    assert nodes.on_demand_usd_per_hour == pytest.approx(3.722)
    assert nodes.note == "no on-demand fallback pool: spot only, up to the on-demand price"
    assert hourly_cost(config(), TABLE).groups["g6e"][0].note == ""


def test_a_price_override_prices_trn2_and_a_spot_discount_changes_the_estimate() -> None:
    from datetime import date

    table = TABLE.with_overrides({"trn2.48xlarge": 40.0}, date(2026, 11, 30)).with_spot_discount(0.5)
    b = hourly_cost(config(), table)
    assert b.unpriced == []
    assert item(b, "trn2", "1 x trn2.48xlarge").spot_usd_per_hour == pytest.approx(20.0)
    assert item(b, "inf2", "1 x inf2.48xlarge").spot_usd_per_hour == pytest.approx(12.98127 / 2)


def test_reservations_are_noted_not_priced() -> None:
    b = hourly_cost(config({"generations": {"inf2": {"capacity_reservation_ids": ["cr-0123456789abcdef0"]}}}), TABLE)
    assert any(n.startswith("inf2: capacity reservations (cr-0123456789abcdef0)") for n in b.notes)


def test_per_million_tokens() -> None:
    """36 $/h at 1,000 tok/s = 3.6M tokens/h -> $10 per 1M."""
    assert per_million(36.0, 1000) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="tokens per second: got 0; allowed: more than 0"):
        per_million(1.0, 0)


def test_seed_baseline_from_its_own_figures() -> None:
    """8 x g6e.12xlarge on demand = 8 x 10.49264 = 83.94112 $/h; at 5,200 tok/s 83.94112 / 18.72 = $4.48 per 1M output
    tokens, at 3,600 tok/s 83.94112 / 12.96 = $6.48: the issue's "$4.5-6.5"."""
    fleet, best, worst = seed_baseline(TABLE)
    assert fleet == pytest.approx(83.94112)
    assert best == pytest.approx(4.484, abs=1e-3) and worst == pytest.approx(6.477, abs=1e-3)
    assert round(best, 1) == 4.5 and round(worst, 1) == 6.5


def test_root_volumes_are_the_node_classes() -> None:
    """The volumes the cost model prices are the ones the node classes and the system launch template
    get: both read gennstack/instances.py (gennstack_infra/components/node_pools.py node_class and
    gennstack_infra/components/cluster.py)."""
    from gennstack_infra.components import node_pools

    for generation, (gib, iops, mbps) in ROOT_VOLUMES.items():
        spec = node_pools.node_class(name="x", generation=None if generation == "general" else generation,
                                     instance_types=(), cluster_name="c", node_role="r", security_group_id="sg", tags={})
        (mapping,) = spec["spec"]["blockDeviceMappings"]
        assert mapping["ebs"] == {"volumeType": "gp3", "encrypted": True, "deleteOnTermination": True,
                                  "volumeSize": f"{gib}Gi", "iops": iops, "throughput": mbps}
    assert SYSTEM_ROOT_VOLUME_GIB == 20


def test_a_neuron_replica_needs_a_node_with_cores_for_its_tp_degree() -> None:
    """inf2.24xlarge: 6 chips x 2 = 12 NeuronCores, too few for TP 24; trn2.48xlarge: 16 x 4 logical = 64 cores."""
    from gennstack.cost.model import replicas_per_node

    assert replicas_per_node("inf2", "inf2.24xlarge", 24) == 0
    assert replicas_per_node("inf2", "inf2.24xlarge", 12) == 1
    assert replicas_per_node("inf2", "inf2.48xlarge", 24) == 1
    assert replicas_per_node("trn2", "trn2.48xlarge", 64) == 1
    assert replicas_per_node("g6e", "g6e.48xlarge", 2) == 4


def test_ceiling_is_the_costliest_fill_of_the_nodepool_limits() -> None:
    """g6e defaults: max_nodes 8 of the largest type -> limits 384 vCPU, 3,072 GiB, 32 GPUs. Nodes that fit every limit:
    xlarge min(96, 96, 32) = 32 x 1.861 = 59.55; 2xlarge 32 x 2.24208 = 71.75; 4xlarge min(24, 24, 32) = 24 x 3.00424
    = 72.10; 8xlarge 12 x 4.52856 = 54.34; 12xlarge min(8, 8, 8) = 8 x 10.49264 = 83.94 -> the ceiling, x 2 pools
    (spot and on-demand fallback) = 167.88 $/h. Without fallback, one pool."""
    from gennstack.cost.model import ceiling

    top = ceiling(config(), "g6e", TABLE)
    assert (top.instance_type, top.nodes_per_pool, top.pools) == ("g6e.12xlarge", 8, 2)
    assert top.on_demand_usd_per_hour == pytest.approx(167.88224)
    assert ceiling(config({"generations": {"g6e": {"on_demand_fallback": False}}}), "g6e", TABLE).pools == 1
    assert ceiling(config(), "trn2", TABLE) is None  # no price
    assert any(n.startswith("ceiling inf2: its NodePool limits (max_nodes 4) allow 4 x inf2.48xlarge per pool, 51.93 $/h")
               for n in hourly_cost(config(), TABLE).notes)


def test_secrets_and_keys_counted_are_what_the_stack_creates(synth, synth_variant) -> None:
    """The counts the cost model prices equal the AWS::SecretsManager::Secret and AWS::KMS::Key
    resources of both synths."""
    from gennstack.cost.model import KMS_KEYS, secrets_created

    for built in (synth, synth_variant):
        assert secrets_created(built.config) == len(built.resources("AWS::SecretsManager::Secret"))
        assert KMS_KEYS == len(built.resources("AWS::KMS::Key"))


def test_managed_prometheus_is_named_as_not_included() -> None:
    """monitoring.managed_prometheus remote-writes every sample to a workspace billed by ingestion: unpriced, and said."""
    amp = "not included: Amazon Managed Service for Prometheus"
    assert not any(n.startswith(amp) for n in hourly_cost(config(), TABLE).notes)
    enabled = config({"monitoring": {"managed_prometheus": {"enabled": True}}})
    assert any(n.startswith(amp) for n in hourly_cost(enabled, TABLE).notes)
