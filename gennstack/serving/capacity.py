"""Accelerator memory per NeuronCore / GPU for each generation's layout: computed, not guessed.

Pure functions over plain numbers (no CDK, no pydantic): the config validators, ``gennstack
summary`` and the docs all call :func:`plan`, so they cannot disagree.

How each runtime lays out memory (upstream files read at the versions the chart's images ship):

* **Neuron (inf2, trn2), NxD Inference** (aws-neuron/neuronx-distributed-inference,
  ``modules/kvcache/kv_cache_manager.py``, ``modules/attention/gqa.py``; the DLC pins
  neuronx_distributed_inference 0.10.18399, whose source is not public: read at the public
  release-2.29 sync, commit ef2731e). vllm-neuron's custom scheduler turns chunked prefill off
  and the chart turns prefix caching off, so the KV cache is the *contiguous* layout: one
  ``(batch, kv_heads_per_rank, max_len, head_dim)`` tensor for K and one for V in every layer,
  allocated up front on every rank. KV heads are sharded when TP divides them, otherwise
  replicated to the TP degree (``GQA.REPLICATE_TO_TP_DEGREE``: one KV head per rank); query
  heads are padded up to a multiple of TP (neuronx_distributed ``get_number_of_extra_heads``),
  and so are column-parallel MLP and vocabulary dimensions (``pad=True``).
* **GPU (g6e), vLLM**: weights, activations and CUDA graphs come out of
  ``gpu_memory_utilization x GPU memory``; what is left is the paged KV cache, shared by all
  sequences. Sliding-window layers keep only the window (plus the tokens of one scheduled chunk)
  per sequence. vLLM refuses to start when one ``max_model_len`` sequence does not fit.

Two allowances are estimates, not upstream numbers, and are named as such everywhere they show:
the Neuron runtime's share of each core (scratchpad, collectives buffers, I/O tensors, compiled
graphs: :data:`NEURON_RESERVE_SHARE`) and vLLM's activation + CUDA graph + CUDA context memory
(:data:`GPU_ACTIVATION_MARGIN_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ACCELERATORS", "GPU_ACTIVATION_MARGIN_BYTES", "MODELS", "NEURON_RESERVE_SHARE", "Accelerator",
    "CapacityError", "Layout", "ModelSpec", "Plan", "check", "gb", "kv_heads_per_rank", "markdown_table", "plan", "summary_line",
]

GB = 10**9
GiB = 2**30

# Share of each NeuronCore's memory kept free of weights and KV cache for the Neuron runtime
# (scratchpad, collectives and I/O buffers, the compiled graphs). An estimate.
NEURON_RESERVE_SHARE = 0.10
# vLLM's memory outside weights and KV cache on one GPU (activations of the profiled batch,
# CUDA graphs, CUDA context). An estimate; vLLM measures the real value at start-up.
GPU_ACTIVATION_MARGIN_BYTES = 3 * GiB
# Upper bound of vLLM's per-step token budget (max_num_batched_tokens) the sliding-window
# allowance assumes; vLLM's defaults are at most this.
GPU_MAX_BATCHED_TOKENS = 8192
# vLLM's default KV block size on CUDA (tokens per block).
GPU_BLOCK_SIZE = 16


class CapacityError(ValueError):
    """A layout does not fit. ``key`` is the config key to change, ``allowed`` says what fits."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        super().__init__(f"{key}: got {value!r}; allowed: {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


@dataclass(frozen=True)
class Accelerator:
    """One unit a rank runs on: a (logical) NeuronCore or a GPU."""

    name: str
    memory_bytes: int
    # The EC2 specification the figure comes from.
    source: str


ACCELERATORS: dict[str, Accelerator] = {
    "inf2": Accelerator("NeuronCore-v2", 16 * GB, "inf2: 32 GB HBM per Inferentia2 chip, 2 NeuronCores per chip"),
    "trn2": Accelerator(
        "logical NeuronCore (LNC=2)", 24 * GB, "trn2: 96 GB HBM per Trainium2 chip, 8 physical = 4 logical cores at LNC=2"),
    "g6e": Accelerator("NVIDIA L40S", 48 * GB, "g6e: NVIDIA L40S with 48 GB GDDR6 per GPU"),
}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one model, from its config.json on the Hugging Face Hub (``source``)."""

    model_id: str
    source: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    # Dense MLP width (Llama 3: intermediate_size). 0 when per-rank weights are not derived from it.
    intermediate_size: int
    # Bytes per weight element in the served dtype, and per KV cache element.
    dtype_bytes: int
    # Bytes of all weights as served (the checkpoint in the served precision).
    weight_bytes: int
    # Of num_layers, how many use sliding-window attention, and the window in tokens (GPT-OSS).
    sliding_layers: int = 0
    sliding_window: int = 0
    # Chunked attention (Llama 4: attention_chunk_size); 0 when the model has none.
    attention_chunk_size: int = 0
    # Parameters of a vision encoder that runs on the same cores with its own TP degree.
    vision_params: int = 0


MODELS: dict[str, ModelSpec] = {
    # config.json: num_hidden_layers 80, hidden_size 8192, num_attention_heads 64,
    # num_key_value_heads 8 (head_dim 8192/64 = 128), vocab_size 128256, intermediate_size 28672,
    # torch_dtype bfloat16. Weights: 70,553,706,496 parameters (derived from those numbers:
    # 80 x 855,654,400 per layer + 2 x 128256 x 8192 + 8192) x 2 bytes.
    "meta-llama/Meta-Llama-3-70B-Instruct": ModelSpec(
        model_id="meta-llama/Meta-Llama-3-70B-Instruct",
        source="huggingface.co/meta-llama/Meta-Llama-3-70B-Instruct config.json",
        num_layers=80, hidden_size=8192, num_attention_heads=64, num_kv_heads=8, head_dim=128,
        vocab_size=128256, intermediate_size=28672, dtype_bytes=2, weight_bytes=70_553_706_496 * 2,
    ),
    # config.json text_config: num_hidden_layers 48, hidden_size 5120, num_attention_heads 40,
    # num_key_value_heads 8, head_dim 128, vocab_size 202048, attention_chunk_size 8192,
    # num_local_experts 128; bfloat16. Weights: ~801 GB (about 400 B parameters x 2 bytes, the
    # checkpoint's size on the Hub). vision_config: 34 layers of width 1408 (MLP 5632) plus the
    # projector, rounded up to 0.85 B parameters.
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": ModelSpec(
        model_id="meta-llama/Llama-4-Maverick-17B-128E-Instruct",
        source="huggingface.co/meta-llama/Llama-4-Maverick-17B-128E-Instruct config.json",
        num_layers=48, hidden_size=5120, num_attention_heads=40, num_kv_heads=8, head_dim=128,
        vocab_size=202048, intermediate_size=0, dtype_bytes=2, weight_bytes=801 * GB,
        attention_chunk_size=8192, vision_params=850_000_000,
    ),
    # Llama 4 Scout, text_config: num_hidden_layers 48, hidden_size 5120, num_attention_heads 40,
    # num_key_value_heads 8, head_dim 128, vocab_size 202048, intermediate_size 8192 (each of the 16
    # num_local_experts and the shared expert), interleave_moe_layer_step 1 (every layer MoE),
    # attention_chunk_size 8192, tie_word_embeddings false; bfloat16. These are transformers'
    # Llama4TextConfig defaults, which it documents as this checkpoint's
    # (src/transformers/models/llama4/configuration_llama4.py, @auto_docstring(checkpoint=
    # "meta-llama/Llama-4-Scout-17B-16E")). Parameters, derived from them: per layer attention
    # 62,914,560 (q, o 5120 x 5120; k, v 5120 x 1024) + experts 16 x 3 x 5120 x 8192 + shared expert
    # 3 x 5120 x 8192 + router 5120 x 16 + 2 norms = 2,202,101,760; x 48 + embedding and lm_head
    # (2 x 202048 x 5120) + norm = 107,769,861,120 text, + the vision encoder (Maverick's, 0.85 B
    # rounded up) = 108,619,861,120: the "109B total" of the model card. x 2 bytes.
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": ModelSpec(
        model_id="meta-llama/Llama-4-Scout-17B-16E-Instruct",
        source="huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct config.json (transformers Llama4TextConfig defaults)",
        num_layers=48, hidden_size=5120, num_attention_heads=40, num_kv_heads=8, head_dim=128,
        vocab_size=202048, intermediate_size=0, dtype_bytes=2, weight_bytes=108_619_861_120 * 2,
        attention_chunk_size=8192, vision_params=850_000_000,
    ),
    # config.json: num_hidden_layers 24, layer_types alternating sliding_attention (window 128) /
    # full_attention, num_attention_heads 64, num_key_value_heads 8, head_dim 64, hidden_size
    # 2880, vocab_size 201088, quantization_config mxfp4 (experts; attention, router, embeddings
    # and lm_head stay bfloat16). Weights: the checkpoint's ~13.8 GB on the Hub.
    "openai/gpt-oss-20b": ModelSpec(
        model_id="openai/gpt-oss-20b",
        source="huggingface.co/openai/gpt-oss-20b config.json",
        num_layers=24, hidden_size=2880, num_attention_heads=64, num_kv_heads=8, head_dim=64,
        vocab_size=201088, intermediate_size=0, dtype_bytes=2, weight_bytes=13_800_000_000,
        sliding_layers=12, sliding_window=128,
    ),
}


@dataclass(frozen=True)
class Layout:
    """What a generation's config chooses: parallelism, batch and context."""

    generation: str
    tensor_parallel_size: int
    max_num_seqs: int
    max_model_len: int
    # GPU only: vLLM's --gpu-memory-utilization.
    gpu_memory_utilization: float = 1.0
    # trn2 only: the vision encoder's TP degree (its data-parallel degree is TP / this).
    vision_tensor_parallel_size: int = 0
    # GPU only: vLLM's --pipeline-parallel-size, one stage per node of a multi-node replica
    # (gennstack.serving.multinode); each stage holds its share of the layers at TP degree.
    pipeline_parallel_size: int = 1


@dataclass(frozen=True)
class Plan:
    """Bytes on one NeuronCore or GPU of a replica, and how many sequences fit."""

    generation: str
    accelerator: Accelerator
    model: ModelSpec
    layout: Layout
    weights: int
    kv_cache: int
    # Neuron: the runtime reserve. GPU: (1 - utilization) x memory + the activation margin.
    margin: int
    kv_per_sequence: int
    # Most sequences of max_model_len tokens whose KV cache fits next to weights and margin.
    max_sequences: int

    @property
    def used(self) -> int:
        return self.weights + self.kv_cache + self.margin

    @property
    def free(self) -> int:
        return self.accelerator.memory_bytes - self.used

    @property
    def neuron(self) -> bool:
        return self.generation in ("inf2", "trn2")


def padded(value: int, tp: int) -> int:
    """``value`` rounded up to a multiple of ``tp`` (neuronx_distributed pads sharded dims so)."""
    return -(-value // tp) * tp


def kv_heads_per_rank(num_kv_heads: int, num_attention_heads: int, tp: int) -> int:
    """KV heads each rank holds under NxD Inference's GQA sharding (modules/attention/gqa.py).

    TP divides the KV heads: they are split. TP is a multiple of them: each is replicated to the
    TP degree (REPLICATE_TO_TP_DEGREE), one per rank. Otherwise NxD Inference falls back to
    CONVERT_TO_MHA: as many KV heads as (padded) query heads.
    """
    if num_kv_heads >= tp and num_kv_heads % tp == 0:
        return num_kv_heads // tp
    if tp % num_kv_heads == 0:
        return 1
    return padded(num_attention_heads, tp) // tp


def _dense_weights_per_rank(m: ModelSpec, tp: int) -> int:
    """Per-rank bytes of a Llama-style dense decoder under NxD Inference tensor parallelism."""
    q_heads = padded(m.num_attention_heads, tp) // tp
    kv_heads = kv_heads_per_rank(m.num_kv_heads, m.num_attention_heads, tp)
    attention = m.hidden_size * m.head_dim * (2 * q_heads + 2 * kv_heads)  # q, o; k, v
    mlp = 3 * m.hidden_size * (padded(m.intermediate_size, tp) // tp)  # gate, up, down
    norms = 2 * m.hidden_size
    vocab = 2 * (padded(m.vocab_size, tp) // tp) * m.hidden_size + m.hidden_size  # embedding, lm_head, norm
    return (m.num_layers * (attention + mlp + norms) + vocab) * m.dtype_bytes


def _moe_weights_per_rank(m: ModelSpec, tp: int, vision_tp: int) -> int:
    """Per-rank bytes of a MoE decoder sharded evenly over ``tp`` ranks, plus what does not shard
    evenly: K/V projections replicated to the TP degree and a vision encoder at its own TP."""
    kv_total = m.num_layers * 2 * m.hidden_size * m.num_kv_heads * m.head_dim * m.dtype_bytes
    kv_rank = m.num_layers * 2 * m.hidden_size * kv_heads_per_rank(m.num_kv_heads, m.num_attention_heads, tp) \
        * m.head_dim * m.dtype_bytes
    vision_total = m.vision_params * m.dtype_bytes
    vision_rank = -(-vision_total // vision_tp) if vision_tp else 0
    even = m.weight_bytes - kv_total - vision_total
    return -(-even // tp) + kv_rank + vision_rank


def _neuron_kv_per_sequence(m: ModelSpec, tp: int, max_len: int) -> int:
    """K and V of one sequence in every layer on one rank: (kv_heads_per_rank, max_len, head_dim).

    Chunked attention (Llama 4) allocates the chunk for every layer only when the chunk is shorter
    than max_len *and* no per-layer sizes are given; the worst case is max_len for every layer.
    """
    heads = kv_heads_per_rank(m.num_kv_heads, m.num_attention_heads, tp)
    return m.num_layers * 2 * heads * max_len * m.head_dim * m.dtype_bytes


def _gpu_kv_per_sequence(m: ModelSpec, tp: int, max_len: int, pp: int = 1) -> int:
    """One max_len sequence's KV blocks on one GPU: full layers hold max_len tokens, sliding
    layers the window plus one scheduled chunk (vLLM SlidingWindowSpec), both in whole blocks.

    With pipeline parallelism a GPU holds the KV cache of its stage's layers only: at most
    ceil(layers / pp) of each kind (vLLM's get_pp_indices splits layers into near-equal stages).
    Chunked-attention layers (Llama 4) count as full layers: an upper bound."""
    per_token_layer = 2 * max(m.num_kv_heads // tp, 1) * m.head_dim * m.dtype_bytes
    full_tokens = -(-max_len // GPU_BLOCK_SIZE) * GPU_BLOCK_SIZE
    window = min(m.sliding_window - 1 + GPU_MAX_BATCHED_TOKENS, max_len) if m.sliding_layers else 0
    sliding_tokens = (-(-window // GPU_BLOCK_SIZE) + 1) * GPU_BLOCK_SIZE if m.sliding_layers else 0
    full_layers = -(-(m.num_layers - m.sliding_layers) // pp)
    sliding_layers = -(-m.sliding_layers // pp)
    return per_token_layer * (full_layers * full_tokens + sliding_layers * sliding_tokens)


def _gpu_weights_per_rank(m: ModelSpec, tp: int, pp: int) -> int:
    """Bytes of weights on one GPU: the whole model over ``tp`` ranks; with ``pp`` stages, the
    heaviest stage's: its ceil(layers / pp) decoder layers plus the embedding and the vision encoder
    (first stage) or the lm_head and final norm (last stage), over ``tp`` ranks."""
    if pp == 1:
        return -(-m.weight_bytes // tp)
    embedding = m.vocab_size * m.hidden_size * m.dtype_bytes
    vision = m.vision_params * m.dtype_bytes
    head = embedding + m.hidden_size * m.dtype_bytes
    layers = m.weight_bytes - embedding - head - vision
    stage = -(-layers // m.num_layers) * -(-m.num_layers // pp)
    return -(-(stage + max(embedding + vision, head)) // tp)


def plan(layout: Layout, model: ModelSpec) -> Plan:
    """Bytes per core/GPU for ``layout`` serving ``model``. Raises nothing: see :func:`check`."""
    accelerator = ACCELERATORS[layout.generation]
    tp = layout.tensor_parallel_size
    memory = accelerator.memory_bytes
    if layout.generation == "g6e":
        pp = layout.pipeline_parallel_size
        weights = _gpu_weights_per_rank(model, tp, pp)
        per_sequence = _gpu_kv_per_sequence(model, tp, layout.max_model_len, pp)
        margin = memory - int(layout.gpu_memory_utilization * memory) + GPU_ACTIVATION_MARGIN_BYTES
        # vLLM hands all of what is left to the paged KV cache.
        kv_cache = max(memory - margin - weights, 0)
    else:
        if model.intermediate_size:
            weights = _dense_weights_per_rank(model, tp)
        else:
            weights = _moe_weights_per_rank(model, tp, layout.vision_tensor_parallel_size)
        per_sequence = _neuron_kv_per_sequence(model, tp, layout.max_model_len)
        margin = int(NEURON_RESERVE_SHARE * memory)
        kv_cache = per_sequence * layout.max_num_seqs
    max_sequences = max((memory - margin - weights) // per_sequence, 0)
    return Plan(layout.generation, accelerator, model, layout, weights, kv_cache, margin, per_sequence, max_sequences)


def gb(value: int) -> str:
    return f"{value / GB:.2f} GB"


def check(p: Plan) -> None:
    """Raise :class:`CapacityError` naming the numbers when ``p`` does not fit its accelerator."""
    lay, acc = p.layout, p.accelerator
    unit = "NeuronCore" if p.neuron else "GPU"
    if p.weights + p.margin > acc.memory_bytes:
        key = "tensor_parallel_size" if p.neuron else "gpus_per_replica"
        raise CapacityError(
            key, lay.tensor_parallel_size,
            f"enough {unit}s that the weights fit: {gb(p.weights)} of weights + {gb(p.margin)} "
            f"{'runtime reserve' if p.neuron else 'outside gpu_memory_utilization and activations'} per {unit} "
            f"> {gb(acc.memory_bytes)} ({acc.name})",
        )
    if p.neuron and p.used > acc.memory_bytes:
        raise CapacityError(
            "max_num_seqs", lay.max_num_seqs,
            f"at most {p.max_sequences} at tensor_parallel_size {lay.tensor_parallel_size} and max_model_len "
            f"{lay.max_model_len}: per {unit} {gb(p.weights)} weights + {gb(p.kv_cache)} KV cache "
            f"({lay.max_num_seqs} x {gb(p.kv_per_sequence)}) + {gb(p.margin)} runtime reserve = {gb(p.used)} "
            f"> {gb(acc.memory_bytes)} ({acc.name})",
        )
    if not p.neuron and p.kv_cache < p.kv_per_sequence:
        raise CapacityError(
            "max_model_len", lay.max_model_len,
            f"a context whose KV cache fits: one {lay.max_model_len}-token sequence needs {gb(p.kv_per_sequence)} "
            f"per GPU, {gb(p.kv_cache)} is left after {gb(p.weights)} weights and {gb(p.margin)} margin",
        )


def summary_line(p: Plan) -> str:
    """One line for ``gennstack summary`` and the docs."""
    lay = p.layout
    unit = "NeuronCore" if p.neuron else "GPU"
    parallel = f"TP {lay.tensor_parallel_size}"
    if lay.pipeline_parallel_size > 1:
        parallel += f" x PP {lay.pipeline_parallel_size}"
    if lay.vision_tensor_parallel_size:
        parallel += f" (vision TP {lay.vision_tensor_parallel_size})"
    return (
        f"{parallel}, {lay.max_num_seqs} seqs x {lay.max_model_len} tokens; per {unit} ({gb(p.accelerator.memory_bytes)}): "
        f"weights {gb(p.weights)}, KV {gb(p.kv_cache)}, margin {gb(p.margin)}, free {gb(p.free)}; "
        f"at most {p.max_sequences} sequences of {lay.max_model_len} tokens"
    )



def markdown_table(plans: dict[str, Plan]) -> str:
    """The docs' table of the default layouts (README.md and docs/serving.md; tests/test_docs.py
    checks both hold exactly this)."""
    rows = [
        "| generation | model | layout | memory per core/GPU | weights | KV cache | margin | free | sequences of max_model_len that fit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in plans.items():
        lay = p.layout
        parallel = f"TP {lay.tensor_parallel_size}" + (f", vision TP {lay.vision_tensor_parallel_size}"
                                                       if lay.vision_tensor_parallel_size else "")
        if not p.neuron:
            parallel += f", gpu_memory_utilization {lay.gpu_memory_utilization}"
        kv = (f"{gb(p.kv_cache)} ({lay.max_num_seqs} x {lay.max_model_len} tokens)" if p.neuron
              else f"{gb(p.kv_cache)} (paged, shared; {gb(p.kv_per_sequence)} per {lay.max_model_len}-token sequence)")
        rows.append(
            f"| `{name}` | {p.model.model_id} | {parallel}, {lay.max_num_seqs} seqs x {lay.max_model_len} tokens | "
            f"{gb(p.accelerator.memory_bytes)} ({p.accelerator.name}) | {gb(p.weights)} | {kv} | {gb(p.margin)} | "
            f"{gb(p.free)} | {p.max_sequences} |"
        )
    return "\n".join(rows)
