"""``gennstack cost``: what a configuration costs per hour, and per million tokens of a benchmark.

Reads the config the synth reads (cdk.json's ``gennstack`` context, deep-merged with ``--config
PATH``). Prices come from the bundled, dated table (gennstack/cost/prices.json) or, with
``--live``, from the AWS Price List API and EC2 spot price history (read-only: pricing:GetProducts,
ec2:DescribeSpotPriceHistory). Spot prices are estimates offline and say so.

examples:
  gennstack cost                                   # hourly range of cdk.json's config
  gennstack cost --config prod.yaml --live         # today's prices, per-zone spot
  gennstack cost tokens bench-results/run-1 --instance-type g6e.12xlarge --replicas 8 --capacity-type spot --region us-east-1
  gennstack cost layouts --generation g6e          # which instance types and GPUs per replica cost what

A subcommand's flags go after its name (`gennstack cost layouts --config prod.yaml ...`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from gennstack.config_base import ConfigError
from gennstack.cost.prices import DEFAULT_REGION, PriceError, PriceTable, load_table
from gennstack.cost.tokens import CostInputError


def _price_override(text: str) -> tuple[str, float]:
    name, _, usd = text.partition("=")
    try:
        value = float(usd)
    except ValueError:
        value = -1.0
    if not name or value <= 0:
        raise argparse.ArgumentTypeError(f"--price {text!r}: expected INSTANCE_TYPE=USD_PER_HOUR, e.g. trn2.48xlarge=45.0")
    return name, value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--region", help="region to price (default: the config's region, else us-east-1)")
    parser.add_argument("--spot-discount", type=float, help="offline spot estimate: fraction off on-demand (default: the table's, 0.6)")
    parser.add_argument("--price", type=_price_override, action="append", default=[], metavar="TYPE=USD",
                        help="an on-demand $/hour for an instance type the table lacks or you pay differently (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("cost", help="hourly cost of a configuration; $ per 1M tokens of bench results",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="PATH", help="config file deep-merged over cdk.json, as `-c config=PATH`")
    parser.add_argument("--cdk-json", default="cdk.json", metavar="PATH", help="cdk.json to read (default: %(default)s)")
    parser.add_argument("--live", action="store_true", help="today's EC2 prices from AWS (Price List API, spot price history)")
    parser.add_argument("--profile", help="AWS profile for --live")
    parser.add_argument("--markdown", action="store_true", help="print the 'What it costs' block in full (docs/cost.md's)")
    parser.add_argument("--brief", action="store_true", help="with --markdown: one row per generation (the README's block)")
    _common(parser)
    parser.set_defaults(func=run_hourly)
    sub = parser.add_subparsers(dest="cost_command", metavar="{tokens,layouts}")

    tokens = sub.add_parser("tokens", help="$ per 1M output and total tokens of gennstack bench results")
    tokens.add_argument("results", nargs="+", help="result.json files or run directories")
    tokens.add_argument("--instance-type", help="node type the endpoint ran on (default: the result's recorded layout)")
    tokens.add_argument("--replicas", type=int, help="model-server replicas behind the endpoint")
    tokens.add_argument("--replicas-per-node", type=int, help="replicas sharing one node (default: 1)")
    tokens.add_argument("--capacity-type", help="spot, on-demand or reserved")
    tokens.add_argument("--hourly-price", type=float, help="$ per node-hour you paid (wins over the price table)")
    _common(tokens)
    tokens.set_defaults(func=run_tokens)

    layouts = sub.add_parser("layouts", help="compare the layouts the capacity model allows for a generation")
    layouts.add_argument("--generation", required=True, choices=("inf2", "trn2", "g6e"))
    layouts.add_argument("--replicas", type=int, help="replicas to place (default: the config's)")
    layouts.add_argument("--bench", action="append", default=[], metavar="RESULT",
                         help="a bench result whose recorded layout matches a row: adds its measured $/1M output tokens")
    layouts.add_argument("--config", metavar="PATH", help="config file deep-merged over cdk.json, as `-c config=PATH`")
    layouts.add_argument("--cdk-json", default="cdk.json", metavar="PATH", help="cdk.json to read (default: %(default)s)")
    _common(layouts)
    layouts.set_defaults(func=run_layouts)


def _table(args: argparse.Namespace, region: str, today: date) -> PriceTable:
    table = load_table(region)
    if args.spot_discount is not None:
        table = table.with_spot_discount(args.spot_discount)
    return table.with_overrides(dict(args.price), today) if args.price else table


def _config(args: argparse.Namespace):
    from gennstack.cli_config import read_config

    return read_config(Path(args.cdk_json), getattr(args, "config", None))


def run_hourly(args: argparse.Namespace, *, make_clients: Callable[[str], Any] | None = None,
               now: datetime | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """The command. Tests pass ``make_clients`` (region -> client factory of Stubber-wrapped clients) and a fixed ``now``."""
    from gennstack.cost import live, report
    from gennstack.cost.model import hourly_cost

    out, err = stdout or sys.stdout, stderr or sys.stderr
    now = now or datetime.now(timezone.utc)
    try:
        config = _config(args)
        region = args.region or config.region or DEFAULT_REGION
        note = "" if (args.region or config.region) else " (the config names no region: priced at us-east-1)"
        notes: list[str] = []
        share: dict[str, Any] | None = None
        newest = None
        if args.live:
            if make_clients is None:
                import boto3

                session = boto3.Session(profile_name=args.profile) if args.profile else boto3.Session()
                make_clients = lambda r: live.session_clients(session, r)  # noqa: E731
            types = sorted({t for g in config.generations.enabled().values() for t in g.instance_types}
                           | {config.cluster.system_node_instance_types[0], "m7i.xlarge"})
            zones = list(config.network.availability_zones) if config.network.availability_zones else None
            table, notes = live.live_table(region, types, zones, make_clients(region), now)
            table = table.with_overrides(dict(args.price), now.date()) if args.price else table
            share, newest = _on_demand_share(config, table, make_clients(region), now, notes)
        else:
            table = _table(args, region, now.date())
        breakdown = hourly_cost(config, table)
    except (ConfigError, PriceError, live.LiveError) as exc:
        print(f"gennstack cost: {exc}", file=err)
        return 2
    breakdown.notes.extend(notes)
    if args.markdown:
        print(report.markdown(breakdown, table, brief=args.brief), file=out)
    elif args.json:
        data = report.as_dict(breakdown, table, now.date())
        data["spot_by_zone"] = {t: {z: p.usd for z, p in zones.items()} for t, zones in table.spot_by_zone.items()}
        if share is not None:
            data["on_demand_now"] = {**share, "as_of": newest.isoformat() if newest else None}
        print(json.dumps(data, indent=2), file=out)
    else:
        lines = report.hourly_lines(breakdown, table, now.date(), region_note=note)
        if table.spot_by_zone:
            lines += ["spot prices by zone (live, cheapest first):", *live.spot_zones_lines(table)]
        if share is not None:
            lines += live.on_demand_share_lines(share, newest)
        print("\n".join(lines), file=out)
    return 0


def _on_demand_share(config: Any, table: PriceTable, clients: Callable[[str], Any], now: datetime,
                     notes: list[str]) -> tuple[dict[str, Any] | None, datetime | None]:
    """The deployed fleet's on-demand share at ``table``'s prices; a failed read is a note, not a failure
    (the prices above stand on their own)."""
    from gennstack.cost import live
    from gennstack.observability.names import INTERRUPTION_METRICS_NAMESPACE, INTERRUPTION_SERVICE_NAME

    generations = {name: g.instance_types for name, g in config.generations.enabled().items()}
    try:
        fleet, newest = live.fetch_fleet(clients("cloudwatch"), generations, now, namespace=INTERRUPTION_METRICS_NAMESPACE,
                                         service=INTERRUPTION_SERVICE_NAME)
        return live.on_demand_share(fleet, table), newest
    except (live.LiveError, PriceError) as exc:
        notes.append(f"on-demand share now not shown: {exc}")
        return None, None


def run_tokens(args: argparse.Namespace, *, now: datetime | None = None, stdout: TextIO | None = None,
               stderr: TextIO | None = None) -> int:
    from gennstack.bench.results import ResultFileError, load_result
    from gennstack.cost import report
    from gennstack.cost.tokens import fleet_prices, layout_of, level_costs

    out, err = stdout or sys.stdout, stderr or sys.stderr
    today = (now or datetime.now(timezone.utc)).date()
    flags = {"instance_type": args.instance_type, "replicas": args.replicas, "replicas_per_node": args.replicas_per_node,
             "capacity_type": args.capacity_type, "hourly_price": args.hourly_price, "region": args.region}
    docs = []
    try:
        for path in args.results:
            result = load_result(path)
            layout = layout_of(result, flags)
            if layout is None:
                raise CostInputError(f"{result['_path']}: records no layout; give --instance-type, --replicas, "
                                     "--capacity-type and --region (or --hourly-price)")
            table = None
            if layout.instance_type and layout.region:
                table = _table(args, layout.region, today)
            prices = fleet_prices(layout, table)
            docs.append((result, layout, prices, level_costs(result, prices)))
    except (ResultFileError, CostInputError, PriceError) as exc:
        print(f"gennstack cost tokens: {exc}", file=err)
        return 2
    if args.json:
        print(json.dumps([{"result": r["_path"], "layout": lay.to_dict(), "source": p.source, "spot_label": p.spot_label,
                           "levels": rows} for r, lay, p, rows in docs], indent=2), file=out)
        return 0
    for result, layout, prices, rows in docs:
        print("\n".join(report.token_lines(result["_path"], rows, prices, layout.describe(), today)), file=out)
    return 0


def run_layouts(args: argparse.Namespace, *, now: datetime | None = None, stdout: TextIO | None = None,
                stderr: TextIO | None = None) -> int:
    from gennstack.cost.layouts import compare_layouts, layout_lines

    out, err = stdout or sys.stdout, stderr or sys.stderr
    today = (now or datetime.now(timezone.utc)).date()
    try:
        config = _config(args)
        region = args.region or config.region or DEFAULT_REGION
        table = _table(args, region, today)
        rows = compare_layouts(config, args.generation, table, replicas=args.replicas, bench=args.bench)
    except (ConfigError, PriceError, CostInputError) as exc:
        print(f"gennstack cost layouts: {exc}", file=err)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
        return 0
    from gennstack.cost.report import age_note

    as_of = min(table.on_demand_price(r["instance_type"]).as_of for r in rows)
    lines = layout_lines(args.generation, region, rows)
    lines.append(f"{region} prices as of {as_of.isoformat()}{age_note(as_of, today)}"
                 + ("" if table.spot_by_zone else f"; spot is an estimate: {table.spot_discount:.0%} off on-demand"))
    print("\n".join(lines), file=out)
    return 0
