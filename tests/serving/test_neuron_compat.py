"""The sync init container's Neuron check (files/neuron_compat.py, called by files/s3sync.py pull):
it logs the node's Neuron driver and the image's Neuron runtime before the copy and the long load,
and stops on a pair upstream says fails.

Upstream, read at the tags named:

* aws-neuron/aws-neuron-sdk v2.31.0 (and unchanged in v2.32.0) ``release-notes/components/runtime.rst``,
  "Neuron Runtime (Neuron 2.31.0 Release)", Neuron Driver 2.29, Known Issues: "Neuron Driver 2.29
  requires Neuron Runtime Library 2.33 or later. Upgrading the Driver without also upgrading the
  Runtime Library will cause ``nrt_init()`` to fail." and "Neuron Runtime (Neuron 2.30.0 Release)",
  Known Issues: "Neuron Runtime Library 2.32 is not backward-compatible with Neuron Driver 2.26 or
  earlier." Otherwise ``neuron-runtime/nrt-troubleshoot.rst``: "The driver remains backwards
  compatible with older versions of Neuron Runtime".
* aws-neuron/aws-neuron-driver 2.24.7.0 ``neuron_module.c``: ``MODULE_VERSION("2.24.7.0")`` (the
  kernel's /sys/module/neuron/version).
* aws-neuron/deep-learning-containers 2.28.0 ``vllm/inference/0.13.0/Dockerfile.neuronx``:
  ``NEURONX_RUNTIME_LIB_VERSION=2.30.51.0-faafe26f0``, installed with apt (so in the dpkg status).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from tests import helm
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, STAGING, load_script, merged

SCRIPTS = CHART / "files"
DLC_RUNTIME = "2.30.51.0-faafe26f0"

# A dpkg status as Ubuntu 24.04 writes it: the runtime among other packages, and a removed package
# whose config files remain (not installed).
DPKG_STATUS = f"""Package: aws-neuronx-collectives
Status: install ok installed
Priority: optional
Version: 2.30.59.0-f5cdefb39
Description: Neuron collectives

Package: aws-neuronx-runtime-lib
Status: install ok installed
Priority: optional
Section: misc
Installed-Size: 200000
Maintainer: Amazon AWS Neuron <neuron-maintainers@amazon.com>
Architecture: amd64
Version: {DLC_RUNTIME}
Description: Neuron runtime library
 The library the Neuron frameworks load.

Package: aws-neuronx-tools
Status: deinstall ok config-files
Version: 2.28.23.0-f1c114a9d
"""


@pytest.fixture
def compat():
    return load_script("neuron_compat")


@pytest.mark.parametrize("driver, runtime, bad", [
    ("2.29.0.0", DLC_RUNTIME, True),     # the v20260714 Neuron AMI's driver and the SDK 2.28 DLC's runtime
    ("2.29.0.0", "2.32.31.0", True),     # still below 2.33
    ("2.29.0.0", "2.33.10.0", False),    # "2.33 or later"
    ("2.28.0.0", DLC_RUNTIME, False),    # the v20260625 Neuron AMI's driver: no rule refuses it
    ("2.26.10.0", "2.32.31.0", True),    # runtime 2.32 with driver 2.26 or earlier
    ("2.27.4.0", "2.32.31.0", False),
    ("2.26.10.0", DLC_RUNTIME, False),   # an older runtime on an older driver
])
def test_known_bad_pairs_are_the_release_notes(compat, driver, runtime, bad) -> None:
    why = compat.incompatibility(driver, runtime)
    assert (why is not None) is bad
    if bad:
        assert "release-notes/components/runtime.rst" in why


def test_versions_are_read_where_the_driver_and_the_dlc_put_them(compat, tmp_path) -> None:
    driver_file = tmp_path / "version"
    driver_file.write_text("2.28.0.0\n")
    status = tmp_path / "status"
    status.write_text(DPKG_STATUS)
    assert compat.driver_version(driver_file) == "2.28.0.0"
    assert compat.runtime_version(status) == DLC_RUNTIME
    assert compat.runtime_version(status, "aws-neuronx-tools") is None  # removed, config files only
    assert compat.driver_version(tmp_path / "absent") is None
    assert compat.runtime_version(tmp_path / "absent") is None
    assert compat.parse(DLC_RUNTIME) == (2, 30, 51, 0)
    with pytest.raises(ValueError, match="not a Neuron version: 'n/a'"):
        compat.parse("n/a")


def test_unreadable_versions_are_logged_and_pass(compat, tmp_path) -> None:
    logged: list[str] = []
    compat.check(logged.append, tmp_path / "no-driver", tmp_path / "no-status")
    assert logged == [f"Neuron driver on this node: unknown (no {tmp_path / 'no-driver'}); Neuron runtime in this image: "
                      f"unknown (no aws-neuronx-runtime-lib in {tmp_path / 'no-status'})"]


def _versions(tmp_path: Path, driver: str) -> dict[str, str]:
    (tmp_path / "driver").write_text(driver + "\n")
    (tmp_path / "status").write_text(DPKG_STATUS)
    return {"NEURON_CHECK": "true", "NEURON_DRIVER_FILE": str(tmp_path / "driver"), "DPKG_STATUS": str(tmp_path / "status")}


def test_the_sync_container_stops_before_copying_on_a_known_bad_pair(tmp_path) -> None:
    """`python3 s3sync.py pull` as the init container runs it: exit 1 with both versions and the
    release notes' text, before any S3 request (none could succeed: no endpoint answers here) and
    before the model directory exists."""
    env = {"PATH": os.environ["PATH"], "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1", "MODE": "serve", "S3_CONCURRENCY": "4",
           "MODELS_BUCKET": "models", "MODEL_PREFIX": "m/", "MODEL_DIR": str(tmp_path / "model"),
           "COMPILE_BUCKET": "compiled", "COMPILE_PREFIX": "neuron-2.28.0/m/", "COMPILED_DIR": str(tmp_path / "compiled"),
           "WORK_DIR": str(tmp_path), **_versions(tmp_path, "2.29.0.0")}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "s3sync.py"), "pull"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"Neuron driver on this node: 2.29.0.0; Neuron runtime in this image: {DLC_RUNTIME}" in proc.stdout
    assert (f"s3sync pull: the node's Neuron driver 2.29.0.0 cannot run this image's Neuron runtime {DLC_RUNTIME}"
            in proc.stderr)
    assert "Neuron Driver 2.29 requires Neuron Runtime Library 2.33 or later" in proc.stderr
    assert "NEURON_AMI_ALIAS" in proc.stderr
    assert "S3 refused" not in proc.stderr
    assert not (tmp_path / "model").exists()


def test_a_good_pair_is_logged_and_the_copy_goes_on(tmp_path) -> None:
    sync = load_script("s3sync")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        s3.put_object(Bucket="models", Key="m/config.json", Body=b"{}")
        s3.put_object(Bucket="models", Key="m/.gennstack-complete", Body=b"{}")
        logged: list[str] = []
        env = {"MODE": "serve", "S3_CONCURRENCY": "4", "MODELS_BUCKET": "models", "MODEL_PREFIX": "m/",
               "MODEL_DIR": str(tmp_path / "model"), **_versions(tmp_path, "2.28.0.0")}
        sync.run_pull(env, s3, tmp_path, log=logged.append)
    assert logged[0] == f"Neuron driver on this node: 2.28.0.0; Neuron runtime in this image: {DLC_RUNTIME}"
    assert (tmp_path / "model" / "config.json").read_bytes() == b"{}"


def test_every_neuron_sync_container_checks_and_g6es_does_not() -> None:
    """Serving pods, warm spares and compile Jobs (staging on) of inf2 and trn2; not g6e's tiktoken sync."""
    objects = helm.render(CHART, merged(REQUIRED, STAGING), namespace=NAMESPACE)
    checks = {}
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "RayService":
            pods = {f"{obj['metadata']['name']}/workers": spec["rayClusterConfig"]["workerGroupSpecs"][0]["template"]}
        elif obj["kind"] in ("Deployment", "Job"):
            pods = {obj["metadata"]["name"]: spec["template"]}
        else:
            continue
        for name, template in pods.items():
            for container in template["spec"].get("initContainers", []):
                if container["name"] == "sync-from-s3":
                    checks[name] = {e["name"]: e.get("value") for e in container["env"]}.get("NEURON_CHECK")
    assert checks["gen1-inf2/workers"] == checks["gen2-trn2"] == "true"
    assert checks["gen1-inf2-warm-spare"] == checks["gen2-trn2-warm-spare"] == "true"
    compiles = {name.split("-compile")[0]: check for name, check in checks.items() if "compile" in name}
    assert compiles == {"gen1-inf2": "true", "gen2-trn2": "true", "gen3-g6e": None}  # g6e's: vLLM's compile cache
    assert checks["gen3-g6e"] is None
