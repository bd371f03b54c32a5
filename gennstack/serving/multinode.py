"""Multi-node replicas: one serving replica across several nodes (``serving.multi_node``), off by default.

A replica is a LeaderWorkerSet group (LWS v0.10.0, ``leaderworkerset.x-k8s.io/v1``): one pod per
node, ``nodes_per_replica`` pods, the leader (worker index 0) runs a Ray head and, once every member
has joined, vLLM with tensor parallelism inside a node and pipeline parallelism across the nodes over
Ray (``--distributed-executor-backend ray``), the multi-node layout vLLM 0.29.0 documents
(``docs/serving/parallelism_scaling.md``: TP = GPUs per node, PP = nodes). The serving chart's
templates/multinode-lws.yaml renders it; its files/multinode_bootstrap.py is the pods' entry point.

GPU only. NxD Inference, which serves inf2 and trn2, distributes a model only within one instance:
"Pipeline parallelism and multi-node inference will be supported in future Neuron releases"
(aws-neuron/aws-neuron-sdk v2.28.0, ``libraries/nxd-inference/overview-index.rst``, "Distributed
Strategies"), so ``generation`` refuses inf2 and trn2.

The first model is Llama 4 Scout (17B active, 109B total, BF16: ~217 GB of weights) on two
g6e.12xlarge (4 x L40S, 48 GB each): TP 4 x PP 2, 8 GPUs, ~27 GB of weights per GPU
(:mod:`gennstack.serving.capacity` computes it, :func:`gennstack.serving.fit.check_multi_node` rejects
what does not fit).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gennstack.config_base import ConfigError, FieldError, StrictModel
from gennstack.instances import INSTANCE_TYPES, family
from gennstack.serving.capacity import MODELS, Layout, Plan, plan

__all__ = ["NEURON_NO_MULTI_NODE", "WARM_SPARE_NAMESPACE_SUFFIX", "MultiNodeServing", "check_multi_node_zones", "multi_node_layout",
           "multi_node_plan", "multi_node_values", "warm_spare_group_name", "warm_spare_namespace"]

NEURON_NO_MULTI_NODE = (
    "g6e: NxD Inference (inf2, trn2) documents no pipeline-parallel or multi-node inference "
    "(aws-neuron-sdk v2.28.0 libraries/nxd-inference/overview-index.rst: \"Pipeline parallelism and "
    "multi-node inference will be supported in future Neuron releases\")"
)
_SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
# The warm-spare groups' namespace is the serving namespace plus this (the chart's
# templates/multinode-warm-spare.yaml default): see warm_spare_namespace for why it is not the same one.
WARM_SPARE_NAMESPACE_SUFFIX = "-group-spares"


class MultiNodeServing(StrictModel):
    """One extra model whose every replica spans ``nodes_per_replica`` nodes (a LeaderWorkerSet group)."""

    # Off by default: nothing of it renders, the LWS controller is not installed, the config it
    # records is the default's.
    enabled: bool = False
    """Serve one extra model whose replicas span several nodes (LeaderWorkerSet groups); off: nothing of it is
    synthesized."""
    # The generation whose NodePool (and spot-first capacity) the groups run on. GPU only.
    generation: Literal["inf2", "trn2", "g6e"] = "g6e"
    """The generation whose NodePool (spot first) the groups run on; GPU only (g6e)."""
    model_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")] = _SCOUT
    """Hugging Face repo id of the multi-node model."""
    # A commit hash, tag or branch (part of the models bucket's keys, like generations.<name>.model_revision).
    model_revision: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")] = "main"
    """Commit, tag or branch of model_id (part of the models bucket's keys)."""
    served_model_name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")] = "llama-4-scout"
    """The model name clients send and the gateway routes on."""
    # Every member's instance type: one pod per node takes all its GPUs. It must be one of the
    # generation's instance_types (its NodePool launches it).
    instance_type: str = "g6e.12xlarge"
    """Every member's instance type, one of the generation's instance_types; one pod per node takes all its GPUs."""
    # Pods (nodes) per replica: the LWS group size.
    nodes_per_replica: Annotated[int, Field(ge=2, le=8)] = 2
    """Pods (nodes) per replica: the LeaderWorkerSet group size."""
    # vLLM --tensor-parallel-size: inside one node, so the instance type's GPU count (PCIe only on
    # L40S: tensor parallelism across nodes would put every layer's all-reduce on the network).
    tensor_parallel_size: Annotated[int, Field(ge=1, le=8)] = 4
    """vLLM --tensor-parallel-size inside one node: the instance type's GPU count."""
    # vLLM --pipeline-parallel-size: one stage per node, so nodes_per_replica.
    pipeline_parallel_size: Annotated[int, Field(ge=2, le=8)] = 2
    """vLLM --pipeline-parallel-size: one stage per node, so nodes_per_replica."""
    # Groups (replicas). A fixed count: KEDA does not scale groups yet (docs/serving.md).
    replicas: Annotated[int, Field(ge=1, le=20)] = 1
    """Groups (replicas); a fixed count."""
    # Warm-spare groups at rest (the LeaderWorkerSet <pool>-multinode-warm-spare, nodes_per_replica
    # idle members each, preempted whole by a serving group); the interruption handler adds one per
    # group with a doomed member, up to interruptions.warm_spare_cap. 0: none until an interruption.
    warm_spare_replicas: Annotated[int, Field(ge=0, le=20)] = 0
    """Idle warm-spare groups at rest; the interruption handler adds one per group with an interrupted member, up to
    interruptions.warm_spare_cap."""
    max_model_len: Annotated[int, Field(ge=256, le=1_048_576)] = 32768
    """Longest prompt plus completion in tokens (vLLM --max-model-len)."""
    max_num_seqs: Annotated[int, Field(ge=1, le=1024)] = 16
    """Most sequences one group runs at once (vLLM --max-num-seqs)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.95)] = 0.9
    """Share of each GPU's memory vLLM may use (weights + KV cache)."""
    # How long the leader may take from its start to vLLM's /health (the startup probe): the Ray
    # group forming, ~217 GB streamed from S3 over two nodes, CUDA graphs. The cold-start budget.
    startup_timeout_seconds: Annotated[int, Field(ge=300, le=7200)] = 2400
    """How long the leader may take from its start to vLLM's /health (its startup probe)."""
    # How long the leader waits for every member to join its Ray cluster before it gives up (and
    # LWS recreates the group).
    group_timeout_seconds: Annotated[int, Field(ge=60, le=3600)] = 900
    """How long the leader waits for every member to join its Ray cluster before it gives up (and LWS recreates the
    group)."""
    # A full image reference of vLLM with Ray (the leader starts a Ray head, vLLM's Ray executor
    # drives the pipeline). Unset: CDK builds assets/images/g6e-vllm-ray, the chart's vLLM image
    # plus Ray (vllm/vllm-openai has none). ServingConfig checks it is pinned, as every image.
    image: str | None = None
    """A full, pinned image reference of vLLM with Ray; unset: CDK builds assets/images/g6e-vllm-ray."""

    @model_validator(mode="after")
    def _layout(self) -> MultiNodeServing:
        if self.generation != "g6e":
            raise FieldError("generation", self.generation, NEURON_NO_MULTI_NODE)
        if self.instance_type not in INSTANCE_TYPES or family(self.instance_type) != "g6e":
            allowed = sorted(t for t in INSTANCE_TYPES if family(t) == "g6e" and INSTANCE_TYPES[t].accelerators > 1)
            raise FieldError("instance_type", self.instance_type, f"a multi-GPU g6e type, one of {allowed}")
        gpus = INSTANCE_TYPES[self.instance_type].accelerators
        if gpus < 2:
            allowed = sorted(t for t in INSTANCE_TYPES if family(t) == "g6e" and INSTANCE_TYPES[t].accelerators > 1)
            raise FieldError("instance_type", self.instance_type,
                             f"a multi-GPU g6e type, one of {allowed} (one {gpus}-GPU node per pipeline stage is no layout)")
        if self.tensor_parallel_size != gpus:
            raise FieldError("tensor_parallel_size", self.tensor_parallel_size,
                             f"{gpus}, the GPUs of one {self.instance_type} (tensor parallelism stays inside a node)")
        if self.pipeline_parallel_size != self.nodes_per_replica:
            raise FieldError("pipeline_parallel_size", self.pipeline_parallel_size,
                             f"nodes_per_replica ({self.nodes_per_replica}): one pipeline stage per node")
        return self


def multi_node_layout(section: MultiNodeServing) -> Layout:
    return Layout(section.generation, section.tensor_parallel_size, section.max_num_seqs, section.max_model_len,
                  section.gpu_memory_utilization, pipeline_parallel_size=section.pipeline_parallel_size)


def multi_node_plan(section: MultiNodeServing) -> Plan:
    """Bytes on one GPU of the replica's heaviest pipeline stage."""
    return plan(multi_node_layout(section), MODELS[section.model_id])


def check_multi_node_zones(section: MultiNodeServing, az_count: int) -> None:
    """One group per zone (the chart's LWS exclusive-topology on topology.kubernetes.io/zone): more
    groups than the VPC's zones would leave the rest pending for ever. Warm-spare groups likewise,
    among themselves (their own namespace)."""
    if section.enabled and section.replicas > az_count:
        raise ConfigError(
            f"serving.multi_node.replicas: got {section.replicas}; allowed: at most network.az_count ({az_count}): "
            "each group holds a zone of its own (LWS exclusive-topology), so groups never share a zone's reclaim"
        )
    if section.enabled and section.warm_spare_replicas > az_count:
        raise ConfigError(
            f"serving.multi_node.warm_spare_replicas: got {section.warm_spare_replicas}; allowed: at most "
            f"network.az_count ({az_count}): each warm-spare group holds a zone among the spares (LWS exclusive-topology)"
        )


def warm_spare_group_name(generation_pool: str) -> str:
    """The warm-spare LeaderWorkerSet of the multi-node model on ``generation_pool`` (e.g. gen3-g6e)."""
    return f"{generation_pool}-multinode-warm-spare"


def warm_spare_namespace(serving_namespace: str) -> str:
    """The namespace of the warm-spare groups: not the serving one.

    LWS v0.10.0's pod webhook labels every group's leader with ``leaderworkerset.sigs.k8s.io/group-key``
    whether or not it asks for exclusive topology (``pkg/webhooks/pod_webhook.go``), and a serving
    group's exclusive-topology anti-affinity (``SetExclusiveAffinities``: group-key Exists, NotIn its
    own) selects such pods in its own namespace (the term names no namespaces). Spare groups beside the
    serving ones would keep serving groups out of their zones, and preemption could not clear them:
    the scheduler picks victims on one candidate node, the spare's other members stay in the zone.
    """
    namespace = f"{serving_namespace}{WARM_SPARE_NAMESPACE_SUFFIX}"
    if len(namespace) > 63:
        raise ConfigError(
            f"serving.namespace: got {serving_namespace!r}; allowed: at most {63 - len(WARM_SPARE_NAMESPACE_SUFFIX)} "
            f"characters with serving.multi_node on (its warm-spare groups' namespace {namespace!r} must be a DNS label)"
        )
    return namespace


def multi_node_values(section: MultiNodeServing, model_prefix: str) -> dict[str, Any]:
    """The serving chart's ``multiNode`` values (templates/multinode-lws.yaml)."""
    values: dict[str, Any] = {
        "enabled": True,
        "generation": section.generation,
        "modelId": section.model_id,
        "revision": section.model_revision,
        "modelPrefix": model_prefix,
        "servedModelName": section.served_model_name,
        "instanceType": section.instance_type,
        "nodesPerReplica": section.nodes_per_replica,
        "tensorParallelSize": section.tensor_parallel_size,
        "pipelineParallelSize": section.pipeline_parallel_size,
        "gpusPerNode": INSTANCE_TYPES[section.instance_type].accelerators,
        "replicas": section.replicas,
        "warmSpareReplicas": section.warm_spare_replicas,
        "maxModelLen": section.max_model_len,
        "maxNumSeqs": section.max_num_seqs,
        "gpuMemoryUtilization": section.gpu_memory_utilization,
        "startupTimeoutSeconds": section.startup_timeout_seconds,
        "groupTimeoutSeconds": section.group_timeout_seconds,
    }
    if section.image is not None:
        values["image"] = section.image
    return values
