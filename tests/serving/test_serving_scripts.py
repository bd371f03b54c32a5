"""The scripts the chart's pods run (assets/charts/gennstack-serving/files), tested where they
can run without a cluster: staging against moto's S3 and Secrets Manager with a stand-in Hub,
the Ray Serve proxy's helpers, and the shell scripts' syntax (the launcher, the Ray Serve
replica's process handling and the sidecar run as processes in test_serving_processes.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from tests.serving.conftest import CHART, load_script

FILES = CHART / "files"


load = load_script


@dataclass
class Lfs:
    sha256: str


@dataclass
class Sibling:
    rfilename: str
    size: int
    blob_id: str | None = None
    lfs: Lfs | None = None


def sibling(name: str, data: bytes) -> Sibling:
    """LFS for weights (sha256), a git blob (sha1 of "blob <size>\\0" + content) for the rest."""
    if name.endswith((".safetensors", ".pth")):
        return Sibling(name, len(data), lfs=Lfs(hashlib.sha256(data).hexdigest()))
    return Sibling(name, len(data), blob_id=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())


@dataclass
class Info:
    sha: str
    siblings: list[Sibling]


class FakeHub:
    """Stands in for huggingface_hub.HfApi: serves files from memory, counts downloads."""

    def __init__(self, files: dict[str, bytes], sha: str = "c0ffee") -> None:
        self.files, self.sha, self.downloads = files, sha, []

    def model_info(self, repo_id: str, *, revision: str, files_metadata: bool) -> Info:
        assert files_metadata
        return Info(self.sha, [sibling(name, data) for name, data in self.files.items()])

    def hf_hub_download(self, repo_id: str, filename: str, *, revision: str, local_dir: str) -> str:
        assert revision == self.sha  # pinned to the commit model_info resolved
        self.downloads.append(filename)
        path = Path(local_dir) / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.files[filename])
        return str(path)


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="models")
        yield client


FILES_ON_HUB = {
    "config.json": b'{"model_type": "llama"}',
    "model-00001-of-00002.safetensors": b"a" * 1000,
    "model-00002-of-00002.safetensors": b"b" * 500,
    "original/consolidated.00.pth": b"c" * 2000,
    "metal/model.bin": b"d" * 100,
    ".gitattributes": b"*.safetensors filter=lfs",
}


def test_stage_copies_the_model_and_marks_it_complete(s3, tmp_path) -> None:
    stage = load("stage")
    hub = FakeHub(FILES_ON_HUB)
    record = stage.stage(hub=hub, s3=s3, bucket="models", prefix="org/model/main/", model_id="org/model",
                         revision="main", scratch=str(tmp_path), log=lambda *_: None)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="models")["Contents"]}
    assert keys == {"org/model/main/config.json", "org/model/main/model-00001-of-00002.safetensors",
                    "org/model/main/model-00002-of-00002.safetensors", "org/model/main/.gennstack-complete"}
    assert s3.get_object(Bucket="models", Key="org/model/main/model-00002-of-00002.safetensors")["Body"].read() == b"b" * 500
    assert record == {"model_id": "org/model", "revision": "main", "commit": "c0ffee", "files": 3, "bytes": 1523, "tiktoken": []}
    assert json.loads(s3.get_object(Bucket="models", Key="org/model/main/.gennstack-complete")["Body"].read()) == record
    assert list(tmp_path.rglob("*.safetensors")) == []  # one file at a time on local disk


def test_stage_does_nothing_once_complete_and_resumes_a_partial_copy(s3, tmp_path) -> None:
    stage = load("stage")
    digest = "sha256:" + hashlib.sha256(b"a" * 1000).hexdigest()
    s3.put_object(Bucket="models", Key="org/model/main/model-00001-of-00002.safetensors", Body=b"a" * 1000,
                  Metadata={"hub-digest": digest, "commit": "c0ffee"})
    # Same size, but uploaded without (or with another) digest: copied again.
    s3.put_object(Bucket="models", Key="org/model/main/config.json", Body=b'{"model_type": "LLAMA"}')
    hub = FakeHub(FILES_ON_HUB)
    stage.stage(hub=hub, s3=s3, bucket="models", prefix="org/model/main/", model_id="org/model", revision="main",
                scratch=str(tmp_path), log=lambda *_: None)
    assert sorted(hub.downloads) == ["config.json", "model-00002-of-00002.safetensors"]
    again = FakeHub(FILES_ON_HUB)
    stage.stage(hub=again, s3=s3, bucket="models", prefix="org/model/main/", model_id="org/model", revision="main",
                scratch=str(tmp_path), log=lambda *_: None)
    assert again.downloads == []


@pytest.mark.parametrize("secret, token", [("hf_plain", "hf_plain"), ('{"token": "hf_json"}', "hf_json"), ("  hf_pad\n", "hf_pad")])
def test_stage_reads_the_token_from_secrets_manager(secret, token) -> None:
    stage = load("stage")
    with mock_aws():
        secrets = boto3.client("secretsmanager", region_name="us-east-1")
        secrets.create_secret(Name="gennstack/hf-token", SecretString=secret)
        assert stage.hf_token(secrets, "gennstack/hf-token") == token


def test_ray_serve_app_imports_without_ray_and_drops_hop_by_hop_headers(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(FILES))
    serve_app = load("gennstack_serve")
    headers = {"Content-Type": "application/json", "Authorization": "Bearer x", "Connection": "keep-alive",
               "Transfer-Encoding": "chunked", "Host": "gen1-inf2-serve-svc", "Content-Length": "12"}
    assert serve_app.forwarded_headers(headers) == {"Content-Type": "application/json", "Authorization": "Bearer x"}
    with pytest.raises(AttributeError):
        serve_app.something_else  # noqa: B018


@pytest.mark.parametrize("script, shell", [("compile.sh", "bash")])
def test_shell_scripts_parse(script, shell) -> None:
    proc = subprocess.run([shell, "-n", str(FILES / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_stage_refuses_unknown_tiktoken_encodings(s3, tmp_path) -> None:
    stage = load("stage")
    with pytest.raises(SystemExit, match=r"TIKTOKEN_ENCODINGS: got \['p50k_base'\]; allowed: \['cl100k_base', 'o200k_base'\]"):
        stage.stage(hub=FakeHub(FILES_ON_HUB), s3=s3, bucket="models", prefix="p/", model_id="org/model", revision="main",
                    scratch=str(tmp_path), encodings=("p50k_base",), log=lambda *_: None)


def test_s3sync_compile_mode_needs_the_marker_and_never_waits(s3, tmp_path) -> None:
    sync = load("s3sync")
    assert not hasattr(sync, "wait_for")
    env = {"MODE": "compile", "S3_CONCURRENCY": "4", "MODELS_BUCKET": "models", "MODEL_PREFIX": "m/", "MODEL_DIR": str(tmp_path / "m"),
           "COMPILE_BUCKET": "models", "COMPILE_PREFIX": "neuron/m/", "COMPILED_DIR": str(tmp_path / "c")}
    with pytest.raises(sync.SyncError, match=r"s3://models/m/.gennstack-complete is missing, yet this compile Job runs"):
        sync.run_pull(env, s3, tmp_path)
    s3.put_object(Bucket="models", Key="m/config.json", Body=b"{}")
    s3.put_object(Bucket="models", Key="m/.gennstack-complete", Body=b"{}")
    sync.run_pull(env, s3, tmp_path, log=lambda *_: None)
    assert (tmp_path / "m" / "config.json").read_bytes() == b"{}"


def test_s3sync_refuses_keys_outside_the_destination(s3, tmp_path) -> None:
    sync = load("s3sync")
    s3.put_object(Bucket="models", Key="m/../../escape", Body=b"x")
    with pytest.raises(sync.SyncError, match="outside"):
        sync.pull(s3, "models", "m/", tmp_path / "dest", 4, log=lambda *_: None)
    with pytest.raises(sync.SyncError, match="MODE: got 'warm'; allowed: 'serve' or 'compile'"):
        sync.run_pull({"MODE": "warm"}, s3, tmp_path)
