"""The scaling policy GenNStack renders, driven through a model of KEDA + the HPA (tests/autoscaling/hpa_model.py).

The ScaledObjects come from the real chart rendered with the values CDK builds from the default
config; the model follows kubernetes v1.36 pkg/controller/podautoscaler/horizontal.go and
replica_calculator.go, and KEDA v2.20.2 pkg/fallback/fallback.go and
pkg/scaling/executor/scale_scaledobjects.go (see the model's docstring for each step). Load is
in-flight requests over all of a generation's replicas; the HPA reads it every 15 s as Prometheus
last scraped it (every SCRAPE_SECONDS: the vLLM PodMonitor's 15 s).
"""

from __future__ import annotations

import math

import pytest

from gennstack.config import load_config
from tests import helm
from tests.autoscaling.hpa_model import SCRAPE_SECONDS, Autoscaler, Policy, Rules, ScalingSpec, simulate
from tests.serving.conftest import CHART, NAMESPACE, cdk_values

pytestmark = pytest.mark.slow

POOLS = {"trn2": "gen2-trn2", "g6e": "gen3-g6e"}


@pytest.fixture(scope="module")
def specs() -> dict[str, ScalingSpec]:
    objects = helm.render(CHART, cdk_values(), namespace=NAMESPACE)
    scaled = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ScaledObject"}
    return {gen: ScalingSpec.from_scaled_object(scaled[pool]) for gen, pool in POOLS.items()}


def last_seen_above(steps, level: float) -> float:
    """When the HPA last read a load above ``level``: stabilization windows count from there."""
    return max(s.time for s in steps if s.seen is not None and s.seen > level)


def changes(steps) -> list[tuple[float, int, int]]:
    """(time, before, after) of every replica change."""
    return [(b.time, a.replicas, b.replicas) for a, b in zip(steps, steps[1:]) if a.replicas != b.replicas]


def reversals(steps) -> int:
    """How often the direction of scaling flips (up then down, or down then up)."""
    directions = [1 if after > before else -1 for _, before, after in changes(steps)]
    return sum(1 for a, b in zip(directions, directions[1:]) if a != b)


def assert_never_below_in_flight_work(spec: ScalingSpec, steps, max_num_seqs: int) -> None:
    """No scale-down leaves fewer replicas than the load seen needs at the target, nor fewer batch
    slots than the requests in flight at that moment."""
    for a, b in zip(steps, steps[1:]):
        if b.replicas < a.replicas:
            assert b.seen is not None, f"t={b.time}: scaled down without a metric"
            assert b.replicas >= math.ceil(b.seen / spec.target), f"t={b.time}: {b.replicas} replicas for {b.seen} in flight"
            assert b.replicas * max_num_seqs >= b.demand, f"t={b.time}: {b.replicas} x {max_num_seqs} slots < {b.demand}"


def test_the_rendered_policy_is_the_configured_one(specs) -> None:
    """What the simulations below drive: the defaults of gennstack/serving/config.py, rendered."""
    serving = load_config({}).serving
    for gen in ("trn2", "g6e"):
        spec, section = specs[gen], getattr(serving, gen)
        assert (spec.min_replicas, spec.max_replicas, spec.target) == (
            section.min_replicas, section.max_replicas, section.target_ongoing_requests)
        assert spec.scale_up.stabilization_seconds == section.scale_up_delay_seconds
        assert spec.scale_down.stabilization_seconds == section.scale_down_delay_seconds
        assert spec.scale_up == Rules(60, "Max", (Policy("Pods", 2, 60), Policy("Percent", 100, 60)))
        assert spec.scale_down.select == "Min" and spec.scale_down.policies == (Policy("Pods", 1, 120),)
        assert (spec.fallback_threshold, spec.fallback_replicas, spec.fallback_behavior) == (
            3, section.min_replicas, "currentReplicasIfHigher")


def test_hpa_formula_and_tolerance() -> None:
    """replica_calculator.go: ceil(usage / target) outside a 10% band around the target, else unchanged."""
    spec = ScalingSpec(1, 10, 48.0, Rules(0, "Max", (Policy("Percent", 1000, 15),)),
                       Rules(0, "Min", (Policy("Percent", 100, 15),)), 3, 1, "currentReplicasIfHigher")
    assert Autoscaler(spec, 2).sync(0, 2 * 48 * 1.1) == 2  # ratio 1.1: within tolerance
    assert Autoscaler(spec, 2).sync(0, 2 * 48 * 1.11) == 3  # ceil(106.6 / 48)
    assert Autoscaler(spec, 2).sync(0, 2 * 48 * 0.9) == 2
    assert Autoscaler(spec, 4).sync(0, 100) == 3  # ratio 0.52: ceil(100 / 48)
    assert Autoscaler(spec, 4).sync(0, 1000) == 10  # capped at maxReplicas


def test_g6e_ramp_scales_up_without_lag_or_overshoot(specs) -> None:
    """In-flight requests ramp from 20 to 320 over 20 minutes and stay: replicas only rise, follow
    ceil(load / 48) within the scale-up delay, and stop at max_replicas (6)."""
    spec = specs["g6e"]

    def demand(t: float) -> float:
        return 20 + 300 * min(t, 1200) / 1200

    steps = simulate(spec, demand, duration=2400)
    assert all(b.replicas >= a.replicas for a, b in zip(steps, steps[1:])), changes(steps)
    assert steps[-1].replicas == spec.max_replicas == 6
    for step in steps:
        # What the load one scrape, the scale-up delay and one sync ago needs, less the tolerance.
        needed = min(spec.max_replicas, math.ceil(demand(step.time - SCRAPE_SECONDS - 60 - 15) * 0.9 / spec.target))
        assert step.replicas >= needed, f"t={step.time}: {step.replicas} replicas, load {step.demand}"
    assert_never_below_in_flight_work(spec, steps, 64)


def test_g6e_blip_adds_nothing_and_a_sustained_spike_scales_at_once(specs) -> None:
    """A load spike one scrape sees (SCRAPE_SECONDS), shorter than scale_up_delay_seconds (60), adds no replica;
    one that lasts adds them once every recommendation in the window is high (the HPA keeps those
    strictly newer than now - window: after window - sync), plus up to one scrape, at the policy's rate."""
    spec = specs["g6e"]
    blip = simulate(spec, lambda t: 400 if 600 <= t < 600 + SCRAPE_SECONDS else 60, duration=1800)
    assert changes(blip) == []
    spike = simulate(spec, lambda t: 400 if t >= 600 else 60, duration=1800)
    first = changes(spike)[0]
    assert first[1:] == (2, 4)  # Max(2 pods, 100%) in one period
    assert 600 + 60 - 15 <= first[0] <= 600 + 60 + SCRAPE_SECONDS
    assert spike[-1].replicas == 6
    assert reversals(spike) == 0


def test_g6e_drop_scales_down_slowly_and_never_below_load(specs) -> None:
    """From 280 in flight (6 replicas) load falls to 20: nothing is removed for scale_down_delay_seconds
    (600 s), then one replica per 120 s down to min_replicas (2); none of this flaps."""
    spec = specs["g6e"]
    steps = simulate(spec, lambda t: 280 if t < 900 else 20, duration=3600, start_replicas=6)
    downs = changes(steps)
    assert [d[1:] for d in downs] == [(6, 5), (5, 4), (4, 3), (3, 2)]
    assert downs[0][0] >= last_seen_above(steps, 100) + 600
    assert all(b[0] - a[0] >= 120 for a, b in zip(downs, downs[1:]))
    assert_never_below_in_flight_work(spec, steps, 64)


def test_g6e_partial_drop_stops_at_the_load(specs) -> None:
    """Load falls from 280 to 130: replicas fall only to ceil(130 / 48) = 3, and stay."""
    spec = specs["g6e"]
    steps = simulate(spec, lambda t: 280 if t < 600 else 130, duration=3600, start_replicas=6)
    assert steps[-1].replicas == 3
    assert min(s.replicas for s in steps) == 3
    assert_never_below_in_flight_work(spec, steps, 64)


def test_g6e_noisy_load_around_a_threshold_does_not_flap(specs) -> None:
    """Load that swings +-25% around 2.5 replicas' worth every scrape settles once and never reverses."""
    spec = specs["g6e"]
    pattern = [1.25, 0.75, 1.1, 0.8, 1.2, 0.9]

    def demand(t: float) -> float:
        return 120 * pattern[int(t // SCRAPE_SECONDS) % len(pattern)]

    steps = simulate(spec, demand, duration=7200)
    assert reversals(steps) == 0
    assert len(changes(steps)) <= 2
    assert_never_below_in_flight_work(spec, steps, 64)


def test_trn2_holds_a_node_through_short_lulls(specs) -> None:
    """trn2 (a replica loads ~800 GB, up to an hour): after scaling to 2, a 20-minute lull removes
    nothing (scale_down_delay_seconds 1800); a lull longer than that scales back to 1."""
    spec = specs["trn2"]

    def demand(t: float) -> float:
        if t < 600:
            return 8
        if t < 2400:
            return 22  # ceil(22 / 12) = 2
        if t < 3600:
            return 4  # 20 minutes
        if t < 6000:
            return 22
        return 4

    steps = simulate(spec, demand, duration=10800)
    assert [c[1:] for c in changes(steps)] == [(1, 2), (2, 1)]
    up, down = changes(steps)
    assert 600 + 60 - 15 <= up[0] <= 600 + 60 + SCRAPE_SECONDS
    assert down[0] >= last_seen_above(steps, 12) + 1800
    assert_never_below_in_flight_work(spec, steps, 16)


@pytest.mark.parametrize("generation", ["trn2", "g6e"])
def test_prometheus_outage_never_scales_down(specs, generation) -> None:
    """Prometheus unreachable for 20 minutes at high replicas while load falls: the HPA gets no
    metric for the first failed reads, then KEDA's fallback (max(current, min) replicas' worth):
    no replica is removed until the metric is back and the scale-down delay has passed."""
    spec = specs[generation]
    high = spec.max_replicas
    steps = simulate(spec, lambda t: 5, duration=5400, start_replicas=high, outage=(0, 1200))
    fallback_until = max(s.time for s in steps if s.seen is None)
    first_down = changes(steps)[0]
    assert first_down[1:] == (high, high - 1)
    assert first_down[0] >= fallback_until + spec.scale_down.stabilization_seconds
    assert steps[-1].replicas == spec.min_replicas
