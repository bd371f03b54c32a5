"""gen2-trn2's ``--additional-config``, checked against what the pinned vllm-neuron and NxD Inference accept.

The chart's Neuron image (pytorch-inference-vllm-neuronx 0.16.0, Neuron 2.31.1) is built by
aws-neuron/deep-learning-containers tag 2.31.1, ``vllm/inference/0.16.0/Dockerfile.neuronx``:
vllm-project/vllm-neuron branch ``release-0.5.3`` and neuronx_distributed_inference 0.10.18399.
Neither exact source is in reach here. The loader code below is replicated from
``vllm_neuron/worker/neuronx_distributed_model_loader.py`` as it reads in vllm-project/vllm-neuron
``release-0.2.x`` (a967125) and in exa-labs/vllm-neuron 1df2cde, a fork on the same vLLM 0.16.0
line as release-0.5.x (requirements/core.txt ``vllm==0.16.0``); both read the same for every
function used here, and NxD Inference's own contrib notes that 0.5.3 keeps 0.5.0's model loading.
NxD Inference code is read at the public release-2.29 sync (ef2731e).
"""

from __future__ import annotations

import copy
import json

import pytest

from tests import helm
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, cdk_values, merged, only


class UpstreamAssertion(AssertionError):
    """What vllm-neuron or NxD Inference would raise at start-up."""


def replicated_load(default_neuron_config: dict, override_neuron_config: dict) -> tuple[dict, dict]:
    """The (text, vision) neuron configs vllm-neuron builds for Llama4ForConditionalGeneration.

    get_neuron_model -> _get_neuron_config_after_override: the defaults are updated with the
    override and text_neuron_config / vision_neuron_config popped from them; _validate_neuron_config
    asserts neither is left. NeuronMultiModalCausalLM.load_weights ->
    _validate_image_to_text_override_neuron_config asserts the override holds no other key, then
    lays each sub-dict over a deep copy of the defaults.
    """
    merged_defaults = copy.deepcopy(default_neuron_config)
    merged_defaults.update(override_neuron_config)
    merged_defaults.pop("text_neuron_config", None)
    merged_defaults.pop("vision_neuron_config", None)
    allowed = {"text_neuron_config", "vision_neuron_config"}
    if override_neuron_config and not override_neuron_config.keys() <= allowed:
        raise UpstreamAssertion(
            f"override_neuron_config for ImageToText models can only contain keys {allowed}, got {override_neuron_config.keys()}")
    text = {**copy.deepcopy(merged_defaults), **override_neuron_config.get("text_neuron_config", {})}
    vision = {**copy.deepcopy(merged_defaults), **override_neuron_config.get("vision_neuron_config", {})}
    return text, vision


# Keys NxD Inference's NeuronConfig / MoENeuronConfig pop from their kwargs (models/config.py);
# any other key only logs "NeuronConfig init: Unexpected keyword arguments" and is ignored.
NXDI_KEYS = {"tp_degree", "cp_degree", "world_size", "batch_size", "buckets", "save_sharded_checkpoint", "seq_len"}


def replicated_nxdi_checks(text: dict, vision: dict) -> None:
    """NxD Inference's checks on what the chart sets (models/config.py NeuronConfig.__init__,
    models/llama4/modeling_llama4_vision.py NeuronLlama4VisionEmbeddings.__init__,
    models/image_to_text_model_base.py load())."""
    if text["tp_degree"] % text.get("cp_degree", 1):
        raise UpstreamAssertion("TP Degree must be evenly divisible by CP Degree")
    if vision["world_size"] % vision["tp_degree"]:
        raise UpstreamAssertion("Invalid parallel config. world_size should be a multiple of tp_degree")
    # world_size defaults to tp_degree x pp x ep (1 x 1 here): the text model's 64 ranks.
    if vision["world_size"] != text.get("world_size", text["tp_degree"]):
        raise UpstreamAssertion("text and vision models must span the same ranks")
    # load() reads presharded text *and* vision weights when the top-level (text) config says so,
    # but each part is only presharded at compile time when its own config says so.
    if text.get("save_sharded_checkpoint", False) != vision.get("save_sharded_checkpoint", False):
        raise UpstreamAssertion("save_sharded_checkpoint must match in text and vision configs")


def vllm_args(values: dict) -> list[str]:
    objects = helm.render(CHART, values, namespace=NAMESPACE)
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gen2-trn2")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return json.loads(next(e["value"] for e in container["env"] if e["name"] == "VLLM_ARGS"))


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def defaults_from(args: list[str]) -> dict:
    """The parts of vllm-neuron's _get_default_neuron_config the checks read, from the vLLM flags."""
    return {"tp_degree": int(flag(args, "--tensor-parallel-size")), "batch_size": int(flag(args, "--max-num-seqs")),
            "seq_len": int(flag(args, "--max-model-len"))}


@pytest.fixture(scope="module")
def rendered_args() -> list[str]:
    return vllm_args(merged(cdk_values(), only("trn2")))


def test_override_has_only_the_keys_the_multimodal_loader_accepts(rendered_args) -> None:
    """vllm_neuron/worker/neuronx_distributed_model_loader.py (release-0.2.x a967125; exa-labs 1df2cde on
    vLLM 0.16.0): _validate_image_to_text_override_neuron_config allows exactly these two keys."""
    config = json.loads(flag(rendered_args, "--additional-config"))
    assert set(config) == {"override_neuron_config"}
    assert set(config["override_neuron_config"]) == {"text_neuron_config", "vision_neuron_config"}
    replicated_load(defaults_from(rendered_args), config["override_neuron_config"])


def test_the_old_flat_moe_override_is_what_upstream_rejects() -> None:
    """The same assertion fails on the flat keys the chart sent before."""
    with pytest.raises(UpstreamAssertion, match="can only contain keys"):
        replicated_load({"tp_degree": 64}, {"moe_ep_degree": 16, "moe_tp_degree": 4})


def test_text_config_sets_context_parallelism_and_presharding(rendered_args) -> None:
    """NxD Inference models/config.py NeuronConfig pops cp_degree (tp_degree % cp_degree must be 0) and
    save_sharded_checkpoint; the aws-neuron-sdk Llama 4 tutorial (libraries/nxd-inference/tutorials/
    llama4-tutorial.ipynb) runs text TP 64 with cp_degree 16."""
    override = json.loads(flag(rendered_args, "--additional-config"))["override_neuron_config"]
    text, vision = replicated_load(defaults_from(rendered_args), override)
    assert override["text_neuron_config"] == {"cp_degree": 16, "save_sharded_checkpoint": True}
    assert (text["tp_degree"], text["cp_degree"]) == (64, 16)
    replicated_nxdi_checks(text, vision)


def test_vision_config_runs_tp16_dp4_one_batch(rendered_args) -> None:
    """modeling_llama4_vision.py: dp_degree = world_size // tp_degree (64 // 16 = 4); the tutorial's
    vision config: batch_size 1, tp_degree 16, world_size 64, buckets [8, 28, 88]. The buckets must be
    given: NeuronConfig defaults them to [seq_len], which is not None, so modeling_llama4.py would
    compile an 8192-chunk vision bucket instead of generating its own."""
    override = json.loads(flag(rendered_args, "--additional-config"))["override_neuron_config"]
    assert override["vision_neuron_config"] == {
        "tp_degree": 16, "world_size": 64, "batch_size": 1, "buckets": [8, 28, 88], "save_sharded_checkpoint": True}
    _, vision = replicated_load(defaults_from(rendered_args), override)
    assert vision["world_size"] // vision["tp_degree"] == 4


def test_every_key_is_one_nxd_inference_reads(rendered_args) -> None:
    """models/config.py (release-2.29 sync ef2731e): each key is popped by NeuronConfig.__init__;
    an unknown one would only be logged and ignored, silently dropping the setting."""
    override = json.loads(flag(rendered_args, "--additional-config"))["override_neuron_config"]
    for part in override.values():
        assert set(part) <= NXDI_KEYS, set(part) - NXDI_KEYS


@pytest.mark.parametrize("values, expected", [
    ({"trn2": {"contextParallelSize": 32, "visionTensorParallelSize": 8, "saveShardedCheckpoint": False}},
     ({"cp_degree": 32, "save_sharded_checkpoint": False}, {"tp_degree": 8, "world_size": 64})),
])
def test_override_follows_values(values, expected) -> None:
    args = vllm_args(merged(REQUIRED, only("trn2"), values))
    override = json.loads(flag(args, "--additional-config"))["override_neuron_config"]
    assert override["text_neuron_config"] == expected[0]
    assert {k: override["vision_neuron_config"][k] for k in ("tp_degree", "world_size")} == expected[1]
    replicated_nxdi_checks(*replicated_load(defaults_from(args), override))


def test_mismatched_presharding_is_caught() -> None:
    with pytest.raises(UpstreamAssertion, match="save_sharded_checkpoint"):
        replicated_nxdi_checks({"tp_degree": 64, "save_sharded_checkpoint": True},
                               {"tp_degree": 16, "world_size": 64, "save_sharded_checkpoint": False})
