"""The bundled, dated price table (``prices.json`` beside this module) and its lookups.

Each price names its source, and each source its date, so every figure the cost model shows can
say where it came from and how old it is. Spot has no list price: offline, spot is an estimate,
on-demand x (1 - discount), with the discount and its basis stated in the file (``spot_estimate``)
and changeable per run. ``gennstack cost --live`` (:mod:`gennstack.cost.live`) builds a
:class:`PriceTable` from the AWS APIs instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

BUNDLED = Path(__file__).with_name("prices.json")
SCHEMA = "gennstack-prices/1"
# Bundled prices older than this are flagged as stale wherever they show.
STALE_AFTER_DAYS = 90
HOURS_PER_MONTH = 730  # AWS's convention for monthly figures (8,760 h / 12)
# The region priced when neither --region nor the config names one (an environment-agnostic stack).
DEFAULT_REGION = "us-east-1"
SERVICE_KEYS = (
    "eks_cluster_per_hour", "nat_gateway_per_hour", "interface_endpoint_per_az_hour", "nlb_per_hour",
    "gp3_per_gb_month", "gp3_per_iops_month_over_3000", "gp3_per_mbps_month_over_125",
    "kms_key_per_month", "secret_per_month",
)


class PriceError(ValueError):
    """A price the cost model needs is missing or a price file is malformed; the message says which and what to do."""


@dataclass(frozen=True)
class Price:
    """One figure: dollars (per hour or per month, as its key says), where it came from, when."""

    usd: float
    source: str
    as_of: date
    confirmed: bool = True
    # "list" (a published on-demand price), "estimate" (offline spot) or "observed" (--live spot history).
    kind: str = "list"

    def age_days(self, today: date) -> int:
        return (today - self.as_of).days

    def stale(self, today: date) -> bool:
        return self.kind != "observed" and self.age_days(today) > STALE_AFTER_DAYS


@dataclass(frozen=True)
class PriceTable:
    """Prices for one region: on-demand per instance type, services, and how spot is estimated."""

    region: str
    on_demand: dict[str, Price]
    services: dict[str, Price]
    spot_discount: float
    spot_basis: str
    # Observed spot prices (--live), per instance type then zone; empty offline.
    spot_by_zone: dict[str, dict[str, Price]] = field(default_factory=dict)
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    # Where the on-demand prices came from, for messages.
    origin: str = "bundled table (gennstack/cost/prices.json)"

    def on_demand_price(self, instance_type: str) -> Price:
        price = self.on_demand.get(instance_type)
        if price is None:
            raise PriceError(
                f"instance type {instance_type!r}: no on-demand price for region {self.region} in the {self.origin}; "
                f"priced types: {sorted(self.on_demand)}; give one with --price {instance_type}=USD_PER_HOUR"
            )
        return price

    def spot_price(self, instance_type: str) -> Price:
        """The cheapest observed zone's spot price (--live), else the stated estimate."""
        zones = self.spot_by_zone.get(instance_type)
        if zones:
            return min(zones.values(), key=lambda p: p.usd)
        od = self.on_demand_price(instance_type)
        return Price(round(od.usd * (1 - self.spot_discount), 6), od.source, od.as_of, od.confirmed, "estimate")

    def price(self, instance_type: str, capacity_type: str) -> Price:
        """Per node-hour at ``spot``, ``on-demand`` or ``reserved`` (an On-Demand Capacity Reservation bills the on-demand rate)."""
        if capacity_type == "spot":
            return self.spot_price(instance_type)
        if capacity_type in ("on-demand", "reserved"):
            return self.on_demand_price(instance_type)
        raise PriceError(f"capacity type: got {capacity_type!r}; allowed: 'spot', 'on-demand' or 'reserved'")

    def service(self, key: str) -> Price:
        return self.services[key]

    def with_overrides(self, overrides: dict[str, float], today: date) -> PriceTable:
        """``--price TYPE=USD`` on-demand prices that replace (or add to) the table's, dated today."""
        on_demand = dict(self.on_demand)
        for instance_type, usd in overrides.items():
            on_demand[instance_type] = Price(usd, "--price", today, True)
        return replace(self, on_demand=on_demand)

    def with_spot_discount(self, discount: float) -> PriceTable:
        check_discount(discount)
        return replace(self, spot_discount=discount, spot_basis=f"--spot-discount {discount:g} (your assumption)")

    def oldest(self) -> date:
        return min(p.as_of for p in [*self.on_demand.values(), *self.services.values()])


def check_discount(discount: float) -> None:
    if not 0 <= discount <= 0.9:
        raise PriceError(f"--spot-discount: got {discount!r}; allowed: 0 to 0.9 (AWS: spot saves 'up to 90%')")


def _date(value: Any, where: str) -> date:
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        raise PriceError(f"{where}: got {value!r}; allowed: an ISO date such as 2026-07-06") from None


def _price(entry: Any, where: str, sources: dict[str, date]) -> Price:
    if not isinstance(entry, dict) or set(entry) - {"price", "source", "confirmed"}:
        raise PriceError(f"{where}: got {entry!r}; allowed: an object with 'price', 'source' and optional 'confirmed'")
    usd, source = entry.get("price"), entry.get("source")
    if isinstance(usd, bool) or not isinstance(usd, (int, float)) or usd <= 0:
        raise PriceError(f"{where}.price: got {usd!r}; allowed: a positive number of US dollars")
    if source not in sources:
        raise PriceError(f"{where}.source: got {source!r}; allowed: one of the file's sources {sorted(sources)}")
    confirmed = entry.get("confirmed", True)
    if not isinstance(confirmed, bool):
        raise PriceError(f"{where}.confirmed: got {confirmed!r}; allowed: true or false")
    return Price(float(usd), source, sources[source], confirmed)


def parse_table(data: Any, region: str) -> PriceTable:
    """Validate a price file's content and return the table of ``region``."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise PriceError(f"price file: not a GenNStack price table (expected schema {SCHEMA!r})")
    raw_sources = data.get("sources")
    if not isinstance(raw_sources, dict) or not raw_sources:
        raise PriceError("price file: 'sources' must name at least one source")
    sources = {}
    for name, source in raw_sources.items():
        if not isinstance(source, dict) or not source.get("title") or not source.get("url"):
            raise PriceError(f"sources.{name}: got {source!r}; allowed: an object with 'title', 'url' and 'date'")
        sources[name] = _date(source.get("date"), f"sources.{name}.date")
    spot = data.get("spot_estimate", {})
    discount = spot.get("discount") if isinstance(spot, dict) else None
    if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not spot.get("basis"):
        raise PriceError(f"spot_estimate: got {spot!r}; allowed: an object with a 'discount' (0 to 0.9) and its 'basis'")
    check_discount(discount)
    regions = data.get("regions")
    if not isinstance(regions, dict) or region not in regions:
        raise PriceError(
            f"region: got {region!r}; allowed: a region the bundled price table has ({sorted(regions or {})}); "
            f"for {region} run `gennstack cost --live` (AWS Price List API)"
        )
    table = regions[region]
    ec2, services = table.get("ec2_on_demand_per_hour"), table.get("services")
    if not isinstance(ec2, dict) or not isinstance(services, dict):
        raise PriceError(f"regions.{region}: must hold 'ec2_on_demand_per_hour' and 'services' objects")
    missing = [key for key in SERVICE_KEYS if key not in services]
    unknown = [key for key in services if key not in SERVICE_KEYS]
    if missing or unknown:
        raise PriceError(f"regions.{region}.services: missing {missing}, unknown {unknown}; allowed keys: {list(SERVICE_KEYS)}")
    return PriceTable(
        region=region,
        on_demand={t: _price(e, f"regions.{region}.ec2_on_demand_per_hour.{t}", sources) for t, e in ec2.items()},
        services={k: _price(e, f"regions.{region}.services.{k}", sources) for k, e in services.items()},
        spot_discount=float(discount),
        spot_basis=str(spot["basis"]),
        sources={name: {k: str(v) for k, v in s.items()} for name, s in raw_sources.items()},
    )


def bundled_regions(path: Path = BUNDLED) -> list[str]:
    return sorted(json.loads(path.read_text(encoding="utf-8")).get("regions", {}))


def load_table(region: str, path: Path = BUNDLED) -> PriceTable:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PriceError(f"price file {path}: cannot read it: {exc}") from None
    return parse_table(data, region)
