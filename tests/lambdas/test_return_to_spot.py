"""The return-to-spot decision (lambdas/interruption_handler/return_to_spot.py), step by step."""

from __future__ import annotations

import pytest

from lambdas.interruption_handler.return_to_spot import (
    Action,
    Backoff,
    Move,
    Policy,
    Replica,
    decide,
    deletion_costs,
)

POLICY = Policy(settle_s=600, pending_bound_s=300, ready_bound_s=1800, drain_settle_s=30, drain_grace_s=600,
                backoff_base_s=300, backoff_cap_s=3600)


def spot(name: str, **kw) -> Replica:
    return Replica(name, node=f"n-{name}", capacity_type="spot", ready=True, routable=True, started_at=0, **kw)


def od(name: str, **kw) -> Replica:
    defaults = dict(node=f"n-{name}", capacity_type="on-demand", ready=True, routable=True, started_at=0)
    defaults.update(kw)
    return Replica(name, **defaults)


def test_the_whole_move_in_order():
    """start -> wait (pending, loading) -> drain -> wait (streams) -> delete -> complete; nothing below the minimum."""
    now = 1000.0
    replicas = [spot("a"), od("b")]
    d = decide(replicas, ready_minimum=1, move=None, backoff=Backoff(), now=now, policy=POLICY)
    assert (d.action, d.pod) == (Action.START, "b")
    move = d.move
    assert move == Move(pod="b", started_at=now)
    # The executor names the replacement once it exists; pending, then scheduled but loading.
    move = Move(pod="b", started_at=now, replacement="c")
    pending = Replica("c", node=None, capacity_type=None, ready=False, routable=True)
    d = decide([*replicas, pending], ready_minimum=1, move=move, backoff=Backoff(), now=now + 60, policy=POLICY)
    assert d.action is Action.WAIT and d.reason == "the replacement is pending"
    loading = Replica("c", node="n-c", capacity_type="spot", ready=False, routable=True)
    d = decide([*replicas, loading], ready_minimum=1, move=move, backoff=Backoff(), now=now + 400, policy=POLICY)
    assert d.action is Action.WAIT and d.reason == "the replacement is loading"
    ready = Replica("c", node="n-c", capacity_type="spot", ready=True, routable=True)
    d = decide([*replicas, ready], ready_minimum=1, move=move, backoff=Backoff(), now=now + 900, policy=POLICY)
    assert (d.action, d.pod) == (Action.DRAIN, "b")
    move = d.move
    assert move.drained_at == now + 900
    drained = od("b", routable=False, in_flight=3)
    d = decide([spot("a"), drained, ready], ready_minimum=1, move=move, backoff=Backoff(), now=now + 950, policy=POLICY)
    assert d.action is Action.WAIT and d.reason == "its streams are finishing"
    idle = od("b", routable=False, in_flight=0)
    d = decide([spot("a"), idle, ready], ready_minimum=1, move=move, backoff=Backoff(), now=now + 950, policy=POLICY)
    assert (d.action, d.pod) == (Action.DELETE, "b")
    d = decide([spot("a"), ready], ready_minimum=1, move=move, backoff=Backoff(failures=2), now=now + 990, policy=POLICY)
    assert d.action is Action.COMPLETE and d.move is None and d.backoff == Backoff()


def test_streams_are_bounded_by_the_grace():
    move = Move(pod="b", started_at=0, replacement="c", drained_at=100)
    busy = [spot("a"), od("b", routable=False, in_flight=5), spot("c")]
    assert decide(busy, ready_minimum=1, move=move, backoff=Backoff(), now=699, policy=POLICY).action is Action.WAIT
    assert decide(busy, ready_minimum=1, move=move, backoff=Backoff(), now=700, policy=POLICY).action is Action.DELETE


def test_capacity_errors_back_off_exponentially_and_capped():
    backoff = Backoff()
    now = 10_000.0  # the on-demand replica (started at 0) has settled
    delays = []
    for _ in range(6):
        move = Move(pod="b", started_at=now, replacement="c")
        pending = Replica("c", node=None, capacity_type=None, ready=False, routable=True)
        d = decide([spot("a"), od("b"), pending], ready_minimum=1, move=move, backoff=backoff, now=now + 10,
                   policy=POLICY, capacity_error=True)
        assert (d.action, d.move, d.replacement) == (Action.CANCEL, None, "c")
        backoff = d.backoff
        delays.append(backoff.retry_at - (now + 10))
        # Nothing starts before retry_at; at retry_at, the next attempt.
        early = decide([spot("a"), od("b")], ready_minimum=1, move=None, backoff=backoff, now=backoff.retry_at - 1,
                       policy=POLICY)
        assert early.action is Action.WAIT and early.retry_at == backoff.retry_at
        now = backoff.retry_at
        assert decide([spot("a"), od("b")], ready_minimum=1, move=None, backoff=backoff, now=now,
                      policy=POLICY).action is Action.START
    assert delays == [300, 600, 1200, 2400, 3600, 3600]


def test_a_replacement_stuck_pending_past_the_bound_is_a_failure():
    move = Move(pod="b", started_at=0, replacement="c")
    pending = Replica("c", node=None, capacity_type=None, ready=False, routable=True)
    assert decide([od("b"), pending], ready_minimum=1, move=move, backoff=Backoff(), now=299,
                  policy=POLICY).action is Action.WAIT
    d = decide([od("b"), pending], ready_minimum=1, move=move, backoff=Backoff(), now=300, policy=POLICY)
    assert d.action is Action.CANCEL and d.backoff.failures == 1 and d.backoff.retry_at == 600


def test_never_below_the_ready_minimum():
    # Two serving replicas, minimum 2: the replacement counts, so draining the on-demand one is fine...
    move = Move(pod="b", started_at=0, replacement="c")
    assert decide([spot("a"), od("b"), spot("c")], ready_minimum=2, move=move, backoff=Backoff(), now=10,
                  policy=POLICY).action is Action.DRAIN
    # ...but not when another replica has stopped serving meanwhile.
    gone = Replica("a", node="n-a", capacity_type="spot", ready=False, routable=True)
    d = decide([gone, od("b"), spot("c")], ready_minimum=2, move=move, backoff=Backoff(), now=10, policy=POLICY)
    assert d.action is Action.WAIT and "ready minimum" in d.reason
    # Drained, then a replica is lost: the drained pod goes back into routing instead of being deleted.
    drained = Move(pod="b", started_at=0, replacement="c", drained_at=5)
    d = decide([gone, od("b", routable=False, in_flight=0), spot("c")], ready_minimum=2, move=drained,
               backoff=Backoff(), now=700, policy=POLICY)
    assert (d.action, d.pod, d.move.drained_at) == (Action.RESTORE, "b", None)
    # Nothing starts while the generation is below its minimum.
    d = decide([gone, od("b")], ready_minimum=2, move=None, backoff=Backoff(), now=10_000, policy=POLICY)
    assert d.action is Action.WAIT


def test_one_move_at_a_time():
    """With a move in progress, a second on-demand replica is never started on."""
    move = Move(pod="b", started_at=0, replacement="c")
    loading = Replica("c", node="n-c", capacity_type="spot", ready=False, routable=True)
    for now in (10, 100, 1000):
        d = decide([od("b"), od("d"), loading], ready_minimum=1, move=move, backoff=Backoff(), now=now, policy=POLICY)
        assert d.action is not Action.START and d.move == move and d.pod == "b"


def test_reserved_never_moves_and_disabled_does_nothing():
    reserved = Replica("r", node="n-r", capacity_type="reserved", ready=True, routable=True, started_at=0)
    assert decide([reserved], ready_minimum=0, move=None, backoff=Backoff(), now=1e6, policy=POLICY).action is Action.NONE
    off = Policy(enabled=False)
    assert decide([od("b")], ready_minimum=0, move=None, backoff=Backoff(), now=1e6, policy=off).action is Action.NONE


def test_settle_and_active_interruptions_hold_the_start():
    fresh = od("b", started_at=1000)
    d = decide([spot("a"), fresh], ready_minimum=1, move=None, backoff=Backoff(), now=1100, policy=POLICY)
    assert d.action is Action.WAIT and d.retry_at == 1600
    d = decide([spot("a"), od("b")], ready_minimum=1, move=None, backoff=Backoff(), now=1e6, policy=POLICY,
               interruptions_active=1)
    assert d.action is Action.WAIT


def test_deletion_cost_orders_on_demand_first_reserved_last():
    reserved = Replica("r", node="n-r", capacity_type="reserved", ready=True, routable=True)
    unscheduled = Replica("u", node=None, capacity_type=None, ready=False, routable=True)
    costs = deletion_costs([spot("a"), od("b"), reserved, unscheduled])
    assert costs == {"a": 0, "b": -100, "r": 100}
    assert sorted(costs, key=costs.get) == ["b", "a", "r"]


def test_bad_policy_is_named():
    with pytest.raises(ValueError, match="backoff_cap_s"):
        Policy(backoff_base_s=100, backoff_cap_s=10)


def test_default_backoff_outlasts_karpenters_unavailable_offering_mark():
    """aws/karpenter-provider-aws v1.14.1 pkg/cache/cache.go: "UnavailableOfferingsTTL = 3 * time.Minute"."""
    from lambdas.interruption_handler.return_to_spot import KARPENTER_UNAVAILABLE_OFFERINGS_TTL_S

    assert KARPENTER_UNAVAILABLE_OFFERINGS_TTL_S == 180
    assert Policy().backoff_base_s > KARPENTER_UNAVAILABLE_OFFERINGS_TTL_S
    assert Policy().pending_bound_s > KARPENTER_UNAVAILABLE_OFFERINGS_TTL_S


def test_the_dearest_settled_on_demand_replica_moves_first():
    cheap = od("a", started_at=0, premium_usd_per_hour=1.1)
    dear = od("b", started_at=100, premium_usd_per_hour=6.4)
    unknown = od("c", started_at=0)
    d = decide([cheap, dear, unknown], ready_minimum=1, move=None, backoff=Backoff(), now=10_000, policy=POLICY)
    assert (d.action, d.pod) == (Action.START, "b")
    # without prices: the longest-serving, then by name
    d = decide([od("y", started_at=5), od("x", started_at=5), od("z", started_at=9)], ready_minimum=1, move=None,
               backoff=Backoff(), now=10_000, policy=POLICY)
    assert d.pod == "x"


def test_after_the_release_the_pod_goes_or_comes_back_into_routing():
    """DELETE records the release; the HPA then removes the pod (COMPLETE), or keeps it past
    release_bound_s (RESTORE, cause kept, the move ends without a backoff), or the generation falls
    below its minimum meanwhile (RESTORE at once, cause below_minimum)."""
    drained = Move(pod="b", started_at=0.0, replacement="c", drained_at=100.0)
    replicas = [spot("a"), spot("c"), od("b", routable=False)]
    d = decide(replicas, ready_minimum=2, move=drained, backoff=Backoff(), now=700.0, policy=POLICY)
    assert d.action is Action.DELETE and d.move == Move(pod="b", started_at=0.0, replacement="c", drained_at=100.0,
                                                        released_at=700.0)
    released = d.move
    d = decide(replicas, ready_minimum=2, move=released, backoff=Backoff(), now=700.0 + POLICY.release_bound_s - 1,
               policy=POLICY)
    assert (d.action, d.move, d.retry_at) == (Action.WAIT, released, 700.0 + POLICY.release_bound_s)
    d = decide(replicas, ready_minimum=2, move=released, backoff=Backoff(failures=1), now=700.0 + POLICY.release_bound_s,
               policy=POLICY)
    assert (d.action, d.cause, d.move, d.backoff) == (Action.RESTORE, "kept", None, Backoff(failures=1))
    lost = [Replica("a", node="n-a", capacity_type="spot", ready=False, routable=True), spot("c"), od("b", routable=False)]
    d = decide(lost, ready_minimum=2, move=released, backoff=Backoff(), now=800.0, policy=POLICY)
    assert (d.action, d.cause, d.move) == (Action.RESTORE, "below_minimum", None)
    d = decide([spot("a"), spot("c")], ready_minimum=2, move=released, backoff=Backoff(failures=2), now=800.0,
               policy=POLICY)
    assert (d.action, d.move, d.backoff) == (Action.COMPLETE, None, Backoff())
