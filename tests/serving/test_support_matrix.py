"""The support matrix (gennstack/serving/support.py), each row held to the upstream text that supports it.

Sources, read at the versions named (aws-neuron/aws-neuron-sdk at 81ce03a, the 2.32.0 docs;
aws-neuron/deep-learning-containers tags 2.28.0 and 2.32.0; ray-project/kuberay v1.7.0;
aws-neuron/neuron-helm-charts 8172e5e):

* NxD Inference release notes, ``release-notes/components/nxd-inference.rst``, "NxD Inference
  [0.9.17334] + vLLM Neuron Plugin [0.5.0] (Neuron 2.29.0 Release)", Breaking Changes: "NxD Inference
  models are now only supported on Trn2 and newer hardware. Customers who require NxD Inference kernel
  support on Trn1 or Inf2 instances should pin to release 2.28." and "The BWMM shard-on-hidden kernel
  ... has been removed. Models that depend on this kernel (including Llama 4, Mixtral, and DBRX
  configurations) should be pinned to release 2.28 for optimal performance."
* Containers release notes, ``release-notes/components/containers.rst``, 2.32.0: "NeuronX Distributed
  Inference (NxDI) and NeuronX Distributed (NxD) are no longer included in Neuron DLCs. As a result,
  the ``pytorch-inference-neuronx`` DLC and the legacy vLLM 0.16 ``pytorch-inference-vllm-neuronx``
  DLC are no longer published."
* deep-learning-containers README (2.32.0), vllm-inference-neuronx table: "VLLM 0.13.0 | ... |
  Neuron 2.28.0 | trn1,trn2,trn3,inf2 | 3.12 (py312) |
  public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04";
  the vLLM 0.24.0 DLC of 2.32.0 lists "trn2,trn3" only. Tag 2.28.0
  ``vllm/inference/0.13.0/Dockerfile.neuronx``: ``GITHUB_REPO_BRANCH=release-0.4.1`` (vllm-project/
  vllm-neuron), ``NEURONX_DISTRIBUTED_INFERENCE_VERSION=0.8.16251+f3ca5575``; the NxD Inference notes
  for 2.28.0: "This version of the vLLM Neuron Plugin is pinned to vLLM version v0.13.0".
* vLLM Neuron's model recipes (``vllm-neuron/docs/model-recipes/``, 2.32.0): gpt-oss, llama-3,
  qwen3-embedding-8b, qwen3-vl; no Llama 4.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from gennstack.config import ConfigError, load_config
from gennstack.controller_values import operator_values
from gennstack.serving import ServingConfig, compile_cache_prefixes
from gennstack.serving.support import NXDI_LAST_RELEASE, SUPPORT, effective_release, neuron_release_of, release_error
from gennstack.serving.values import neuron_release
from gennstack.serving.capacity import MODELS
from gennstack import versions
from gennstack.generations import _GENERATION_DEFAULTS
from tests import helm
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, cdk_values, load_script, merged
from tests.support import ROOT

# The deep-learning-containers README rows GenNStack's Neuron images come from: tag -> (Neuron
# release, instance families, vLLM, Python).
DLC_README = {
    "0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04": ("2.28.0", {"trn1", "trn2", "trn3", "inf2"}, "0.13.0", "3.12"),
    "0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04": ("2.31.1", {"trn1", "trn2", "trn3", "inf2"}, "0.16.0", "3.12"),
    "0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04": ("2.32.0", {"trn2", "trn3"}, "0.24.0", "3.13"),
}
# The architectures (Hugging Face config.json `architectures`) of each generation's default model.
ARCHITECTURES = {
    "meta-llama/Meta-Llama-3-70B-Instruct": "LlamaForCausalLM",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct": "Llama4ForConditionalGeneration",
    "openai/gpt-oss-20b": "GptOssForCausalLM",
}


@pytest.mark.parametrize("generation", ["inf2", "trn2"])
def test_each_neuron_row_is_a_published_dlc_whose_release_supports_its_family(generation) -> None:
    """The row's image is a DLC the README lists for the row's family, the tag names the row's
    release, and the release is at most the last whose NxD Inference runs that family (Inf2: 2.28,
    from the 2.29.0 NxD Inference notes; Trn2: 2.31, from the 2.32.0 containers notes)."""
    row = SUPPORT[generation]
    repository, tag = row.image.rsplit(":", 1)
    assert repository == "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx"
    release, families, vllm, _ = DLC_README[tag]
    assert row.neuron_release == release == neuron_release_of(row.image)
    assert row.instance_family in families
    assert row.vllm == vllm
    assert release_error(generation, row.neuron_release) is None


# --- the node AMI's Neuron driver and the image's Neuron runtime ------------------------------
# awslabs/amazon-eks-ami CHANGELOG.md (main, 81fec2e), the "Kubernetes 1.36" tables: aws-neuronx-dkms of
# amazon-eks-node-al2023-x86_64-neuron-1.36-<release> (every 1.36 AMI is built on an
# al2023-ami-minimal-...-kernel-6.18 source AMI: "Source AMI Name (K8s 1.36)"). v20260610 is the first
# release with 1.36 AMIs.
NEURON_AMI_DRIVER = {"v20260610": "2.28.0.0", "v20260618": "2.28.0.0", "v20260625": "2.28.0.0", "v20260714": "2.29.0.0"}
# deep-learning-containers 2.28.0 vllm/inference/0.13.0/Dockerfile.neuronx: NEURONX_RUNTIME_LIB_VERSION.
DLC_RUNTIME = {"0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04": "2.30.51.0-faafe26f0"}


@pytest.mark.parametrize("generation", ["inf2", "trn2"])
def test_the_neuron_nodes_driver_runs_the_rows_runtime(generation) -> None:
    """The Neuron node classes' AMI release ships driver NEURON_AMI_DRIVER, and no rule of
    files/neuron_compat.py (aws-neuron-sdk runtime.rst, Known Issues of Neuron 2.30.0 and 2.31.0) refuses
    it with the row's runtime. More than no known issue: the driver predates 2.29, the driver that
    "requires Neuron Runtime Library 2.33 or later", and "The driver remains backwards compatible with
    older versions of Neuron Runtime" (neuron-runtime/nrt-troubleshoot.rst, v2.31.0). On 1.36's kernel
    6.18: driver 2.26.10.0 brought "Compatibility fixes for Linux kernel 6.18" (runtime.rst, Neuron 2.28.0),
    so 2.28.0.0 has them; AWS built three 1.36 Neuron AMIs with it (unverified here: Neuron's 2.28.0.0
    test table lists AL2023 6.12 and 6.1, not 6.18)."""
    compat = load_script("neuron_compat")
    row = SUPPORT[generation]
    release = versions.NEURON_AMI_ALIAS.split("@", 1)[1]
    driver = NEURON_AMI_DRIVER[release]
    assert versions.NEURON_AMI_DRIVER == driver
    assert row.neuron_runtime == DLC_RUNTIME[row.image.rsplit(":", 1)[1]]
    assert compat.incompatibility(driver, row.neuron_runtime) is None
    assert compat.parse(driver)[:2] < (2, 29) or compat.parse(row.neuron_runtime)[:2] >= (2, 33)
    assert compat.parse(driver) >= (2, 26, 10, 0)  # kernel 6.18
    assert "1.36" in versions.KUBERNETES


def test_the_general_ami_release_would_refuse_the_neuron_image() -> None:
    """Why the Neuron classes do not run AL2023_AMI_ALIAS: its Neuron AMI's driver 2.29.0.0 with the
    SDK 2.28 DLC's runtime 2.30.51 fails at nrt_init()."""
    compat = load_script("neuron_compat")
    driver = NEURON_AMI_DRIVER[versions.AL2023_AMI_ALIAS.split("@", 1)[1]]
    why = compat.incompatibility(driver, SUPPORT["inf2"].neuron_runtime)
    assert why is not None and "Neuron Driver 2.29 requires Neuron Runtime Library 2.33 or later" in why
    assert versions.NEURON_AMI_ALIAS != versions.AL2023_AMI_ALIAS


def test_gen1_is_on_2_28_the_release_the_notes_name_for_inf2() -> None:
    assert SUPPORT["inf2"].neuron_release.startswith("2.28.")
    assert NXDI_LAST_RELEASE["inf2"] == (2, 28)
    assert SUPPORT["inf2"].plugin == "release-0.4.1" and SUPPORT["inf2"].vllm == "0.13.0"


def test_gen2_llama4_is_on_2_28_the_release_the_notes_name_for_llama4() -> None:
    """2.29.0 removed the MoE prefill kernel Llama 4 uses ("should be pinned to release 2.28"); from
    2.32.0 no NxD Inference DLC is published, and vLLM Neuron has no Llama 4 recipe."""
    assert SUPPORT["trn2"].neuron_release.startswith("2.28.")
    assert SUPPORT["trn2"].architecture == "Llama4ForConditionalGeneration"


@pytest.mark.parametrize("tag, generation", [
    ("0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04", "inf2"),  # the image gen1 ran before: NxD Inference no longer on Inf2
    ("0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04", "inf2"),
    ("0.24.0.1.1.0-neuronx-py313-sdk2.32.0-ubuntu24.04", "trn2"),  # no NxD Inference in the DLC
])
def test_an_image_bump_that_leaves_its_hardware_unsupported_is_refused(tag, generation) -> None:
    release = DLC_README[tag][0]
    assert release_error(generation, release) is not None
    image = f"public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:{tag}"
    with pytest.raises(ConfigError, match=rf"serving\.{generation}\.image: got '{re.escape(image)}'; allowed: a Neuron release at most"):
        load_config({"serving": {generation: {"image": image}}})


def test_a_built_image_without_a_release_in_its_tag_takes_the_declared_or_the_matrix_release() -> None:
    built = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/inf2-ray-serve:1"
    assert effective_release("inf2", built, None) == SUPPORT["inf2"].neuron_release
    assert effective_release("inf2", built, "2.27.1") == "2.27.1"
    with pytest.raises(ConfigError, match=r"serving\.inf2\.neuron_release: got '2\.29\.0'; allowed: a Neuron release at most 2\.28"):
        load_config({"serving": {"inf2": {"image": built, "neuron_release": "2.29.0"}}})
    tagged = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"
    with pytest.raises(ConfigError, match=r"serving\.inf2\.neuron_release: got '2\.27\.1'; allowed: the release the image's tag names \(2\.28\.0\)"):
        load_config({"serving": {"inf2": {"image": tagged, "neuron_release": "2.27.1"}}})


@pytest.mark.parametrize("generation", ["inf2", "trn2", "g6e"])
def test_each_row_names_its_family_and_its_default_models_architecture(generation) -> None:
    row = SUPPORT[generation]
    assert row.instance_family == generation
    model_id = _GENERATION_DEFAULTS[generation]["model_id"]
    assert model_id in MODELS
    assert row.architecture == ARCHITECTURES[model_id]


def test_the_chart_and_the_inf2_image_run_the_matrix_images() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["images"]["neuronVllm"] == SUPPORT["inf2"].image == SUPPORT["trn2"].image
    assert values["neuron"]["sdkVersion"] == SUPPORT["inf2"].neuron_release
    assert values["images"]["vllm"] == SUPPORT["g6e"].image
    dockerfile = (ROOT / "assets" / "images" / "inf2-ray-serve" / "Dockerfile").read_text()
    assert re.findall(r"^FROM (\S+)$", dockerfile, flags=re.MULTILINE) == [SUPPORT["inf2"].image]


def test_ray_serve_gets_its_own_environment_beside_the_dlcs() -> None:
    """The DLC has its own Ray: deep-learning-containers 2.28.0 vllm/inference/0.13.0/Dockerfile.neuronx
    installs vllm-neuron (`-e /opt/vllm`, release-0.4.1), which installs vLLM 0.13.0, whose PyPI wheel
    requires `ray[cgraph]>=2.48.0` (vllm-0.13.0 METADATA). Against that environment's packages as
    constraints (a reconstruction of its PyPI set at the DLC's release, pip 26.3
    `--uploaded-prior-to 2026-02-27`: ray 2.54.0, starlette 0.52.1, aiohttp 3.13.3,
    prometheus-fastapi-instrumentator 7.1.0) `ray[serve]==2.60.0` cannot resolve: the constrained
    ray; without it, Ray 2.60.0's serve extra requires starlette>=1.0.1 and aiohttp>=3.14.4, and
    vLLM's instrumentator 7.1.0 requires starlette<1.0.0. So Ray Serve goes into a virtual environment
    of its own, with nothing of the DLC's moved, and only `ray` goes first on PATH."""
    dockerfile = (ROOT / "assets" / "images" / "inf2-ray-serve" / "Dockerfile").read_text()
    steps = re.findall(r"^RUN (.*?)(?<!\\)$", dockerfile, flags=re.MULTILINE | re.DOTALL)
    assert len(steps) == 1
    commands = [c.strip() for c in steps[0].replace("\\\n", " ").split("&&")]
    assert commands[0] == "python3 -m venv /opt/ray"
    assert re.fullmatch(r'/opt/ray/bin/python3 -m pip install --no-cache-dir "ray\[serve\]==\d+\.\d+\.\d+"', commands[1])
    assert "/opt/ray/bin/python3 -m pip check" in commands
    assert "ln -s /opt/ray/bin/ray /opt/ray-bin/ray" in commands
    installs = [c for c in commands if " pip install " in c]
    assert not any(re.search(r"\s(-c|--constraint)\s", c) for c in installs) and "pip list" not in steps[0]  # nothing pins Ray to the DLC's packages
    # and the build fails unless the venv's `import ray` is its own, of the version it installed
    version = re.search(r'ray\[serve\]==(\d+\.\d+\.\d+)', commands[1]).group(1)
    assert commands[-1].startswith("/opt/ray/bin/python3 -c 'import ray, sys;")
    assert f'ray.__version__ == "{version}"' in commands[-1] and 'ray.__file__.startswith("/opt/ray/")' in commands[-1]
    assert re.findall(r"^ENV (.*)$", dockerfile, flags=re.MULTILINE) == ["PATH=/opt/ray-bin:$PATH"]


def test_the_prestop_drain_runs_with_the_python_of_the_ray_on_path(tmp_path) -> None:
    """The preStop's shell line, run by a real sh over the image's layout (/opt/ray/bin with ray and
    python3, /opt/ray-bin/ray linking to it, a DLC python3 on PATH): ray_drain.py runs with
    /opt/ray/bin/python3, not the DLC's `python3`, whose Ray is the DLC's."""
    service = next(o for o in helm.render(CHART, REQUIRED, namespace=NAMESPACE) if o["kind"] == "RayService")
    worker = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    shell, flag, line = worker["lifecycle"]["preStop"]["exec"]["command"]
    ray_env, ray_bin, dlc_bin = tmp_path / "opt/ray/bin", tmp_path / "opt/ray-bin", tmp_path / "opt/conda/bin"
    for directory in (ray_env, ray_bin, dlc_bin):
        directory.mkdir(parents=True)
    (ray_env / "python3").symlink_to(sys.executable)
    (ray_env / "ray").write_text(f"#!{ray_env / 'python3'}\n")
    (ray_env / "ray").chmod(0o755)
    (ray_bin / "ray").symlink_to(ray_env / "ray")
    (dlc_bin / "python3").write_text("#!/bin/sh\necho the DLC python3; exit 3\n")
    (dlc_bin / "python3").chmod(0o755)
    probe = tmp_path / "ray_drain.py"
    probe.write_text("import sys; print(sys.executable)\n")
    assert line.count("/scripts/ray_drain.py") == 1
    proc = subprocess.run([shell, flag, line.replace("/scripts/ray_drain.py", str(probe))], capture_output=True, text=True,
                          env={"PATH": f"{ray_bin}:{dlc_bin}:/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == str(ray_env / "python3")


def test_rayservice_names_the_images_ray_version() -> None:
    """KubeRay v1.7.0 ray-operator/controllers/ray/common/pod.go: supportsUnifiedHealthCheck is true
    only for a parseable rayVersion of at least 2.53.0; otherwise initLivenessAndReadinessProbe gives a
    pod without its own probes (the Ray head here) exec probes that run `wget` (utils.BaseWgetHealthCommand)."""
    dockerfile = (ROOT / "assets" / "images" / "inf2-ray-serve" / "Dockerfile").read_text()
    (pinned,) = re.findall(r'"ray\[serve\]==(\d+\.\d+\.\d+)"', dockerfile)
    service = next(o for o in helm.render(CHART, REQUIRED, namespace=NAMESPACE) if o["kind"] == "RayService")
    assert service["spec"]["rayClusterConfig"]["rayVersion"] == pinned
    assert tuple(int(p) for p in pinned.split(".")) >= (2, 53, 0)


# --- compiled artifacts are keyed by each generation's own release -----------------------------


def test_compile_cache_keys_carry_each_generations_release() -> None:
    built = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/inf2-ray-serve:1"
    serving = ServingConfig.model_validate({"inf2": {"image": built, "neuron_release": "2.27.1"}})
    prefixes = compile_cache_prefixes(load_config({}), serving)
    assert prefixes["inf2"].startswith("neuron-2.27.1/")
    assert prefixes["trn2"].startswith(f"neuron-{SUPPORT['trn2'].neuron_release}/")
    assert neuron_release("inf2", serving) == "2.27.1"


def test_the_chart_keys_each_generation_by_the_release_cdk_passes() -> None:
    built = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/inf2-ray-serve:1"
    serving = ServingConfig.model_validate({"inf2": {"image": built, "neuron_release": "2.27.1"}})
    values = cdk_values(serving=serving)
    assert values["inf2"]["neuronRelease"] == "2.27.1" and values["trn2"]["neuronRelease"] == "2.28.0"
    objects = helm.render(CHART, merged(values), namespace=NAMESPACE)
    prefixes = compile_cache_prefixes(load_config({}), serving)
    for generation, pool in (("inf2", "gen1-inf2"), ("trn2", "gen2-trn2")):
        spare = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{pool}-warm-spare")
        sync = spare["spec"]["template"]["spec"]["initContainers"][0]
        assert {e["name"]: e.get("value") for e in sync["env"]}["COMPILE_PREFIX"] == prefixes[generation]


# --- a first deploy that installs ------------------------------------------------------------


def test_the_neuron_chart_installs_the_device_plugin_only() -> None:
    """neuron-helm-chart values.yaml (aws-neuron/neuron-helm-charts 8172e5e, the only chart version
    that repository holds): `npd.enabled: true` with `npd.namespaceOverride: neuron-healthcheck-system`,
    a namespace no template of the chart creates (templates/: device-plugin-*, npd-*, scheduler-*, no
    Namespace), which AWS's guides create by hand first (`kubectl create ns neuron-healthcheck-system`).
    GenNStack installs into kube-system with `wait`, so the node problem detector is turned off."""
    values = operator_values(serving_namespace="gennstack-serving")["neuron-helm-chart"]
    assert values["npd"] == {"enabled": False}
    assert values["devicePlugin"]["enabled"] is True


@pytest.mark.parametrize("generation", ["inf2", "trn2"])
def test_a_config_whose_compile_job_no_pool_can_run_is_refused(generation) -> None:
    context = {"generations": {generation: {"on_demand_fallback": False}}, "serving": {"staging": True}}
    with pytest.raises(ConfigError, match=rf"generations\.{generation}\.on_demand_fallback: got False; allowed: true, "
                                          rf"or capacity_reservation_ids for {generation}, while serving\.staging is true"):
        load_config(context)
    load_config({"generations": {generation: {"on_demand_fallback": False, "capacity_reservation_ids": ["cr-0123456789abcdef0"]}},
                 "serving": {"staging": True}})
    load_config({"generations": {generation: {"on_demand_fallback": False}}})  # no compile Job rendered
