"""Karpenter NodePools and EC2NodeClasses: spot first, tainted, limited, pinned, and schema-valid."""

from __future__ import annotations

import re

import pytest

from gennstack_infra.components.node_pools import GENERAL_POOL, POOL_NAMES, node_classes, node_pools
from gennstack import versions
from gennstack.config import load_config
from tests.k8s_schema import validate

SG = "sg-0123456789abcdef0"


def _pools(config_overrides: dict | None = None) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in node_pools(load_config(config_overrides or {}))}


def _classes(config_overrides: dict | None = None) -> dict[str, dict]:
    config = load_config(config_overrides or {})
    return {c["metadata"]["name"]: c for c in node_classes(config, node_role="KarpenterNodeRole", security_group_id=SG)}


def _requirement(pool: dict, key: str) -> list[str]:
    requirements = pool["spec"]["template"]["spec"]["requirements"]
    return next(r["values"] for r in requirements if r["key"] == key)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"generations": {"trn2": {"enabled": False, "on_demand_fallback": False}, "inf2": {"on_demand_fallback": False}}},
        {"generations": {"g6e": {"instance_types": ["g6e.48xlarge"], "max_nodes": 1}}},
        {"generations": {"trn2": {"capacity_reservation_ids": ["cr-0123456789abcdef0", "cr-0fedcba9876543210"]}}},
    ],
    ids=["default", "some-disabled", "single-type", "reserved"],
)
def test_every_manifest_validates_against_its_crd(overrides: dict) -> None:
    for manifest in [*_pools(overrides).values(), *_classes(overrides).values()]:
        validate(manifest)


def test_validation_catches_a_typo() -> None:
    """The schema check can fail: an unknown field is rejected as `kubectl --validate=strict` would."""
    pool = _pools()["gen1-inf2"]
    pool["spec"]["disruption"]["consolidationPolcy"] = "WhenEmpty"
    with pytest.raises(AssertionError, match="consolidationPolcy"):
        validate(pool)


def test_validation_evaluates_the_crds_cel_rules() -> None:
    """The CRD's x-kubernetes-validations run too: Karpenter forbids requiring its own nodepool label."""
    pool = _pools()["gen1-inf2"]
    pool["spec"]["template"]["spec"]["requirements"].append(
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["other"]}
    )
    with pytest.raises(AssertionError, match="breaks its CRD's validation rules"):
        validate(pool)


def test_cel_rules_use_kubernetes_string_functions() -> None:
    """A rule needing Kubernetes' `find` extension evaluates (a restricted label domain is rejected)."""
    pool = _pools()["gen3-g6e"]
    pool["spec"]["template"]["metadata"]["labels"]["karpenter.sh/custom"] = "x"
    with pytest.raises(AssertionError, match="breaks its CRD's validation rules"):
        validate(pool)


def test_pool_names_and_spot_first() -> None:
    pools = _pools()
    assert set(pools) == {
        GENERAL_POOL, "gen1-inf2", "gen1-inf2-on-demand", "gen2-trn2", "gen2-trn2-on-demand", "gen3-g6e", "gen3-g6e-on-demand"
    }
    for generation, name in POOL_NAMES.items():
        spot, fallback = pools[name], pools[f"{name}-on-demand"]
        assert _requirement(spot, "karpenter.sh/capacity-type") == ["spot"]
        assert _requirement(fallback, "karpenter.sh/capacity-type") == ["on-demand"]
        assert spot["spec"]["weight"] > fallback["spec"]["weight"]
        assert spot["spec"]["template"]["metadata"]["labels"]["gennstack.io/generation"] == generation


def test_on_demand_fallback_is_a_config_flag_and_disabled_generations_have_no_pool() -> None:
    pools = _pools({"generations": {"g6e": {"on_demand_fallback": False}, "trn2": {"enabled": False}}})
    assert "gen3-g6e" in pools and "gen3-g6e-on-demand" not in pools
    assert not any(name.startswith("gen2-trn2") for name in pools)


def test_instance_types_and_taints() -> None:
    pools = _pools()
    assert _requirement(pools["gen1-inf2"], "node.kubernetes.io/instance-type") == ["inf2.48xlarge"]
    assert _requirement(pools["gen2-trn2"], "node.kubernetes.io/instance-type") == ["trn2.48xlarge"]
    assert _requirement(pools["gen3-g6e"], "node.kubernetes.io/instance-type") == [
        "g6e.xlarge", "g6e.2xlarge", "g6e.4xlarge", "g6e.8xlarge", "g6e.12xlarge"
    ]
    taint = lambda name: pools[name]["spec"]["template"]["spec"]["taints"]  # noqa: E731
    assert taint("gen1-inf2") == [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}]
    assert taint("gen2-trn2") == [{"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}]
    assert taint("gen3-g6e") == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert "taints" not in pools[GENERAL_POOL]["spec"]["template"]["spec"]


def test_limits_follow_max_nodes() -> None:
    pools = _pools({"generations": {"inf2": {"max_nodes": 3}, "g6e": {"max_nodes": 2}},
                    "serving": {"g6e": {"min_replicas": 1, "max_replicas": 2}}})
    assert pools["gen1-inf2"]["spec"]["limits"] == {"cpu": "576", "memory": "2304Gi", "aws.amazon.com/neuron": "36"}
    # g6e: the largest configured type (12xlarge: 48 vCPU, 384 GiB, 4 GPUs) times two nodes.
    assert pools["gen3-g6e"]["spec"]["limits"] == {"cpu": "96", "memory": "768Gi", "nvidia.com/gpu": "8"}


def test_serving_nodes_are_never_consolidated_while_serving() -> None:
    for name in ("gen1-inf2", "gen2-trn2", "gen3-g6e", "gen3-g6e-on-demand"):
        pool = _pools()[name]
        assert pool["spec"]["disruption"] == {
            "consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m", "budgets": [{"nodes": "1"}]
        }
        assert pool["spec"]["template"]["spec"]["expireAfter"] == "Never"


def test_an_expired_general_node_with_do_not_disrupt_pods_is_not_stuck_terminating() -> None:
    """kubernetes-sigs/karpenter v1.14.1: expiry deletes the NodeClaim regardless of its pods
    (pkg/controllers/nodeclaim/expiration/controller.go, "forcefully expire the nodeclaim (by deleting
    it)"); the drain never evicts a pod whose karpenter.sh/do-not-disrupt is "true"
    (pkg/utils/pod/scheduling.go IsEvictable, IsDoNotDisruptActive) but waits for it (IsDrainable: "node
    drain should stall until these pods are evicted or become terminal"); pkg/apis/v1/nodepool.go
    TerminationGracePeriod: "If left undefined, the controller will wait indefinitely for pods to be
    drained" and, set, it "bypasses any blocked PDBs or the karpenter.sh/do-not-disrupt annotation".
    Prometheus and Alertmanager on the general pool carry do-not-disrupt; their own grace periods
    (Prometheus Operator v0.93.0: 600 s and 120 s) fit inside it."""
    from gennstack.observability.values import DO_NOT_DISRUPT

    general = _pools()[GENERAL_POOL]["spec"]["template"]["spec"]
    assert general["expireAfter"] == "720h"
    assert DO_NOT_DISRUPT == {"karpenter.sh/do-not-disrupt": "true"}
    assert general["terminationGracePeriod"] == "1h"
    # The accelerator pools never expire (expireAfter Never): nothing to bound there.
    for name in ("gen1-inf2", "gen2-trn2", "gen3-g6e"):
        assert "terminationGracePeriod" not in _pools()[name]["spec"]["template"]["spec"]


def test_node_classes_pin_ami_and_require_imdsv2() -> None:
    classes = _classes()
    assert set(classes) == {GENERAL_POOL, "gen1-inf2", "gen2-trn2", "gen3-g6e"}
    # The Neuron classes run the AMI release whose Neuron driver accepts the image's runtime
    # (gennstack/versions.py NEURON_AMI_ALIAS; the pair is held in tests/serving/test_support_matrix.py).
    aliases = {"gen1-inf2": versions.NEURON_AMI_ALIAS, "gen2-trn2": versions.NEURON_AMI_ALIAS}
    for name, node_class in classes.items():
        spec = node_class["spec"]
        alias = aliases.get(name, versions.AL2023_AMI_ALIAS)
        assert spec["amiSelectorTerms"] == [{"alias": alias}]
        assert re.fullmatch(r"al2023@v\d{8}", alias)  # a dated release, never @latest
        assert spec["metadataOptions"]["httpTokens"] == "required"
        assert spec["metadataOptions"]["httpPutResponseHopLimit"] == 1
        (volume,) = spec["blockDeviceMappings"]
        assert volume["ebs"]["encrypted"] is True and volume["ebs"]["volumeType"] == "gp3"
        assert spec["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "gennstack"}}]
        assert spec["securityGroupSelectorTerms"] == [{"id": SG}]


def test_nvme_raid0_where_the_instance_has_it() -> None:
    classes = _classes()
    assert classes["gen2-trn2"]["spec"]["instanceStorePolicy"] == "RAID0"
    assert classes["gen3-g6e"]["spec"]["instanceStorePolicy"] == "RAID0"
    assert "instanceStorePolicy" not in classes["gen1-inf2"]["spec"]
    # inf2 has no instance store: its root volume holds the model cache.
    inf2_root = classes["gen1-inf2"]["spec"]["blockDeviceMappings"][0]["ebs"]
    assert inf2_root["volumeSize"] == "600Gi" and inf2_root["throughput"] == 1000


RESERVED = ("cr-0123456789abcdef0", "cr-0fedcba9876543210")


def test_reserved_capacity_pool_comes_first() -> None:
    """Capacity reservations (ODCRs, Capacity Blocks) get their own NodePool with the highest weight.

    Karpenter v1.14.1 offers reservations selected by the EC2NodeClass's
    ``capacityReservationSelectorTerms`` as capacity type ``reserved`` (feature gate
    ``reservedCapacity``, on by default in the chart's ``values.yaml`` at v1.14.1).
    """
    overrides = {"generations": {"trn2": {"capacity_reservation_ids": list(RESERVED)}}}
    pools = _pools(overrides)
    reserved, spot, on_demand = pools["gen2-trn2-reserved"], pools["gen2-trn2"], pools["gen2-trn2-on-demand"]
    assert _requirement(reserved, "karpenter.sh/capacity-type") == ["reserved"]
    assert reserved["spec"]["weight"] > spot["spec"]["weight"] > on_demand["spec"]["weight"]
    assert reserved["spec"]["template"]["spec"]["nodeClassRef"]["name"] == "gen2-trn2"
    assert reserved["spec"]["template"]["metadata"]["labels"]["gennstack.io/generation"] == "trn2"
    assert reserved["spec"]["disruption"] == spot["spec"]["disruption"]
    classes = _classes(overrides)
    assert classes["gen2-trn2"]["spec"]["capacityReservationSelectorTerms"] == [{"id": r} for r in RESERVED]
    # Only the generation with reservations changes.
    assert "gen1-inf2-reserved" not in pools and "capacityReservationSelectorTerms" not in classes["gen1-inf2"]["spec"]
    assert "gen2-trn2-reserved" not in _pools()
