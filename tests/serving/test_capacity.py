"""The capacity model against arithmetic done by hand, and every rejection it makes."""

from __future__ import annotations

import pytest

from gennstack.config import ConfigError, load_config
from gennstack.serving.capacity import (
    GB, GPU_ACTIVATION_MARGIN_BYTES, MODELS, NEURON_RESERVE_SHARE, Layout, kv_heads_per_rank, plan,
)
from gennstack.serving.fit import plans

LLAMA3 = MODELS["meta-llama/Meta-Llama-3-70B-Instruct"]
MAVERICK = MODELS["meta-llama/Llama-4-Maverick-17B-128E-Instruct"]
GPT_OSS = MODELS["openai/gpt-oss-20b"]


def test_kv_heads_per_rank_follows_nxd_inference_gqa_sharding() -> None:
    """aws-neuron/neuronx-distributed-inference modules/attention/gqa.py (release-2.29 sync, ef2731e):
    determine_sharding_strategy + get_shardable_head_counts; kv_cache_manager.py divides by TP."""
    assert kv_heads_per_rank(8, 64, 4) == 2  # 8 KV heads split 4 ways
    assert kv_heads_per_rank(8, 64, 8) == 1
    assert kv_heads_per_rank(8, 64, 16) == 1  # REPLICATE_TO_TP_DEGREE: 8 -> 16 heads, one per rank
    assert kv_heads_per_rank(8, 64, 24) == 1  # 8 -> 24
    assert kv_heads_per_rank(8, 40, 64) == 1  # Maverick at TP 64
    assert kv_heads_per_rank(8, 64, 12) == 6  # CONVERT_TO_MHA: 64 query heads padded to 72, 6 per rank


def test_llama3_70b_at_tp16_is_the_issue_numbers() -> None:
    """TP 16, 32 sequences of 8192 tokens: the old default.

    Weights per rank (BF16): per layer q,o = 2 x 8192 x (4 x 128) = 8,388,608; k,v with one
    replicated KV head = 2 x 8192 x 128 = 2,097,152; MLP = 3 x 8192 x 28672/16 = 44,040,192;
    norms 16,384 -> 54,542,336 x 80 layers = 4,363,386,880; embedding + lm_head
    2 x 128256/16 x 8192 = 131,334,144; final norm 8,192. Sum 4,494,729,216 x 2 B = 8,989,458,432 B.
    KV: 80 layers x (K,V) 2 x 32 seqs x 1 head x 8192 x 128 x 2 B = 10,737,418,240 B (10 GiB).
    Reserve 10% of 16 GB = 1.6 GB. 8.99 + 10.74 + 1.6 = 21.33 GB > 16 GB: it never fit.
    """
    p = plan(Layout("inf2", 16, 32, 8192), LLAMA3)
    assert p.weights == 8_989_458_432
    assert p.kv_cache == 10_737_418_240
    assert p.margin == 1_600_000_000
    assert p.used == 21_326_876_672 > 16 * GB
    # (16e9 - 1.6e9 - 8,989,458,432) // 335,544,320 = 16 sequences at TP 16.
    assert p.kv_per_sequence == 335_544_320 and p.max_sequences == 16


def test_llama3_70b_at_tp24_pads_heads_and_fits_more_sequences() -> None:
    """TP 24: 64 query heads padded to 72 (3 per rank), KV heads replicated 8 -> 24 (1 per rank),
    MLP 28672 padded to 28680 (1195 per rank), vocabulary 128256 / 24 = 5344 per rank.

    Per layer: q,o 2 x 8192 x 384 = 6,291,456; k,v 2,097,152; MLP 3 x 8192 x 1195 = 29,368,320;
    norms 16,384 -> 37,773,312 x 80 = 3,021,864,960; + 2 x 5344 x 8192 = 87,556,096 + 8,192
    = 3,109,429,248 params x 2 B = 6,218,858,496 B. KV per sequence is the same 335,544,320 B as at
    TP 16 (one KV head per rank either way). (16e9 - 1.6e9 - 6,218,858,496) // 335,544,320 = 24.
    Default 20 sequences: 6.22 + 6.71 + 1.6 = 14.53 GB, 1.47 GB free.
    """
    p = plan(Layout("inf2", 24, 20, 8192), LLAMA3)
    assert p.weights == 6_218_858_496
    assert p.kv_cache == 20 * 335_544_320 == 6_710_886_400
    assert p.max_sequences == 24
    assert p.free == 16 * GB - 1_600_000_000 - 6_218_858_496 - 6_710_886_400 == 1_470_255_104


def test_maverick_at_tp64() -> None:
    """TP 64, vision TP 16, 16 sequences of 8192 tokens on 24 GB logical cores.

    Evenly sharded: 801e9 - K/V projections (48 x 2 x 5120 x 8 x 128 x 2 B = 1,006,632,960)
    - vision (0.85e9 x 2 B = 1.7e9) = 798,293,367,040 / 64 = 12,473,333,860 (rounded up).
    K/V replicated, one head per rank: 48 x 2 x 5120 x 128 x 2 = 125,829,120.
    Vision at TP 16: 1.7e9 / 16 = 106,250,000. Sum 12,705,412,980 B.
    KV: 48 x 2 x 16 x 1 x 8192 x 128 x 2 = 3,221,225,472 B. Reserve 2.4e9.
    Max: (24e9 - 2.4e9 - 12,705,412,980) // 201,326,592 = 44 sequences.
    """
    p = plan(Layout("trn2", 64, 16, 8192, vision_tensor_parallel_size=16), MAVERICK)
    assert p.weights == 12_705_412_980
    assert p.kv_cache == 3_221_225_472
    assert p.margin == 2_400_000_000
    assert p.max_sequences == 44


def test_gpt_oss_20b_on_one_l40s() -> None:
    """vLLM budget: 0.9 x 48e9 = 43.2e9; minus 13.8e9 weights and 3 GiB activation margin
    leaves 26,178,774,528 B for the paged KV cache.

    Per token per layer: K,V 2 x 8 heads x 64 x 2 B = 2048 B. 12 full-attention layers hold
    32768 tokens: 12 x 2048 x 32768 = 805,306,368. 12 sliding layers hold the 128-token window
    plus one 8192-token chunk: min(127 + 8192, 32768) = 8319 -> ceil(8319/16) + 1 = 521 blocks of
    16 = 8336 tokens: 12 x 2048 x 8336 = 204,865,536. Per sequence 1,010,171,904 B;
    26,178,774,528 // 1,010,171,904 = 25 sequences at the full 32768-token context.
    """
    p = plan(Layout("g6e", 1, 64, 32768, 0.9), GPT_OSS)
    assert p.margin == 48 * GB - int(0.9 * 48 * GB) + GPU_ACTIVATION_MARGIN_BYTES
    assert p.kv_cache == 26_178_774_528
    assert p.kv_per_sequence == 1_010_171_904
    assert p.max_sequences == 25


def test_defaults_fit_with_margin() -> None:
    """Every default layout fits: Neuron cores keep the runtime reserve and at least 1 GB more; the
    GPU holds at least 16 sequences of the full context."""
    config = load_config({})
    result = plans(config.generations, config.serving)
    assert set(result) == {"inf2", "trn2", "g6e"}
    for name in ("inf2", "trn2"):
        p = result[name]
        assert p.margin == int(NEURON_RESERVE_SHARE * p.accelerator.memory_bytes)
        assert p.free >= 1 * GB, (name, p.free)
        assert p.layout.max_num_seqs <= p.max_sequences
    assert result["g6e"].max_sequences >= 16


def test_tp24_is_accepted_on_inf2_48xlarge() -> None:
    config = load_config({"serving": {"inf2": {"tensor_parallel_size": 24, "max_num_seqs": 24}}})
    assert config.serving.inf2.tensor_parallel_size == 24


def reject(context: dict) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(context)
    return str(info.value)


@pytest.mark.parametrize("context, expected", [
    # Neuron: the KV cache is allocated up front for max_num_seqs x max_model_len.
    ({"serving": {"inf2": {"max_num_seqs": 32}}},
     "serving.inf2.max_num_seqs: got 32; allowed: at most 24 at tensor_parallel_size 24 and max_model_len 8192: "
     "per NeuronCore 6.22 GB weights + 10.74 GB KV cache (32 x 0.34 GB) + 1.60 GB runtime reserve = 18.56 GB "
     "> 16.00 GB (NeuronCore-v2)"),
    ({"serving": {"inf2": {"tensor_parallel_size": 16, "max_num_seqs": 20}}},
     "serving.inf2.max_num_seqs: got 20; allowed: at most 16 at tensor_parallel_size 16"),
    # Weights alone: 8 cores hold 141 GB only at 17.6 GB each.
    ({"serving": {"inf2": {"tensor_parallel_size": 8, "max_num_seqs": 8, "target_ongoing_requests": 8}}},
     "serving.inf2.tensor_parallel_size: got 8; allowed: enough NeuronCores that the weights fit: 17.64 GB of "
     "weights + 1.60 GB runtime reserve per NeuronCore > 16.00 GB (NeuronCore-v2)"),
    ({"serving": {"inf2": {"tensor_parallel_size": 12}}},
     "serving.inf2.tensor_parallel_size: got 12; allowed: a divisor or a multiple of "
     "meta-llama/Meta-Llama-3-70B-Instruct's 8 KV heads"),
    ({"serving": {"trn2": {"tensor_parallel_size": 32, "context_parallel_size": 16, "vision_tensor_parallel_size": 16}}},
     "serving.trn2.tensor_parallel_size: got 32; allowed: enough NeuronCores that the weights fit"),
    ({"serving": {"trn2": {"max_num_seqs": 64}}},
     "serving.trn2.max_num_seqs: got 64; allowed: at most 44 at tensor_parallel_size 64 and max_model_len 8192"),
    # Llama 4's 8192-token attention chunks: the last chunk of 12288 is 4096, which 16 divides; 8192 % 3 != 0 ...
    ({"serving": {"trn2": {"max_model_len": 12288, "max_num_seqs": 8, "context_parallel_size": 32}}},
     None),
    # GPU: one max_model_len sequence must fit what vLLM leaves for the KV cache.
    # 0.3 x 48 GB leaves 33.6 GB outside vLLM's budget, + 3 GiB margin = 36.82 GB; + 13.8 GB > 48 GB.
    ({"serving": {"g6e": {"gpu_memory_utilization": 0.3}}},
     "serving.g6e.gpus_per_replica: got 1; allowed: enough GPUs that the weights fit: 13.80 GB of weights + "
     "36.82 GB outside gpu_memory_utilization and activations per GPU > 48.00 GB (NVIDIA L40S)"),
    # 0.4 x 48 GB = 19.2 GB - 13.8 GB - 3 GiB = 2.18 GB; one 131072-token sequence needs
    # 12 x 2048 x 131072 + 12 x 2048 x 8336 = 3.43 GB.
    ({"serving": {"g6e": {"gpu_memory_utilization": 0.4, "max_model_len": 131072}}},
     "serving.g6e.max_model_len: got 131072; allowed: a context whose KV cache fits: one 131072-token sequence "
     "needs 3.43 GB per GPU, 2.18 GB is left after 13.80 GB weights and 32.02 GB margin"),
    ({"generations": {"g6e": {"model_id": "acme/unknown-7b"}}},
     "generations.g6e.model_id: got 'acme/unknown-7b'; allowed: a model whose shape gennstack/serving/capacity.py MODELS knows"),
])
def test_rejections_name_key_value_and_numbers(context, expected) -> None:
    if expected is None:
        load_config(context)  # a layout that satisfies the chunk rule loads
        return
    assert expected in reject(context)


def test_context_parallel_must_divide_the_attention_chunks() -> None:
    """NxD Inference models/config.py InferenceConfig._validate_chunked_attention_support (release-2.29
    sync, ef2731e): attention_chunk_size % cp_degree == 0 and (seq_len % chunk) % cp_degree == 0 when
    the chunk is shorter than seq_len. 8192 + 1000 tokens: last chunk 1000, 1000 % 16 = 8."""
    message = reject({"serving": {"trn2": {"max_model_len": 9192, "max_num_seqs": 8}}})
    assert ("serving.trn2.context_parallel_size: got 16; allowed: a divisor of "
            "meta-llama/Llama-4-Maverick-17B-128E-Instruct's attention chunk (8192) and of the last chunk of "
            "max_model_len (9192 % 8192 = 1000)") in message
