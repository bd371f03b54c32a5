"""The replay: one generation's serving replicas and warm spares through a spot trace, per policy.

Time advances in ``Workload.step_s`` steps. What decides is GenNStack's own code, imported, not
redone here: the interruption handler's warm-spare count (``settings.WarmSpare.desired_replicas``
over the records ``interruptions.is_active`` counts), its drain on a signal, the return-to-spot
decision (``return_to_spot.decide``), the spare placement (``gennstack.serving.spare_placement``)
and the NodePool weights (``gennstack.generations``). What is *modelled* (Karpenter and EC2, and the
requests): a launch takes the highest-weight NodePool with an offering to launch on (spot unless
every spot offering is short or in Karpenter's 3-minute unavailable-offerings cache after a spot
warning, then on-demand), the cheapest such offering first (Karpenter's price-capacity-optimized
allocation, reduced to price: capacity pools are not modelled; one replica per node, so a 4-GPU
g6e.12xlarge is priced whole for one replica); nodes consolidate only when empty, so an on-demand
replica stays unless moved; a replacement replica is created at the warning (Karpenter v1.14.1
deletes the NodeClaim on a spot interruption message, CordonAndDrain), Ready after the
generation's ``cold_start_s`` on a new node or ``warm_start_s`` on a preempted warm spare's node
(:data:`START_TIMES`); requests arrive at ``rate`` and each Ready replica in routing serves
``capacity`` of them; streams a replica holds when its node goes break, unless it was drained (the
drill: 159 of 159 finished) or resume saves them.

Each generation is simulated with its own instance types, drain signals and start times
(:func:`generation_model`): gen1-inf2 drains on no signal and never moves back to spot (its
replicas are Ray Serve's); gen2-trn2 and gen3-g6e drain and, in the policy "with issue 31", move
(``MOVES_BACK``; ``interruptions.return_to_spot``, on by default, docs/spot-drills.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from gennstack.config import GenNStackConfig, InterruptionConfig
from gennstack.generations import ON_DEMAND_WEIGHT, SPOT_WEIGHT
from gennstack.serving.spare_placement import Offering, placement_tier, rank_offerings
from gennstack.simulate.trace import WARNING_S, Trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # lambdas/ beside gennstack/ (editable install)
from lambdas.interruption_handler import return_to_spot as rts  # noqa: E402
from lambdas.interruption_handler.interruptions import active_by_generation  # noqa: E402
from lambdas.interruption_handler.settings import DEFAULT_RECORD_TTL_SECONDS, WarmSpare  # noqa: E402

KARPENTER_UNAVAILABLE_TTL_S = 180.0  # karpenter-provider-aws v1.14.1 pkg/cache/cache.go UnavailableOfferingsTTL
GENERATIONS = ("inf2", "trn2", "g6e")
# Generations whose on-demand replicas the reconciler moves back to spot: the Deployment ones
# (gennstack_infra's DELETION_COST_GENERATIONS; tests/test_simulate.py holds the two equal).
MOVES_BACK = ("trn2", "g6e")
# Seconds from "a pod needs a node" to "the model answers": (cold, on a preempted warm spare's node),
# the upper ends of docs/serving.md's cold-start budget (estimates, not measurements): inf2 ~6-15 min
# cold, ~3-8 min on a warm spare; trn2 ~15-30 / ~10-20 min; g6e ~1-3 / ~1-2 min.
START_TIMES = {"inf2": (900.0, 480.0), "trn2": (1800.0, 1200.0), "g6e": (180.0, 120.0)}
# The handler's defaults (gennstack/config.py): the grace an interruption stays active.
_INTERRUPTIONS = InterruptionConfig()
GRACE = SimpleNamespace(replacement_grace_seconds=_INTERRUPTIONS.replacement_grace_seconds)


@dataclass(frozen=True)
class GenerationModel:
    """What the simulation takes from one generation's configuration (the defaults')."""

    name: str
    instance_types: tuple[str, ...]
    drain_signals: frozenset[str]  # config interruptions.drain_on: inf2 none (KubeRay owns its Service's selector)
    moves_back: bool
    cold_start_s: float
    warm_start_s: float


def generation_model(name: str, config: GenNStackConfig | None = None) -> GenerationModel:
    if name not in GENERATIONS:
        raise ValueError(f"generation: got {name!r}; allowed: one of {list(GENERATIONS)}")
    config = config or GenNStackConfig()
    cold, warm = START_TIMES[name]
    return GenerationModel(
        name, tuple(getattr(config.generations, name).instance_types),
        frozenset(getattr(config.interruptions.drain_on, name)),
        name in MOVES_BACK, cold, warm)  # the policy "with issue 31" moves where the move exists (on by default)

POLICIES = ("all on-demand", "Karpenter spot + on-demand fallback", "GenNStack today", "GenNStack with issue 31")


@dataclass(frozen=True)
class Workload:
    replicas: int = 3
    ready_minimum: int = 1
    spare_baseline: int = 1
    spare_cap: int = 2  # interruptions.warm_spare_cap's default
    rate: float = 2.0  # requests per second
    stream_s: float = 20.0  # assumption: seconds a stream lasts
    capacity: float = 0.95  # requests per second one replica serves (the 3 run at 70 %)
    drain_saved: float = 1.0  # local drill, drain routing on: 159 of 159 doomed streams finished
    # broken streams that stream resume saves (GenNStack policies only: the relay is GenNStack's): the README's
    # resume-drill block, 14 of 14 resumed streams identical to the uninterrupted answer, none broken
    resume_saved: float = 1.0
    step_s: float = 60.0


@dataclass
class Node:
    index: int
    offering: Offering
    capacity_type: str
    launched_at: float
    warned_at: float | None = None  # when its reclaim warning (or rebalance signal) arrives
    gone_at: float | None = None


@dataclass
class Pod:
    name: str
    role: str  # server | spare | replacement (return to spot)
    node: Node
    ready_at: float
    routable: bool = True
    drained_at: float | None = None


@dataclass
class Result:
    policy: str
    seconds: float
    ready_seconds: float = 0.0  # with at least one Ready replica in routing
    requests: float = 0.0
    failed: float = 0.0  # arrived beyond the Ready replicas' capacity
    broken: float = 0.0  # held by a replica whose node went without a drain
    node_hours: dict[str, float] = field(default_factory=lambda: {"spot": 0.0, "on-demand": 0.0})
    cost: float = 0.0
    moves: int = 0

    @property
    def availability(self) -> float:
        return self.ready_seconds / self.seconds

    @property
    def lost_share(self) -> float:
        return (self.failed + self.broken) / self.requests if self.requests else 0.0


class Sim:
    """``prices``: per instance type, per capacity type (spot, on-demand), dollars per node-hour."""

    def __init__(self, trace: Trace, workload: Workload, policy: str, prices: dict[str, dict[str, float]],
                 generation: GenerationModel | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy: got {policy!r}; allowed: one of {list(POLICIES)}")
        self.gen = generation or generation_model("inf2")
        missing = sorted({o.instance_type for o in trace.offerings} - set(prices))
        if missing:
            raise ValueError(f"prices: no price for {missing}; the trace's offerings need one each")
        self.trace, self.w, self.policy, self.prices = trace, workload, policy, prices
        self.gennstack = policy.startswith("GenNStack")
        self.issue31 = policy == "GenNStack with issue 31"
        self.nodes: list[Node] = []
        self.pods: list[Pod] = []
        self.unavailable: dict[Offering, float] = {}  # Karpenter's cache: offering -> until
        self.records: list[dict] = []
        self.move: rts.Move | None = None
        self.backoff = rts.Backoff()
        self.capacity_error = False
        self.result = Result(policy, trace.params.hours * 3600.0)
        self._names = 0

    # --- Karpenter and EC2 (modelled) ------------------------------------------------------
    def _price(self, offering: Offering, capacity_type: str) -> float:
        return self.prices[offering.instance_type][capacity_type]

    def _by_price(self, offerings: list[Offering], capacity_type: str) -> list[Offering]:
        return sorted(offerings, key=lambda o: self._price(o, capacity_type))  # stable: the trace's order on ties

    def _spot_offerings(self, now: float) -> list[Offering]:
        return self._by_price([o for o in self.trace.offerings
                               if not self.trace.spot_short(o, now) and self.unavailable.get(o, -1.0) <= now], "spot")

    def _launch(self, now: float, role: str, *, spot_only: bool = False, on_demand_only: bool = False) -> Node | None:
        """A node for one pod: the highest-weight NodePool that can launch (spot 50 over on-demand 10).

        A GenNStack serving pod's zone spread (maxSkew 1, ScheduleAnyway) is a preference Karpenter
        keeps while any NodePool can meet it and relaxes only then (kubernetes-sigs/karpenter
        pkg/controllers/provisioning/scheduling: every NodePool is tried before ``Preferences.Relax``):
        a zone whose spot offerings are all short gets an on-demand node before the pod crowds
        another zone on spot."""
        pools = [c for c, _ in sorted([("spot", SPOT_WEIGHT), ("on-demand", ON_DEMAND_WEIGHT)], key=lambda p: -p[1])
                 if not (spot_only and c != "spot") and not (on_demand_only and c != "on-demand")]
        spread = role in ("server", "replacement") and self.gennstack
        for zones in ((self._spread_zones(), None) if spread else (None,)):
            for capacity_type in pools:
                candidates = (self._spot_offerings(now) if capacity_type == "spot"
                              else self._by_price(list(self.trace.offerings), "on-demand"))
                candidates = [c for c in candidates if zones is None or c.zone in zones]
                if not candidates:
                    continue
                offering = self._place(candidates, role, now)
                node = Node(len(self.nodes), offering, capacity_type, now)
                self.nodes.append(node)
                return node
        return None

    def _counted(self) -> list[Offering]:
        """The serving pods topology counts: not the doomed ones (terminating: Karpenter's
        ``IgnoredForTopology`` and the kube-scheduler skip them)."""
        return [p.node.offering for p in self.pods if p.role in ("server", "replacement")]

    def _spread_zones(self) -> set[str]:
        """The zones a new serving pod may go to with its spread kept: those with the fewest."""
        counts = {zone: 0 for zone in self.trace.params.zones}
        for offering in self._counted():
            counts[offering.zone] += 1
        least = min(counts.values())
        return {zone for zone, count in counts.items() if count == least}

    def _place(self, candidates: list[Offering], role: str, now: float) -> Offering:
        servers = self._counted()
        spares = [p.node.offering for p in self.pods if p.role == "spare"]
        if self.policy == "Karpenter spot + on-demand fallback" or self.policy == "all on-demand":
            return candidates[0]  # no spread: the first (cheapest, as Karpenter orders them) offering
        if role == "spare":
            if self.issue31:  # spare_placement: away from the replicas' zones (Karpenter's relax order)
                ranked = rank_offerings(candidates, servers)
                best = [c for c in ranked if placement_tier(c, servers) == placement_tier(ranked[0], servers)]
                return min(best, key=lambda o: sum(s.zone == o.zone for s in spares))
            return min(candidates, key=lambda o: sum(s.zone == o.zone for s in spares))  # spares' own spread
        return min(candidates, key=lambda o: sum(s.zone == o.zone for s in servers))  # zone spread, maxSkew 1

    # --- one step --------------------------------------------------------------------------
    def start(self) -> None:
        for _ in range(self.w.replicas):
            self._new_server(0.0, ready_now=True)
        if self.gennstack:
            self._converge_spares(0.0, ready_now=True)

    def _name(self, role: str) -> str:
        self._names += 1
        return f"{role}-{self._names}"

    def _new_server(self, now: float, *, ready_now: bool = False) -> None:
        spares = [p for p in self.pods if p.role == "spare" and p.ready_at <= now and p.node.warned_at is None]
        if spares and not ready_now:  # a serving pod preempts a warm spare: its node is up and warm
            spare = spares[0]
            spare.role, spare.name, spare.ready_at = "server", self._name("server"), now + self.gen.warm_start_s
            return
        node = self._launch(now, "server", on_demand_only=self.policy == "all on-demand")
        assert node is not None  # on-demand always launches in this model
        self.pods.append(Pod(self._name("server"), "server", node, now if ready_now else now + self.gen.cold_start_s))

    def _converge_spares(self, now: float, *, ready_now: bool = False) -> None:
        spare = WarmSpare(self.gen.name, "serving", f"{self.gen.name}-warm-spare", self.w.spare_baseline, self.w.spare_cap)
        desired = spare.desired_replicas(active_by_generation(self.records, now=now, settings=GRACE)[self.gen.name])
        spares = [p for p in self.pods if p.role == "spare"]
        for _ in range(desired - len(spares)):
            node = self._launch(now, "spare")
            if node is not None:
                self.pods.append(Pod(self._name("spare"), "spare", node, now if ready_now else now + self.gen.cold_start_s))
        for extra in spares[desired:] if len(spares) > desired else []:
            self._remove(extra, now)

    def _remove(self, pod: Pod, now: float) -> None:
        self.pods.remove(pod)
        pod.node.gone_at = now  # empty: Karpenter consolidates it (WhenEmpty)

    def _signal(self, node: Node, now: float, *, warning: bool) -> None:
        node.warned_at = node.warned_at if node.warned_at is not None else now
        if warning:
            self.unavailable[node.offering] = now + KARPENTER_UNAVAILABLE_TTL_S
        if self.gennstack:
            if not any(r["instance"] == node.index for r in self.records):
                self.records.append({"instance": node.index, "generation": self.gen.name,
                                     "expires_at": now + DEFAULT_RECORD_TTL_SECONDS})
            for pod in self.pods:
                if (("warning" if warning else "rebalance") in self.gen.drain_signals and pod.node is node
                        and pod.role != "spare" and pod.routable):
                    pod.routable, pod.drained_at = False, now
            self._converge_spares(now)
        if warning:  # Karpenter deletes the NodeClaim: the pods terminate, the ReplicaSet replaces each
            doomed = [p for p in self.pods if p.node is node and p.role != "spare"]
            for pod in doomed:
                pod.role = "doomed"
            for _ in doomed:
                self._new_server(now)

    def _reclaim(self, node: Node, now: float) -> None:
        node.gone_at = now
        for record in self.records:
            if record["instance"] == node.index:
                record["terminated_at"] = now
                record["expires_at"] = max(record["expires_at"], now + GRACE.replacement_grace_seconds)
        for pod in [p for p in self.pods if p.node is node]:
            if pod.role in ("server", "doomed", "replacement") and pod.ready_at <= now:
                held = self.w.rate / max(1, self._serving(now)) * self.w.stream_s
                saved = self.w.drain_saved if pod.drained_at is not None else 0.0
                if self.gennstack:
                    saved = saved + (1 - saved) * self.w.resume_saved
                self.result.broken += held * (1 - saved) if pod.routable or pod.drained_at is not None else 0.0
            self.pods.remove(pod)
            if self.move is not None and pod.name == self.move.replacement:
                self.capacity_error = True
        if self.gennstack:
            self._converge_spares(now)

    def _serving(self, now: float) -> int:
        return sum(1 for p in self.pods if p.role in ("server", "replacement") and p.routable and p.ready_at <= now)

    def _return_to_spot(self, now: float) -> None:
        replicas = [rts.Replica(p.name, str(p.node.index), p.node.capacity_type, p.ready_at <= now, p.routable,
                                started_at=p.ready_at, in_flight=0 if p.drained_at is not None else None)
                    for p in self.pods if p.role in ("server", "replacement")]
        active = active_by_generation(self.records, now=now, settings=GRACE)
        decision = rts.decide(replicas, ready_minimum=self.w.ready_minimum, move=self.move, backoff=self.backoff,
                              now=now, capacity_error=self.capacity_error, interruptions_active=active[self.gen.name])
        self.capacity_error = False
        by_name = {p.name: p for p in self.pods}
        if decision.action is rts.Action.START:
            node = self._launch(now, "server", spot_only=True)
            move = decision.move
            if node is None:
                self.capacity_error = True  # the NodeClaim's launch fails: insufficient capacity
            else:
                name = self._name("replacement")
                self.pods.append(Pod(name, "replacement", node, now + self.gen.cold_start_s))
                move = rts.Move(move.pod, move.started_at, replacement=name)
            self.move = move
        elif decision.action is rts.Action.CANCEL:
            if decision.replacement in by_name:
                self._remove(by_name[decision.replacement], now)
            self.move = None
        elif decision.action is rts.Action.DRAIN:
            pod = by_name[decision.pod]
            pod.routable, pod.drained_at = False, now
            self.move = decision.move
        elif decision.action is rts.Action.RESTORE:
            by_name[decision.pod].routable, by_name[decision.pod].drained_at = True, None
            self.move = decision.move
        elif decision.action is rts.Action.DELETE:
            self._remove(by_name[decision.pod], now)
            if self.move and self.move.replacement in by_name:
                by_name[self.move.replacement].role = "server"
            self.result.moves += 1
            self.move = decision.move
        else:
            self.move, self.backoff = decision.move, decision.backoff
            return
        self.backoff = decision.backoff

    def run(self) -> Result:
        self.start()
        step, end = self.w.step_s, self.result.seconds
        pending = []  # (time, kind, node)
        now = 0.0
        while now < end:
            for burst in self.trace.bursts:
                if now <= burst.at < now + step and self.policy != "all on-demand":
                    for node in self.nodes:
                        if node.gone_at is None and node.capacity_type == "spot" and node.offering == burst.offering:
                            warned = self.trace.reclaimed(burst, node.index)
                            if warned is not None:
                                if burst.rebalance_lead_s is not None:
                                    pending.append((max(now, warned - burst.rebalance_lead_s), "rebalance", node))
                                pending.append((warned, "warning", node))
                                pending.append((warned + WARNING_S, "reclaim", node))
            for event in sorted([e for e in pending if e[0] < now + step], key=lambda e: e[0]):
                pending.remove(event)
                at, kind, node = event
                if node.gone_at is not None:
                    continue
                if kind == "reclaim":
                    self._reclaim(node, at)
                else:
                    self._signal(node, at, warning=kind == "warning")
            while sum(1 for p in self.pods if p.role in ("server",)) < self.w.replicas:
                self._new_server(now)  # a lost replica's pod is recreated (no warning reached it)
            if self.issue31 and self.gen.moves_back:
                self._return_to_spot(now)
            for pod in [p for p in self.pods if p.role == "doomed" and p.node.gone_at is not None]:
                self.pods.remove(pod)
            if self.gennstack:
                self._converge_spares(now)
            self._account(now, step)
            now += step
        return self._finish()

    def _account(self, now: float, step: float) -> None:
        r = self.result
        serving = self._serving(now)
        r.requests += self.w.rate * step
        r.failed += max(0.0, self.w.rate - serving * self.w.capacity) * step
        r.ready_seconds += step if serving > 0 else 0.0
        for node in self.nodes:
            if node.gone_at is None:
                r.node_hours[node.capacity_type] += step / 3600.0
                r.cost += self._price(node.offering, node.capacity_type) * step / 3600.0

    def _finish(self) -> Result:
        return self.result


def simulate(trace: Trace, workload: Workload, prices: dict[str, dict[str, float]],
             generation: GenerationModel | None = None) -> list[Result]:
    return [Sim(trace, workload, policy, prices, generation).run() for policy in POLICIES]
