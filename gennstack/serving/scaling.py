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

if TYPE_CHECKING:
    from gennstack.config import GenerationsConfig
    from gennstack.serving.config import ServingConfig

__all__ = ["LOAD_GAUGES", "SCALERS", "check_nodes_admit", "scaling_line"]

# vLLM's scheduler gauges, per engine, labelled model_name (the served name) and engine. Defined in
# vllm/v1/metrics/loggers.py (PrometheusStatLogger) with these names in both vLLM GenNStack deploys:
# v0.29.0 (g6e, images.vllm) and v0.16.0 (the Neuron DLC, trn2 and inf2).
LOAD_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")

SCALERS = {"inf2": "Ray Serve autoscaling", "trn2": "KEDA/HPA", "g6e": "KEDA/HPA"}


def check_nodes_admit(generations: GenerationsConfig, serving: ServingConfig) -> None:
    """``max_replicas`` must fit under the generation's NodePool limits in the worst case.

    The limits are ``max_nodes`` nodes of the largest configured type (gennstack.instances.pool_limits).
    The worst case is every replica on a node of its own (a replica never spans nodes; Karpenter may
    launch a node per pending pod, and accelerator nodes are consolidated only when empty), and that
    node of the largest type: then ``max_replicas`` nodes must fit, so ``max_replicas <= max_nodes``.
    Warm spares need no room of their own: a serving pod preempts one (it has the higher priority)
    and takes its node.
    """
    for name, generation in generations.enabled().items():
        section = getattr(serving, name)
        if section.max_replicas > generation.max_nodes:
            raise ConfigError(
                f"serving.{name}.max_replicas: got {section.max_replicas}; allowed: at most generations.{name}.max_nodes "
                f"({generation.max_nodes}), the nodes the NodePool's limits admit when each replica has a node of its own; "
                f"raise generations.{name}.max_nodes or lower max_replicas"
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
