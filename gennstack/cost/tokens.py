"""Dollars per million tokens from ``gennstack bench`` result files and the layout they ran on.

The layout comes from the result's ``layout`` block (``gennstack bench --instance-type ...``
records it) or from flags, which win. Per level of concurrency:

* ``$/1M output tokens = hourly / (aggregate output tok/s x 3600) x 1e6``, the fleet's whole cost
  spread over the tokens it delivered;
* ``$/1M total tokens`` divides by prompt + output tokens: output tok/s x (1 + mean prompt tokens /
  mean output tokens per completed request), the prompt tokens each delivered output token came with.

Only :mod:`gennstack.cost.prices` is imported (no config, no CDK), so the benchmark's report uses it too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from datetime import date
from typing import Any

from gennstack.cost.prices import PriceError, PriceTable, load_table

CAPACITY_TYPES = ("spot", "on-demand", "reserved")
LAYOUT_FLAGS = "--instance-type/--replicas/--capacity-type/--region or --hourly-price"


class CostInputError(ValueError):
    """A bench result or layout lacks what the cost needs; the message names the file, level or flag."""


@dataclass(frozen=True)
class BenchLayout:
    """What served the benchmarked endpoint: ``replicas`` on ``instance_type`` nodes, ``replicas_per_node`` each."""

    instance_type: str | None = None
    replicas: int | None = None
    replicas_per_node: int = 1
    capacity_type: str | None = None
    # Dollars per node-hour actually paid (an observed spot price, a negotiated rate); wins over tables.
    hourly_price: float | None = None
    region: str | None = None

    def __post_init__(self) -> None:
        if self.replicas is not None and self.replicas < 1:
            raise CostInputError(f"--replicas: got {self.replicas!r}; allowed: 1 or more")
        if self.replicas_per_node < 1:
            raise CostInputError(f"--replicas-per-node: got {self.replicas_per_node!r}; allowed: 1 or more")
        if self.capacity_type is not None and self.capacity_type not in CAPACITY_TYPES:
            raise CostInputError(f"--capacity-type: got {self.capacity_type!r}; allowed: {', '.join(CAPACITY_TYPES)}")
        if self.hourly_price is not None and not self.hourly_price > 0:
            raise CostInputError(f"--hourly-price: got {self.hourly_price!r}; allowed: US dollars per node-hour, more than 0")

    @property
    def nodes(self) -> int:
        return math.ceil((self.replicas or 1) / self.replicas_per_node)

    def describe(self) -> str:
        parts = [f"{self.replicas or 1} replica(s) on {self.nodes} x {self.instance_type or 'node'}"]
        if self.capacity_type:
            parts.append(self.capacity_type)
        if self.region:
            parts.append(self.region)
        if self.hourly_price is not None:
            parts.append(f"${self.hourly_price:g}/node-hour as recorded")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def layout_of(result: dict, overrides: dict[str, Any] | None = None) -> BenchLayout | None:
    """The result's recorded layout with ``overrides`` (flags that were given) applied; None when neither has one."""
    recorded = result.get("layout") or {}
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    if not recorded and not given:
        return None
    known = {k: recorded[k] for k in BenchLayout.__dataclass_fields__ if recorded.get(k) is not None}
    return replace(BenchLayout(**known), **given) if given else BenchLayout(**known)


@dataclass(frozen=True)
class HourlyPrices:
    """Fleet dollars per hour: as recorded (``--hourly-price``), at spot and at on-demand, with labels."""

    recorded: float | None
    spot: float | None
    on_demand: float | None
    spot_label: str
    source: str
    # Date of the table prices used (None for --hourly-price alone).
    as_of: date | None = None


def fleet_prices(layout: BenchLayout, table: PriceTable | None = None) -> HourlyPrices:
    """What the layout's nodes cost per hour. Table prices need ``instance_type`` and a table (or ``region``)."""
    recorded = layout.hourly_price * layout.nodes if layout.hourly_price is not None else None
    if layout.instance_type is None:
        if recorded is None:
            raise CostInputError(f"no layout to price: give {LAYOUT_FLAGS}")
        return HourlyPrices(recorded, None, None, "", "--hourly-price")
    if table is None:
        if layout.region is None:
            if recorded is None:
                raise CostInputError(f"layout {layout.describe()}: no region to price it in; give --region or --hourly-price")
            return HourlyPrices(recorded, None, None, "", "--hourly-price")
        table = load_table(layout.region)
    try:
        spot, od = table.spot_price(layout.instance_type), table.on_demand_price(layout.instance_type)
    except PriceError:
        if recorded is None:
            raise
        return HourlyPrices(recorded, None, None, "", "--hourly-price")
    label = "spot (observed)" if spot.kind == "observed" else f"spot (estimate: {table.spot_discount:.0%} off on-demand)"
    return HourlyPrices(recorded, spot.usd * layout.nodes, od.usd * layout.nodes, label,
                        f"{table.region} prices as of {od.as_of.isoformat()}", od.as_of)


def _total_factor(level: dict) -> float | None:
    prompt, output = level["metrics"]["prompt_tokens"]["mean"], level["metrics"]["output_tokens"]["mean"]
    if not prompt or not output:
        return None
    return 1 + prompt / output


def level_costs(result: dict, prices: HourlyPrices) -> list[dict[str, Any]]:
    """One row per concurrency level: throughput, per-user tok/s and $/1M output and total tokens per price."""
    where = result.get("_path", "result")
    levels = result.get("levels") or []
    if not levels:
        raise CostInputError(f"{where}: has no levels, so no throughput to divide the cost by")
    rows = []
    for level in levels:
        output_tps = level.get("aggregate_output_tokens_per_s") or 0.0
        if output_tps <= 0:
            raise CostInputError(f"{where}, concurrency {level.get('concurrency')}: aggregate_output_tokens_per_s is "
                                 f"{output_tps!r}; no tokens were measured, so there is nothing to divide the cost by")
        factor = _total_factor(level)
        row = {"concurrency": level["concurrency"], "rate_rps": level.get("rate_rps"), "aggregate_output_tokens_per_s": output_tps,
               "user_output_tokens_per_s": level["metrics"]["user_output_tokens_per_s"]["mean"],
               "total_tokens_per_s": output_tps * factor if factor else None}
        for key, usd in (("recorded", prices.recorded), ("spot", prices.spot), ("on_demand", prices.on_demand)):
            row[f"usd_per_hour_{key}"] = usd
            row[f"usd_per_m_output_{key}"] = None if usd is None else usd / (output_tps * 3600) * 1e6
            row[f"usd_per_m_total_{key}"] = None if usd is None or not factor else usd / (output_tps * factor * 3600) * 1e6
        rows.append(row)
    return rows


def report_costs(result: dict) -> tuple[list[dict[str, Any]], HourlyPrices] | str:
    """For the benchmark report: rows when the result's layout can be priced, else a sentence saying why not."""
    layout = layout_of(result)
    if layout is None:
        return f"no layout recorded: run gennstack bench with {LAYOUT_FLAGS} to see $ per 1M tokens"
    try:
        prices = fleet_prices(layout)
        return level_costs(result, prices), prices
    except (CostInputError, PriceError) as exc:
        return str(exc)
