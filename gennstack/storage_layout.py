"""Where things live in GenNStack's buckets. Staging jobs write these keys; serving reads them.

Models bucket::

    s3://<models-bucket>/<model-id>/<revision>/...            e.g. openai/gpt-oss-20b/<commit>/config.json

Compile-cache bucket::

    s3://<compile-cache-bucket>/neuron-<sdk>/<model-id>/<revision>/<parallelism>/...
                                e.g. neuron-2.26.0/meta-llama/Meta-Llama-3-70B-Instruct/<commit>/tp24/
    s3://<compile-cache-bucket>/vllm-<vllm>/<model-id>/<revision>/<gpu>-<parallelism>/...
                                e.g. vllm-0.29.0/openai/gpt-oss-120b/<commit>/l40s-tp4-seqs64-len32768/

A compiled Neuron artifact is valid only for the SDK version, model weights and parallelism it
was compiled for, so all of them are part of its key; a new SDK or layout never reads a stale one.
A vLLM compile cache (g6e: VLLM_CACHE_ROOT's torch.compile artifacts and the Triton cache) is
keyed the same way by vLLM version, model revision, GPU type and layout; vLLM itself keys the
directories inside by a hash of its config, environment and code, so a set that still differs in
something the key leaves out is a cache miss (a cold start), never a wrong load.

What a server copies to its node: inf2 and trn2 compile with ``save_sharded_checkpoint`` (layout
``-sharded``), so their artifacts hold per-rank weights (inf2: ``weights/tp<rank>_sharded_checkpoint.safetensors``;
trn2: ``text_model/weights/...`` and ``vision_model/weights/...``) and their servers copy from the
model revision only what is not :data:`PRESHARDED_SERVER_SKIPS`: config, tokenizer and processor
files. Their compile Jobs still copy everything. Without the setting a server copies the whole revision.
"""

from __future__ import annotations

import re

# Model keys (fnmatch patterns, relative to the model prefix) a server loading a presharded
# checkpoint never reads: NxD Inference 2.28.0 (aws-neuron/neuronx-distributed-inference,
# "Neuron SDK Release 2.28.0" cd3abf3) image_to_text_model_base.py load_weights reads, with
# save_sharded_checkpoint, only the compiled path's weights/tp<rank>_sharded_checkpoint.safetensors,
# and vllm-neuron's loader (worker/neuronx_distributed_model_loader.py _load_compiled_model) builds
# the model from the compiled path; the model directory serves only load_pretrained_config
# (config.json) and vLLM's tokenizer and processor. The chart passes these to s3sync.py as
# MODEL_EXCLUDE (templates/_helpers.tpl syncContainer).
PRESHARDED_SERVER_SKIPS = ("*.safetensors",)

_MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def model_prefix(model_id: str, revision: str) -> str:
    """The key prefix (ending in ``/``) of one model revision's files in the models bucket."""
    _check(model_id=model_id, revision=revision)
    return f"{model_id}/{revision}/"


def compile_cache_prefix(*, neuron_sdk: str, model_id: str, revision: str, parallelism: str) -> str:
    """The key prefix (ending in ``/``) of one compiled Neuron artifact set.

    ``parallelism`` names the layout, for example ``tp24`` or ``tp64-ep16``.
    """
    _check(model_id=model_id, revision=revision)
    for name, value in (("neuron_sdk", neuron_sdk), ("parallelism", parallelism)):
        if not _PART_RE.match(value):
            raise ValueError(f"{name}: got {value!r}; allowed: letters, digits, '._-', starting with a letter or digit")
    return f"neuron-{neuron_sdk}/{model_id}/{revision}/{parallelism}/"


def vllm_compile_cache_prefix(*, vllm: str, model_id: str, revision: str, gpu: str, parallelism: str) -> str:
    """The key prefix (ending in ``/``) of one vLLM compile cache set (torch.compile and Triton).

    ``gpu`` names the GPU type (``l40s``), ``parallelism`` the layout (``tp4-seqs64-len32768``).
    """
    _check(model_id=model_id, revision=revision)
    for name, value in (("vllm", vllm), ("gpu", gpu), ("parallelism", parallelism)):
        if not _PART_RE.match(value):
            raise ValueError(f"{name}: got {value!r}; allowed: letters, digits, '._-', starting with a letter or digit")
    return f"vllm-{vllm}/{model_id}/{revision}/{gpu}-{parallelism}/"


def _check(*, model_id: str, revision: str) -> None:
    if not _MODEL_ID_RE.match(model_id):
        raise ValueError(f"model_id: got {model_id!r}; allowed: a Hugging Face repository id like 'org/name'")
    if not _PART_RE.match(revision):
        raise ValueError(f"revision: got {revision!r}; allowed: a commit hash, tag or branch without '/'")
