"""``gennstack cost layouts``: the layouts the capacity model allows for one generation, side by side.

For g6e: every g6e size the price table has, times every ``gpus_per_replica`` (1, 2, 4, 8) whose
replica fits the L40S memory (:mod:`gennstack.serving.capacity`) and splits the model's KV heads,
and that the size has GPUs for. For inf2 and trn2: the configured tensor-parallel layout, one
replica per node, on each size of the family. A bench result whose recorded layout matches a row
(instance type and replicas per node) adds its measured $/1M output tokens at its best level.
"""

from __future__ import annotations

from typing import Any

from gennstack.bench.results import load_result
from gennstack.config import GenNStackConfig
from gennstack.cost.model import NodeLayout, node_layouts
from gennstack.cost.prices import PriceError, PriceTable
from gennstack.cost.report import money
from gennstack.cost.tokens import CostInputError, fleet_prices, layout_of, level_costs
from gennstack.instances import INSTANCE_TYPES, family
from gennstack.serving.capacity import MODELS, CapacityError, Layout, check, plan
from gennstack.serving.fit import layout as serving_layout


def fitting_gpu_counts(config: GenNStackConfig, generation: str) -> list[int]:
    """Replica widths the capacity model allows: GPUs per replica on g6e, the configured TP degree on Neuron."""
    configured = serving_layout(generation, config.serving)
    if generation != "g6e":
        return [configured.tensor_parallel_size]
    model = MODELS[config.generations.g6e.model_id]
    fits = []
    for gpus in (1, 2, 4, 8):
        if model.num_kv_heads % gpus and gpus % model.num_kv_heads:
            continue
        try:
            check(plan(Layout("g6e", gpus, configured.max_num_seqs, configured.max_model_len, configured.gpu_memory_utilization), model))
        except CapacityError:
            continue
        fits.append(gpus)
    return fits


def _measured(bench: list[dict], layout: NodeLayout, table: PriceTable) -> dict[str, Any] | None:
    for result in bench:
        recorded = layout_of(result)
        if recorded and recorded.instance_type == layout.instance_type and recorded.replicas_per_node == layout.replicas_per_node:
            rows = level_costs(result, fleet_prices(recorded, table))
            best = min(rows, key=lambda r: r["usd_per_m_output_on_demand"])
            return {"result": result["_path"], "concurrency": best["concurrency"],
                    "user_output_tokens_per_s": best["user_output_tokens_per_s"],
                    "usd_per_m_output_spot": best["usd_per_m_output_spot"], "usd_per_m_output_on_demand": best["usd_per_m_output_on_demand"]}
    return None


def compare_layouts(config: GenNStackConfig, generation: str, table: PriceTable, *, replicas: int | None = None,
                    bench: list[str] = ()) -> list[dict[str, Any]]:
    gen = getattr(config.generations, generation)
    if replicas is None:
        from gennstack.cost.model import serving_replicas

        replicas = serving_replicas(config, generation)[0]
    if replicas < 1:
        raise CostInputError(f"--replicas: got {replicas!r}; allowed: 1 or more")
    results = [load_result(path) for path in bench]
    types = sorted((t for t in INSTANCE_TYPES if family(t) == family(gen.instance_types[0])),
                   key=lambda t: (INSTANCE_TYPES[t].accelerators, INSTANCE_TYPES[t].vcpu))
    configured_width = serving_layout(generation, config.serving).tensor_parallel_size
    rows = []
    for width, layout in node_layouts(generation, types, fitting_gpu_counts(config, generation), replicas):
        try:
            spot, od = table.spot_price(layout.instance_type), table.on_demand_price(layout.instance_type)
        except PriceError:
            continue
        rows.append({
            "instance_type": layout.instance_type, "accelerators_per_replica": width, "replicas": replicas,
            "replicas_per_node": layout.replicas_per_node, "nodes": layout.nodes, "idle_slots": layout.idle_slots,
            "spot_usd_per_hour": layout.nodes * spot.usd, "on_demand_usd_per_hour": layout.nodes * od.usd,
            "spot_kind": spot.kind,
            "allowed_by_config": layout.instance_type in gen.instance_types and width == configured_width,
            "measured": _measured(results, layout, table),
        })
    if not rows:
        raise PriceError(f"generation {generation}: no layout of its family has a price in {table.region}; "
                         "give one with --price TYPE=USD")
    return sorted(rows, key=lambda r: (r["on_demand_usd_per_hour"], r["instance_type"], r["accelerators_per_replica"]))


def layout_lines(generation: str, region: str, rows: list[dict[str, Any]]) -> list[str]:
    unit = "GPUs" if generation == "g6e" else "TP"
    spot_head = "spot (estimate)" if rows and rows[0]["spot_kind"] == "estimate" else "spot (observed)"
    lines = [f"layouts for {generation} in {region}, {rows[0]['replicas']} replica(s), cheapest on-demand first "
             f"(* = allowed by the current config)",
             f"  {'instance type':<14} {unit:>4} {'per node':>8} {'nodes':>5} {'idle':>4} {spot_head + ' $/h':>20} {'on-demand $/h':>14}  measured"]
    for r in rows:
        measured = r["measured"]
        m = (f"{spot_head} {money(measured['usd_per_m_output_spot'] or 0)} / on-demand {money(measured['usd_per_m_output_on_demand'])} "
             "per 1M output tokens "
             f"at c={measured['concurrency']} ({measured['user_output_tokens_per_s'] or 0:,.1f} tok/s per user)") if measured else "–"
        lines.append(f"{'*' if r['allowed_by_config'] else ' '} {r['instance_type']:<14} {r['accelerators_per_replica']:>4} "
                     f"{r['replicas_per_node']:>8} {r['nodes']:>5} {r['idle_slots']:>4} {money(r['spot_usd_per_hour']):>20} "
                     f"{money(r['on_demand_usd_per_hour']):>14}  {m}")
    return lines
