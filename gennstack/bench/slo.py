"""Service-level objectives: per-request SLO attainment and goodput, and the sweep's pick of the rate at the SLO.

``--slo ttft_p90=500ms,itl_p90=50ms,e2e_p90=10s`` sets a threshold per metric. A measured request is *good*
when it completed and each of its values is at or under every threshold: the per-request test of vLLM's
``--goodput`` (vllm 0.29.0 ``vllm/benchmarks/serve.py`` ``calculate_metrics``: ``is_good_req = all([s >= r
for s, r in zip(slo_values, req_metric)])`` over TTFT, TPOT and E2EL) and of DistServe's goodput (the requests
served within both their TTFT and TPOT targets). Per level:

* ``attainment``: good requests / measured requests with an outcome (completed or failed; a failed one is not
  good): DistServe's "SLO attainment". Open-loop levels let every request run to its end; a closed-loop
  ``--duration`` level cuts the requests still streaming when its window closes (``incomplete``), and those have no
  outcome, so they are left out. vLLM prints no share, only the goodput;
* ``goodput_rps``: good requests completed inside the measured window / its length (vLLM: ``good_completed /
  dur_s``, the whole run's duration);
* ``goodput_output_tokens_per_s``: the output tokens of those requests / the window's length;
* per metric, the level's ``p<NN>`` (the ``_pNN`` of its key, 90 if none) and whether it is at or under the
  threshold: the SLO as a percentile, which ``attainment`` >= NN/100 implies for one metric alone.

Metrics: ``ttft`` (time to first token), ``itl`` (``(t_last - t_first) / (n - 1)``, see metrics.py), ``tpot``
(vLLM's ``(e2e - ttft) / (n - 1)``: it counts the stream's tail after the last token), ``e2e``. As in vLLM, a
request of one output token has no ITL/TPOT and passes that test. Values are seconds, or ``ms``/``s`` suffixed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gennstack.bench.config import ConfigError
from gennstack.bench.metrics import quantile
from gennstack.bench.runner import COMPLETED, INCOMPLETE

SLO_METRICS = ("ttft", "itl", "tpot", "e2e")
DEFAULT_PERCENTILE = 90


@dataclass(frozen=True, slots=True)
class Objective:
    metric: str  # one of SLO_METRICS
    threshold_s: float
    percentile: int = DEFAULT_PERCENTILE

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.percentile}"


@dataclass(frozen=True, slots=True)
class SLO:
    objectives: tuple[Objective, ...]

    @classmethod
    def parse(cls, spec: str, *, option: str = "--slo") -> SLO:
        allowed = f"METRIC[_pNN]=SECONDS[ms|s], comma separated; METRIC one of {', '.join(SLO_METRICS)}"
        objectives: list[Objective] = []
        for part in (p.strip() for p in str(spec).split(",")):
            match = re.fullmatch(r"([a-z0-9]+?)(?:_p(\d{1,3}))?=([0-9.eE+-]+)\s*(ms|s)?", part)
            if not match:
                raise ConfigError(f"{option}={spec!r}: cannot read {part!r}; expected {allowed}")
            metric, pct, value, unit = match.groups()
            if metric not in SLO_METRICS:
                raise ConfigError(f"{option}={spec!r}: unknown metric {metric!r}; expected one of {', '.join(SLO_METRICS)}")
            percentile = int(pct) if pct else DEFAULT_PERCENTILE
            if not 1 <= percentile <= 100:
                raise ConfigError(f"{option}={spec!r}: {metric}_p{pct}: the percentile must be 1 to 100")
            try:
                seconds = float(value) / (1000.0 if unit == "ms" else 1.0)
            except ValueError:
                raise ConfigError(f"{option}={spec!r}: {part!r}: {value!r} is not a number") from None
            if not (seconds > 0 and math.isfinite(seconds)):
                raise ConfigError(f"{option}={spec!r}: {part!r}: the threshold must be above 0 seconds")
            if any(o.metric == metric for o in objectives):
                raise ConfigError(f"{option}={spec!r}: {metric} given twice")
            objectives.append(Objective(metric, seconds, percentile))
        return cls(tuple(objectives))

    def to_dict(self) -> dict:
        return {o.key: o.threshold_s for o in self.objectives}


def request_value(record, metric: str) -> float | None:
    """The request's value of an SLO metric (None: it has none, e.g. ITL of a one-token answer)."""
    if metric == "ttft":
        return record.ttft
    if metric == "e2e":
        return record.e2e
    if metric == "itl":
        return record.itl
    n = record.output_tokens
    if n < 2 or record.ttft is None or record.e2e is None:
        return None
    return (record.e2e - record.ttft) / (n - 1)


def is_good(record, slo: SLO) -> bool:
    if record.status != COMPLETED:
        return False
    for objective in slo.objectives:
        value = request_value(record, objective.metric)
        if value is None:
            if objective.metric in ("ttft", "e2e"):
                return False
            continue  # vLLM: a one-token answer's TPOT counts as 0
        if value > objective.threshold_s:
            return False
    return True


def level_slo(records: Sequence, slo: SLO, *, window_start: float, window_end: float) -> dict:
    """The ``slo`` block of one level over its measured (non-warm-up) requests."""
    measured = [r for r in records if not r.warmup and r.status != INCOMPLETE]
    good = [r for r in measured if is_good(r, slo)]
    window = max(window_end - window_start, 1e-9)
    good_in_window = [r for r in good if window_start <= r.t_end <= window_end + 1e-9]
    completed = [r for r in measured if r.status == COMPLETED]
    percentiles = {}
    for o in slo.objectives:
        values = sorted(v for v in (request_value(r, o.metric) for r in completed) if v is not None)
        value = quantile(values, o.percentile / 100) if values else None
        percentiles[o.key] = {"threshold_s": o.threshold_s, "value_s": value, "met": value is not None and value <= o.threshold_s}
    return {
        "thresholds": slo.to_dict(),
        "measured": len(measured),
        "good": len(good),
        "attainment": len(good) / len(measured) if measured else None,
        "goodput_rps": len(good_in_window) / window,
        "goodput_output_tokens_per_s": sum(r.output_tokens for r in good_in_window) / window,
        "percentiles": percentiles,
    }


def pick_rate_at_slo(levels: Sequence[dict], target: float) -> dict | None:
    """Of the open-loop levels (those with a ``rate_rps``), the one of the highest rate whose SLO attainment is at
    least ``target``; None when none is."""
    passing = [lvl for lvl in levels if lvl.get("rate_rps") is not None and (lvl.get("slo") or {}).get("attainment") is not None
               and lvl["slo"]["attainment"] >= target]
    return max(passing, key=lambda lvl: lvl["rate_rps"]) if passing else None


def request_rate(level: dict) -> float:
    """The requests/s a closed-loop level of the sweep sustained: its aggregate output tokens/s over the mean output
    tokens of a completed request. GuideLLM takes the requests completed per second instead; over a short window that
    counts whole requests (a few at concurrency 1), while the tokens that arrived in it measure the same rate with
    far less quantisation. 0 when nothing completed."""
    mean = level["metrics"]["output_tokens"]["mean"]
    return level["aggregate_output_tokens_per_s"] / mean if mean else 0.0


def sweep_rates(synchronous_rps: float, saturated_rps: float, levels: int) -> list[float]:
    """GuideLLM's sweep (guidellm 0.8.1 ``guidellm/benchmark/profiles/sweep.py`` ``SweepProfile.next_strategy``: after the
    synchronous and throughput runs, ``np.linspace(synchronous_rate, throughput_rate, sweep_size - 1)[1:]``):
    ``levels`` rates evenly spaced above the synchronous rate, the last one the saturated rate."""
    if levels < 1:
        raise ValueError(f"levels {levels!r}: must be at least 1")
    if not (synchronous_rps > 0 and saturated_rps > 0):
        raise ValueError(f"cannot sweep between {synchronous_rps!r} and {saturated_rps!r} requests/s: "
                         "did any request complete in the synchronous and throughput runs?")
    low, high = min(synchronous_rps, saturated_rps), max(synchronous_rps, saturated_rps)
    step = (high - low) / levels
    return [low + step * (i + 1) for i in range(levels)]


def at_slo(result: dict, target: float) -> dict:
    """The sweep's answer: the highest rate that meets the SLO at ``target`` attainment, what it delivered there and,
    where the result's layout can be priced (gennstack.cost.tokens), dollars per million output tokens at that rate
    (all output tokens the window delivered) and per million good ones (those of requests within the SLO)."""
    from gennstack.cost.tokens import report_costs

    out: dict = {"target": target, "at_slo": None}
    level = pick_rate_at_slo(result["levels"], target)
    if level is None:
        out["note"] = f"no rate level met the SLO for {target:.0%} of its requests"
        return out
    slo = level["slo"]
    block = {"rate_rps": level["rate_rps"], "offered_rps": level["schedule"]["offered_rps"], "attainment": slo["attainment"],
             "output_tokens_per_s": level["aggregate_output_tokens_per_s"], "goodput_rps": slo["goodput_rps"],
             "goodput_output_tokens_per_s": slo["goodput_output_tokens_per_s"]}
    costs = report_costs(result)
    if isinstance(costs, str):
        block["cost"] = costs
    else:
        rows, prices = costs
        row = rows[result["levels"].index(level)]
        block["price_source"] = prices.source
        for key in ("recorded", "spot", "on_demand"):
            usd = row[f"usd_per_hour_{key}"]
            if usd is None:
                continue
            good = slo["goodput_output_tokens_per_s"]
            block[f"usd_per_hour_{key}"] = usd
            block[f"usd_per_m_output_{key}"] = row[f"usd_per_m_output_{key}"]
            block[f"usd_per_m_good_output_{key}"] = usd / (good * 3600) * 1e6 if good > 0 else None
    out["at_slo"] = block
    return out
