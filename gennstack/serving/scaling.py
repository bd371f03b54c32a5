"""How each generation's serving replicas scale on load, in the terms several modules share.

gen1-inf2 scales with Ray Serve's autoscaler; gen2-trn2 and gen3-g6e with a KEDA ScaledObject (an
HPA) on vLLM's own gauges, summed over a generation's servers in Prometheus (the serving chart's
templates/scaledobjects.yaml). All three read the same config keys (``min_replicas``,
``max_replicas``, ``target_ongoing_requests``, ``scale_up_delay_seconds``,
``scale_down_delay_seconds``), and aim at the same quantity: requests in flight (running + queued)
per replica. docs/autoscaling.md says what the simulation in tests/autoscaling shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gennstack.config_base import ConfigError
from gennstack.instances import INSTANCE_TYPES, pool_limits

if TYPE_CHECKING:
    from gennstack.generations import GenerationsConfig
    from gennstack.serving.config import ServingConfig

__all__ = ["LOAD_GAUGES", "SCALERS", "check_nodes_admit", "replica_accelerators", "scaling_line", "worst_case_usage"]

# vLLM's scheduler gauges, per engine, labelled model_name (the served name) and engine. Defined in
# vllm/v1/metrics/loggers.py (PrometheusStatLogger) with these names in both vLLM GenNStack deploys:
# v0.29.0 (g6e, images.vllm) and v0.16.0 (the Neuron DLC, trn2 and inf2).
LOAD_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")

SCALERS = {"inf2": "Ray Serve autoscaling", "trn2": "KEDA/HPA", "g6e": "KEDA/HPA"}


def replica_accelerators(generation: str, instance_types: tuple[str, ...], gpus_per_replica: int) -> int:
    """Accelerator devices one serving replica asks for: its GPUs on g6e; on Neuron every chip of the
    smallest configured type (gennstack/serving/values.py ``_chips``: a replica takes a whole node)."""
    if generation == "g6e":
        return gpus_per_replica
    return min(INSTANCE_TYPES[t].accelerators for t in instance_types)


def worst_case_usage(instance_types: tuple[str, ...], per_replica: int, replicas: int) -> dict[str, int]:
    """The most vCPUs, GiB and accelerators the nodes under ``replicas`` serving replicas can add up to.

    Karpenter launches a node only for a pod the scheduler cannot place, so when a node is launched
    every existing node is full for a replica; later scale-downs free room there, which the next
    replicas fill before any node is launched. The worst fleet is therefore some full nodes holding at
    most ``replicas - 1`` replicas, of whatever types add up to the most of a resource (an unbounded
    knapsack over the types, a full node of type t holding ``accelerators_t // per_replica``), plus
    one node of the largest type holding the last replica. The types are any Karpenter may pick.
    """
    fits = {t: INSTANCE_TYPES[t].accelerators // per_replica for t in instance_types}
    usable = [t for t, fit in fits.items() if fit > 0]
    usage: dict[str, int] = {}
    for resource in ("vcpu", "memory_gib", "accelerators"):
        best = [0] * replicas  # best[c]: most of the resource in full nodes holding at most c replicas
        for c in range(1, replicas):
            best[c] = max([best[c - 1]] + [best[c - fits[t]] + getattr(INSTANCE_TYPES[t], resource)
                                          for t in usable if fits[t] <= c])
        last = max(getattr(INSTANCE_TYPES[t], resource) for t in usable)
        usage[resource] = (best[replicas - 1] if replicas else 0) + last
    return usage


def check_nodes_admit(generations: GenerationsConfig, serving: ServingConfig) -> None:
    """``max_replicas`` must fit under the generation's NodePool limits in the worst case.

    The limits (gennstack.instances.pool_limits) are ``max_nodes`` nodes of the largest configured
    type; :func:`worst_case_usage` is the most the nodes under ``max_replicas`` replicas can take. Each
    pool (spot, on-demand fallback, reserved) has these limits, so the spot pool alone must admit it.
    Warm spares need no room of their own: a serving pod preempts one (it has the higher priority)
    and takes its node.

    gen1's RayService also needs room for a second RayCluster: KubeRay v1.7.0 upgrades a RayService
    whose ``rayClusterConfig`` changed (an image or pod template bump) by the ``NewCluster`` strategy,
    its default with no ``upgradeStrategy`` (``rayservice_controller.go``
    ``isZeroDowntimeUpgradeEnabled``). It starts a pending RayCluster beside the active one and
    points the Service at it only once every Serve application on it is RUNNING
    (``getAndCheckServeStatus``), i.e. once ``min_replicas`` replicas run there; the active cluster
    keeps its replicas, up to ``max_replicas``, until then. Without room for both the pending
    cluster's workers never schedule and the upgrade never finishes, so the pool must admit the
    worst case of ``max_replicas`` plus that of ``min_replicas`` (two fleets: a Neuron replica takes
    a whole node). The strategy stays ``NewCluster``: with ``None`` KubeRay never applies such a
    change at all, and gen1 would keep serving the old image.
    """
    keys = {"vcpu": "cpu", "memory_gib": "memory_gib", "accelerators": None}
    for name, generation in generations.enabled().items():
        section = getattr(serving, name)
        types = generation.instance_types
        per_replica = replica_accelerators(name, types, getattr(section, "gpus_per_replica", 1))
        if not any(INSTANCE_TYPES[t].accelerators >= per_replica for t in types):
            continue  # check_fits reports a replica no type holds
        limits = pool_limits(types, generation.max_nodes)
        usage = worst_case_usage(types, per_replica, section.max_replicas)
        upgrade = name == "inf2"  # its RayService (min_replicas is at least 1)
        if upgrade:
            pending = worst_case_usage(types, per_replica, section.min_replicas)
            usage = {resource: need + pending[resource] for resource, need in usage.items()}
        for resource, need in usage.items():
            key = keys[resource] or INSTANCE_TYPES[types[0]].accelerator_resource
            if need > limits[key]:
                what = (f"{section.max_replicas} replicas of the active RayCluster and the {section.min_replicas} a "
                        f"KubeRay upgrade's pending RayCluster starts beside it (NewCluster) sit on nodes"
                        if upgrade else f"{section.max_replicas} replicas sit on nodes")
                lower = "lower max_replicas or min_replicas" if upgrade else "lower max_replicas"
                raise ConfigError(
                    f"serving.{name}.max_replicas: got {section.max_replicas}; allowed: at most what "
                    f"generations.{name}.max_nodes ({generation.max_nodes}) admits: in the worst case "
                    f"{what} with {need} {key} in all, over the NodePool's "
                    f"limit of {limits[key]}; raise generations.{name}.max_nodes or {lower}"
                )


def scaling_line(generation: str, section: Mapping[str, Any]) -> str:
    """One line for ``gennstack summary``: the range, the signal and the delays, from recorded config."""
    low, high = int(section["min_replicas"]), int(section["max_replicas"])
    target = int(section["target_ongoing_requests"])
    seqs = int(section["max_num_seqs"])
    scaler = SCALERS[generation]
    signal = "in-flight requests per replica" if generation == "inf2" else f"{' + '.join(LOAD_GAUGES)} per replica"
    return (
        f"Scaling: {low}-{high} replicas by {scaler} on {signal}, target {target} (batch {seqs}); "
        f"up after {section['scale_up_delay_seconds']} s, down after {section['scale_down_delay_seconds']} s below target; "
        f"at most {high * seqs} sequences at once"
    )
