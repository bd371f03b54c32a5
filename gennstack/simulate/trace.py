"""Spot traces: per offering, when a reclaim burst warns, reclaims and how long spot stays short.

No public spot trace for inf2, trn2 or g6e exists that this repository could read: the traces
SkyServe replayed (arXiv 2411.01438) are of GCP and AWS GPU types (p3, g4dn and similar) and no
network but PyPI is reachable here. So :func:`generate` draws one, seeded. Its correlation is the
published statistic issue 31 quotes (Spot-and-Scoot, arXiv 2604.16457: > 92 % of one instance
type's interruptions in one zone within 3 minutes of each other): in a burst, each spot node on the
offering is warned with probability ``burst_share`` at a uniform offset within ``burst_window_s``.
The burst rate, how long spot capacity stays short after one and the share of bursts preceded by a
rebalance recommendation are *assumptions* (:class:`TraceParams` defaults), stated in every table.
The two-minute warning is AWS's (EC2 Spot Instance interruption notice).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from gennstack.serving.spare_placement import Offering

WARNING_S = 120.0  # EC2 Spot Instance interruption notice: two minutes before the reclaim


@dataclass(frozen=True)
class Burst:
    """One correlated reclaim of an offering: warning at ``at``, spot short until ``short_until``."""

    offering: Offering
    at: float
    short_until: float
    rebalance_lead_s: float | None  # a rebalance recommendation this long before the warning, or none
    seed: int  # which of the offering's spot nodes it takes (with burst_share, burst_window_s)


@dataclass(frozen=True)
class TraceParams:
    hours: float = 22.0  # SkyServe's Chatbot Arena replay ran ~22 h
    zones: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c")
    instance_types: tuple[str, ...] = ("inf2.48xlarge",)
    burst_mean_gap_h: float = 8.0  # assumption: mean hours between bursts per offering (Poisson)
    short_mean_h: float = 1.5  # assumption: mean hours spot stays short after a burst (exponential)
    burst_share: float = 0.92  # Spot-and-Scoot: > 92 % within 3 minutes
    burst_window_s: float = 180.0
    rebalance_share: float = 0.5  # assumption: bursts preceded by a rebalance recommendation
    rebalance_lead_s: float = 600.0  # assumption: how long before the warning it comes
    seed: int = 31

    def describe(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Trace:
    params: TraceParams
    bursts: tuple[Burst, ...]

    @property
    def offerings(self) -> tuple[Offering, ...]:
        return tuple(Offering(z, t) for z in self.params.zones for t in self.params.instance_types)

    def spot_short(self, offering: Offering, now: float) -> bool:
        return any(b.offering == offering and b.at <= now < b.short_until for b in self.bursts)

    def reclaimed(self, burst: Burst, node_index: int) -> float | None:
        """When ``burst`` warns the offering's node ``node_index`` (None: the node is spared)."""
        rng = random.Random(f"{burst.seed}:{node_index}")
        if rng.random() >= self.params.burst_share:
            return None
        return burst.at + rng.uniform(0.0, self.params.burst_window_s)


def generate(params: TraceParams) -> Trace:
    rng = random.Random(params.seed)
    end = params.hours * 3600.0
    bursts: list[Burst] = []
    for offering in (Offering(z, t) for z in params.zones for t in params.instance_types):
        at = rng.expovariate(1.0 / (params.burst_mean_gap_h * 3600.0))
        while at < end:
            short = rng.expovariate(1.0 / (params.short_mean_h * 3600.0))
            lead = params.rebalance_lead_s if rng.random() < params.rebalance_share else None
            bursts.append(Burst(offering, at, at + short, lead, rng.randrange(2**31)))
            at = at + short + rng.expovariate(1.0 / (params.burst_mean_gap_h * 3600.0))
    return Trace(params, tuple(sorted(bursts, key=lambda b: (b.at, b.offering))))
