"""Does each enabled generation's replica fit: on its instance types, and in accelerator memory?

Needs both config sections (``generations`` names the model and instance types, ``serving`` the
layout), so ``GenNStackConfig`` calls :func:`check_fits` after both are built, and
``serving_values`` calls it again for configs built piecemeal. Lives apart from
:mod:`gennstack.serving.values` so that :mod:`gennstack.config` can import it without a cycle:
it imports only the config building blocks, the instance table and the capacity model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gennstack.config_base import ConfigError
from gennstack.instances import INSTANCE_TYPES, NEURON_CORES_PER_DEVICE, pool_limits
from gennstack.serving.capacity import MODELS, CapacityError, Layout, Plan, check, plan
from gennstack.serving.config import ServingConfig
from gennstack.serving.multinode import multi_node_plan
from gennstack.serving.scaling import check_nodes_admit, worst_case_usage

if TYPE_CHECKING:
    from gennstack.generations import GenerationsConfig

__all__ = ["check_fits", "check_multi_node", "layout", "plans"]


def layout(generation: str, serving: ServingConfig) -> Layout:
    """The capacity model's view of one generation's serving settings."""
    if generation == "inf2":
        s = serving.inf2
        return Layout("inf2", s.tensor_parallel_size, s.max_num_seqs, s.max_model_len)
    if generation == "trn2":
        t = serving.trn2
        return Layout("trn2", t.tensor_parallel_size, t.max_num_seqs, t.max_model_len,
                      vision_tensor_parallel_size=t.vision_tensor_parallel_size)
    if generation == "g6e":
        g = serving.g6e
        return Layout("g6e", g.gpus_per_replica, g.max_num_seqs, g.max_model_len, g.gpu_memory_utilization)
    raise ValueError(f"generation: got {generation!r}; allowed: one of ['inf2', 'trn2', 'g6e']")


def plans(generations: GenerationsConfig, serving: ServingConfig) -> dict[str, Plan]:
    """Per-core/GPU memory of each enabled generation whose model the capacity model knows."""
    return {
        name: plan(layout(name, serving), MODELS[gen.model_id])
        for name, gen in generations.enabled().items()
        if gen.model_id in MODELS
    }


def check_fits(generations: GenerationsConfig, serving: ServingConfig) -> None:
    """Each enabled generation's replica must fit the instance types its NodePool may launch and
    its accelerators' memory, for the model it serves."""
    inf2, trn2, g6e = generations.inf2, generations.trn2, generations.g6e
    if inf2.enabled:
        cores = min(INSTANCE_TYPES[t].accelerators for t in inf2.instance_types) * NEURON_CORES_PER_DEVICE["inf2"]
        if serving.inf2.tensor_parallel_size > cores:
            raise ConfigError(
                f"serving.inf2.tensor_parallel_size: got {serving.inf2.tensor_parallel_size}; allowed: at most the "
                f"{cores} NeuronCores of the smallest type in generations.inf2.instance_types {list(inf2.instance_types)}"
            )
    if trn2.enabled:
        cores = min(INSTANCE_TYPES[t].accelerators for t in trn2.instance_types) * NEURON_CORES_PER_DEVICE["trn2"]
        if serving.trn2.tensor_parallel_size > cores:
            raise ConfigError(
                f"serving.trn2.tensor_parallel_size: got {serving.trn2.tensor_parallel_size}; allowed: at most the "
                f"{cores} logical NeuronCores of the smallest type in generations.trn2.instance_types"
            )
    if g6e.enabled:
        most = max(INSTANCE_TYPES[t].accelerators for t in g6e.instance_types)
        if serving.g6e.gpus_per_replica > most:
            raise ConfigError(
                f"serving.g6e.gpus_per_replica: got {serving.g6e.gpus_per_replica}; allowed: at most {most}, the GPUs of "
                f"the largest type in generations.g6e.instance_types {list(g6e.instance_types)} (add g6e.12xlarge for 4)"
            )
    for name, gen in generations.enabled().items():
        if gen.model_id not in MODELS:
            raise ConfigError(
                f"generations.{name}.model_id: got {gen.model_id!r}; allowed: a model whose shape "
                f"gennstack/serving/capacity.py MODELS knows ({sorted(MODELS)}); add its config.json figures there"
            )
        _check_heads(name, serving, MODELS[gen.model_id])
        try:
            check(plan(layout(name, serving), MODELS[gen.model_id]))
        except CapacityError as exc:
            raise ConfigError(f"serving.{name}.{exc}") from None
    if trn2.enabled:
        _check_chunked_attention(serving, MODELS[trn2.model_id])
    _check_compile_capacity(generations, serving)
    check_nodes_admit(generations, serving)
    check_multi_node(generations, serving)


def _check_compile_capacity(generations: GenerationsConfig, serving: ServingConfig) -> None:
    """A Neuron generation's compile Job runs only on on-demand or reserved capacity (never spot: a
    reclaim mid-compile leaves a half-written artifact set), so while staging renders it, the
    generation needs its on-demand pool or a capacity reservation, or the Job never schedules."""
    if not serving.staging:
        return
    for name in ("inf2", "trn2"):
        gen = getattr(generations, name)
        if gen.enabled and not gen.on_demand_fallback and not gen.capacity_reservation_ids:
            raise ConfigError(
                f"generations.{name}.on_demand_fallback: got False; allowed: true, or capacity_reservation_ids "
                f"for {name}, while serving.staging is true: the {name} compile Job runs only on on-demand or "
                "reserved capacity, and with neither pool no node can run it"
            )


def _check_heads(name: str, serving: ServingConfig, model) -> None:
    tp = layout(name, serving).tensor_parallel_size
    kv = model.num_kv_heads
    if kv % tp and tp % kv:
        key = "gpus_per_replica" if name == "g6e" else "tensor_parallel_size"
        most = {"inf2": 24, "trn2": 64, "g6e": 8}[name]
        good = [d for d in range(1, most + 1) if kv % d == 0 or d % kv == 0]
        raise ConfigError(
            f"serving.{name}.{key}: got {tp}; allowed: a divisor or a multiple of {model.model_id}'s {kv} KV heads "
            f"(NxD Inference replicates KV heads to the TP degree only then; vLLM splits them): one of {good}"
        )


def _check_chunked_attention(serving: ServingConfig, model) -> None:
    """NxD Inference's InferenceConfig._validate_chunked_attention_support (models/config.py):
    with an attention chunk shorter than seq_len, cp_degree must divide the chunk and the last chunk."""
    chunk, cp, seq_len = model.attention_chunk_size, serving.trn2.context_parallel_size, serving.trn2.max_model_len
    if chunk and chunk < seq_len and (chunk % cp or (seq_len % chunk) % cp):
        raise ConfigError(
            f"serving.trn2.context_parallel_size: got {cp}; allowed: a divisor of {model.model_id}'s attention chunk "
            f"({chunk}) and of the last chunk of max_model_len ({seq_len} % {chunk} = {seq_len % chunk})"
        )


def check_multi_node(generations: GenerationsConfig, serving: ServingConfig) -> None:
    """An enabled multi-node model runs on an enabled GPU generation that may launch its instance
    type, fits its GPUs' memory, and its groups fit the NodePool's limits next to that generation's
    own replicas at their worst case."""
    section = serving.multi_node
    if not section.enabled:
        return
    key = "serving.multi_node"
    generation = getattr(generations, section.generation)
    if not generation.enabled:
        raise ConfigError(f"{key}.generation: got {section.generation!r}; allowed: an enabled generation "
                          f"(generations.{section.generation}.enabled is false), whose NodePool runs the groups")
    if section.instance_type not in generation.instance_types:
        raise ConfigError(f"{key}.instance_type: got {section.instance_type!r}; allowed: one of "
                          f"generations.{section.generation}.instance_types {list(generation.instance_types)}")
    if section.model_id not in MODELS:
        raise ConfigError(f"{key}.model_id: got {section.model_id!r}; allowed: a model whose shape "
                          f"gennstack/serving/capacity.py MODELS knows ({sorted(MODELS)})")
    model = MODELS[section.model_id]
    if model.num_kv_heads % section.tensor_parallel_size and section.tensor_parallel_size % model.num_kv_heads:
        raise ConfigError(f"{key}.tensor_parallel_size: got {section.tensor_parallel_size}; allowed: a divisor or "
                          f"a multiple of {model.model_id}'s {model.num_kv_heads} KV heads")
    try:
        check(multi_node_plan(section))
    except CapacityError as exc:
        fix, value = exc.key, exc.value
        if exc.key == "gpus_per_replica":  # the weights do not fit: more nodes, more stages
            fix, value = "nodes_per_replica", section.nodes_per_replica
        raise ConfigError(f"{key}.{fix}: got {value!r} at TP {section.tensor_parallel_size} x PP "
                          f"{section.pipeline_parallel_size}; allowed: {exc.allowed}") from None
    spec = INSTANCE_TYPES[section.instance_type]
    groups = {"vcpu": spec.vcpu, "memory_gib": spec.memory_gib, "accelerators": spec.accelerators}
    groups = {resource: need * section.nodes_per_replica * section.replicas for resource, need in groups.items()}
    own = getattr(serving, section.generation)
    usage = worst_case_usage(generation.instance_types, own.gpus_per_replica, own.max_replicas)
    limits = pool_limits(generation.instance_types, generation.max_nodes)
    names = {"vcpu": "cpu", "memory_gib": "memory_gib", "accelerators": spec.accelerator_resource}
    for resource, need in groups.items():
        total = need + usage[resource]
        if total > limits[names[resource]]:
            raise ConfigError(
                f"{key}.replicas: got {section.replicas}; allowed: what generations.{section.generation}.max_nodes "
                f"({generation.max_nodes}) admits: {section.replicas} groups of {section.nodes_per_replica} "
                f"{section.instance_type} take {need} {names[resource]}, and {section.generation}'s own "
                f"{own.max_replicas} replicas up to {usage[resource]}, over the NodePool's limit of "
                f"{limits[names[resource]]}; raise generations.{section.generation}.max_nodes or lower replicas"
            )
