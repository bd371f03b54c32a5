"""`gennstack simulate` pinned on small hand-computed scenarios, and the README block it generates."""

from __future__ import annotations

from pathlib import Path

import pytest

from gennstack.serving.spare_placement import Offering
from gennstack.simulate.cli import render
from gennstack.simulate.engine import MOVES_BACK, Sim, Workload, generation_model
from gennstack.simulate.trace import Burst, Trace, TraceParams
from gennstack_infra.components.interruption_handler import DELETION_COST_GENERATIONS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
PRICES = {"inf2.48xlarge": {"spot": 4.0, "on-demand": 10.0}}


def test_one_reclaim_of_a_lone_plain_karpenter_replica() -> None:
    """1 h, one replica, 1 req/s, 20 s streams, capacity 1 req/s; one burst on us-east-1a at 600 s
    (share 1, window 0: the node is warned at 600 s, reclaimed at 720 s).

    Plain Karpenter: the replica starts in us-east-1a (the first offering); at the warning the
    replacement is created and launches in us-east-1b (1a is short and in Karpenter's cache), Ready
    at 600 + 900 = 1500 s. From the 600 s step to the 1440 s step no replica serves: 15 steps x 60 s
    x 1 req/s = 900 failed; ready 3600 - 900 = 2700 s. At the reclaim it holds 1 req/s x 20 s = 20
    streams, broken (no drain). Spot node-hours: the old node steps 0..660 (12 x 60 s = 0.2 h), the
    new one steps 600..3540 (50 x 60 s = 0.8333 h): 1.0333 h x $4 = $4.1333. All on-demand: 1 h x
    $10, nothing lost.
    """
    trace = Trace(TraceParams(hours=1, burst_share=1.0, burst_window_s=0.0),
                  (Burst(Offering("us-east-1a", "inf2.48xlarge"), 600.0, 3600.0, None, 7),))
    workload = Workload(replicas=1, rate=1.0, stream_s=20.0, capacity=1.0)
    plain = Sim(trace, workload, "Karpenter spot + on-demand fallback", PRICES).run()
    assert (plain.ready_seconds, plain.requests, plain.failed, plain.broken) == (2700.0, 3600.0, 900.0, 20.0)
    assert plain.node_hours["spot"] == pytest.approx(1.0333333) and plain.node_hours["on-demand"] == 0.0
    assert plain.cost == pytest.approx(4.1333333)
    od = Sim(trace, workload, "all on-demand", PRICES).run()
    assert (od.failed, od.broken, od.cost) == (0.0, 0.0, pytest.approx(10.0))


def test_no_bursts_costs_replicas_and_standing_spares() -> None:
    """1 h, no bursts, 2 replicas and 1 standing spare: all on-demand 2 x $10 = $20; plain spot
    2 x $4 = $8; GenNStack (today and with issue 31) 3 spot nodes x $4 = $12; at 1 req/s the two
    replicas (0.95 req/s each) lose nothing."""
    trace = Trace(TraceParams(hours=1), ())
    workload = Workload(replicas=2, spare_baseline=1, rate=1.0)
    costs = {p: Sim(trace, workload, p, PRICES).run() for p in
             ("all on-demand", "Karpenter spot + on-demand fallback", "GenNStack today", "GenNStack with issue 31")}
    assert [round(r.cost, 6) for r in costs.values()] == [20.0, 8.0, 12.0, 12.0]
    assert all(r.failed == r.broken == 0 for r in costs.values())


def test_a_zone_short_of_spot_gets_an_on_demand_replica_before_another_zone_gets_two() -> None:
    """1 h, 3 replicas (one per zone), no spare, 2 req/s at 0.95 each; spot short in us-east-1a for
    the whole hour from a burst at 600 s (warned at 600 s, reclaimed at 720 s).

    GenNStack: the doomed pod terminates (topology ignores it), so us-east-1a has none: the
    replacement keeps the spread on the on-demand pool there (Karpenter tries every NodePool before
    it relaxes ScheduleAnyway), Ready at 600 + 900 = 1500 s. Steps 600..1440 serve 2 replicas: 15 x
    60 s x (2 - 1.9) = 90 failed; the on-demand node runs steps 600..3540: 50 x 60 s = 0.8333 h.
    The reclaim holds 2 / 2 x 20 = 20 streams; inf2 does not drain, stream resume saves them.
    Plain Karpenter (no spread): all three start on the first offering, us-east-1a, the burst takes
    them together and their replacements all go to the next spot offering, us-east-1b: the hour stays
    on spot."""
    trace = Trace(TraceParams(hours=1, burst_share=1.0, burst_window_s=0.0),
                  (Burst(Offering("us-east-1a", "inf2.48xlarge"), 600.0, 3600.0, None, 7),))
    workload = Workload(replicas=3, spare_baseline=0, rate=2.0, capacity=0.95)
    ours = Sim(trace, workload, "GenNStack today", PRICES)
    result = ours.run()
    assert sorted((p.node.offering.zone, p.node.capacity_type) for p in ours.pods) == [
        ("us-east-1a", "on-demand"), ("us-east-1b", "spot"), ("us-east-1c", "spot")]
    assert result.failed == pytest.approx(90.0) and result.broken == 0.0
    assert result.node_hours["on-demand"] == pytest.approx(50 / 60)
    plain = Sim(trace, workload, "Karpenter spot + on-demand fallback", PRICES)
    plain_result = plain.run()
    assert [p.node.offering.zone for p in plain.pods] == ["us-east-1b"] * 3
    assert plain_result.node_hours["on-demand"] == 0.0 and plain_result.broken > 0


def test_each_generation_runs_on_its_own_configuration() -> None:
    inf2, g6e = generation_model("inf2"), generation_model("g6e")
    assert inf2.instance_types == ("inf2.48xlarge",) and not inf2.drain_signals and not inf2.moves_back
    assert len(g6e.instance_types) == 5 and g6e.drain_signals == {"rebalance", "warning"} and g6e.moves_back
    assert (inf2.cold_start_s, inf2.warm_start_s, g6e.cold_start_s) == (900.0, 480.0, 180.0)
    # The generations the reconciler moves back are those the handler keeps a deletion cost on.
    assert set(MOVES_BACK) == set(DELETION_COST_GENERATIONS)
    with pytest.raises(ValueError, match="generation: got 'p5'"):
        generation_model("p5")


def test_a_trace_offering_without_a_price_is_named() -> None:
    trace = Trace(TraceParams(hours=1, instance_types=("g6e.xlarge",)), ())
    with pytest.raises(ValueError, match=r"prices: no price for \['g6e.xlarge'\]"):
        Sim(trace, Workload(), "GenNStack today", PRICES, generation_model("g6e"))


def test_an_unpriced_generation_is_an_error_when_asked_for_and_a_note_otherwise() -> None:
    from gennstack.cost.prices import PriceError
    with pytest.raises(PriceError, match="--generation trn2: no on-demand price for"):
        render(TraceParams(hours=1), generations=("trn2",), strict=True, seeds=range(1, 2))
    block = render(TraceParams(hours=1), generations=("trn2",), seeds=range(1, 2))
    assert "gen2-trn2 is not simulated" in block
    priced = render(TraceParams(hours=1), generations=("trn2",), prices={"trn2.48xlarge": 40.0}, seeds=range(1, 2))
    assert "| gen2-trn2 | GenNStack with issue 31 |" in priced


def test_unknown_policy_is_named() -> None:
    with pytest.raises(ValueError, match="policy: got 'spot only'"):
        Sim(Trace(TraceParams(hours=1), ()), Workload(), "spot only", PRICES)


def test_readme_and_docs_blocks_are_the_commands_output() -> None:
    block = README.split("<!-- spot-simulation:start -->\n", 1)[1].split("\n<!-- spot-simulation:end -->", 1)[0]
    assert block == render(detail=False)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "spot-drills.md").read_text()
    detail = docs.split("<!-- spot-simulation-detail:start -->\n", 1)[1].split("\n<!-- spot-simulation-detail:end -->", 1)[0]
    assert detail == render()
    # Right after the local-drill block.
    assert README.index("<!-- local-drill:end -->") < README.index("<!-- spot-simulation:start -->")
