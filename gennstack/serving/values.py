"""The values of the ``gennstack-serving`` chart (assets/charts/gennstack-serving), built in one place.

CDK calls :func:`serving_values` with the config and the names of what it created (buckets,
secret, service accounts; CloudFormation tokens arrive as strings) and hands the result to
``HelmChart(values=...)``. Tests call it on its own and render the chart with the real helm.

The chart builds the S3 keys it reads and writes from these values with the same layout as
:mod:`gennstack.storage_layout`; :func:`model_prefixes` and :func:`compile_cache_prefixes` give
the same keys in Python (to scope IAM policies, or to check a bucket), and the tests hold the two
to each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from gennstack.config import ConfigError, GenerationConfig, GenNStackConfig
from gennstack import network_policy
from gennstack.instances import INSTANCE_TYPES
from gennstack.observability.names import PROMETHEUS_URL
from gennstack.serving.config import G6eServing, Inf2Serving, ServingConfig, Trn2Serving
from gennstack.serving.fit import check_fits
from gennstack.serving.multinode import multi_node_values
from gennstack.serving.support import NEURON_GENERATIONS, SUPPORT, effective_release
from gennstack.storage_layout import compile_cache_prefix, model_prefix, vllm_compile_cache_prefix

__all__ = ["G6E_GPU", "MULTI_NODE_STAGED_MARKER", "NEURON_SDK_VERSION", "STAGED_GATE_MODES", "STAGED_MARKERS", "StagedGate", "compile_cache_prefixes", "compile_layout", "generation_image", "model_prefixes",
           "neuron_release", "serving_values"]

# The Neuron release of the chart's default Neuron image (images.neuronVllm and neuron.sdkVersion in
# values.yaml): the support matrix's (gennstack/serving/support.py). Compiled artifacts are only
# valid for the release that made them, so each generation's compile-cache key carries its own
# (neuron_release); a test fails when this and the chart's neuron.sdkVersion disagree.
NEURON_SDK_VERSION = SUPPORT["inf2"].neuron_release

# The chart's `<gen>.staged`: whether a generation's servers and warm spares may request accelerator
# nodes. "auto" (the default): the chart reads the generation's `<pool>-staged` ConfigMap with helm's
# `lookup` at install and upgrade and opens the gate once it records the model revision (and, Neuron,
# the compiled artifacts) this config renders, i.e. at the first deploy after staging; True / False
# force it (what `helm template`, which has no cluster, needs to show either state).
StagedGate = Literal["auto"] | bool
STAGED_GATE_MODES: tuple[StagedGate, ...] = ("auto", True, False)
# Each generation's marker, the ConfigMap the stage Job and the compile Job's upload record into
# (the chart's templates/staged-markers.yaml; a test holds the two to each other).
STAGED_MARKERS = {"inf2": "gen1-inf2-staged", "trn2": "gen2-trn2-staged", "g6e": "gen3-g6e-staged"}
# serving.multi_node's model has a marker of its own (its stage Job records there, its group pods'
# gate reads it); `staged={"multi_node": ...}` sets its gate like a generation's.
MULTI_NODE_STAGED_MARKER = "gen3-g6e-multinode-staged"
# The GPU of every g6e instance type (AWS: "G6e instances feature up to 8 NVIDIA L40S Tensor Core
# GPUs"): the GPU part of gen3's vLLM compile-cache key (the chart's gen facts spell it too).
G6E_GPU = "l40s"


def generation_image(generation: str, serving: ServingConfig) -> str:
    """The image a generation runs: ``serving.<gen>.image`` if set, else the support matrix's."""
    section: Inf2Serving | Trn2Serving | G6eServing = getattr(serving, generation)
    return section.image or SUPPORT[generation].image


def neuron_release(generation: str, serving: ServingConfig) -> str:
    """The Neuron release a Neuron generation runs (its image tag's, its declared ``neuron_release``,
    or the support matrix's): what its compile-cache key carries, so two releases never mix."""
    if generation not in NEURON_GENERATIONS:
        raise ValueError(f"generation: got {generation!r}; allowed: one of {list(NEURON_GENERATIONS)} (Neuron only)")
    section: Inf2Serving | Trn2Serving = getattr(serving, generation)
    return effective_release(generation, section.image, section.neuron_release)


def compile_layout(generation: str, serving: ServingConfig) -> str:
    """The parallelism part of a compile-cache key: everything besides SDK (vLLM), model and revision
    that the compiled graphs depend on (parallel degrees, batch size, sequence length)."""
    if generation == "g6e":
        g6e = serving.g6e
        return f"tp{g6e.gpus_per_replica}-seqs{g6e.max_num_seqs}-len{g6e.max_model_len}"
    if generation == "inf2":
        section: Inf2Serving | Trn2Serving = serving.inf2
        parallel = f"tp{section.tensor_parallel_size}{'-sharded' if section.save_sharded_checkpoint else ''}"
    elif generation == "trn2":
        section = serving.trn2
        parallel = (f"tp{section.tensor_parallel_size}-cp{section.context_parallel_size}"
                    f"-vtp{section.vision_tensor_parallel_size}{'-sharded' if section.save_sharded_checkpoint else ''}")
    else:
        raise ValueError(f"generation: got {generation!r}; allowed: one of {[*NEURON_GENERATIONS, 'g6e']}")
    return f"{parallel}-seqs{section.max_num_seqs}-len{section.max_model_len}"


def model_prefixes(config: GenNStackConfig) -> dict[str, str]:
    """Key prefix of each enabled generation's weights in the models bucket."""
    return {name: model_prefix(gen.model_id, gen.model_revision) for name, gen in config.generations.enabled().items()}


def compile_cache_prefixes(config: GenNStackConfig, serving: ServingConfig) -> dict[str, str]:
    """Key prefix of each enabled generation's compiled artifacts in the compile-cache bucket: the
    Neuron generations' compiled models, g6e's vLLM compile cache (:func:`g6e_compile_cache_prefix`)."""
    prefixes = {
        name: compile_cache_prefix(
            neuron_sdk=neuron_release(name, serving), model_id=gen.model_id, revision=gen.model_revision,
            parallelism=compile_layout(name, serving),
        )
        for name, gen in config.generations.enabled().items()
        if name in NEURON_GENERATIONS
    }
    if config.generations.g6e.enabled:
        prefixes["g6e"] = g6e_compile_cache_prefix(config, serving)
    return prefixes


def g6e_compile_cache_prefix(config: GenNStackConfig, serving: ServingConfig) -> str:
    """gen3-g6e's vLLM compile cache: ``vllm-<vllm>/<model>/<revision>/l40s-tp<N>-seqs<S>-len<L>/``.

    The vLLM version is the support matrix's (the chart's images.vllm): with another image
    (serving.g6e.image) vLLM's own hash of its code and config, which names the directories inside,
    makes a cache written by another build a miss, never a wrong load.
    """
    gen = config.generations.g6e
    return vllm_compile_cache_prefix(vllm=SUPPORT["g6e"].vllm, model_id=gen.model_id, revision=gen.model_revision,
                                     gpu=G6E_GPU, parallelism=compile_layout("g6e", serving))


def serving_values(
    config: GenNStackConfig,
    serving: ServingConfig,
    *,
    models_bucket: str,
    compile_cache_bucket: str,
    region: str,
    hf_token_secret: str,
    serving_service_account: str = "gennstack-serving",
    staging_service_account: str = "gennstack-staging",
    compile_service_account: str = "gennstack-compile",
    staged: Mapping[str, StagedGate] | None = None,
) -> dict[str, Any]:
    """The chart's values for ``config``'s enabled generations.

    ``hf_token_secret`` is the Secrets Manager secret's name or ARN, never the token: the staging
    Job reads the token at run time with its own Pod Identity role. ``staged`` sets a generation's
    gate (``STAGED_GATE_MODES``); a generation not named gets ``"auto"``.
    """
    gates = _staged_gates(staged or {})
    for key, value in (("models_bucket", models_bucket), ("compile_cache_bucket", compile_cache_bucket),
                       ("region", region), ("hf_token_secret", hf_token_secret)):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"serving_values: {key}: got {value!r}; allowed: a non-empty string (a CDK token is fine)")
    gens = config.generations
    check_fits(gens, serving)
    # Validates model ids and revisions the way the buckets' key layout needs them.
    model_prefixes(config)
    compile_cache_prefixes(config, serving)

    return {
        "aws": {"region": region},
        "buckets": {"models": models_bucket, "compileCache": compile_cache_bucket},
        "serviceAccounts": {
            "serving": {"name": serving_service_account},
            "staging": {"name": staging_service_account},
            # A name prefix: one account per Neuron generation, `<name>-inf2`, `<name>-trn2`.
            "compile": {"name": compile_service_account},
        },
        # The chart's default for a generation without its own neuronRelease; each Neuron
        # generation below passes its own (the support matrix's, or its configured image's).
        "neuron": {"sdkVersion": NEURON_SDK_VERSION},
        "staging": {"enabled": serving.staging, "hfTokenSecret": hf_token_secret},
        # KEDA (gennstack/controller_values.py keda_values) scales gen2/gen3 on what GenNStack's Prometheus scrapes.
        "autoscaling": {"enabled": True, "prometheusUrl": PROMETHEUS_URL},
        "networkPolicy": network_policy.serving_values(enabled=config.cluster.network_policies,
                                                       vpc_cidr=config.network.vpc_cidr),
        "inf2": {**_model(gens.inf2, serving.inf2), "staged": gates["inf2"], **_inf2(serving.inf2, gens.inf2),
                 "neuronRelease": neuron_release("inf2", serving)},
        "trn2": {**_model(gens.trn2, serving.trn2), "staged": gates["trn2"], **_trn2(serving.trn2, gens.trn2),
                 "neuronRelease": neuron_release("trn2", serving)},
        "g6e": {**_model(gens.g6e, serving.g6e), "staged": gates["g6e"], **_g6e(serving.g6e),
                "vllmVersion": SUPPORT["g6e"].vllm},
        # Only when on: off, the chart's default (multiNode.enabled false) renders nothing of it.
        **({"multiNode": {**multi_node_values(serving.multi_node, model_prefix(
            serving.multi_node.model_id, serving.multi_node.model_revision)), "staged": gates["multi_node"]}}
           if serving.multi_node.enabled else {}),
    }


def _staged_gates(staged: Mapping[str, StagedGate]) -> dict[str, StagedGate]:
    names = (*STAGED_MARKERS, "multi_node")
    for name, mode in staged.items():
        if name not in names:
            raise ConfigError(f"serving_values: staged: got generation {name!r}; allowed: one of {list(names)}")
        # Not `in STAGED_GATE_MODES`: 1 == True, and the chart's schema takes only the three literals.
        if not (isinstance(mode, bool) or (isinstance(mode, str) and mode == "auto")):
            raise ConfigError(f"serving_values: staged.{name}: got {mode!r}; allowed: 'auto', True or False")
    return {name: staged.get(name, "auto") for name in names}


def _model(generation: GenerationConfig, section: Inf2Serving | Trn2Serving | G6eServing) -> dict[str, Any]:
    values: dict[str, Any] = {
        "enabled": generation.enabled,
        "modelId": generation.model_id,
        "revision": generation.model_revision,
        "servedModelName": section.served_model_name,
        "maxModelLen": section.max_model_len,
        "maxNumSeqs": section.max_num_seqs,
        "warmSpareReplicas": section.warm_spare_replicas,
        # The same scaling keys for every generation: Ray Serve's autoscaling_config on gen1, a
        # KEDA ScaledObject (an HPA) on gen2 and gen3.
        "minReplicas": section.min_replicas,
        "maxReplicas": section.max_replicas,
        "targetOngoingRequests": section.target_ongoing_requests,
        "scaleUpDelaySeconds": section.scale_up_delay_seconds,
        "scaleDownDelaySeconds": section.scale_down_delay_seconds,
    }
    if section.image is not None:
        values["image"] = section.image
    return values


def _chips(generation: GenerationConfig) -> int:
    # A Neuron replica takes a whole node (one replica per node fits), so it asks for every chip
    # of the smallest configured type: the scheduler cannot leave a fragment nobody can use.
    return min(INSTANCE_TYPES[t].accelerators for t in generation.instance_types)


def _inf2(section: Inf2Serving, generation: GenerationConfig) -> dict[str, Any]:
    return {
        "tensorParallelSize": section.tensor_parallel_size,
        "saveShardedCheckpoint": section.save_sharded_checkpoint,
        "neuronChips": _chips(generation),
    }


def _trn2(section: Trn2Serving, generation: GenerationConfig) -> dict[str, Any]:
    return {
        "tensorParallelSize": section.tensor_parallel_size,
        "contextParallelSize": section.context_parallel_size,
        "visionTensorParallelSize": section.vision_tensor_parallel_size,
        "saveShardedCheckpoint": section.save_sharded_checkpoint,
        "neuronChips": _chips(generation),
    }


def _g6e(section: G6eServing) -> dict[str, Any]:
    return {
        "gpusPerReplica": section.gpus_per_replica,
        "gpuMemoryUtilization": section.gpu_memory_utilization,
        "toolCallParser": section.tool_call_parser or "",
    }

