"""How ``gennstack cost`` shows its numbers: terminal lines, JSON, and the README's markdown.

Every spot figure carries its basis ("estimate: 60% off on-demand" offline, "observed" with
--live), every price table its date, and stale or unconfirmed prices are listed under the totals.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from gennstack.cost.model import Breakdown, LineItem
from gennstack.cost.prices import HOURS_PER_MONTH, STALE_AFTER_DAYS, PriceTable

# The seed design's Gen3: 8 x g6e.12xlarge (4 x L40S, TP 4), 3,600-5,200 output tok/s aggregate, on demand.
SEED_BASELINE = {"instance_type": "g6e.12xlarge", "nodes": 8, "tokens_per_s": (3600, 5200), "region": "us-east-1"}


def spot_label(table: PriceTable) -> str:
    if table.spot_by_zone:
        return "spot (observed, cheapest zone)"
    return f"spot (estimate: {table.spot_discount:.0%} off on-demand)"


def money(usd: float) -> str:
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.4f}"


def price_notes(breakdown: Breakdown, table: PriceTable, today: date | None) -> list[str]:
    """Dates and ages of the prices used, stale ones, unconfirmed ones and the spot basis."""
    used = breakdown.prices()
    dates = sorted({p.as_of for p in used if p.kind != "observed"})
    lines = []
    if dates:
        when = ", ".join(d.isoformat() for d in dates)
        if today is None:
            lines.append(f"prices as of {when} (gennstack/cost/prices.json names each source)")
        else:
            oldest = dates[0]
            age = (today - oldest).days
            stale = f": STALE, older than {STALE_AFTER_DAYS} days; check them or run with --live" if age > STALE_AFTER_DAYS else ""
            lines.append(f"prices as of {when}; the oldest is {age} days old{stale}")
    unconfirmed = sorted({f"{key} (${p.usd:g}, source {p.source})" for key, p in table.services.items()
                          if not p.confirmed and p in used})
    if unconfirmed:
        lines.append("unconfirmed (one public source, not checked against AWS): " + ", ".join(unconfirmed))
    if not table.spot_by_zone:
        lines.append(f"spot is an estimate: {table.spot_basis}")
    return lines


def hourly_lines(breakdown: Breakdown, table: PriceTable, today: date | None, *, region_note: str = "") -> list[str]:
    label = spot_label(table)
    lines = [f"GenNStack cost per hour in {breakdown.region}{region_note}: what runs all the time",
             f"{'ITEM':<86} {label:>40} {'ON-DEMAND':>11}"]
    for group, items in breakdown.groups.items():
        lines.append(group if group == "platform" else f"generation {group}")
        for item in items:
            lines.append(f"  {item.name:<84} {money(item.spot_usd_per_hour):>40} {money(item.on_demand_usd_per_hour):>11}"
                         + (f"  ({item.note})" if item.note else ""))
        spot, od = breakdown.total(group)
        lines.append(f"  {'subtotal':<84} {money(spot):>40} {money(od):>11}")
    spot, od = breakdown.total()
    lines.append(f"TOTAL {money(spot)}-{money(od)} per hour ({label} to on-demand), "
                 f"{money(spot * HOURS_PER_MONTH)}-{money(od * HOURS_PER_MONTH)} per month of {HOURS_PER_MONTH} h")
    for what, why in breakdown.unpriced:
        lines.append(f"WARNING: {what} is not in the totals: {why}")
    lines.extend(breakdown.notes)
    lines.extend(price_notes(breakdown, table, today))
    return lines


def _item_dict(item: LineItem) -> dict[str, Any]:
    return {"name": item.name, "quantity": item.quantity, "spot_usd_per_hour": round(item.spot_usd_per_hour, 6),
            "on_demand_usd_per_hour": round(item.on_demand_usd_per_hour, 6), "note": item.note,
            "prices": [{"usd": p.usd, "source": p.source, "as_of": p.as_of.isoformat(), "kind": p.kind, "confirmed": p.confirmed}
                       for p in item.prices]}


def as_dict(breakdown: Breakdown, table: PriceTable, today: date | None) -> dict[str, Any]:
    spot, od = breakdown.total()
    return {
        "region": breakdown.region,
        "spot_basis": "observed" if table.spot_by_zone else {"estimate": True, "discount": table.spot_discount, "basis": table.spot_basis},
        "groups": {g: {"items": [_item_dict(i) for i in items],
                       "spot_usd_per_hour": round(breakdown.total(g)[0], 6), "on_demand_usd_per_hour": round(breakdown.total(g)[1], 6)}
                   for g, items in breakdown.groups.items()},
        "layouts": {g: {"instance_type": layout.instance_type, "nodes": layout.nodes, "replicas": layout.replicas,
                        "warm_spares": layout.spares, "replicas_per_node": layout.replicas_per_node, "idle_slots": layout.idle_slots}
                    for g, layout in breakdown.layouts.items()},
        "total": {"spot_usd_per_hour": round(spot, 6), "on_demand_usd_per_hour": round(od, 6),
                  "spot_usd_per_month": round(spot * HOURS_PER_MONTH, 2), "on_demand_usd_per_month": round(od * HOURS_PER_MONTH, 2)},
        "unpriced": [{"item": what, "reason": why} for what, why in breakdown.unpriced],
        "notes": breakdown.notes + price_notes(breakdown, table, today),
        "sources": table.sources,
    }


def seed_baseline(table: PriceTable) -> tuple[float, float, float]:
    """(fleet $/h, $/1M output tokens at the high and at the low throughput) of the seed design, on demand."""
    from gennstack.cost.model import per_million

    fleet = SEED_BASELINE["nodes"] * table.on_demand_price(SEED_BASELINE["instance_type"]).usd
    low_tps, high_tps = SEED_BASELINE["tokens_per_s"]
    return fleet, per_million(fleet, high_tps), per_million(fleet, low_tps)


def markdown(breakdown: Breakdown, table: PriceTable, *, brief: bool = False) -> str:
    """The "What it costs" block: the default config's always-on items and the seed baseline. ``brief``
    (the README's): the platform and each generation as one row each, and only what the totals leave out;
    in full (docs/cost.md's): every item and every note on the prices."""
    label = spot_label(table)
    rows = [f"| {'part' if brief else 'item'} | {label} $/h | on-demand $/h |", "|---|---|---|"]
    for group, items in breakdown.groups.items():
        if brief:
            spot, od = breakdown.total(group)
            name = "platform (EKS, system nodes, network, keys, monitoring)" if group == "platform" else (
                "`" + group + "`: " + ", ".join(item.name.split(" (")[0] for item in items))
            rows.append(f"| {name} | {money(spot)} | {money(od)} |")
            continue
        for item in items:
            where = "" if group == "platform" else f"`{group}`: "
            rows.append(f"| {where}{item.name} | {money(item.spot_usd_per_hour)} | {money(item.on_demand_usd_per_hour)} |")
    for group in breakdown.groups if not brief else ():
        if group != "platform":
            spot, od = breakdown.total(group)
            rows.append(f"| **`{group}` subtotal** | {money(spot)} | {money(od)} |")
    spot, od = breakdown.total()
    rows.append(f"| **total** | **{money(spot)}** ({money(spot * HOURS_PER_MONTH)}/month) | **{money(od)}** ({money(od * HOURS_PER_MONTH)}/month) |")
    text = [f"Default configuration in {breakdown.region}, computed by `gennstack cost` "
            f"(months of {HOURS_PER_MONTH} h):", "", *rows, ""]
    for what, why in breakdown.unpriced:
        text.append(f"- **Not in the totals:** {what}: {why}.")
    if brief:
        text.append("- Every item, the ceilings, what is not included and the prices' sources: [Cost](docs/cost.md#what-it-costs-item-by-item).")
    else:
        text.extend(f"- {note[0].upper()}{note[1:].rstrip('.')}." for note in breakdown.notes + price_notes(breakdown, table, None))
    fleet, best, worst = seed_baseline(table)
    low, high = SEED_BASELINE["tokens_per_s"]
    text += ["", f"**The number to beat.** The seed design's Gen3 ran {SEED_BASELINE['nodes']} x {SEED_BASELINE['instance_type']} "
             f"(4 x L40S each, tensor parallel 4) at {low:,}-{high:,} output tokens/s in aggregate. On demand in "
             f"{SEED_BASELINE['region']} that fleet costs {money(fleet)}/h, so **{money(best)}-{money(worst)} per million output "
             "tokens**. Measure your own with `gennstack bench ... --instance-type --replicas --capacity-type` and price it with "
             "`gennstack cost tokens`."]
    return "\n".join(text)


def age_note(as_of: date | None, today: date | None) -> str:
    """`` (147 days old: STALE ...)`` for a table price, empty without one."""
    if as_of is None or today is None:
        return ""
    age = (today - as_of).days
    return f" ({age} days old" + (f": STALE, older than {STALE_AFTER_DAYS} days; check them or run gennstack cost --live)"
                                  if age > STALE_AFTER_DAYS else ")")


def token_lines(label: str, rows: list[dict[str, Any]], prices: Any, describe: str, today: date | None = None) -> list[str]:
    lines = [f"{label}: {describe}; {prices.source}{age_note(prices.as_of, today)}"]
    columns = [("recorded", "recorded"), ("spot", prices.spot_label or "spot"), ("on_demand", "on-demand")]
    present = [(key, name) for key, name in columns if rows and rows[0][f"usd_per_hour_{key}"] is not None]
    header = f"  {'conc.':>5} {'user tok/s':>10} {'agg tok/s':>10}" + "".join(f" | {name} $/h, $/1M out, $/1M total" for _, name in present)
    lines.append(header)
    for row in rows:
        cells = f"  {row['concurrency']:>5} {row['user_output_tokens_per_s'] or 0:>10,.1f} {row['aggregate_output_tokens_per_s']:>10,.1f}"
        for key, _ in present:
            total = row[f"usd_per_m_total_{key}"]
            cells += (f" | {money(row[f'usd_per_hour_{key}'])}, {money(row[f'usd_per_m_output_{key}'])}, "
                      f"{money(total) if total is not None else '–'}")
        lines.append(cells)
    return lines
