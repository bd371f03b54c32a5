"""The credential chain of every program the chart's pods run against S3, run for real.

Each program runs as a process with the environment the chart renders for its container, plus
what the EKS Pod Identity webhook injects (a credentials URI and a token file) and an S3 endpoint
override, and nothing else to get credentials from (tests/serving/aws_fakes.py). S3 is moto in
server mode with SigV4 authentication on, so only the Pod Identity role's credentials work; the
fake Pod Identity agent hands them out only for the right token. Every program is also run with a
wrong token and must fail: a program that fell back to other credentials, or sent none, would pass
the first run but not this one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import helm
from tests.serving.aws_fakes import TOKEN, pod_env
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, SCRIPTS, STAGING, merged
from tests.serving.containers import (
    COMMIT, HUB_FILES, chart_env, env_with_prefixes, put, run, safetensors, workload,
)
from tests.serving.fake_hub import FakeHub

pytestmark = pytest.mark.slow

BUCKET, COMPILE_BUCKET = "models", "compile-cache"
WRONG = "eyJhbGciOiJSUzI1NiJ9.another-pods-token"


@pytest.fixture(scope="module")
def rendered() -> dict:
    """Every container's environment as the chart renders it (all generations, staging on)."""
    values = merged(REQUIRED, STAGING, {"buckets": {"models": BUCKET, "compileCache": COMPILE_BUCKET}})
    out: dict = {}
    for obj in helm.render(CHART, values, namespace=NAMESPACE):
        specs = []
        if obj["kind"] in ("Deployment", "Job"):
            specs.append(obj["spec"]["template"]["spec"])
        if obj["kind"] == "RayService":
            specs += [g["template"]["spec"] for g in obj["spec"]["rayClusterConfig"]["workerGroupSpecs"]]
        for spec in specs:
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                out[(obj["metadata"]["name"], c["name"])] = c
    return out


# --- the Neuron syncer and the compile upload (files/s3sync.py in the Neuron DLC) ----------------


def test_neuron_serving_sync_copies_weights_and_compile_with_pod_identity(moto, agent, rendered, tmp_path) -> None:
    """botocore's container provider (botocore/credentials.py, boto3 1.44.5 here; the DLC installs
    the latest boto3, `pip install boto3` in aws-neuron/deep-learning-containers
    vllm/inference/0.16.0/Dockerfile.neuronx) reads AWS_CONTAINER_CREDENTIALS_FULL_URI and sends the
    token file's content as Authorization; AWS_ENDPOINT_URL_S3 moves only S3."""
    container = workload(rendered, "gen1-inf2", "sync-from-s3")
    s3 = moto.client("s3")
    weights = {"config.json": b'{"model_type": "llama"}', "model-00001.safetensors": safetensors("w", bytes(range(200)))}
    compiled = {"model.pt": b"neff" * 100, "neuron_config.json": b"{}"}
    put(s3, BUCKET, "a/inf2/", weights)
    put(s3, COMPILE_BUCKET, "neuron/a/inf2/tp24/", compiled)
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, tmp_path, MODEL_PREFIX="a/inf2/", COMPILE_PREFIX="neuron/a/inf2/tp24/"))
    served = agent.served
    proc = run(container, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    model_dir, compiled_dir = Path(env["MODEL_DIR"]), Path(env["COMPILED_DIR"])
    # inf2 serves the presharded checkpoint in its artifacts (inf2.saveShardedCheckpoint, on by
    # default: tests/serving/test_inf2_presharded.py), so the model's safetensors stay in S3.
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == {"config.json": weights["config.json"]}
    assert {p.name: p.read_bytes() for p in compiled_dir.iterdir()} == compiled
    assert agent.served > served
    assert "pulled 2 of 2 files" in proc.stdout
    again = run(container, env, tmp_path)  # a warm node: a listing, no download
    assert again.returncode == 0, again.stderr
    assert "pulled 0 of 2 files" in again.stdout


# Llama 4 Maverick's staged files, by kind (small stand-ins): what the server reads, and its weights.
TRN2_READ = {"config.json": b'{"model_type": "llama4"}', "generation_config.json": b"{}", "tokenizer.json": b"{}",
             "tokenizer_config.json": b"{}", "special_tokens_map.json": b"{}", "chat_template.json": b"{}",
             "preprocessor_config.json": b"{}", "processor_config.json": b"{}", "model.safetensors.index.json": b"{}"}
TRN2_WEIGHTS = {f"model-0000{i}-of-00002.safetensors": safetensors("w", bytes([i]) * 300) for i in (1, 2)}
# save_sharded_checkpoint's artifacts: NxD Inference 2.28.0 image_to_text_model_base.py compile writes
# text_model/ and vision_model/, each with model.pt and weights/tp<rank>_sharded_checkpoint.safetensors.
TRN2_COMPILED = {f"{part}/{name}": b"s" * 100 for part in ("text_model", "vision_model")
                 for name in ("model.pt", "weights/tp0_sharded_checkpoint.safetensors", "weights/tp1_sharded_checkpoint.safetensors")}


def test_trn2_serving_sync_leaves_the_model_weights_in_s3(moto, agent, rendered, tmp_path) -> None:
    """trn2 loads the presharded checkpoint from its compiled artifacts (NxD Inference 2.28.0,
    aws-neuron/neuronx-distributed-inference cd3abf3, image_to_text_model_base.py load_weights:
    with save_sharded_checkpoint it reads only <compiled>/{text,vision}_model/weights/
    tp<rank>_sharded_checkpoint.safetensors; vllm-neuron's _load_compiled_model builds the model
    from the compiled path and reads config.json from the model directory), so its server and warm
    spare copy the config, tokenizer and processor files and leave the ~800 GB of safetensors in S3;
    the compile Job, which shards them, still copies everything."""
    s3 = moto.client("s3")
    put(s3, BUCKET, "t/trn2/", {**TRN2_READ, **TRN2_WEIGHTS})
    put(s3, COMPILE_BUCKET, "neuron/t/trn2/sharded/", TRN2_COMPILED)
    for workload_name in ("gen2-trn2", "gen2-trn2-warm-spare"):
        container = workload(rendered, workload_name, "sync-from-s3")
        root = tmp_path / workload_name
        env = pod_env(root / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                      **env_with_prefixes(container, root, MODEL_PREFIX="t/trn2/", COMPILE_PREFIX="neuron/t/trn2/sharded/"))
        proc = run(container, env, tmp_path)
        assert proc.returncode == 0, proc.stderr
        model_dir, compiled_dir = Path(env["MODEL_DIR"]), Path(env["COMPILED_DIR"])
        assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == TRN2_READ
        assert {p.relative_to(compiled_dir).as_posix(): p.read_bytes() for p in compiled_dir.rglob("*") if p.is_file()} == TRN2_COMPILED
        assert "left 2 files (0.00 GB) matching *.safetensors in s3://models/t/trn2/: the server does not read them" in proc.stdout
        assert f"pulled {len(TRN2_READ)} of {len(TRN2_READ)} files" in proc.stdout
    compile_sync = workload(rendered, "gen2-trn2-compile", "sync-from-s3")
    assert "MODEL_EXCLUDE" not in {e["name"] for e in compile_sync["env"]}
    root = tmp_path / "compile"
    (root / "work").mkdir(parents=True)
    env = pod_env(root / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(compile_sync, root, MODEL_PREFIX="t/trn2/", COMPILE_PREFIX="neuron/t/trn2/unsharded/"))
    proc = run(compile_sync, {**env, "MODEL_EXCLUDE": "*.safetensors"}, tmp_path)  # ignored outside serve mode
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in Path(env["MODEL_DIR"]).iterdir()} == {*TRN2_READ, *TRN2_WEIGHTS}


def test_g6e_serving_sync_restores_the_vllm_compile_cache_when_staged_and_starts_cold_without(moto, agent, rendered,
                                                                                                 tmp_path) -> None:
    """gen3-g6e's sync: the tiktoken encodings, then vLLM's compile cache (torch.compile + Triton) into
    VLLM_CACHE_ROOT when its compile Job has staged it; before that the server starts and compiles
    itself (COMPILE_OPTIONAL), so a first deploy never waits on the compile Job."""
    container = workload(rendered, "gen3-g6e", "sync-from-s3")
    (server,) = [c for (name, cname), c in rendered.items() if name == "gen3-g6e" and cname == "vllm"]
    server_env = {e["name"]: e.get("value") for e in server["env"]}
    assert chart_env(container, tmp_path)["COMPILED_DIR"] == server_env["VLLM_CACHE_ROOT"] == "/home/vllm/.cache/vllm"
    s3 = moto.client("s3")
    put(s3, BUCKET, "g/gpt/", {"tiktoken/o200k_base.tiktoken": b"e"})
    cache_prefix = "vllm-0.29.0/g/gpt/l40s-tp1-seqs64-len32768/"
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, tmp_path, MARKER_PREFIX="g/gpt/", MODEL_PREFIX="g/gpt/tiktoken/",
                                      COMPILE_PREFIX=cache_prefix, COMPILED_DIR=str(tmp_path / "vllm-cache")))
    cold = run(container, env, tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert f"no compile cache in s3://{COMPILE_BUCKET}/{cache_prefix} yet" in cold.stdout
    assert not (tmp_path / "vllm-cache").exists()
    cached = {"torch_compile_cache/torch_aot_compile/0123abcd/rank_0_0/model": b"aot" * 50,
              "triton/ABCDEF/kernel.cubin": b"cubin"}
    put(s3, COMPILE_BUCKET, cache_prefix, cached)
    warm = run(container, env, tmp_path)
    assert warm.returncode == 0, warm.stderr
    restored = tmp_path / "vllm-cache"
    assert {p.relative_to(restored).as_posix(): p.read_bytes() for p in restored.rglob("*") if p.is_file()} == cached
    # Not another set's: a half-written one (no marker) is never read.
    put(s3, COMPILE_BUCKET, "vllm-0.29.0/g/gpt/l40s-tp1-seqs32-len32768/", cached, marker=False)
    other = run(container, {**env, "COMPILE_PREFIX": "vllm-0.29.0/g/gpt/l40s-tp1-seqs32-len32768/",
                            "COMPILED_DIR": str(tmp_path / "other")}, tmp_path)
    assert other.returncode == 0 and not (tmp_path / "other").exists()
    # A set that does not come whole (S3 refusing a read: here an object archived, GetObject InvalidObjectState):
    # the server starts cold, nothing half-restored, never kept in Init (upstream review).
    s3.put_object(Bucket=COMPILE_BUCKET, Key=cache_prefix + "triton/ABCDEF/kernel.cubin", Body=b"cubin",
                  StorageClass="GLACIER")
    broken = run(container, {**env, "COMPILED_DIR": str(tmp_path / "broken")}, tmp_path)
    assert broken.returncode == 0, broken.stderr
    assert "not restored" in broken.stdout and "the server compiles at start" in broken.stdout
    assert not (tmp_path / "broken").exists()


def test_neuron_serving_sync_fails_without_the_staged_marker_or_the_compile(moto, agent, rendered, tmp_path) -> None:
    container = workload(rendered, "gen2-trn2", "sync-from-s3")
    s3 = moto.client("s3")
    put(s3, BUCKET, "b/trn2/", {"config.json": b"{}"}, marker=False)
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, tmp_path, MODEL_PREFIX="b/trn2/", COMPILE_PREFIX="neuron/b/"))
    proc = run(container, env, tmp_path)
    assert proc.returncode == 1
    assert "s3://models/b/trn2/.gennstack-complete is missing: stage the model first" in proc.stderr
    s3.put_object(Bucket=BUCKET, Key="b/trn2/.gennstack-complete", Body=b"{}")
    proc = run(container, env, tmp_path)
    assert proc.returncode == 1
    assert "s3://compile-cache/neuron/b/.gennstack-complete is missing: run the compile Job first" in proc.stderr


def test_compile_job_fails_at_once_without_the_staging_marker(moto, agent, rendered, tmp_path) -> None:
    """The compile Job runs only once its stage Job has released it, after writing the marker
    (tests/serving/test_compile_gate.py): a missing marker means it was released by hand, and
    waiting would only keep the on-demand accelerator node. It fails at once, saying so."""
    container = workload(rendered, "gen1-inf2-compile", "sync-from-s3")
    assert "STAGING_WAIT_SECONDS" not in {e["name"] for e in container["env"]}
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, tmp_path, MODEL_PREFIX="c/never-staged/", COMPILE_PREFIX="neuron/c/"))
    started = time.monotonic()
    proc = run(container, env, tmp_path)
    assert proc.returncode == 1
    assert time.monotonic() - started < 20
    assert ("s3://models/c/never-staged/.gennstack-complete is missing, yet this compile Job runs: its staging Job "
            "releases it (spec.suspend=false) only after writing that marker") in proc.stderr


def test_compile_job_skips_a_compile_already_in_s3(moto, agent, rendered, tmp_path) -> None:
    container = workload(rendered, "gen1-inf2-compile", "sync-from-s3")
    put(moto.client("s3"), COMPILE_BUCKET, "neuron/d/", {"model.pt": b"x"})
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, tmp_path, MODEL_PREFIX="d/m/", COMPILE_PREFIX="neuron/d/"))
    (tmp_path / "work").mkdir()
    proc = run(container, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "work" / "skip").exists()


def test_compile_upload_pushes_the_artifacts_then_the_marker(moto, agent, rendered, kube_api, tmp_path) -> None:
    container = workload(rendered, "gen1-inf2-compile", "upload")
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, tmp_path, COMPILE_PREFIX="neuron/e/", **kube_api.env))
    compiled = Path(env["COMPILED_DIR"])
    (compiled / "graphs").mkdir(parents=True)
    (compiled / "graphs" / "model.neff").write_bytes(b"n" * 3000)
    (compiled / "neuron_config.json").write_text("{}")
    (tmp_path / "work").mkdir()
    proc = run(container, env, tmp_path)
    assert proc.returncode == 1 and "no finished compile to upload" in proc.stderr
    (tmp_path / "work" / "compiled").touch()
    proc = run(container, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    s3 = moto.client("s3")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=COMPILE_BUCKET, Prefix="neuron/e/")["Contents"]}
    assert keys == {"neuron/e/graphs/model.neff", "neuron/e/neuron_config.json", "neuron/e/.gennstack-complete"}
    assert json.loads(s3.get_object(Bucket=COMPILE_BUCKET, Key="neuron/e/.gennstack-complete")["Body"].read())["files"] == 2
    # Then the staged marker (tests/serving/test_staged_gate.py covers it in full).
    assert "neuron/e/" in kube_api.configmaps[(NAMESPACE, "gen1-inf2-staged")]["data"].values()


def test_compile_upload_refuses_a_link_out_of_the_artifacts(moto, agent, rendered, kube_api, tmp_path) -> None:
    """The compile container (the model's code) writes the artifacts and has no credentials; the
    upload has them. A link it left pointing at the upload's own token (or any file outside the
    artifacts) must not be copied to S3, where every server could read it: nothing is uploaded."""
    container = workload(rendered, "gen1-inf2-compile", "upload")
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, tmp_path, COMPILE_PREFIX="neuron/link/", **kube_api.env))
    compiled = Path(env["COMPILED_DIR"])
    compiled.mkdir(parents=True)
    (compiled / "model.pt").write_bytes(b"n" * 100)
    (compiled / "same.pt").symlink_to(compiled / "model.pt")  # inside the artifacts: harmless
    secret = tmp_path / "eks-pod-identity-token"
    secret.write_text(TOKEN)
    (compiled / "weights").mkdir()
    (compiled / "weights" / "tp0.safetensors").symlink_to(secret)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "compiled").touch()
    proc = run(container, env, tmp_path)
    assert proc.returncode == 1
    assert f"refusing to upload {compiled / 'weights' / 'tp0.safetensors'}: a link to {secret.resolve()}" in proc.stderr
    assert "Contents" not in moto.client("s3").list_objects_v2(Bucket=COMPILE_BUCKET, Prefix="neuron/link/")
    (compiled / "weights" / "tp0.safetensors").unlink()
    proc = run(container, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    s3 = moto.client("s3")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=COMPILE_BUCKET, Prefix="neuron/link/")["Contents"]}
    assert keys == {"neuron/link/model.pt", "neuron/link/same.pt", "neuron/link/.gennstack-complete"}


UPLOAD_UID = 65532  # the compile Job's upload container (the chart's helper user); the compile runs as root


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the upload's walk as another user: needs root (CI is root)")
def test_compile_upload_never_marks_a_set_it_cannot_read_complete() -> None:
    """The compile (root) may leave a 0700 folder or a 0600 file; Path.rglob skips a folder it cannot
    list, so an upload as another user would mark an incomplete set complete. s3sync's walk refuses
    it, and compile.sh makes the set readable before it hands over (both run for real, as that user)."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="gennstack-compiled-"))
    try:
        top.chmod(0o755)
        artifacts = top / "artifacts"
        (artifacts / "weights").mkdir(parents=True)
        (artifacts / "model.pt").write_bytes(b"m")
        (artifacts / "weights" / "tp0.safetensors").write_bytes(b"w")
        (artifacts / "weights").chmod(0o700)
        walk = ("import sys; sys.path.insert(0, sys.argv[1]); import s3sync; "
                "print(sorted(p.relative_to(sys.argv[2]).as_posix() for p in s3sync._walk(__import__('pathlib').Path(sys.argv[2]))))")
        # Debian's python3: the venv's interpreter lives under /root, which that user cannot enter
        python = Path("/usr/bin/python3")
        if not python.exists():
            pytest.skip("no /usr/bin/python3 another user may run")
        as_upload = dict(user=UPLOAD_UID, group=UPLOAD_UID, capture_output=True, text=True, timeout=60)
        refused = subprocess.run([str(python), "-c", walk, str(SCRIPTS), str(artifacts)], **as_upload)
        assert refused.returncode == 1 and "cannot list" in refused.stderr and "incomplete set" in refused.stderr
        (chmod,) = [line for line in (SCRIPTS / "compile.sh").read_text().splitlines() if line.startswith("chmod ")]
        subprocess.run(["bash", "-c", chmod], env={"out": str(artifacts), "PATH": "/usr/bin:/bin"}, check=True)
        listed = subprocess.run([str(python), "-c", walk, str(SCRIPTS), str(artifacts)], **as_upload)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.strip() == str(["model.pt", "weights", "weights/tp0.safetensors"])
    finally:
        shutil.rmtree(top)


# --- staging (files/stage.py in the vLLM image) -----------------------------------------------

# Stand-ins for the real encodings; their sha256 is what stage.py must accept for them.
ENCODINGS = {"o200k_base.tiktoken": b"bzIwMGs= 0\n", "cl100k_base.tiktoken": b"Y2wxMDBr 0\n"}


@pytest.fixture(scope="module")
def hf_secret(moto, rendered) -> str:
    """The token secret the staging Job's HF_TOKEN_SECRET names, holding the fake Hub's token."""
    name = chart_env(workload(rendered, "gen3-g6e-stage", "stage"), Path("/"))["HF_TOKEN_SECRET"]
    moto.client("secretsmanager").create_secret(Name=name, SecretString='{"token": "hf_test"}')
    return name


@pytest.fixture
def hub():
    fake = FakeHub("openai/gpt-oss-20b", HUB_FILES, commit=COMMIT, refs={"main": COMMIT}, token="hf_test",
                   static=ENCODINGS)
    yield fake
    fake.stop()


def stage_env(rendered: dict, moto, agent, hub, root: Path, token: str = TOKEN, prefix: str = "openai/gpt-oss-20b/main/",
              kube: dict | None = None) -> dict:
    container = workload(rendered, "gen3-g6e-stage", "stage")
    env = pod_env(root / "home", agent, token=token, AWS_ENDPOINT_URL=moto.endpoint, HF_ENDPOINT=hub.endpoint,
                  **env_with_prefixes(container, root, MODEL_PREFIX=prefix, TIKTOKEN_SOURCE=f"{hub.endpoint}/encodings/",
                                      **(kube or {})))
    Path(env["HF_HOME"]).mkdir(parents=True, exist_ok=True)
    return env


def test_staging_resolves_the_revision_verifies_and_skips_what_no_server_reads(moto, agent, rendered, hub, hf_secret, kube_api,
                                                                               tmp_path) -> None:
    """huggingface_hub 1.28.0 (>= 1.28.0 is what vLLM 0.29.0 requires) reads HF_ENDPOINT and writes
    hf_hub_download(local_dir=HF_HOME) there; boto3 reads AWS_ENDPOINT_URL for S3 and Secrets Manager."""
    container = workload(rendered, "gen3-g6e-stage", "stage")
    env = stage_env(rendered, moto, agent, hub, tmp_path, kube=kube_api.env)
    # The compile Job (vLLM's compile cache) the stage Job releases once the model is in S3, as installed: suspended.
    compile_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": env["COMPILE_JOB"]}, "spec": {"suspend": True}}
    kube_api.jobs[(NAMESPACE, env["COMPILE_JOB"])] = compile_job
    assert env["MODEL_REVISION"] == "main" and env["TIKTOKEN_ENCODINGS"] == "o200k_base cl100k_base"
    env["TIKTOKEN_ENCODINGS"] = ""  # the stand-in encodings cannot have the real digests: see the next test
    proc = run(container, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    s3 = moto.client("s3")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="openai/gpt-oss-20b/main/")["Contents"]}
    assert keys == {f"openai/gpt-oss-20b/main/{k}" for k in ("config.json", "model-00001-of-00001.safetensors", ".gennstack-complete")}
    marker = json.loads(s3.get_object(Bucket=BUCKET, Key="openai/gpt-oss-20b/main/.gennstack-complete")["Body"].read())
    assert marker["commit"] == COMMIT and marker["revision"] == "main"
    head = s3.head_object(Bucket=BUCKET, Key="openai/gpt-oss-20b/main/model-00001-of-00001.safetensors")
    assert head["Metadata"] == {"commit": COMMIT,
                                "hub-digest": "sha256:" + hashlib.sha256(HUB_FILES["model-00001-of-00001.safetensors"]).hexdigest()}
    assert f"openai/gpt-oss-20b@main is commit {COMMIT}" in proc.stdout
    assert sorted(hub.downloads) == ["config.json", "model-00001-of-00001.safetensors"]
    assert "openai/gpt-oss-20b/main/" in kube_api.configmaps[(NAMESPACE, "gen3-g6e-staged")]["data"].values()
    assert kube_api.jobs[(NAMESPACE, env["COMPILE_JOB"])]["spec"]["suspend"] is False
    # The branch moves: the staged commit stays, and the Job says how to stage the new one.
    hub.refs["main"] = "9" * 40
    again = run(container, env, tmp_path)
    assert again.returncode != 0
    assert f"holds commit {COMMIT}" in again.stderr and "set the revision to 9999" in again.stderr


def test_staging_fetches_tiktoken_encodings_and_checks_them_against_the_pinned_digest(moto, agent, rendered, hub, hf_secret, tmp_path) -> None:
    """The encodings come from TIKTOKEN_SOURCE (openaipublic by default) and must have the sha256
    that openai_harmony 0.0.8 checks; stand-ins do not, so nothing is uploaded and the Job fails."""
    container = workload(rendered, "gen3-g6e-stage", "stage")
    env = stage_env(rendered, moto, agent, hub, tmp_path, prefix="tk/gpt-oss/main/")
    proc = run(container, env, tmp_path)
    assert proc.returncode != 0
    expected = "sha256:446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
    got = "sha256:" + hashlib.sha256(ENCODINGS["o200k_base.tiktoken"]).hexdigest()
    assert f"/encodings/o200k_base.tiktoken: downloaded content has {got}, the source says {expected}" in proc.stderr
    listed = moto.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="tk/")
    assert not any("tiktoken/" in o["Key"] or o["Key"].endswith(".gennstack-complete") for o in listed["Contents"])


def test_staging_refuses_a_file_whose_digest_differs_from_the_hub(moto, agent, rendered, hf_secret, tmp_path) -> None:
    hub = FakeHub("openai/gpt-oss-20b", HUB_FILES, commit=COMMIT, refs={"main": COMMIT}, token="hf_test",
                  corrupt=frozenset({"model-00001-of-00001.safetensors"}), static=ENCODINGS)
    try:
        container = workload(rendered, "gen3-g6e-stage", "stage")
        env = stage_env(rendered, moto, agent, hub, tmp_path, prefix="corrupt/gpt-oss/main/")
        proc = run(container, env, tmp_path)
    finally:
        hub.stop()
    assert proc.returncode != 0
    assert "model-00001-of-00001.safetensors: downloaded content has sha256:" in proc.stderr and "not uploaded" in proc.stderr
    listed = moto.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="corrupt/")
    assert {o["Key"] for o in listed.get("Contents", [])} <= {"corrupt/gpt-oss/main/config.json"}


# --- g6e: tiktoken copy and the Run:ai model streamer -----------------------------------------


def test_g6e_init_container_copies_the_staged_encodings_to_tiktoken_encodings_base(moto, agent, rendered, tmp_path) -> None:
    sync = workload(rendered, "gen3-g6e", "sync-from-s3")
    server = workload(rendered, "gen3-g6e", "vllm")
    assert chart_env(server, Path(""))["TIKTOKEN_ENCODINGS_BASE"] == chart_env(sync, Path(""))["MODEL_DIR"]
    put(moto.client("s3"), BUCKET, "f/g6e/", {"tiktoken/o200k_base.tiktoken": b"abc", "model.safetensors": b"big"})
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(sync, tmp_path, MARKER_PREFIX="f/g6e/", MODEL_PREFIX="f/g6e/tiktoken/"))
    proc = run(sync, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in Path(env["MODEL_DIR"]).iterdir()] == ["o200k_base.tiktoken"]


def test_openai_harmony_reads_its_encoding_from_tiktoken_encodings_base_and_checks_the_staged_digest(tmp_path) -> None:
    """openai_harmony 0.0.8 (src/tiktoken_ext/public_encodings.rs): with TIKTOKEN_ENCODINGS_BASE set it
    loads `<base>/o200k_base.tiktoken` and checks its sha256 (no download); the digest it expects is
    the one stage.py verifies before it uploads."""
    from tests.serving.conftest import load_script as load

    stage = load("stage")
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"bm90IHRoZSByZWFsIGZpbGU= 0\n")
    probe = "from openai_harmony import load_harmony_encoding as l, HarmonyEncodingName as n; l(n.HARMONY_GPT_OSS)"
    env = {"PATH": "/usr/bin:/bin", "TIKTOKEN_ENCODINGS_BASE": str(tmp_path), "TIKTOKEN_RS_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert f"expected={stage.TIKTOKEN_SHA256['o200k_base']}" in proc.stderr
    (tmp_path / "o200k_base.tiktoken").unlink()
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert "No such file or directory" in proc.stderr


PROBE = Path(__file__).parent / "streamer_probe.py"


def _stream(moto, agent, home: Path, token: str, prefix: str, **extra: str) -> subprocess.CompletedProcess:
    # The C++ client reads AWS_ENDPOINT_URL; path-style addressing because 127.0.0.1 has no bucket subdomains.
    env = pod_env(home, agent, token=token, AWS_ENDPOINT_URL=moto.endpoint, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0", **extra)
    return subprocess.run([sys.executable, str(PROBE), f"s3://{BUCKET}/{prefix}"], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path, extra", [("c++", {}), ("boto3", {"RUNAI_STREAMER_NO_BOTO3_SESSION": "0"})])
def test_runai_streamer_streams_safetensors_with_pod_identity(moto, agent, rendered, tmp_path, path, extra) -> None:
    """runai-model-streamer(-s3) 0.17.1, runai_model_streamer_s3/credentials/credentials.py: with
    RUNAI_STREAMER_NO_BOTO3_SESSION unset (default "1") the C++ libstreamers3.so (AWS SDK for C++
    1.11.584, GeneralHTTPCredentialsProvider) resolves credentials itself; "0" resolves them with
    boto3 and hands them over. Both take Pod Identity's; the chart sets neither way (the server env
    has no RUNAI_STREAMER_* variable), so the image's default path is the one used."""
    server_env = chart_env(workload(rendered, "gen3-g6e", "vllm"), tmp_path)
    assert not [k for k in server_env if k.startswith("RUNAI_STREAMER")]
    args = json.loads(server_env["VLLM_ARGS"])
    assert args[args.index("--load-format") + 1] == "runai_streamer" and args[args.index("--model") + 1].startswith("s3://")
    data = {"model-00001-of-00002.safetensors": safetensors("a", b"\x02" * 4096),
            "model-00002-of-00002.safetensors": safetensors("b", b"\x03" * 1000)}
    prefix = f"g/{path}/"
    put(moto.client("s3"), BUCKET, prefix, {**data, "config.json": b"{}"})
    served = agent.served
    proc = _stream(moto, agent, tmp_path / "home", TOKEN, prefix, **extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["credentials_from"] == path
    assert out["files"] == {f"s3://{BUCKET}/{prefix}{k}": {"sha256": hashlib.sha256(v).hexdigest(), "tensors": [t]}
                            for (k, v), t in zip(data.items(), ["a", "b"], strict=True)}
    assert agent.served > served


@pytest.mark.parametrize("path, extra", [("c++", {}), ("boto3", {"RUNAI_STREAMER_NO_BOTO3_SESSION": "0"})])
def test_runai_streamer_fails_with_a_wrong_token(moto, agent, tmp_path, path, extra) -> None:
    put(moto.client("s3"), BUCKET, "h/", {"model.safetensors": safetensors("a", b"\x01" * 64)})
    proc = _stream(moto, agent, tmp_path / "home", WRONG, "h/", PROBE_SKIP_GLOB="1", **extra)
    assert proc.returncode != 0
    assert (WRONG, 403) in agent.calls


# --- every program refuses to run on a wrong token --------------------------------------------


@pytest.mark.parametrize("workload_prefix, container, extra", [
    ("gen2-trn2", "sync-from-s3", {"MODEL_PREFIX": "a/trn2/"}),
    ("gen1-inf2-compile", "sync-from-s3", {"MODEL_PREFIX": "a/trn2/"}),
    ("gen1-inf2-compile", "upload", {}),
    ("gen3-g6e", "sync-from-s3", {}),
    ("gen3-g6e-stage", "stage", {}),
])
def test_every_program_fails_fast_with_a_wrong_token(moto, agent, rendered, tmp_path, workload_prefix, container, extra) -> None:
    spec = workload(rendered, workload_prefix, container)
    env = pod_env(tmp_path / "home", agent, token=WRONG, AWS_ENDPOINT_URL=moto.endpoint,
                  **env_with_prefixes(spec, tmp_path, **extra))
    Path(env.get("COMPILED_DIR", tmp_path / "c")).mkdir(parents=True, exist_ok=True)
    (Path(env.get("COMPILED_DIR", tmp_path / "c")) / "f").write_text("x")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "compiled").touch()
    started = time.monotonic()
    proc = run(spec, env, tmp_path)
    assert proc.returncode != 0
    assert time.monotonic() - started < 30  # no waiting loop mistakes "no credentials" for "not staged yet"
    assert "403" in proc.stderr and "container" in proc.stderr.lower()
    assert (WRONG, 403) in agent.calls


def test_no_container_uses_s5cmd_and_the_s3_containers_run_the_generation_image(rendered) -> None:
    """peak/s5cmd v2.3.0 (go.mod) builds on aws-sdk-go v1.44.298, whose aws/defaults/defaults.go
    accepts AWS_CONTAINER_CREDENTIALS_FULL_URI only for loopback hosts (the Pod Identity agent is
    169.254.170.23) and never reads AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (added in v1.47.11): it
    cannot use Pod Identity, and with IMDS at hop limit 1 it has no credentials at all. The S3
    containers run files/s3sync.py in the image of the pod they serve, so no other image is pulled."""
    assert not [key for key, c in rendered.items() if "s5cmd" in json.dumps(c).lower()]
    for (name, cname), c in rendered.items():
        if cname in ("sync-from-s3", "upload"):
            server = next(s for (n, sc), s in rendered.items() if n == name and sc in ("vllm", "ray-worker", "compile", "idle"))
            assert c["image"] == server["image"], (name, cname)
            assert c["command"][:2] == ["python3", "/scripts/s3sync.py"]
