"""A model of the scaling decision KEDA 2.20.2 and the Kubernetes 1.36 HPA take for a ScaledObject.

Written from the upstream sources, not copied; each step names the function it follows:

* kubernetes/kubernetes v1.36, pkg/controller/podautoscaler/replica_calculator.go
  ``GetExternalPerPodMetricReplicas`` (metricType AverageValue): usage is the metric (KEDA serves
  one value), ``ratio = usage / (target * statusReplicas)``; within the tolerance (0.1 each way,
  the controller's default, ``Tolerances.isWithin``: ``1 - down <= ratio <= 1 + up``) the
  proposal is the current count, else ``ceil(usage / target)``.
* pkg/controller/podautoscaler/horizontal.go ``reconcileAutoscaler``: below minReplicas the
  target is raised to it and above maxReplicas lowered to it without behaviors; otherwise
  ``normalizeDesiredReplicasWithBehaviors`` = ``stabilizeRecommendationWithBehaviors`` (every
  recommendation is recorded; the result is clamped to [min of the scale-up window's
  recommendations, max of the scale-down window's]) then ``convertDesiredReplicasWithBehaviorRate``
  (the rate limits ``calculateScaleUpLimitWithScalingRules`` / ``calculateScaleDownLimitWithBehaviors``
  from the replicas at the start of each policy's period, net of the scale events inside it,
  ``getReplicasChangePerPeriod``; selectPolicy Max/Min; then minReplicas/maxReplicas). A scale
  is stored as an event (``storeScaleEvent``) when the result differs from the current count.
  When every metric fails, the HPA does not scale (``computeReplicasForMetrics`` returns an error).
* kedacore/keda v2.20.2, pkg/fallback/fallback.go ``GetMetricsWithFallback`` / ``doFallback``:
  after more than ``fallback.failureThreshold`` failed reads in a row the metric served is
  ``target * replicas``, replicas = max(current, fallback.replicas) for ``currentReplicasIfHigher``;
  before that the read fails. pkg/scaling/executor/scale_scaledobjects.go: with minReplicaCount >= 1
  KEDA itself only raises a target below minReplicaCount (cooldownPeriod applies to scaling to 0
  only, which GenNStack does not configure); apis/keda/v1alpha1 ``GetHPAMinReplicas``: the HPA's
  minReplicas is minReplicaCount.

Where the sources were read: KEDA at its v2.20.2 tag (a full mirror of kedacore/keda). The
kubernetes/kubernetes repository is too large to mirror here, so horizontal.go and
replica_calculator.go were read as the code-search index stores them, with the v1.36 API types
(k8s.io/api v0.36.3, autoscaling/v2: ``HPAScalingRules.Tolerance`` is beta behind
HPAConfigurableTolerance; GenNStack leaves it unset, so the controller's 0.1 applies both ways, the
same band the older ``math.Abs(1.0-usageRatio) > tolerance`` form gives). Diff this model against the
v1.36 tag's two files before relying on it for a Kubernetes upgrade.

Time is simulated: the HPA runs every ``sync_seconds`` (15 s, kube-controller-manager's default
--horizontal-pod-autoscaler-sync-period), and reads the value Prometheus last scraped, every
``scrape_seconds``: the vLLM PodMonitor's interval (gennstack.observability.manifests.SCRAPE_INTERVAL, 15 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gennstack.observability.manifests import SCRAPE_INTERVAL

# The interval Prometheus scrapes vLLM at (the gennstack-vllm PodMonitor's), in seconds.
SCRAPE_SECONDS = int(SCRAPE_INTERVAL.removesuffix("s"))

TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance default


@dataclass(frozen=True)
class Policy:
    type: str  # "Pods" | "Percent"
    value: int
    period_seconds: int


@dataclass(frozen=True)
class Rules:
    stabilization_seconds: int
    select: str  # "Max" | "Min" | "Disabled"
    policies: tuple[Policy, ...]


@dataclass(frozen=True)
class ScalingSpec:
    """What a ScaledObject (with its one Prometheus AverageValue trigger) tells KEDA and the HPA."""

    min_replicas: int
    max_replicas: int
    target: float
    scale_up: Rules
    scale_down: Rules
    fallback_threshold: int
    fallback_replicas: int
    fallback_behavior: str

    @classmethod
    def from_scaled_object(cls, obj: dict[str, Any]) -> ScalingSpec:
        spec = obj["spec"]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]

        def rules(side: dict[str, Any]) -> Rules:
            return Rules(side["stabilizationWindowSeconds"], side["selectPolicy"],
                         tuple(Policy(p["type"], p["value"], p["periodSeconds"]) for p in side["policies"]))

        return cls(
            min_replicas=max(1, spec["minReplicaCount"]), max_replicas=spec["maxReplicaCount"],
            target=float(trigger["metadata"]["threshold"]),
            scale_up=rules(behavior["scaleUp"]), scale_down=rules(behavior["scaleDown"]),
            fallback_threshold=spec["fallback"]["failureThreshold"], fallback_replicas=spec["fallback"]["replicas"],
            fallback_behavior=spec["fallback"]["behavior"],
        )


@dataclass
class Autoscaler:
    """One HPA (as KEDA configures it) and the Deployment's replica count it sets."""

    spec: ScalingSpec
    replicas: int
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)
    failures: int = 0

    def metric(self, value: float | None) -> float | None:
        """The value KEDA's metrics server answers the HPA with, or None for an error."""
        if value is not None:
            self.failures = 0
            return value
        self.failures += 1
        if self.failures <= self.spec.fallback_threshold:
            return None
        assert self.spec.fallback_behavior == "currentReplicasIfHigher"
        return self.spec.target * max(self.replicas, self.spec.fallback_replicas)

    def sync(self, now: float, value: float | None) -> int:
        """One reconcile at ``now`` with Prometheus' answer ``value`` (None: the query failed)."""
        s, current = self.spec, self.replicas
        usage = self.metric(value)
        if current > s.max_replicas:
            desired = s.max_replicas
        elif current < s.min_replicas:
            desired = s.min_replicas
        else:
            if usage is None:
                return current  # every metric invalid: no scaling this round
            proposal = self._per_pod_replicas(current, usage)
            desired = self._normalize(now, current, proposal)
        if desired != current:
            events = self.up_events if desired > current else self.down_events
            rules = s.scale_up if desired > current else s.scale_down
            # storeScaleEvent: events older than the longest policy period are outdated; the last
            # outdated one is overwritten, else the event is appended (outdated ones still count).
            longest = max(p.period_seconds for p in rules.policies)
            outdated = [i for i, (stamp, _) in enumerate(events) if stamp < now - longest]
            if outdated:
                events[outdated[-1]] = (now, abs(desired - current))
            else:
                events.append((now, abs(desired - current)))
            self.replicas = desired
        return self.replicas

    def _per_pod_replicas(self, status_replicas: int, usage: float) -> int:
        ratio = usage / (self.spec.target * status_replicas)
        if 1 - TOLERANCE <= ratio <= 1 + TOLERANCE:
            return status_replicas
        return math.ceil(usage / self.spec.target)

    def _normalize(self, now: float, current: int, desired: int) -> int:
        s = self.spec
        up_cutoff, down_cutoff = now - s.scale_up.stabilization_seconds, now - s.scale_down.stabilization_seconds
        up_rec = down_rec = desired
        for stamp, rec in self.recommendations:
            if stamp > up_cutoff:
                up_rec = min(rec, up_rec)
            if stamp > down_cutoff:
                down_rec = max(rec, down_rec)
        stabilized = min(max(current, up_rec), down_rec)
        # Record the unstabilized recommendation (one sample older than both windows is reused).
        old = [i for i, (stamp, _) in enumerate(self.recommendations) if stamp < up_cutoff and stamp < down_cutoff]
        if old:
            self.recommendations[old[-1]] = (now, desired)
        else:
            self.recommendations.append((now, desired))
        return self._rate_limited(now, current, stabilized)

    def _change_in_period(self, now: float, period: int, events: list[tuple[float, int]]) -> int:
        return sum(change for stamp, change in events if stamp > now - period)

    def _rate_limited(self, now: float, current: int, desired: int) -> int:
        s = self.spec
        if desired > current:
            limit = self._limit(now, current, s.scale_up, up=True)
            limit = max(limit, current)
            return min(desired, min(s.max_replicas, limit))
        if desired < current:
            limit = self._limit(now, current, s.scale_down, up=False)
            limit = min(limit, current)
            return max(desired, max(s.min_replicas, limit))
        return desired

    def _limit(self, now: float, current: int, rules: Rules, *, up: bool) -> int:
        if rules.select == "Disabled":
            return current
        pick_max = (rules.select != "Min") if up else (rules.select == "Min")
        result: int | None = None
        for policy in rules.policies:
            start = (current - self._change_in_period(now, policy.period_seconds, self.up_events)
                     + self._change_in_period(now, policy.period_seconds, self.down_events))
            if up:
                proposed = (start + policy.value if policy.type == "Pods"
                            else math.ceil(start * (1 + policy.value / 100)))
            else:
                proposed = (start - policy.value if policy.type == "Pods"
                            else int(start * (1 - policy.value / 100)))
            result = proposed if result is None else (max(result, proposed) if pick_max else min(result, proposed))
        assert result is not None
        return result


@dataclass(frozen=True)
class Step:
    time: float
    demand: float  # requests clients have in flight (running + queued) at this instant
    seen: float | None  # what the HPA read (Prometheus' last scrape), None when the query failed
    replicas: int


def simulate(spec: ScalingSpec, demand, *, duration: float, start_replicas: int | None = None,
             sync_seconds: float = 15, scrape_seconds: float = SCRAPE_SECONDS, outage: tuple[float, float] | None = None) -> list[Step]:
    """Run the autoscaler against ``demand(t)`` (in-flight requests over all replicas) for ``duration`` s.

    The gauge sum vLLM's servers export is the demand, as of Prometheus' last scrape: every request a
    client has sent and not yet finished is either running or waiting on some replica.
    """
    scaler = Autoscaler(spec, start_replicas if start_replicas is not None else spec.min_replicas)
    steps: list[Step] = []
    t = 0.0
    while t <= duration:
        scraped_at = math.floor(t / scrape_seconds) * scrape_seconds
        down = outage is not None and outage[0] <= t < outage[1]
        seen = None if down else float(demand(scraped_at))
        steps.append(Step(t, float(demand(t)), seen, scaler.sync(t, seen)))
        t += sync_seconds
    return steps
