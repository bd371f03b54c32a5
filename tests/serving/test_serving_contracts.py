"""Every flag and environment variable the serving chart hands to vLLM and Ray Serve, held to the
pinned upstream versions that define them.

The pinned versions: vLLM 0.29.0 (`images.vllm`, vllm/vllm-openai:v0.29.0, serves g6e), vLLM
0.13.0 (the Neuron 2.28.0 DLC `pytorch-inference-vllm-neuronx:0.13.0-...-sdk2.28.0-...`, serves trn2
and inf2 and runs the compile Jobs; gennstack/serving/support.py), Ray 2.60.0 (`ray[serve]==2.60.0`
in assets/images/inf2-ray-serve/Dockerfile). The tables below were read from those releases' wheels
on PyPI (vllm-0.13.0 cp38-abi3 manylinux_2_31_x86_64, vllm-0.29.0, ray-2.60.0); the installed packages are not exercised here: vLLM needs torch and a GPU or Neuron
device to import, and `ray.serve.schema` imports the whole Serve stack (grpcio, fastapi,
opentelemetry, ...), about 300 MB the test venv does not otherwise need. A flag the chart starts
passing must be added to the table of its version after reading it there, with the file it is in.

The override_neuron_config keys and the S3/model-streamer environment are held elsewhere
(test_serving_chart.py and the staging tests).
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests import helm
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED

pytestmark = pytest.mark.slow

# flag -> the file of that vLLM release that defines it (arg_utils.py: EngineArgs.add_cli_args;
# cli_args.py: FrontendArgs fields, turned into --kebab-case flags by get_kwargs).
VLLM_0_13_0_FLAGS = {
    "--served-model-name": "vllm/engine/arg_utils.py",
    "--max-model-len": "vllm/engine/arg_utils.py",
    "--max-num-seqs": "vllm/engine/arg_utils.py",
    "--tensor-parallel-size": "vllm/engine/arg_utils.py",
    "--block-size": "vllm/engine/arg_utils.py",
    "--num-gpu-blocks-override": "vllm/engine/arg_utils.py",
    "--no-enable-prefix-caching": "vllm/engine/arg_utils.py",  # BooleanOptionalAction of --enable-prefix-caching
    "--additional-config": "vllm/engine/arg_utils.py",
    "--host": "vllm/entrypoints/openai/cli_args.py",
    "--port": "vllm/entrypoints/openai/cli_args.py",
}
VLLM_0_29_0_FLAGS = {
    "--served-model-name": "vllm/engine/arg_utils.py",
    "--max-model-len": "vllm/engine/arg_utils.py",
    "--max-num-seqs": "vllm/engine/arg_utils.py",
    "--tensor-parallel-size": "vllm/engine/arg_utils.py",
    "--gpu-memory-utilization": "vllm/engine/arg_utils.py",
    "--load-format": "vllm/engine/arg_utils.py",
    "--shutdown-timeout": "vllm/engine/arg_utils.py",  # VllmConfig.shutdown_timeout, vllm/config/vllm.py
    "--tool-call-parser": "vllm/entrypoints/launchers/cli_args.py",
    "--enable-auto-tool-choice": "vllm/entrypoints/launchers/cli_args.py",
    "--host": "vllm/entrypoints/launchers/cli_args.py",
    "--port": "vllm/entrypoints/launchers/cli_args.py",
}
# Names in vllm/tool_parsers/__init__.py's registry at 0.29.0 that GenNStack uses (GPT-OSS's).
VLLM_0_29_0_TOOL_PARSERS = {"openai": "gptoss_tool_parser.GptOssToolParser"}
# Values of --load-format GenNStack uses (vllm/config/load.py, 0.29.0).
VLLM_0_29_0_LOAD_FORMATS = {"runai_streamer"}

# The Serve config keys the chart writes into serveConfigV2, by schema class (ray/serve/schema.py
# and, for autoscaling_config, AutoscalingConfig in ray/serve/config.py; Ray 2.60.0).
RAY_2_60_0_SERVE_KEYS = {
    "ServeDeploySchema": {"proxy_location", "http_options", "applications"},
    "HTTPOptionsSchema": {"host", "port"},
    "ServeApplicationSchema": {"name", "route_prefix", "import_path", "deployments"},
    "DeploymentSchema": {"name", "max_ongoing_requests", "autoscaling_config", "health_check_period_s",
                         "health_check_timeout_s", "graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s",
                         "ray_actor_options"},
    "AutoscalingConfig": {"min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s"},
    "RayActorOptionsSchema": {"num_cpus", "resources"},
}
# `proxy_location` values (ray/serve/config.py ProxyLocation, Ray 2.60.0).
RAY_2_60_0_PROXY_LOCATIONS = {"Disabled", "HeadOnly", "EveryNode"}

# Every VLLM_* variable vLLM may see from the chart. vLLM 0.29.0 warns about (or, with
# --fail-on-environ-validation, refuses) any VLLM_* name its vllm/envs.py does not define; VLLM_PORT
# is one it does define, as the base of its own internal ports, so the chart must not reuse it.
# VLLM_CACHE_ROOT (g6e: where its compile cache is restored) is defined there ("Root directory for
# vLLM cache files") and left out of its compile-cache hash (compile_factors' ignored_factors).
VLLM_ENV_ALLOWED: set[str] = {"VLLM_CACHE_ROOT"}


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in helm.render(CHART, REQUIRED, namespace=NAMESPACE)}


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def server(objects: dict, generation: str) -> dict:
    if generation == "inf2":
        spec = objects[("RayService", "gen1-inf2")]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    else:
        spec = objects[("Deployment", {"trn2": "gen2-trn2", "g6e": "gen3-g6e"}[generation])]["spec"]["template"]["spec"]
    return spec["containers"][0]


def flags(objects: dict, generation: str) -> list[str]:
    """The flags `vllm serve` gets: VLLM_ARGS (the model becomes positional) plus --host/--port."""
    args = json.loads(env(server(objects, generation))["VLLM_ARGS"])
    return [a.split("=", 1)[0] for a in args if a.startswith("--") and a != "--model"] + ["--host", "--port"]


@pytest.mark.parametrize("generation", ["trn2", "inf2"])
def test_neuron_flags_exist_in_vllm_0_13_0(objects, generation) -> None:
    """vLLM 0.13.0 (the Neuron 2.28.0 DLC's): vllm/engine/arg_utils.py (EngineArgs.add_cli_args:
    --block-size, --num-gpu-blocks-override, --enable-prefix-caching as a BooleanOptionalAction,
    --additional-config) and vllm/entrypoints/openai/cli_args.py (FrontendArgs host, port) define
    every flag trn2 and inf2 pass."""
    unknown = [f for f in flags(objects, generation) if f not in VLLM_0_13_0_FLAGS]
    assert unknown == [], f"{generation}: flags not read in vLLM 0.13.0's source: {unknown}"


def test_neuron_servers_get_no_shutdown_timeout(objects) -> None:
    """vLLM 0.13.0 has no --shutdown-timeout: vllm/entrypoints/launcher.py cancels the server task on
    SIGTERM (in-flight requests are aborted) and vllm/engine/arg_utils.py defines no such flag. Passing
    it would stop the server from starting, so trn2 and inf2 drain in their preStop instead."""
    for generation in ("trn2", "inf2"):
        assert "--shutdown-timeout" not in flags(objects, generation)
    assert "--shutdown-timeout" not in VLLM_0_13_0_FLAGS


def test_g6e_flags_exist_in_vllm_0_29_0(objects) -> None:
    """vLLM 0.29.0: vllm/engine/arg_utils.py and vllm/entrypoints/launchers/cli_args.py define every
    flag g6e passes; --shutdown-timeout is VllmConfig.shutdown_timeout (vllm/config/vllm.py), which
    vllm/entrypoints/launchers/launcher.py uses to drain the engine on SIGTERM."""
    unknown = [f for f in flags(objects, "g6e") if f not in VLLM_0_29_0_FLAGS]
    assert unknown == []
    assert {"--shutdown-timeout", "--tool-call-parser", "--enable-auto-tool-choice"} <= set(flags(objects, "g6e"))


def test_g6e_tool_parser_and_load_format_are_registered_in_vllm_0_29_0(objects) -> None:
    """vLLM 0.29.0: vllm/tool_parsers/__init__.py registers "openai" (GptOssToolParser, the GPT-OSS
    harmony format the vLLM GPT-OSS recipe names), and vllm/config/load.py documents the
    "runai_streamer" load format; --enable-auto-tool-choice needs --tool-call-parser beside it."""
    args = json.loads(env(server(objects, "g6e"))["VLLM_ARGS"])
    assert args[args.index("--tool-call-parser") + 1] in VLLM_0_29_0_TOOL_PARSERS
    assert args[args.index("--load-format") + 1] in VLLM_0_29_0_LOAD_FORMATS


@pytest.mark.parametrize("generation", ["trn2", "g6e", "inf2"])
def test_no_unknown_vllm_variable_reaches_vllm(objects, generation) -> None:
    """vLLM 0.29.0 vllm/envs.py validate_environ warns about every VLLM_* variable it does not
    define, and vllm/envs.py (0.13.0 and 0.29.0) reads VLLM_PORT as the base port of vLLM's own
    internal sockets (vllm/utils/network_utils.py). The launcher (files/vllm_serve.py environment())
    drops VLLM_ARGS and GENNSTACK_*, so what vLLM sees holds no chart variable named VLLM_*."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_serve", CHART / "files" / "vllm_serve.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    seen = launcher.environment({k: v or "" for k, v in env(server(objects, generation)).items()})
    assert {k for k in seen if k.startswith("VLLM_")} <= VLLM_ENV_ALLOWED
    assert "VLLM_PORT" not in env(server(objects, generation))


@pytest.mark.parametrize("generation", ["trn2", "g6e", "inf2"])
def test_hf_hub_offline_is_what_vllm_reads(objects, generation) -> None:
    """vLLM 0.13.0 and 0.29.0 vllm/transformers_utils/config.py pass
    huggingface_hub.constants.HF_HUB_OFFLINE (set from the HF_HUB_OFFLINE variable) as
    local_files_only, so "1" keeps every model and tokenizer lookup off the internet."""
    assert env(server(objects, generation))["HF_HUB_OFFLINE"] == "1"


def test_serve_config_uses_only_ray_2_60_0_keys(objects) -> None:
    """Ray 2.60.0 ray/serve/schema.py: ServeDeploySchema, HTTPOptionsSchema,
    ServeApplicationSchema, DeploymentSchema (graceful_shutdown_wait_loop_s and
    graceful_shutdown_timeout_s, both ge=0), RayActorOptionsSchema; ray/serve/config.py
    AutoscalingConfig and ProxyLocation. DeploymentSchema does not forbid extra keys (pydantic
    ignores them), so a misspelt key would silently do nothing: this test is what catches it."""
    serve = yaml.safe_load(objects[("RayService", "gen1-inf2")]["spec"]["serveConfigV2"])
    keys = RAY_2_60_0_SERVE_KEYS
    assert set(serve) <= keys["ServeDeploySchema"]
    assert serve["proxy_location"] in RAY_2_60_0_PROXY_LOCATIONS
    assert set(serve["http_options"]) <= keys["HTTPOptionsSchema"]
    for app in serve["applications"]:
        assert set(app) <= keys["ServeApplicationSchema"]
        for deployment in app["deployments"]:
            assert set(deployment) <= keys["DeploymentSchema"]
            assert set(deployment["autoscaling_config"]) <= keys["AutoscalingConfig"]
            assert set(deployment["ray_actor_options"]) <= keys["RayActorOptionsSchema"]
            assert deployment["graceful_shutdown_wait_loop_s"] >= 0 and deployment["graceful_shutdown_timeout_s"] >= 0


def test_vllm_under_ray_gets_the_pods_cpus_for_openmp(objects) -> None:
    """Ray 2.60.0 ray/_private/utils.py set_omp_num_threads_if_unset (called by the worker for each
    task and actor) sets OMP_NUM_THREADS to the actor's CPUs, 1 for the replica (num_cpus 1), unless
    the variable is already set; the vLLM child inherits the actor's environment, and OpenMP (torch's
    CPU threads) sizes itself from OMP_NUM_THREADS. So the chart sets
    GENNSTACK_OMP_NUM_THREADS, which files/gennstack_serve.py puts into vLLM's OMP_NUM_THREADS."""
    serve = yaml.safe_load(objects[("RayService", "gen1-inf2")]["spec"]["serveConfigV2"])
    assert serve["applications"][0]["deployments"][0]["ray_actor_options"]["num_cpus"] == 1
    worker = server(objects, "inf2")
    assert env(worker)["GENNSTACK_OMP_NUM_THREADS"] == worker["resources"]["requests"]["cpu"] == "160"


def test_g6e_tool_calling_off_passes_neither_flag() -> None:
    """vLLM 0.29.0 vllm/entrypoints/launchers/cli_args.py: --enable-auto-tool-choice without
    --tool-call-parser is refused at start, so the chart passes both or neither."""
    values = {**REQUIRED, "g6e": {"toolCallParser": ""}}
    objects = {(o["kind"], o["metadata"]["name"]): o for o in helm.render(CHART, values, namespace=NAMESPACE)}
    assert not {"--tool-call-parser", "--enable-auto-tool-choice"} & set(flags(objects, "g6e"))
