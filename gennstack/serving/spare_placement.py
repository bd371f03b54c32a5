"""Where a warm spare goes: away from the reclaim that threatens the replicas it protects.

Spot reclaims are correlated by offering (instance type x zone): of 2,635 interruption events,
more than 92 % of those of one instance type in one zone came within 3 minutes of each other
(Spot-and-Scoot, arXiv 2604.16457, as issue 31 quotes it). A spare in the zone and instance type
of the serving replicas is likely reclaimed with them. So a spare's pod carries *preferred* pod
anti-affinity to its generation's serving pods by zone (:data:`WEIGHT`), rendered by the serving
chart (``gennstack-serving.spareAntiAffinity``) for the standing spares and so for the ones the
interruption handler adds on a signal (it only scales that Deployment). The multi-node spare groups
(a LeaderWorkerSet in a namespace of their own) carry the same term, naming the serving namespace:
their leader's zone is the group's (LWS v0.10.0's exclusive-topology webhook pins the workers to it).

Not by instance type, though issue 31 asked for "another instance type where the generation has
several": ``gennstack simulate`` measured that term on gen3-g6e (five g6e sizes, one L40S each,
priced $1.861/h to $10.493/h on demand), seeds 1-30: it sent spares to the next size up, and a
serving pod that preempts a spare stays on that pricier node (nodes consolidate only when empty),
so the next spare went a size further: 32.9 % cheaper than all on-demand with 0.207 % of requests
lost, against 42.2 % and 0.225 % with the zone term alone. For inf2 and trn2 (one type) the term
could never be met. docs/spot-drills.md has the table.

What the two schedulers do with it, and what :func:`rank_offerings` reproduces for the simulator:

- Karpenter v1.14.1 first tries a pod's preferences as if required, and on failure relaxes them one
  at a time (kubernetes-sigs/karpenter v1.14.1 pkg/controllers/provisioning/scheduling/preferences.go
  ``Relax``, ``removePreferredPodAntiAffinityTerm``). So a new spare node goes to a zone with no
  serving replica of the generation; failing that (every zone holds one: as many replicas as
  zones), anywhere the NodePool allows, the cheapest offering first. The kube-scheduler scores
  existing nodes by the same term (InterPodAffinity: each matching pod in the node's zone costs
  the weight), so there too a zone with fewer replicas wins.
- After a spot interruption warning Karpenter itself marks the reclaimed offering (instance type,
  zone, spot) unavailable for its launches for 3 minutes (aws/karpenter-provider-aws v1.14.1
  pkg/controllers/interruption/utils.go ``markUnavailableOfferings``, only for
  ``SpotInterruptionKind``; pkg/cache/cache.go ``UnavailableOfferingsTTL = 3 * time.Minute``). That
  covers "not on the offering just reclaimed" for every launch, ours included; GenNStack does not
  repeat it. A rebalance recommendation marks nothing: there the anti-affinity is what keeps a spare
  out of the threatened zone while a zone without a replica exists. A second, lighter term to the
  *drained* serving pods (``gennstack.io/routable: "false"``: Karpenter relaxes the heaviest term
  first, so it would have kept a spare out of a rebalance-threatened zone even when every zone holds
  a replica) was measured and not adopted: ``gennstack simulate`` seeds 1-30, gen3-g6e, 41.9 %
  cheaper than all on-demand with 0.24 % of requests lost, against 42.2 % and 0.22 % without it (the
  trace's reclaims are correlated by offering, and the other zones' cheapest offering costs more).

Standard library only: the simulator (``gennstack simulate``) and the tests call it; the chart
renders the same weights (tests/serving/test_spare_placement.py holds them equal).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

ZONE_KEY = "topology.kubernetes.io/zone"
WEIGHT = 100
TERM_KEYS = (ZONE_KEY,)


@dataclass(frozen=True, order=True)
class Offering:
    """An EC2 spot (or on-demand) offering: what one correlated reclaim takes."""

    zone: str
    instance_type: str


def spare_anti_affinity(serving_labels: dict[str, str], *, namespaces: Sequence[str] = ()) -> dict:
    """The ``affinity`` of a warm spare's pod: preferred anti-affinity to the serving pods
    matching ``serving_labels``, by zone (what the chart renders). ``namespaces``: the serving pods'
    namespace, for spares in another one (the multi-node spare groups); empty: the spare's own
    (core/v1 PodAffinityTerm: no namespaces and no namespaceSelector mean the pod's namespace)."""
    if not serving_labels:
        raise ValueError("serving_labels: got an empty selector; it would repel the spare from every pod")
    selector = {"matchLabels": dict(serving_labels)}
    scope = {"namespaces": list(namespaces)} if namespaces else {}
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": WEIGHT, "podAffinityTerm": {"topologyKey": key, **scope, "labelSelector": selector}}
        for key in TERM_KEYS
    ]}}


def placement_tier(offering: Offering, replicas: Iterable[Offering]) -> int:
    """0: another zone than every replica's; 1: anywhere."""
    return 1 if offering.zone in {r.zone for r in replicas} else 0


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
