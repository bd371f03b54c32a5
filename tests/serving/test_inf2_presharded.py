"""gen1-inf2 loads a presharded checkpoint: sharded once by the compile Job, read per rank by every server.

NxD Inference 2.28.0 (aws-neuron/neuronx-distributed-inference cd3abf3, "Neuron SDK Release 2.28.0",
src/neuronx_distributed_inference/models/application_base.py): ``compile()`` calls ``shard_weights``, which with
``neuron_config.save_sharded_checkpoint`` writes ``<compiled>/weights/tp<rank>_sharded_checkpoint.safetensors``;
``load_weights`` then reads those files (``"Loading presharded checkpoints for ranks"``) and otherwise shards the
model's checkpoint at every load ("The checkpoints will be sharded during load time"). Both are in
NeuronApplicationBase, the base of NeuronLlamaForCausalLM (models/llama/modeling_llama.py), with no hardware check.
vllm-project/vllm-neuron a5ef7c8 (vllm_neuron/worker/neuronx_distributed_model_loader.py): ``get_neuron_model`` lays
``additional_config["override_neuron_config"]`` over NeuronCausalLM's default neuron config (Llama 3 is not
Llama4ForConditionalGeneration, so no text/vision split), and ``_load_compiled_model`` builds the model from
NEURON_COMPILED_ARTIFACTS, whose neuron config the compile wrote.
"""

from __future__ import annotations

import json

from gennstack.serving import ServingConfig, compile_cache_prefixes
from gennstack.config import load_config
from tests import helm
from tests.serving.conftest import CHART, REQUIRED, merged, only
from tests.serving.test_serving_chart import env, named, serving_pod


def _inf2(values: dict | None = None) -> tuple[dict, dict]:
    """(server's sync-from-s3 env, the compile Job's VLLM_ARGS) of gen1-inf2."""
    objects = named(helm.render(CHART, merged(REQUIRED, only("inf2"), {"staging": {"enabled": True, "hfTokenSecret": "t"}},
                                              values or {})))
    sync = next(c for c in serving_pod(objects, "inf2")["initContainers"] if c["name"] == "sync-from-s3")
    job = next(o for (kind, name), o in objects.items() if kind == "Job" and name.startswith("gen1-inf2-compile-"))
    compile_container = next(c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "compile")
    return env(sync), json.loads(env(compile_container)["VLLM_ARGS"])


def _additional_config(args: list[str]) -> dict | None:
    return json.loads(args[args.index("--additional-config") + 1]) if "--additional-config" in args else None


def test_inf2_compiles_a_sharded_checkpoint_and_serves_without_the_safetensors() -> None:
    sync, args = _inf2()
    assert _additional_config(args) == {"override_neuron_config": {"save_sharded_checkpoint": True}}
    assert sync["MODEL_EXCLUDE"] == "*.safetensors"
    assert "-sharded-" in sync["COMPILE_PREFIX"]


def test_unsharded_inf2_keeps_the_old_path_and_key() -> None:
    sync, args = _inf2({"inf2": {"saveShardedCheckpoint": False}})
    assert _additional_config(args) is None
    assert "MODEL_EXCLUDE" not in sync
    assert "/tp24-seqs20-len8192/" in sync["COMPILE_PREFIX"]


def test_the_key_python_computes_follows_the_setting() -> None:
    """Artifacts compiled without shards never serve a pod that skips the safetensors (and back)."""
    config = load_config({})
    sharded = compile_cache_prefixes(config, ServingConfig())["inf2"]
    unsharded = compile_cache_prefixes(config, ServingConfig.model_validate({"inf2": {"save_sharded_checkpoint": False}}))["inf2"]
    assert sharded.endswith("/tp24-sharded-seqs20-len8192/") and unsharded.endswith("/tp24-seqs20-len8192/")
