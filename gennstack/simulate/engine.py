"""The replay: one generation's serving replicas and warm spares through a spot trace, per policy.

Time advances in ``Workload.step_s`` steps. What decides is GenNStack's own code, imported, not
redone here: the interruption handler's warm-spare count (``settings.WarmSpare.desired_replicas``
over the records ``interruptions.is_active`` counts), its drain on a signal, the return-to-spot
decision (``return_to_spot.decide``), the spare placement (``gennstack.serving.spare_placement``)
and the NodePool weights (``gennstack.generations``). What is *modelled* (Karpenter and EC2, and the
requests): a launch takes the highest-weight NodePool with an offering to launch on (spot unless
every spot offering is short or in Karpenter's 3-minute unavailable-offerings cache after a spot
warning, then on-demand); nodes consolidate only when empty, so an on-demand replica stays unless
moved; a replacement replica is created at the warning (Karpenter v1.14.1 deletes the NodeClaim on
a spot interruption message, CordonAndDrain), Ready after ``cold_start_s`` on a new node or
``warm_start_s`` on a preempted warm spare's node; requests arrive at ``rate`` and each Ready
replica in routing serves ``capacity`` of them; streams a replica holds when its node goes break,
unless it was drained (the drill: 159 of 159 finished) or resume saves them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from gennstack.config import InterruptionConfig
from gennstack.generations import ON_DEMAND_WEIGHT, SPOT_WEIGHT
from gennstack.serving.spare_placement import Offering, rank_offerings
from gennstack.simulate.trace import WARNING_S, Trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # lambdas/ beside gennstack/ (editable install)
from lambdas.interruption_handler import return_to_spot as rts  # noqa: E402
from lambdas.interruption_handler.interruptions import active_by_generation  # noqa: E402
from lambdas.interruption_handler.settings import DEFAULT_RECORD_TTL_SECONDS, WarmSpare  # noqa: E402

KARPENTER_UNAVAILABLE_TTL_S = 180.0  # karpenter-provider-aws v1.14.1 pkg/cache/cache.go UnavailableOfferingsTTL
GENERATION = "inf2"
# The handler's defaults (gennstack/config.py): inf2 drains on no signal (KubeRay owns its Service's
# selector), so its streams break at the reclaim; the grace an interruption stays active.
_INTERRUPTIONS = InterruptionConfig()
DRAIN_SIGNALS = frozenset(getattr(_INTERRUPTIONS.drain_on, GENERATION))
GRACE = SimpleNamespace(replacement_grace_seconds=_INTERRUPTIONS.replacement_grace_seconds)

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
    cold_start_s: float = 900.0  # assumption: node launch, image pull, model load
    warm_start_s: float = 180.0  # assumption: a preempted spare's node: image and weights cached
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
    def __init__(self, trace: Trace, workload: Workload, policy: str, prices: dict[str, float]) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy: got {policy!r}; allowed: one of {list(POLICIES)}")
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
    def _spot_offerings(self, now: float) -> list[Offering]:
        return [o for o in self.trace.offerings
                if not self.trace.spot_short(o, now) and self.unavailable.get(o, -1.0) <= now]

    def _launch(self, now: float, role: str, *, spot_only: bool = False, on_demand_only: bool = False) -> Node | None:
        """A node for one pod: the highest-weight NodePool that can launch (spot 50 over on-demand 10)."""
        pools = sorted([("spot", SPOT_WEIGHT), ("on-demand", ON_DEMAND_WEIGHT)], key=lambda p: -p[1])
        for capacity_type, _ in pools:
            if (spot_only and capacity_type != "spot") or (on_demand_only and capacity_type != "on-demand"):
                continue
            candidates = self._spot_offerings(now) if capacity_type == "spot" else list(self.trace.offerings)
            if not candidates:
                continue
            offering = self._place(candidates, role, now)
            node = Node(len(self.nodes), offering, capacity_type, now)
            self.nodes.append(node)
            return node
        return None

    def _place(self, candidates: list[Offering], role: str, now: float) -> Offering:
        servers = [p.node.offering for p in self.pods if p.role != "spare"]
        spares = [p.node.offering for p in self.pods if p.role == "spare"]
        if self.policy == "Karpenter spot + on-demand fallback" or self.policy == "all on-demand":
            return candidates[0]  # no spread: the first (cheapest, as Karpenter orders them) offering
        if role == "spare":
            if self.issue31:  # spare_placement: away from the replicas' zone and type (Karpenter's relax order)
                ranked = rank_offerings(candidates, servers)
                best = [c for c in ranked if _tier(c, servers) == _tier(ranked[0], servers)]
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
            spare.role, spare.name, spare.ready_at = "server", self._name("server"), now + self.w.warm_start_s
            return
        node = self._launch(now, "server", on_demand_only=self.policy == "all on-demand")
        assert node is not None  # on-demand always launches in this model
        self.pods.append(Pod(self._name("server"), "server", node, now if ready_now else now + self.w.cold_start_s))

    def _converge_spares(self, now: float, *, ready_now: bool = False) -> None:
        spare = WarmSpare(GENERATION, "serving", "gen1-inf2-warm-spare", self.w.spare_baseline, self.w.spare_cap)
        desired = spare.desired_replicas(active_by_generation(self.records, now=now, settings=GRACE)[GENERATION])
        spares = [p for p in self.pods if p.role == "spare"]
        for _ in range(desired - len(spares)):
            node = self._launch(now, "spare")
            if node is not None:
                self.pods.append(Pod(self._name("spare"), "spare", node, now if ready_now else now + self.w.cold_start_s))
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
                self.records.append({"instance": node.index, "generation": GENERATION,
                                     "expires_at": now + DEFAULT_RECORD_TTL_SECONDS})
            for pod in self.pods:
                if (("warning" if warning else "rebalance") in DRAIN_SIGNALS and pod.node is node
                        and pod.role != "spare" and pod.routable):
                    pod.routable, pod.drained_at = False, now
            self._converge_spares(now)
        if warning:
            for pod in [p for p in self.pods if p.node is node and p.role != "spare"]:
                self._new_server(now)  # Karpenter deletes the NodeClaim: the ReplicaSet replaces the pod
                pod.role = "doomed"

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
                              now=now, capacity_error=self.capacity_error, interruptions_active=active[GENERATION])
        self.capacity_error = False
        by_name = {p.name: p for p in self.pods}
        if decision.action is rts.Action.START:
            node = self._launch(now, "server", spot_only=True)
            move = decision.move
            if node is None:
                self.capacity_error = True  # the NodeClaim's launch fails: insufficient capacity
            else:
                name = self._name("replacement")
                self.pods.append(Pod(name, "replacement", node, now + self.w.cold_start_s))
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
            if self.issue31:
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
                r.cost += self.prices[node.capacity_type] * step / 3600.0

    def _finish(self) -> Result:
        return self.result


def _tier(offering: Offering, servers: list[Offering]) -> int:
    from gennstack.serving.spare_placement import placement_tier
    return placement_tier(offering, servers)


def simulate(trace: Trace, workload: Workload, prices: dict[str, float]) -> list[Result]:
    return [Sim(trace, workload, policy, prices).run() for policy in POLICIES]
