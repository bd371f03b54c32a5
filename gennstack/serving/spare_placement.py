"""Where a warm spare goes: away from the reclaim that threatens the replicas it protects.

Spot reclaims are correlated by offering (instance type x zone): of 2,635 interruption events,
more than 92 % of those of one instance type in one zone came within 3 minutes of each other
(Spot-and-Scoot, arXiv 2604.16457, as issue 31 quotes it). A spare in the zone and instance type
of the serving replicas is likely reclaimed with them. So a spare's pod carries *preferred* pod
anti-affinity to its generation's serving pods: by instance type and by zone, of equal weight
(:data:`WEIGHT`), the instance-type term listed first, rendered by the serving chart (``gennstack-serving.spareAntiAffinity``)
for the standing spares and so for the ones the interruption handler adds on a signal (it only
scales that Deployment).

What the two schedulers do with it, and what :func:`rank_offerings` reproduces for the simulator:

- Karpenter v1.14.1 first tries a pod's preferences as if required, and on failure relaxes them one
  at a time, preferred pod anti-affinity terms heaviest first
  (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/provisioning/scheduling/preferences.go
  ``Relax``, ``removePreferredPodAntiAffinityTerm``: a stable sort by weight, descending, then the
  first term goes). With equal weights the first listed, the instance-type term, goes first. So a
  new spare node goes to an offering in a zone with no serving replica of the generation and of
  another instance type; failing that (always, for a generation of one instance type: inf2, trn2),
  in another zone; failing that, anywhere the NodePool allows. The kube-scheduler scores existing
  nodes by the same terms (InterPodAffinity: each matching pod in the node's domain costs the
  weight), so there too a zone and a type with fewer replicas win.
- After a spot interruption warning Karpenter itself marks the reclaimed offering (instance type,
  zone, spot) unavailable for its launches for 3 minutes (aws/karpenter-provider-aws v1.14.1
  pkg/controllers/interruption/utils.go ``markUnavailableOfferings``, only for
  ``SpotInterruptionKind``; pkg/cache/cache.go ``UnavailableOfferingsTTL = 3 * time.Minute``). That
  covers "not on the offering just reclaimed" for every launch, ours included; GenNStack does not
  repeat it. A rebalance recommendation marks nothing: there the anti-affinity is what keeps a spare
  off the threatened offering.

Standard library only: the simulator (``gennstack simulate``) and the tests call it; the chart
renders the same weights (tests/serving/test_spare_placement.py holds them equal).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

ZONE_KEY = "topology.kubernetes.io/zone"
INSTANCE_TYPE_KEY = "node.kubernetes.io/instance-type"
# Equal, and the instance-type term first: Karpenter drops the heaviest term first, the first
# listed among equals, so another zone is asked for with another type, then alone, then nothing.
WEIGHT = 100
TERM_KEYS = (INSTANCE_TYPE_KEY, ZONE_KEY)


@dataclass(frozen=True, order=True)
class Offering:
    """An EC2 spot (or on-demand) offering: what one correlated reclaim takes."""

    zone: str
    instance_type: str


def spare_anti_affinity(serving_labels: dict[str, str]) -> dict:
    """The ``affinity`` of a warm spare's pod: preferred anti-affinity to the serving pods
    matching ``serving_labels``, by zone and by instance type (what the chart renders)."""
    if not serving_labels:
        raise ValueError("serving_labels: got an empty selector; it would repel the spare from every pod")
    selector = {"matchLabels": dict(serving_labels)}
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": WEIGHT, "podAffinityTerm": {"topologyKey": key, "labelSelector": selector}}
        for key in TERM_KEYS
    ]}}


def placement_tier(offering: Offering, replicas: Iterable[Offering]) -> int:
    """0: another zone and another type than every replica; 1: another zone; 2: anywhere."""
    replicas = list(replicas)
    zones = {r.zone for r in replicas}
    types = {r.instance_type for r in replicas}
    if offering.zone in zones:
        return 2
    return 0 if offering.instance_type not in types else 1


def rank_offerings(candidates: Sequence[Offering], replicas: Iterable[Offering], *,
                   unavailable: Collection[Offering] = ()) -> list[Offering]:
    """The candidates a spare's new node may launch on, best first, in Karpenter's relaxation order
    (:func:`placement_tier`); ``unavailable``: what Karpenter's unavailable-offerings cache holds
    (it launches nothing there). Ties keep the candidates' order (the NodePool's, then Karpenter's
    price order, which this module does not model)."""
    replicas = list(replicas)
    usable = [c for c in candidates if c not in set(unavailable)]
    return sorted(usable, key=lambda c: placement_tier(c, replicas))


def zones_can_spread(zones: Collection[str]) -> bool:
    """Whether one correlated reclaim can be kept from taking every replica: more than one zone."""
    return len(set(zones)) > 1
