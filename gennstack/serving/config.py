"""The ``serving`` config section: how each generation's model server is laid out and scaled.

Which generations run, and which model id and revision each serves, come from
``GenNStackConfig.generations``; this section holds what the serving chart needs beyond that.
Every cross-field rule raises :class:`~gennstack.config.FieldError`, so a bad value names its
key, the value and what is allowed, like every other GenNStack config error.

The hardware facts the rules use are EC2's published specifications:

* inf2.48xlarge: 12 Inferentia2 chips, 2 NeuronCores each (24), 32 GB HBM per chip, so 16 GB
  per NeuronCore.
* trn2.48xlarge: 16 Trainium2 chips, 8 physical NeuronCores each; Neuron runs Trn2 with
  Logical NeuronCore Config 2 (two physical cores per logical core), so 64 logical cores,
  96 GB HBM per chip, 24 GB per logical core. NxD Inference's Trn2 guides: "With LNC=2, you
  can set a TP degree up to 64".

Whether a layout fits the accelerators' memory depends on the model served, which
``generations`` names: :mod:`gennstack.serving.fit` checks it with :mod:`gennstack.serving.capacity`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, SerializationInfo, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from gennstack.config_base import FieldError, StrictModel
from gennstack.serving.multinode import MultiNodeServing
from gennstack.serving.support import effective_release, neuron_release_of, release_error

__all__ = ["G6eServing", "Inf2Serving", "ServingConfig", "Trn2Serving", "INF2_NEURON_CORES", "TRN2_LOGICAL_CORES"]

INF2_NEURON_CORES = 24  # inf2.48xlarge: 12 chips x 2 NeuronCores
TRN2_LOGICAL_CORES = 64  # trn2.48xlarge: 16 chips x 8 physical cores / LNC 2

_SERVED_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# registry/path:tag or registry/path@sha256:digest (optionally both). Never a bare name or :latest.
_IMAGE_RE = re.compile(
    r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

Replicas = Annotated[int, Field(ge=0, le=100)]
# Serving replicas: at least one. Scale-to-zero is not offered: a generation at zero has no server
# to report load (the autoscaling signal is the servers' own metrics), so nothing would wake it,
# and its cold start (a node, the image, the weights; up to an hour on trn2) is no request's wait.
ServingReplicas = Annotated[int, Field(ge=0, le=100)]  # 0 is refused with the reason, below
# Keys that were renamed, and the message that says what replaced them.
_RENAMED = {
    "replicas": "min_replicas and max_replicas (replicas now scale on load between them; set both to N for a fixed N)",
}


NeuronRelease = Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]


def _check_release(generation: str, image: str | None, declared: str | None) -> None:
    """A Neuron generation's release (its image tag's, the declared one, or the support matrix's)
    must be one whose NxD Inference runs on its family; a declared one must agree with the tag."""
    tagged = neuron_release_of(image) if image is not None else None
    if declared is not None and tagged is not None and declared != tagged:
        raise FieldError("neuron_release", declared, f"the release the image's tag names ({tagged}), or unset")
    release = effective_release(generation, image, declared)
    if error := release_error(generation, release):
        key, value = ("image", image) if tagged is not None else ("neuron_release", release)
        raise FieldError(key, value, error)


def _check_image(value: str | None) -> str | None:
    if value is None:
        return value
    if not _IMAGE_RE.match(value) or not (":" in value.rsplit("/", 1)[-1] or "@sha256:" in value):
        raise ValueError("must be an image reference pinned by tag or digest, e.g. 'registry/repo:1.2.3' or 'repo@sha256:<64 hex>'")
    if value.rsplit("/", 1)[-1].split("@")[0].endswith(":latest"):
        raise ValueError("must be pinned: ':latest' moves under a running fleet")
    return value


class _ModelServer(StrictModel):
    """Settings every generation's model server has."""

    # The model name clients send (OpenAI `model` field) and the gateway routes on.
    served_model_name: str
    """The model name clients send (the OpenAI `model` field) and the gateway routes on."""
    # Longest prompt + completion in tokens (vLLM --max-model-len). On Neuron it is compiled in.
    max_model_len: Annotated[int, Field(ge=256, le=1_048_576)]
    """Longest prompt plus completion in tokens (vLLM --max-model-len); compiled in on Neuron."""
    # Most sequences one replica runs at once (vLLM --max-num-seqs; the compiled batch size on Neuron).
    max_num_seqs: Annotated[int, Field(ge=1, le=1024)]
    """Most sequences one replica runs at once (vLLM --max-num-seqs; the compiled batch size on Neuron); the layout
    must fit the accelerator's memory."""
    # Warm spares: replicas of a low-priority Deployment shaped like one serving replica, which
    # stage the model onto their node and idle. The spot-interruption handler scales them.
    warm_spare_replicas: Replicas = 0
    """Warm spares: idle replicas of a low-priority Deployment shaped like one serving replica, which stage the model
    onto their node; the interruption handler scales them."""
    # A full image reference that replaces the chart's pinned default for this generation.
    image: str | None = None
    """A full image reference that replaces the chart's pinned default for this generation."""
    # Autoscaling (docs/autoscaling.md): serving replicas between min_replicas and max_replicas,
    # aiming at target_ongoing_requests in-flight requests (running + queued) per replica. gen1
    # (Ray Serve) and gen2/gen3 (KEDA + HPA on vLLM's metrics) read the same keys.
    min_replicas: ServingReplicas = 1
    """Fewest serving replicas (no scale to zero)."""
    max_replicas: ServingReplicas = 2
    """Most serving replicas; the generation's NodePool limits (max_nodes) must admit them in the worst case."""
    # Unset: 80% of max_num_seqs, rounded down (_default_target), so the target follows the batch
    # size; the 1 here stands only when max_num_seqs itself is invalid and already reported.
    target_ongoing_requests: Annotated[int, Field(ge=1, le=1024)] = 1
    """In-flight requests (running + queued) per replica the autoscaler aims at; unset: 80% of max_num_seqs."""
    # Load must stay above target this long before replicas are added (HPA
    # scaleUp.stabilizationWindowSeconds; Ray Serve upscale_delay_s). 60: longer than one 30 s
    # Prometheus scrape, so a blip one scrape sees adds nothing (tests/autoscaling).
    scale_up_delay_seconds: Annotated[int, Field(ge=0, le=3600)] = 60
    """How long load must stay above target before replicas are added."""
    # Load must stay below what fewer replicas could carry for this long before one is removed (HPA
    # scaleDown.stabilizationWindowSeconds; Ray Serve downscale_delay_s). At most 3600 (the HPA's cap).
    scale_down_delay_seconds: Annotated[int, Field(ge=0, le=3600)] = 600
    """How long load must stay below what fewer replicas carry before one is removed (at most 3600, the HPA's cap)."""

    @field_validator("min_replicas", "max_replicas")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                "must be at least 1: scale-to-zero is not offered, since a generation at zero replicas has no server "
                "to report load and nothing would wake it (docs/autoscaling.md); disable the generation instead "
                "(generations.<name>.enabled: false)"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, replacement in _RENAMED.items():
                if key in data:
                    raise FieldError(key, data[key], f"no longer a key: use {replacement}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_target(cls, data: Any) -> Any:
        if isinstance(data, dict) and "target_ongoing_requests" not in data:
            seqs = data.get("max_num_seqs", cls.model_fields["max_num_seqs"].default)
            if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs >= 1:
                data = {**data, "target_ongoing_requests": max(1, seqs * 4 // 5)}
        return data

    @model_validator(mode="after")
    def _scaling(self) -> _ModelServer:
        if self.max_replicas < self.min_replicas:
            raise FieldError("max_replicas", self.max_replicas, f"at least min_replicas ({self.min_replicas})")
        if self.target_ongoing_requests > self.max_num_seqs:
            raise FieldError(
                "target_ongoing_requests", self.target_ongoing_requests, f"at most max_num_seqs ({self.max_num_seqs}), the batch one replica runs"
            )
        return self

    @field_validator("served_model_name")
    @classmethod
    def _served_name(cls, value: str) -> str:
        if not _SERVED_NAME_RE.match(value):
            raise ValueError("must be 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        return _check_image(value)


class Inf2Serving(_ModelServer):
    """gen1-inf2: Llama 3 70B Instruct with Ray Serve + vLLM (NxD Inference) on inf2.48xlarge."""

    served_model_name: str = "llama-3-70b-instruct"
    """The model name clients send (the OpenAI `model` field) and the gateway routes on."""
    max_model_len: Annotated[int, Field(ge=256, le=1_048_576)] = 8192
    """Longest prompt plus completion in tokens (vLLM --max-model-len); compiled in on Neuron."""
    # 20: at TP 24 and 8192 tokens each sequence's KV cache takes 0.34 GB per NeuronCore; 24 would
    # fit next to 6.22 GB of weights and the runtime reserve, 20 leaves 1.47 GB spare.
    max_num_seqs: Annotated[int, Field(ge=1, le=1024)] = 20
    """Most sequences one replica runs at once (vLLM --max-num-seqs; the compiled batch size on Neuron); the layout
    must fit the accelerator's memory."""
    # Ray Serve autoscaling: replicas (one per inf2.48xlarge) between min_replicas (1) and
    # max_replicas (2), aiming at 16 in-flight requests per replica (80% of the 20 it batches).
    # Tensor parallelism over NeuronCores. 24, all of an inf2.48xlarge: NxD Inference pads the
    # 64 query heads to 72 (3 per core) and replicates each of the 8 KV heads to 3 cores, so no
    # core idles (8 idle cores are a third of the node's price). Which degrees fit, and how many
    # sequences, is computed per NeuronCore by gennstack.serving.capacity for the model served.
    tensor_parallel_size: Annotated[int, Field(ge=1, le=INF2_NEURON_CORES)] = 24
    """Tensor parallelism over the node's NeuronCores; gennstack.serving.capacity checks it fits and how many sequences
    do."""
    # Shard the checkpoint once, in the compile Job, into the compiled artifacts (24 per-rank
    # safetensors, about the weights' size again), so a serving pod loads its shards instead of
    # sharding ~141 GB on the CPU at every start. NxD Inference 2.28.0 (cd3abf3,
    # models/application_base.py compile/shard_weights/load_weights) does this for any
    # NeuronApplicationBase, Llama included, with no hardware condition.
    save_sharded_checkpoint: bool = True
    """Shard the checkpoint once in the compile Job (24 per-rank safetensors beside the artifacts), so a serving pod
    loads its shards instead of sharding ~141 GB on the CPU at every start."""
    # Neuron release of `image` when its tag names none (`-sdk<x.y.z>-`); unset: the tag's, else
    # the support matrix's (gennstack/serving/support.py). It keys the compiled artifacts.
    neuron_release: NeuronRelease | None = None
    """Neuron release of image when its tag names none (-sdk<x.y.z>-); unset: the tag's, else the support matrix's
    (gennstack/serving/support.py). It keys the compiled artifacts."""


    @model_validator(mode="after")
    def _release(self) -> Inf2Serving:
        _check_release("inf2", self.image, self.neuron_release)
        return self


class Trn2Serving(_ModelServer):
    """gen2-trn2: Llama 4 Maverick (17B active, 128 experts, BF16) with vLLM (NxD Inference) on trn2.48xlarge."""

    served_model_name: str = "llama-4-maverick"
    """The model name clients send (the OpenAI `model` field) and the gateway routes on."""
    max_model_len: Annotated[int, Field(ge=256, le=1_048_576)] = 8192
    """Longest prompt plus completion in tokens (vLLM --max-model-len); compiled in on Neuron."""
    max_num_seqs: Annotated[int, Field(ge=1, le=1024)] = 16
    """Most sequences one replica runs at once (vLLM --max-num-seqs; the compiled batch size on Neuron); the layout
    must fit the accelerator's memory."""
    # Deployment replicas, one per trn2.48xlarge, scaled by KEDA between min and max. A new replica
    # loads ~800 GB (up to an hour), so scale-down waits 30 minutes of low load.
    scale_down_delay_seconds: Annotated[int, Field(ge=0, le=3600)] = 1800
    """How long load must stay below what fewer replicas carry before one is removed; 1800 on trn2, whose replica takes
    up to an hour to load."""
    # Tensor parallelism over the 64 logical NeuronCores: attention, dense and MoE layers split 64
    # ways (Maverick is ~801 GB in BF16; 32 cores hold 768 GB, too little). NxD Inference's Llama 4
    # guide runs text TP 64 with context parallelism 16 and the vision encoder at TP 16 x DP 4;
    # it documents no expert parallelism for Llama 4, so GenNStack sets none.
    tensor_parallel_size: Annotated[int, Field(ge=1, le=TRN2_LOGICAL_CORES)] = 64
    """Tensor parallelism of the text model over the 64 logical NeuronCores."""
    # Context parallelism of the text model's prefill attention (NxD Inference cp_degree).
    context_parallel_size: Annotated[int, Field(ge=1, le=TRN2_LOGICAL_CORES)] = 16
    """Context parallelism of the text model's prefill attention (NxD Inference cp_degree)."""
    # The vision encoder's TP degree; it runs data parallel over the rest (64 / 16 = DP 4).
    vision_tensor_parallel_size: Annotated[int, Field(ge=1, le=TRN2_LOGICAL_CORES)] = 16
    """Tensor parallelism of the vision encoder, which runs data parallel over the rest (64 / 16 = DP 4)."""
    # Shard the checkpoint once, in the compile Job, into the compiled artifacts (one safetensors
    # file per rank, about the weights' size again), so serving pods load shards instead of
    # re-sharding ~800 GB at every start.
    save_sharded_checkpoint: bool = True
    """Shard the checkpoint once, in the compile Job, into the compiled artifacts, so serving pods load shards instead
    of re-sharding at every start."""
    # Neuron release of `image` when its tag names none; see Inf2Serving.neuron_release.
    neuron_release: NeuronRelease | None = None
    """Neuron release of image when its tag names none (-sdk<x.y.z>-); unset: the tag's, else the support matrix's
    (gennstack/serving/support.py). It keys the compiled artifacts."""

    @model_validator(mode="after")
    def _release(self) -> Trn2Serving:
        _check_release("trn2", self.image, self.neuron_release)
        return self

    @model_validator(mode="after")
    def _layout(self) -> Trn2Serving:
        tp = self.tensor_parallel_size
        if TRN2_LOGICAL_CORES % tp:
            raise FieldError("tensor_parallel_size", tp, f"a divisor of the {TRN2_LOGICAL_CORES} logical NeuronCores (LNC=2): 1, 2, 4, 8, 16, 32, 64")
        divisors = [d for d in range(1, tp + 1) if tp % d == 0]
        if tp % self.context_parallel_size:
            raise FieldError("context_parallel_size", self.context_parallel_size,
                             f"a divisor of tensor_parallel_size ({tp}): {divisors}")
        if tp % self.vision_tensor_parallel_size:
            raise FieldError("vision_tensor_parallel_size", self.vision_tensor_parallel_size,
                             f"a divisor of tensor_parallel_size ({tp}, the vision encoder's world size): {divisors}")
        return self


class G6eServing(_ModelServer):
    """gen3-g6e: GPT-OSS 20B (MXFP4) with vLLM on NVIDIA L40S (g6e)."""

    served_model_name: str = "gpt-oss-20b"
    """The model name clients send (the OpenAI `model` field) and the gateway routes on."""
    max_model_len: Annotated[int, Field(ge=256, le=1_048_576)] = 32768
    """Longest prompt plus completion in tokens (vLLM --max-model-len); compiled in on Neuron."""
    max_num_seqs: Annotated[int, Field(ge=1, le=1024)] = 64
    """Most sequences one replica runs at once (vLLM --max-num-seqs; the compiled batch size on Neuron); the layout
    must fit the accelerator's memory."""
    # Deployment replicas, scaled by KEDA between min and max; several fit on one multi-GPU node (a
    # g6e.12xlarge runs 4 at 1 GPU each).
    min_replicas: ServingReplicas = 2
    """Fewest serving replicas (no scale to zero); several fit on one multi-GPU node."""
    max_replicas: ServingReplicas = 6
    """Most serving replicas; the generation's NodePool limits (max_nodes) must admit them in the worst case."""
    # GPUs per replica, which is vLLM's tensor-parallel size. 1: GPT-OSS 20B in MXFP4 needs ~16 GB,
    # one 48 GB L40S holds it with room for the KV cache, and L40S has no NVLink, so splitting a
    # replica across GPUs only adds PCIe traffic. 4 is the original `--tensor-parallel-size 4`.
    gpus_per_replica: int = 1
    """GPUs per replica, vLLM's tensor-parallel size: 1 (GPT-OSS 20B fits one L40S) or 4 (the original TP 4 layout)."""
    # Share of each GPU's memory vLLM may use (weights + KV cache).
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.95)] = 0.9
    """Share of each GPU's memory vLLM may use (weights + KV cache)."""
    # vLLM's tool-call parser (--tool-call-parser, with --enable-auto-tool-choice): "openai" is
    # GPT-OSS's; None turns tool calling off. Change it with generations.g6e.model_id.
    tool_call_parser: Annotated[str, Field(pattern=r"^[a-z0-9_]+$")] | None = "openai"
    """vLLM's tool-call parser (--tool-call-parser, with --enable-auto-tool-choice); unset turns tool calling off."""

    @field_validator("gpus_per_replica")
    @classmethod
    def _gpus(cls, value: int) -> int:
        if value not in (1, 2, 4, 8):
            raise ValueError("must be 1, 2, 4 or 8 (the GPU counts of g6e sizes; vLLM tensor parallelism)")
        return value


class ServingConfig(StrictModel):
    """The serving chart's settings for every generation (enabled ones come from ``generations``)."""

    # Kubernetes namespace of the model servers, their Services, warm spares and staging Jobs.
    namespace: str = "gennstack-serving"
    """Kubernetes namespace of the model servers, their Services, warm spares and staging Jobs."""
    # Render the staging (Hugging Face -> models bucket) and Neuron compile Jobs. Turn on for the
    # deploy that stages a new model or revision, then off: compile Jobs hold on-demand accelerators.
    staging: bool = False
    """Render the staging (Hugging Face -> models bucket) and Neuron compile Jobs: on for the deploy that stages a
    model or revision, then off."""
    inf2: Inf2Serving = Inf2Serving()
    trn2: Trn2Serving = Trn2Serving()
    g6e: G6eServing = G6eServing()
    # One extra model whose replicas span several nodes (gennstack.serving.multinode); off by default.
    multi_node: MultiNodeServing = MultiNodeServing()

    @model_serializer(mode="wrap")
    def _without_default_multi_node(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # The stack records the config it was built from in the template's metadata: left at its
        # default (off), multi_node is not recorded, so a config without it synthesizes as before.
        data = handler(self)
        if self.multi_node == MultiNodeServing():
            data.pop("multi_node", None)
        return data

    @model_validator(mode="after")
    def _multi_node_image(self) -> ServingConfig:
        try:
            _check_image(self.multi_node.image)
        except ValueError as exc:
            raise FieldError("multi_node.image", self.multi_node.image, str(exc)) from None
        return self

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _NAMESPACE_RE.match(value):
            raise ValueError("must be a DNS label: 1-63 lowercase letters, digits and '-'")
        return value
