"""``gennstack cost --live``: today's prices from AWS, read-only.

* On-demand: the AWS Price List API (``pricing:GetProducts``, service ``AmazonEC2``), one query per
  instance type with the filters Karpenter v1.14.1 uses for the same purpose
  (``pkg/providers/pricing/pricing.go``, ``fetchOnDemandPricing`` with its shared-tenancy filters:
  regionCode, serviceCode, preInstalledSw NA, operatingSystem Linux, capacitystatus Used,
  marketoption OnDemand, tenancy Shared, productFamily "Compute Instance") plus ``instanceType``.
  Like Karpenter's ``onDemandPage``, price dimensions of 0 are skipped. The API answers from
  us-east-1 for every region (its endpoints are us-east-1, eu-central-1 and ap-south-1).
* Spot: ``ec2:DescribeSpotPriceHistory`` in the configured region with ``StartTime`` now, which
  returns each zone's current price (``Linux/UNIX``), limited to the configured zones when the config
  names them. A spot node is priced at its type's cheapest zone: a lower bound (the notes say so),
  since Karpenter v1.14.1 asks EC2 Fleet for spot with price-capacity-optimized allocation
  (pkg/providers/instance/types.go), which weighs capacity too, not every node in the cheapest zone.

* The on-demand share now: the interruption handler's ``AcceleratorNodes`` metric (CloudWatch
  ``GetMetricData``, read-only: the newest minute of the last ``FLEET_WINDOW_MINUTES``), the
  accelerator nodes its reconciler counted by generation, capacity type and instance type, priced
  at these prices: what the on-demand nodes cost per hour, and how much more than at spot.

Only EC2 prices are refreshed; service prices (EKS, NAT, endpoints, NLB, EBS) stay the bundled ones.
Clients come from a factory (service name -> client) so tests hand in botocore ``Stubber`` clients.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import date, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gennstack.cost.prices import DEFAULT_REGION, Price, PriceError, PriceTable, bundled_regions, load_table
from gennstack.preflight.aws import ACCESS_DENIED_CODES, client_config, error_code, is_throttled

ClientFactory = Callable[[str], Any]
PRICE_LIST_REGION = "us-east-1"
SPOT_PRODUCT = "Linux/UNIX"
ACTIONS = {"GetProducts": "pricing:GetProducts", "DescribeSpotPriceHistory": "ec2:DescribeSpotPriceHistory",
           "GetMetricData": "cloudwatch:GetMetricData"}
FLEET_METRIC = "AcceleratorNodes"  # lambdas/interruption_handler/handler.py
FLEET_CAPACITY_TYPES = ("on-demand", "spot", "reserved")
FLEET_WINDOW_MINUTES = 10
LIVE_SOURCE = "aws-live"


class LiveError(RuntimeError):
    """An AWS call of --live failed; the message names the action and what to do."""


def session_clients(session: Any, region: str) -> ClientFactory:
    """``pricing`` in us-east-1 (where the Price List API answers), ``ec2`` in ``region``, standard retries."""
    config = client_config()
    clients = {"pricing": session.client("pricing", region_name=PRICE_LIST_REGION, config=config),
               "ec2": session.client("ec2", region_name=region, config=config),
               "cloudwatch": session.client("cloudwatch", region_name=region, config=config)}
    return clients.__getitem__


def on_demand_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    fields = {"instanceType": instance_type, "regionCode": region, "serviceCode": "AmazonEC2", "preInstalledSw": "NA",
              "operatingSystem": "Linux", "capacitystatus": "Used", "marketoption": "OnDemand", "tenancy": "Shared",
              "productFamily": "Compute Instance"}
    return [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in fields.items()]


def parse_on_demand(item: str) -> tuple[float, date] | None:
    """(dollars per hour, effective date) of one Price List product (a JSON string); None when it has no non-zero hourly rate."""
    product = json.loads(item)
    rates = {(float(dim["pricePerUnit"]["USD"]), term["effectiveDate"])
             for term in product["terms"].get("OnDemand", {}).values() for dim in term["priceDimensions"].values()
             if dim.get("unit") == "Hrs" and float(dim["pricePerUnit"].get("USD", 0)) > 0}
    if not rates:
        return None
    if len(rates) > 1:
        raise LiveError(f"--live: Price List product {product['product'].get('sku')} has {len(rates)} hourly on-demand rates: "
                        f"{sorted(r[0] for r in rates)}")
    usd, effective = rates.pop()
    return usd, datetime.fromisoformat(effective.replace("Z", "+00:00")).date()


def _call(what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return fn(**kwargs)
    except ClientError as exc:
        action = ACTIONS.get(exc.operation_name, exc.operation_name)
        code, message = error_code(exc), exc.response.get("Error", {}).get("Message", "")
        if code in ACCESS_DENIED_CODES:
            raise LiveError(f"--live: access denied to {action} ({code}) while reading {what}; allow {action} "
                            "(read-only) or run without --live for the bundled prices") from None
        if is_throttled(exc):
            raise LiveError(f"--live: throttled by {action} ({code or 'HTTP 429'}) while reading {what}; run again in a minute") from None
        raise LiveError(f"--live: {action} failed with {code}: {message} (reading {what})") from None
    except BotoCoreError as exc:
        raise LiveError(f"--live: {type(exc).__name__}: {exc} (reading {what}); check your network, profile and credentials") from None


def fetch_on_demand(pricing: Any, instance_types: list[str], region: str) -> dict[str, Price]:
    """Today's on-demand Linux price of each type in ``region``; types the Price List does not sell there are left out."""
    prices = {}
    for instance_type in instance_types:
        items: list[str] = []
        token = None
        while True:
            params: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": on_demand_filters(instance_type, region),
                                      "FormatVersion": "aws_v1", "MaxResults": 100}
            if token:
                params["NextToken"] = token
            page = _call(f"the on-demand price of {instance_type} in {region}", pricing.get_products, **params)
            items.extend(page.get("PriceList", []))
            token = page.get("NextToken")
            if not token:
                break
        rates = {rate for rate in map(parse_on_demand, items) if rate is not None}
        if len({usd for usd, _ in rates}) > 1:
            raise LiveError(f"--live: the Price List has {len(rates)} different on-demand prices for {instance_type} in {region}: "
                            f"{sorted(usd for usd, _ in rates)}")
        if rates:
            usd, effective = max(rates, key=lambda rate: rate[1])
            prices[instance_type] = Price(usd, LIVE_SOURCE, effective, True, "list")
    return prices


def fetch_spot(ec2: Any, instance_types: list[str], zones: list[str] | None, now: datetime) -> dict[str, dict[str, Price]]:
    """Instance type -> zone -> its latest spot price (``Linux/UNIX``) as of ``now``."""
    params: dict[str, Any] = {"InstanceTypes": instance_types, "ProductDescriptions": [SPOT_PRODUCT], "StartTime": now}
    if zones:
        params["Filters"] = [{"Name": "availability-zone", "Values": zones}]
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    token = None
    while True:
        page = _call("spot price history", ec2.describe_spot_price_history, **params, **({"NextToken": token} if token else {}))
        for item in page.get("SpotPriceHistory", []):
            key, stamp = (item["InstanceType"], item["AvailabilityZone"]), item["Timestamp"]
            if key not in latest or stamp > latest[key][0]:
                latest[key] = (stamp, float(item["SpotPrice"]))
        token = page.get("NextToken")
        if not token:
            break
    out: dict[str, dict[str, Price]] = {}
    for (instance_type, zone), (stamp, usd) in sorted(latest.items()):
        out.setdefault(instance_type, {})[zone] = Price(usd, LIVE_SOURCE, stamp.date(), True, "observed")
    return out


def live_table(region: str, instance_types: list[str], zones: list[str] | None, clients: ClientFactory, now: datetime) -> tuple[PriceTable, list[str]]:
    """A table with today's EC2 prices for ``region`` over the bundled service prices, and notes on what was not refreshed."""
    notes = []
    if region in bundled_regions():
        base = load_table(region)
    else:
        base = load_table(DEFAULT_REGION)
        notes.append(f"service prices (EKS, NAT, endpoints, NLB, EBS) are the bundled {DEFAULT_REGION} ones: "
                     f"the bundled table has none for {region} and --live refreshes only EC2")
    on_demand = fetch_on_demand(clients("pricing"), instance_types, region)
    missing = [t for t in instance_types if t not in on_demand]
    if len(missing) == len(instance_types):
        raise PriceError(f"region: got {region!r}; the AWS Price List has no on-demand Linux price there for any of {instance_types}")
    if missing:
        notes.append(f"no on-demand price in {region} for {', '.join(missing)} (not sold on demand there)")
    spot = fetch_spot(clients("ec2"), instance_types, zones, now)
    if spot:
        notes.append("spot: every node is priced at its type's cheapest zone (a lower bound): Karpenter's spot "
                     "allocation (price-capacity-optimized) weighs capacity too and spreads replicas over zones, so "
                     "nodes also land in dearer zones; the per-zone prices are listed")
    no_spot = [t for t in instance_types if t in on_demand and t not in spot]
    if no_spot:
        notes.append(f"no spot price for {', '.join(no_spot)} in {'the configured zones' if zones else region}: "
                     "its spot figure is the estimate (on-demand less the stated discount)")
    sources = {**base.sources, LIVE_SOURCE: {"title": "AWS Price List API (GetProducts) and EC2 DescribeSpotPriceHistory",
                                             "url": "https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html",
                                             "date": now.date().isoformat()}}
    return replace(base, region=region, on_demand=on_demand, spot_by_zone=spot, sources=sources,
                   origin="AWS Price List API's answer (--live)"), notes


def spot_zones_lines(table: PriceTable) -> list[str]:
    """Per instance type: each zone's spot price, cheapest first, and its discount off on-demand."""
    lines = []
    for instance_type, zones in sorted(table.spot_by_zone.items()):
        od = table.on_demand.get(instance_type)
        cells = []
        for zone, price in sorted(zones.items(), key=lambda kv: (kv[1].usd, kv[0])):
            off = f" ({1 - price.usd / od.usd:.0%} off)" if od else ""
            cells.append(f"{zone} ${price.usd:.4f}{off}")
        lines.append(f"  {instance_type}: " + ", ".join(cells) + f"; cheapest {cells[0].split(' ')[0]}")
    return lines


def fleet_queries(generations: dict[str, tuple[str, ...]], *, namespace: str, service: str) -> list[dict[str, Any]]:
    """One ``GetMetricData`` query per (generation, capacity type, instance type) of ``AcceleratorNodes``,
    with the dimensions Powertools writes (the handler's own and ``service``)."""
    queries = []
    for generation, types in sorted(generations.items()):
        for capacity in FLEET_CAPACITY_TYPES:
            for instance_type in types:
                dimensions = {"generation": generation, "capacity_type": capacity, "instance_type": instance_type,
                              "service": service}
                queries.append({
                    "Id": f"q{len(queries)}",
                    "Label": f"{generation}|{capacity}|{instance_type}",
                    "MetricStat": {"Metric": {"Namespace": namespace, "MetricName": FLEET_METRIC,
                                              "Dimensions": [{"Name": k, "Value": v} for k, v in sorted(dimensions.items())]},
                                   "Period": 60, "Stat": "Maximum"},
                    "ReturnData": True,
                })
    return queries


def fetch_fleet(cloudwatch: Any, generations: dict[str, tuple[str, ...]], now: datetime, *, namespace: str,
                service: str) -> tuple[dict[tuple[str, str, str], int], datetime | None]:
    """``{(generation, capacity type, instance type): nodes}`` from each series' newest minute in the
    window (a series without one: none now, the handler publishes only what it counts), and that minute."""
    queries = fleet_queries(generations, namespace=namespace, service=service)
    labels = {q["Id"]: tuple(q["Label"].split("|")) for q in queries}
    found: dict[tuple[str, str, str], int] = {}
    newest: datetime | None = None
    for start in range(0, len(queries), 500):  # GetMetricData takes at most 500 queries
        params: dict[str, Any] = {"MetricDataQueries": queries[start:start + 500], "ScanBy": "TimestampDescending",
                                  "StartTime": now - timedelta(minutes=FLEET_WINDOW_MINUTES), "EndTime": now}
        while True:
            page = _call("the interruption handler's AcceleratorNodes", cloudwatch.get_metric_data, **params)
            for result in page.get("MetricDataResults", []):
                if result.get("Values") and result.get("Timestamps") and result["Id"] in labels:
                    key = labels[result["Id"]]
                    if key not in found:  # TimestampDescending: the first is the newest
                        found[key] = int(result["Values"][0])
                        stamp = result["Timestamps"][0]
                        newest = stamp if newest is None or stamp > newest else newest
            if not page.get("NextToken"):
                break
            params["NextToken"] = page["NextToken"]
    return {k: n for k, n in found.items() if n > 0}, newest


def on_demand_share(fleet: dict[tuple[str, str, str], int], table: PriceTable) -> dict[str, Any]:
    """What the on-demand nodes in ``fleet`` cost per hour at ``table``'s prices, and at spot's."""
    rows = []
    for (generation, capacity, instance_type), nodes in sorted(fleet.items()):
        if capacity != "on-demand":
            continue
        od, spot = table.on_demand_price(instance_type).usd, table.spot_price(instance_type).usd
        rows.append({"generation": generation, "instance_type": instance_type, "nodes": nodes,
                     "on_demand_usd_per_hour": nodes * od, "spot_usd_per_hour": nodes * spot,
                     "premium_usd_per_hour": nodes * (od - spot)})
    total = {key: sum(r[key] for r in rows) for key in ("on_demand_usd_per_hour", "spot_usd_per_hour", "premium_usd_per_hour")}
    counts = {c: sum(n for (_, cap, _), n in fleet.items() if cap == c) for c in FLEET_CAPACITY_TYPES}
    return {"nodes_by_capacity_type": counts, "on_demand": rows, **total}


def on_demand_share_lines(share: dict[str, Any], newest: datetime | None) -> list[str]:
    when = f" at {newest.isoformat(timespec='minutes')}" if newest else ""
    counts = ", ".join(f"{n} {c}" for c, n in share["nodes_by_capacity_type"].items())
    lines = [f"on-demand share now (the interruption handler's AcceleratorNodes{when}): accelerator nodes {counts}"]
    for row in share["on_demand"]:
        lines.append(f"  {row['generation']}: {row['nodes']} x {row['instance_type']} on-demand ${row['on_demand_usd_per_hour']:.2f}/h, "
                     f"${row['premium_usd_per_hour']:.2f}/h more than at spot (${row['spot_usd_per_hour']:.2f}/h)")
    lines.append(f"  on-demand premium now: ${share['premium_usd_per_hour']:.2f}/h" if share["on_demand"]
                 else "  no accelerator node on on-demand")
    return lines
