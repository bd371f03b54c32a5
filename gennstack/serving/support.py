"""The support matrix: per generation, the image it runs, that image's Neuron release, the instance
family and the model architecture, and the upstream text that says the release supports them.

One table, read by the chart values (:mod:`gennstack.serving.values`), the compile-cache keys, the
config checks (:func:`release_error`) and ``gennstack summary``. Each row is pinned in
tests/serving/test_support_matrix.py to the release notes that support it, so an image bump that
leaves its hardware unsupported fails a test.

Why both Neuron generations run Neuron 2.28.0 (docs/serving.md, "Neuron releases"):

* inf2: the Neuron 2.29.0 NxD Inference release notes (aws-neuron/aws-neuron-sdk
  ``release-notes/components/nxd-inference.rst``, Breaking Changes): "NxD Inference models are now
  only supported on Trn2 and newer hardware. Customers who require NxD Inference kernel support on
  Trn1 or Inf2 instances should pin to release 2.28."
* trn2 (Llama 4): the same notes removed the MoE prefill kernel ("Models that depend on this kernel
  (including Llama 4, Mixtral, and DBRX configurations) should be pinned to release 2.28 for optimal
  performance"); from 2.32.0 the vLLM 0.16 DLC is no longer published and NxD Inference is in
  maintenance mode (``release-notes/components/containers.rst``, 2.32.0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NEURON_GENERATIONS", "SUPPORT", "NXDI_LAST_RELEASE", "Support", "effective_release", "neuron_release_of",
           "release_error"]

NEURON_GENERATIONS = ("inf2", "trn2")

# The DLC tag names its Neuron release: `<vllm>-neuronx-py312-sdk<release>-ubuntu24.04`
# (aws-neuron/deep-learning-containers README, vllm-inference-neuronx table).
_SDK_RE = re.compile(r"-sdk(\d+\.\d+\.\d+)-")

# The newest Neuron release (major.minor) whose NxD Inference runs models on each family: inf2 from
# the 2.29.0 NxD Inference notes (pin to 2.28); trn2 from the 2.32.0 containers notes (NxD Inference
# is no longer in the DLCs; 2.31 is the last release with the vLLM 0.16 NxD Inference DLC).
NXDI_LAST_RELEASE: dict[str, tuple[int, int]] = {"inf2": (2, 28), "trn2": (2, 31)}

_DLC_2_28_0 = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"
_DLC_2_28_0_RUNTIME = "2.30.51.0-faafe26f0"


@dataclass(frozen=True)
class Support:
    """One generation's row: what it runs and on what."""

    generation: str
    # The image's reference; for inf2 the base that CDK adds Ray Serve to (assets/images/inf2-ray-serve).
    image: str
    # Neuron SDK release of the image (its tag's `sdk<release>`); "" for a non-Neuron image.
    neuron_release: str
    instance_family: str
    # The model architecture (Hugging Face config.json `architectures[0]`) the default model has.
    architecture: str
    # vLLM in the image, and the vLLM Neuron plugin (vllm-project/vllm-neuron branch) where there is one.
    vllm: str
    plugin: str
    # The image's Neuron runtime (its aws-neuronx-runtime-lib package); the node's Neuron driver must
    # accept it (gennstack/versions.py NEURON_AMI_DRIVER; the chart's files/neuron_compat.py rules).
    neuron_runtime: str = ""


SUPPORT: dict[str, Support] = {
    # deep-learning-containers 2.28.0, vllm/inference/0.13.0/Dockerfile.neuronx: vllm-neuron
    # release-0.4.1 on vLLM 0.13.0, neuronx_distributed_inference 0.8.16251,
    # NEURONX_RUNTIME_LIB_VERSION=2.30.51.0-faafe26f0; README row "Neuron 2.28.0 | trn1,trn2,trn3,inf2".
    "inf2": Support("inf2", _DLC_2_28_0, "2.28.0", "inf2", "LlamaForCausalLM", vllm="0.13.0", plugin="release-0.4.1",
                    neuron_runtime=_DLC_2_28_0_RUNTIME),
    "trn2": Support("trn2", _DLC_2_28_0, "2.28.0", "trn2", "Llama4ForConditionalGeneration", vllm="0.13.0",
                    plugin="release-0.4.1", neuron_runtime=_DLC_2_28_0_RUNTIME),
    "g6e": Support(
        "g6e",
        "docker.io/vllm/vllm-openai:v0.29.0@sha256:c2914767605584b6d8f45686b82de173ecc99e781897aa3d0a66dacd72c51ae1",
        "", "g6e", "GptOssForCausalLM", vllm="0.29.0", plugin=""),
}


def neuron_release_of(image: str) -> str | None:
    """The Neuron release a Neuron DLC tag names (`...-sdk2.28.0-...`), or None."""
    tag = image.rsplit("/", 1)[-1].split("@")[0]
    match = _SDK_RE.search(tag)
    return match.group(1) if match else None


def release_error(generation: str, release: str) -> str | None:
    """Why Neuron ``release`` cannot run ``generation`` (a Neuron one), or None when it can: the
    release must be one whose NxD Inference runs models on the generation's family."""
    last = NXDI_LAST_RELEASE[generation]
    major, minor = (int(p) for p in release.split(".")[:2])
    if (major, minor) > last:
        why = {
            "inf2": "the Neuron 2.29.0 NxD Inference release notes: NxD Inference models are only supported on Trn2 "
                    "and newer; Inf2 should pin to release 2.28",
            "trn2": "the Neuron 2.32.0 containers release notes: NxD Inference is no longer in the Neuron DLCs "
                    "(use 2.31 or earlier)",
        }[generation]
        return f"a Neuron release at most {last[0]}.{last[1]} for {generation} ({why})"
    return None


def effective_release(generation: str, image: str | None, declared: str | None) -> str:
    """The Neuron release a Neuron generation runs: its image tag's (`-sdk<x.y.z>-`), else the one
    declared for an image whose tag names none (``neuron_release``), else the matrix's (an image
    built from assets/images/inf2-ray-serve is the matrix's DLC plus Ray)."""
    if image is not None and (tagged := neuron_release_of(image)) is not None:
        return tagged
    return declared or SUPPORT[generation].neuron_release
