"""``gennstack simulate``: the spot policies side by side on one seeded trace (issue 31, section 3).

Prints a Markdown block (the README's ``spot-simulation`` block is this output at the defaults;
tests/test_simulate.py holds them equal). See docs/spot-drills.md for the model.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from gennstack.cost.prices import load_table
from gennstack.simulate.engine import GENERATION, Workload, simulate
from gennstack.simulate.trace import TraceParams, generate

TARGET_SAVING, TARGET_LOST = 0.43, 0.003  # SkyServe (arXiv 2411.01438): 43 % cheaper; <= 0.3 % lost


def render(params: TraceParams = TraceParams(), workload: Workload = Workload(), region: str = "us-east-1") -> str:
    table = load_table(region)
    instance_type = params.instance_types[0]
    prices = {c: table.price(instance_type, c).usd for c in ("spot", "on-demand")}
    trace = generate(params)
    results = simulate(trace, workload, prices)
    base = results[0].cost
    lines = [
        f"Spot simulation (`gennstack simulate`): {workload.replicas} replicas of the {GENERATION} generation on "
        f"{instance_type} over {len(params.zones)} zones, {params.hours:g} h; a generated trace (no public spot trace of "
        f"inf2, trn2 or g6e exists to read), seed {params.seed}, {len(trace.bursts)} reclaim bursts; prices "
        f"{region} on-demand ${prices['on-demand']:.5g}/h, spot ${prices['spot']:.5g}/h (gennstack/cost/prices.json).",
        "",
        "| policy | availability | requests failed | broken | lost share | spot node-h | on-demand node-h | cost | vs all on-demand | moves back to spot |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.policy} | {r.availability:.2%} | {r.failed:.0f} | {r.broken:.0f} | {r.lost_share:.2%} | "
            f"{r.node_hours['spot']:.1f} | {r.node_hours['on-demand']:.1f} | ${r.cost:.0f} | "
            f"{1 - r.cost / base:.0%} cheaper | {r.moves} |")
    ours = results[-1]
    met = (1 - ours.cost / base) >= TARGET_SAVING and ours.lost_share <= TARGET_LOST
    lines += ["", f"Targets (SkyServe): >= {TARGET_SAVING:.0%} cheaper with <= {TARGET_LOST:.1%} of requests failed "
                  f"or broken: {'met' if met else 'not met'} by GenNStack with issue 31.", "",
              "Trace parameters (`burst_share`, `burst_window_s`: Spot-and-Scoot's > 92 % within 3 min; the rest "
              "assumptions): " + ", ".join(f"{k}={v}" for k, v in params.describe().items()) + ".",
              "Workload (assumptions but `drain_saved`, the local drill's 159 of 159; `resume_saved`: broken streams "
              "stream resume saves, from the resume drill's 14 of 14, GenNStack policies only): " + ", ".join(f"{k}={v}" for k, v in asdict(workload).items()) + "."]
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("simulate", help="replay a spot trace against the spot policies (issue 31)")
    parser.add_argument("--seed", type=int, default=TraceParams.seed)
    parser.add_argument("--hours", type=float, default=TraceParams.hours)
    parser.add_argument("--resume-saved", type=float, default=Workload.resume_saved,
                        help="share of broken streams stream resume saves in the GenNStack policies (default: 1, the resume drill)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if not 0.0 <= args.resume_saved <= 1.0:
        raise SystemExit(f"--resume-saved: got {args.resume_saved}; allowed: 0 to 1")
    if args.hours <= 0:
        raise SystemExit(f"--hours: got {args.hours}; allowed: > 0")
    print(render(TraceParams(hours=args.hours, seed=args.seed), Workload(resume_saved=args.resume_saved)))
    return 0
