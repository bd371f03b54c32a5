"""Warm spares away from the reclaim that threatens the replicas (issue 31, section 2).

The rule is gennstack/serving/spare_placement.py; the chart renders it on every warm-spare
Deployment (the standing spares and, since the interruption handler only scales that Deployment,
the ones it adds on a signal). Karpenter v1.14.1 tries preferred pod anti-affinity terms as if
required before it relaxes them (kubernetes-sigs/karpenter v1.14.1
pkg/controllers/provisioning/scheduling/preferences.go), which is the order :func:`rank_offerings`
reproduces.
"""

from __future__ import annotations

import pytest

from gennstack.serving.spare_placement import (
    WEIGHT, ZONE_KEY, Offering, placement_tier, rank_offerings, spare_anti_affinity,
    zones_can_spread,
)
from tests import helm
from tests.k8s_schema import validate
from tests.serving.conftest import CHART, GENERATIONS, NAMESPACE, REQUIRED, STAGING, merged
from tests.serving.test_serving_chart import POOLS, named, serving_pod


@pytest.fixture(scope="module")
def rendered() -> dict:
    objects = helm.render(CHART, merged(REQUIRED, STAGING), namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    return named(objects)


def _serving_labels(objects: dict, generation: str) -> dict[str, str]:
    pool = POOLS[generation]
    if generation == "inf2":
        return objects[("RayService", pool)]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
    return objects[("Deployment", pool)]["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_warm_spares_carry_the_anti_affinity_to_their_generations_serving_pods(rendered, generation) -> None:
    spare = rendered[("Deployment", f"{POOLS[generation]}-warm-spare")]["spec"]["template"]["spec"]
    expected = spare_anti_affinity({"app.kubernetes.io/name": POOLS[generation], "app.kubernetes.io/component": "server"})
    assert spare["affinity"] == expected
    # The selector matches the serving replicas' own labels (not the spares': they spread among
    # themselves by the zone topology spread, as before).
    labels = _serving_labels(rendered, generation)
    for term in expected["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]:
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    spare_labels = rendered[("Deployment", f"{POOLS[generation]}-warm-spare")]["spec"]["template"]["metadata"]["labels"]
    assert not expected["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= spare_labels.items()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_serving_replicas_spread_over_zones(rendered, generation) -> None:
    """One correlated reclaim (one zone) cannot take every replica where there are several zones."""
    spread = serving_pod(rendered, generation)["topologySpreadConstraints"]
    assert {"maxSkew": 1, "topologyKey": ZONE_KEY} in [{k: c[k] for k in ("maxSkew", "topologyKey")} for c in spread]


def test_one_term_by_zone_not_by_instance_type() -> None:
    terms = spare_anti_affinity({"app.kubernetes.io/component": "server"})["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    # Not by instance type: on g6e that term cost about 9 points of the saving (gennstack simulate).
    assert [(t["weight"], t["podAffinityTerm"]["topologyKey"]) for t in terms] == [(WEIGHT, ZONE_KEY)]
    with pytest.raises(ValueError, match="serving_labels"):
        spare_anti_affinity({})
    # Spares in another namespace name the serving one; in their own namespace, no namespaces (the pod's).
    [other] = spare_anti_affinity({"a": "b"}, namespaces=["serving"])["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert other["podAffinityTerm"]["namespaces"] == ["serving"] and "namespaces" not in terms[0]["podAffinityTerm"]


def test_rank_offerings_another_zone_then_any() -> None:
    a12, b12, c12 = (Offering(z, "g6e.12xlarge") for z in ("a", "b", "c"))
    a8, b8 = Offering("a", "g6e.8xlarge"), Offering("b", "g6e.8xlarge")
    replicas = [a12, a12]
    assert placement_tier(b8, replicas) == placement_tier(b12, replicas) == 0
    assert placement_tier(a8, replicas) == 1  # same zone: a zone-wide reclaim reaches it
    # Ties keep the candidates' order (the simulator passes them cheapest first).
    assert rank_offerings([a12, a8, b12, c12, b8], replicas) == [b12, c12, b8, a12, a8]
    # Karpenter's unavailable-offerings cache (3 min after a spot warning) is respected, not redone.
    assert rank_offerings([a12, b8, b12], replicas, unavailable={b8}) == [b12, a12]
    # One instance type (inf2, trn2): the same rule.
    inf = [Offering(z, "inf2.48xlarge") for z in ("a", "b")]
    assert rank_offerings(inf, [inf[0]]) == [inf[1], inf[0]]


def test_zones_can_spread() -> None:
    assert zones_can_spread(["a", "b"]) and not zones_can_spread(["a", "a"])
