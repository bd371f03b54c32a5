"""``gennstack simulate``: the spot policies side by side on one seeded trace (issue 31, section 3).

Prints a Markdown block (the README's ``spot-simulation`` block is this output with ``--brief``,
docs/spot-drills.md's ``spot-simulation-detail`` block without; tests/test_simulate.py holds them equal). See docs/spot-drills.md for the model.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import asdict, replace
from datetime import date

from gennstack.cost.cli import _price_override
from gennstack.cost.prices import PriceError, load_table
from gennstack.simulate.engine import GENERATIONS, POLICIES, START_TIMES, Workload, generation_model, simulate
from gennstack.simulate.trace import TraceParams, generate

TARGET_SAVING, TARGET_LOST = 0.43, 0.003  # SkyServe (arXiv 2411.01438): 43 % cheaper; <= 0.3 % lost
POOLS = {"inf2": "gen1-inf2", "trn2": "gen2-trn2", "g6e": "gen3-g6e"}
SUMMARY_SEEDS = range(1, 31)


def render(params: TraceParams = TraceParams(), workload: Workload = Workload(), region: str = "us-east-1",
           generations: tuple[str, ...] = GENERATIONS, prices: dict[str, float] | None = None, *,
           strict: bool = False, seeds: range = SUMMARY_SEEDS, detail: bool = True) -> str:
    """The Markdown block: every policy on one trace (``params.seed``; ``detail`` only), then the same
    over ``seeds``. The README carries the block without the detail, docs/spot-drills.md with it.

    A generation with an instance type the price table lacks (trn2.48xlarge in the bundled us-east-1
    table) is skipped with a note, or, with ``strict``, is an error."""
    table = load_table(region).with_overrides(prices, date.today()) if prices else load_table(region)
    rows, summary, verdicts, described, skipped = [], [], [], [], []
    for name in generations:
        gen = generation_model(name)
        unpriced = [t for t in gen.instance_types if t not in table.on_demand]
        if unpriced:
            if strict:
                raise PriceError(f"--generation {name}: no on-demand price for {unpriced} in {region}'s table "
                                 f"(gennstack/cost/prices.json); give one with --price {unpriced[0]}=USD_PER_HOUR")
            skipped.append(f"{POOLS[name]} is not simulated: no offline on-demand price for {', '.join(unpriced)} in "
                           f"{region} (gennstack/cost/prices.json); `gennstack simulate --generation {name} --price "
                           f"{unpriced[0]}=USD_PER_HOUR` simulates it")
            continue
        node_prices = {t: {c: table.price(t, c).usd for c in ("spot", "on-demand")} for t in gen.instance_types}
        trace = generate(replace(params, instance_types=gen.instance_types))
        results = simulate(trace, workload, node_prices, gen)
        base = results[0].cost
        for r in results:
            rows.append(
                f"| {POOLS[name]} | {r.policy} | {r.availability:.2%} | {r.failed:.0f} | {r.broken:.0f} | {r.lost_share:.2%} | "
                f"{r.node_hours['spot']:.1f} | {r.node_hours['on-demand']:.1f} | ${r.cost:,.0f} | "
                f"{1 - r.cost / base:.0%} cheaper | {r.moves} |")
        runs = [simulate(generate(replace(params, instance_types=gen.instance_types, seed=seed)), workload, node_prices, gen)
                for seed in seeds]
        for i, policy in enumerate(POLICIES[1:], start=1):
            lost = sorted(run[i].lost_share for run in runs)
            saving = [1 - run[i].cost / run[0].cost for run in runs]
            summary.append(f"| {POOLS[name]} | {policy} | {statistics.mean(lost):.2%} | {_decile9(lost):.2%} | "
                           f"{statistics.mean(saving):.1%} | {min(saving):.1%} | {sum(run[i].moves for run in runs)} |")
        ours = results[-1]
        saving = 1 - ours.cost / base
        lost = [run[-1].lost_share for run in runs]
        mean_saving = statistics.mean(1 - run[-1].cost / run[0].cost for run in runs)
        verdicts.append(
            f"{POOLS[name]} {_verdict(saving, ours.lost_share)} on seed {params.seed} ({saving:.0%} cheaper, "
            f"{ours.lost_share:.2%} lost) and {_verdict(mean_saving, statistics.mean(lost))} on the mean of seeds "
            f"{seeds.start}-{seeds.stop - 1} ({mean_saving:.1%}, {statistics.mean(lost):.2%})")
        cold, warm = START_TIMES[name]
        spot = [p["spot"] for p in node_prices.values()]
        on_demand = [p["on-demand"] for p in node_prices.values()]
        described.append(
            f"{POOLS[name]}: {', '.join(gen.instance_types)} (spot ${min(spot):.5g}/h to ${max(spot):.5g}/h, on-demand "
            f"${min(on_demand):.5g}/h to ${max(on_demand):.5g}/h), {len(trace.bursts)} reclaim bursts on seed "
            f"{params.seed}, start {cold:g} s cold / {warm:g} s on a warm spare, drains on "
            f"{', '.join(sorted(gen.drain_signals)) or 'no signal'}, "
            + ("moves back to spot with issue 31 (interruptions.return_to_spot, on by default)" if gen.moves_back
               else "never moves back to spot"))
        if not detail:
            verdicts[-1] = (f"{POOLS[name]} {_verdict(mean_saving, statistics.mean(lost))} on the mean of seeds "
                            f"{seeds.start}-{seeds.stop - 1} ({mean_saving:.1%} cheaper, {statistics.mean(lost):.2%} lost)")
    lines = [
        f"Spot simulation (`gennstack simulate`): {workload.replicas} replicas per generation over "
        f"{len(params.zones)} zones, {params.hours:g} h; a generated trace per generation, over its offerings (zone x "
        f"instance type; no public spot trace of inf2, trn2 or g6e exists to read); prices {region} "
        "(gennstack/cost/prices.json).",
        "",
        *([f"Seed {params.seed}:",
           "",
           "| generation | policy | availability | requests failed | broken | lost share | spot node-h | on-demand node-h | cost | vs all on-demand | moves back to spot |",
           "|---|---|---|---|---|---|---|---|---|---|---|",
           *rows,
           ""] if detail else []),
        f"Seeds {seeds.start}-{seeds.stop - 1}, one trace each (lost share: failed and broken over all requests; saving: "
        "against all on-demand on the same trace):",
        "",
        "| generation | policy | lost share, mean | lost share, 9th decile | saving, mean | saving, worst | moves back to spot |",
        "|---|---|---|---|---|---|---|",
        *summary,
        "",
        f"Targets (SkyServe): >= {TARGET_SAVING:.0%} cheaper with <= {TARGET_LOST:.1%} of requests failed or broken, "
        "GenNStack with issue 31: " + "; ".join(verdicts) + ".",
        "",
        *([" ".join(s + "." for s in skipped), ""] if skipped else []),
        "Generations (instance types and drain signals: the defaults; start times: the upper ends of the cold-start "
        "budget's estimates, docs/serving.md): " + "; ".join(described) + ".",
        "Trace parameters (`burst_share`, `burst_window_s`: Spot-and-Scoot's > 92 % within 3 min, per instance type and "
        "zone; offerings reclaimed independently of each other and the rest: assumptions): "
        + ", ".join(f"{k}={v}" for k, v in params.describe().items() if k != "instance_types") + ".",
        "Workload (assumptions but `drain_saved`, the local drill's 159 of 159; `resume_saved`: broken streams "
        "stream resume saves, from the resume drill's 14 of 14, GenNStack policies only): "
        + ", ".join(f"{k}={v}" for k, v in asdict(workload).items()) + ".",
    ]
    return "\n".join(lines)


def _verdict(saving: float, lost: float) -> str:
    return "met" if saving >= TARGET_SAVING and lost <= TARGET_LOST else "not met"


def _decile9(ordered: list[float]) -> float:
    """The 9th decile, nearest rank (the smallest value with at least 90 % of them at or below it)."""
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("simulate", help="replay a spot trace against the spot policies (issue 31)")
    parser.add_argument("--seed", type=int, default=TraceParams.seed)
    parser.add_argument("--hours", type=float, default=TraceParams.hours)
    parser.add_argument("--generation", action="append", choices=GENERATIONS,
                        help="simulate this generation (repeatable; default: every one the price table prices)")
    parser.add_argument("--price", type=_price_override, action="append", default=[], metavar="TYPE=USD",
                        help="an on-demand $/hour for an instance type the table lacks, e.g. trn2.48xlarge (repeatable)")
    parser.add_argument("--brief", action="store_true",
                        help="only the summary over seeds 1-30, not the one trace's table (the README's block)")
    parser.add_argument("--resume-saved", type=float, default=Workload.resume_saved,
                        help="share of broken streams stream resume saves in the GenNStack policies (default: 1, the resume drill)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if not 0.0 <= args.resume_saved <= 1.0:
        raise SystemExit(f"--resume-saved: got {args.resume_saved}; allowed: 0 to 1")
    if args.hours <= 0:
        raise SystemExit(f"--hours: got {args.hours}; allowed: > 0")
    generations = tuple(dict.fromkeys(args.generation)) if args.generation else GENERATIONS
    try:
        print(render(TraceParams(hours=args.hours, seed=args.seed), Workload(resume_saved=args.resume_saved),
                     generations=generations, prices=dict(args.price), strict=bool(args.generation),
                     detail=not args.brief))
    except PriceError as exc:
        raise SystemExit(str(exc)) from None
    return 0
