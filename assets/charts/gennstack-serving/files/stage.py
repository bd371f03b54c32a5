"""Copies one model revision from the Hugging Face Hub into the models bucket, once.

Runs in the staging Job with the staging ServiceAccount's Pod Identity role. The Hub token is
read here, at run time, from AWS Secrets Manager (its SecretString: the token, or JSON with a
"token" key) and lives only in this process.

- The revision (branch, tag or commit) is resolved to its commit once, and every file is
  downloaded at that commit, so a branch that moves while the Job runs cannot mix two commits.
- Each file is checked against the Hub's own digest before it is uploaded: the LFS sha256 for
  LFS files, the git blob id (sha1 of ``blob <size>\\0<content>``) for the rest. The object
  carries that digest and the commit as metadata, so a re-run skips exactly the files already
  uploaded from the same content.
- Files no server reads are skipped (``SKIP``).
- ``TIKTOKEN_ENCODINGS`` names tiktoken encodings the server would otherwise download at start
  (GPT-OSS: openai_harmony loads ``o200k_base``); each is fetched, checked against the sha256
  that tiktoken and openai_harmony pin, and stored under ``<prefix>tiktoken/``, from where the
  g6e pods copy it and point ``TIKTOKEN_ENCODINGS_BASE`` at it.

Files go one at a time (download, check, upload with boto3's managed multipart transfer, delete),
so the pod's disk needs room for the largest file, not the model. A `.gennstack-complete` object
written last marks the revision complete and records the commit; with it present the Job does
nothing, and it fails when the revision now resolves to another commit.

Once the model is staged (copied now, or found complete), ``COMPILE_JOB`` (every generation's compile Job; g6e's stages vLLM's compile cache) is
released (below); then the model is recorded in the generation's ``STAGED_CONFIGMAP``
(``<pool>-staged``, key ``model-<h>``: files/kube_patch.py), the marker the chart's gate reads, and
when that completes what the gate needs (``STAGED_GATE``: g6e and the multi-node model need the weights
only; Neuron generations also their compiled artifacts, which ``s3sync.py push`` records and then
opens), this Job opens the gate itself: the servers and warm spares may request accelerator nodes
without another deploy (kube_patch.open_gate). The multi-node
model (``multiNode``) has a stage Job of its own running this script, with its own marker
(``gen3-g6e-multinode-staged``) and no compile Job. The chart's
Role ``gennstack-serving-staged-markers`` allows exactly ``patch`` on those ConfigMaps, and
``gennstack-serving-open-staged-gates`` exactly what the gates close.

The compile Job is released: the chart creates that compile Job with ``spec.suspend: true``, so it has no pod and
Karpenter launches no on-demand accelerator node while this Job downloads, and this Job sets
``spec.suspend=false`` with a JSON merge patch on ``/apis/batch/v1/namespaces/<ns>/jobs/<name>``,
authenticated with the pod's ServiceAccount token (the chart's Role allows exactly ``patch`` on that
Job by name). A refused patch (401/403/404/422) of either fails this Job at once, with the API
server's reason; 429, 5xx and connection errors are retried a few times.

Kubernetes' contract (k8s.io/api batch/v1/types.go, JobSpec.suspend, kubernetes-1.36.0): "If a Job
is created with suspend set to true, no Pods are created by the Job controller"; flipping it back
to false starts the Job, and "Suspending a Job will reset the StartTime field of the Job,
effectively resetting the ActiveDeadlineSeconds timer too" (JobSpec.activeDeadlineSeconds: "this
timer will effectively be stopped and reset when the Job is resumed again"), so the compile Job's
deadline counts from its release, not from the start of staging.

    env: AWS_REGION MODELS_BUCKET MODEL_PREFIX MODEL_ID MODEL_REVISION HF_TOKEN_SECRET, HF_HOME (scratch),
         TIKTOKEN_ENCODINGS (space-separated names, optional), STAGED_CONFIGMAP, STAGED_GATE (the chart's
         /gates/<pool>.json; none: the gate is forced and a deploy sets it), COMPILE_JOB (optional),
         KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT (set by the kubelet), SERVICE_ACCOUNT_DIR
         (default: where Kubernetes mounts the token, namespace and CA)
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import kube_patch  # files/kube_patch.py, beside this script in /scripts

MARKER = ".gennstack-complete"
# Never read by the servers: Meta's original consolidated checkpoints (`original/`, another full
# copy of Llama's weights; GPT-OSS's `original/` likewise), GPT-OSS's Apple Metal weights
# (`metal/`), PyTorch pickles and git attributes. vLLM 0.29.0 streams only top-level
# `*.safetensors` (runai_streamer_loader.py -> list_safetensors, not recursive) and its
# LoadConfig ignores `original/**/*` by default.
SKIP = ("original/*", "metal/*", "*.pth", ".gitattributes")
TIKTOKEN_DIR = "tiktoken/"
TIKTOKEN_SOURCE = "https://openaipublic.blob.core.windows.net/encodings/"
# The sha256 openai_harmony 0.0.8 (and tiktoken's openai_public.py) check each file against.
TIKTOKEN_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
CHUNK = 8 * 1024 * 1024


class StagingError(SystemExit):
    """Stops the Job with a message saying what is wrong."""


def hf_token(secrets: Any, secret_id: str) -> str:
    value = secrets.get_secret_value(SecretId=secret_id)["SecretString"].strip()
    if value.startswith("{"):
        value = json.loads(value)["token"]
    if not value:
        raise StagingError(f"secret {secret_id} holds an empty token")
    return value


def hub_digest(sibling: Any) -> str:
    """The Hub's digest of one file: ``sha256:<hex>`` (LFS) or ``git-sha1:<hex>`` (a plain git blob)."""
    if sibling.lfs is not None:
        return f"sha256:{sibling.lfs.sha256}"
    if sibling.blob_id:
        return f"git-sha1:{sibling.blob_id}"
    raise StagingError(f"{sibling.rfilename}: the Hub gave neither an LFS sha256 nor a blob id (files_metadata off?)")


def file_digest(path: str, kind: str) -> str:
    size = os.path.getsize(path)
    digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return f"{kind}:{digest.hexdigest()}"


def _head(s3: Any, bucket: str, key: str) -> dict | None:
    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except s3.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def _upload(s3: Any, path: str, bucket: str, key: str, digest: str, commit: str) -> None:
    s3.upload_file(path, bucket, key, ExtraArgs={"Metadata": {"hub-digest": digest, "commit": commit}})


def _already(s3: Any, bucket: str, key: str, digest: str) -> bool:
    head = _head(s3, bucket, key)
    return head is not None and head.get("Metadata", {}).get("hub-digest") == digest


def fetch_url(url: str, path: str) -> None:
    with urllib.request.urlopen(url, timeout=60) as response, open(path, "wb") as out:
        while chunk := response.read(CHUNK):
            out.write(chunk)


def stage(*, hub: Any, s3: Any, bucket: str, prefix: str, model_id: str, revision: str, scratch: str,
          encodings: tuple[str, ...] = (), tiktoken_source: str = TIKTOKEN_SOURCE,
          fetch: Callable[[str, str], None] = fetch_url, log=print) -> dict:
    """Copy ``model_id@revision`` to ``s3://bucket/prefix``; return what the marker records.

    ``hub`` is a ``huggingface_hub.HfApi`` with the token set; ``s3`` a boto3 S3 client.
    """
    unknown = [e for e in encodings if e not in TIKTOKEN_SHA256]
    if unknown:
        raise StagingError(f"TIKTOKEN_ENCODINGS: got {unknown}; allowed: {sorted(TIKTOKEN_SHA256)}")
    info = hub.model_info(model_id, revision=revision, files_metadata=True)
    commit = info.sha
    log(f"{model_id}@{revision} is commit {commit}")
    marker = prefix + MARKER
    if _head(s3, bucket, marker) is not None:
        record = json.loads(s3.get_object(Bucket=bucket, Key=marker)["Body"].read())
        if record.get("commit") != commit:
            raise StagingError(
                f"s3://{bucket}/{prefix} holds commit {record.get('commit')} of {model_id}, but revision {revision!r} is now "
                f"commit {commit}; the servers keep the staged one. To serve the new commit, set the revision to {commit} "
                "(a new key prefix) and stage again."
            )
        log(f"s3://{bucket}/{marker} exists: commit {commit} already staged")
        return record
    files = [f for f in info.siblings if not any(fnmatch.fnmatch(f.rfilename, p) for p in SKIP)]
    total = 0
    for file in files:
        key = prefix + file.rfilename
        expected = hub_digest(file)
        total += file.size or 0
        if _already(s3, bucket, key, expected):
            log(f"{key}: already uploaded")
            continue
        path = hub.hf_hub_download(model_id, file.rfilename, revision=commit, local_dir=scratch)
        _check_and_upload(s3, path, bucket, key, expected, commit, what=f"{model_id}@{commit}/{file.rfilename}")
        log(f"{key}: {file.size} bytes, {expected}")
    for name in encodings:
        key = f"{prefix}{TIKTOKEN_DIR}{name}.tiktoken"
        expected = f"sha256:{TIKTOKEN_SHA256[name]}"
        if _already(s3, bucket, key, expected):
            log(f"{key}: already uploaded")
            continue
        path = os.path.join(scratch, f"{name}.tiktoken")
        fetch(f"{tiktoken_source}{name}.tiktoken", path)
        _check_and_upload(s3, path, bucket, key, expected, commit, what=f"{tiktoken_source}{name}.tiktoken")
        log(f"{key}: {expected}")
    record = {"model_id": model_id, "revision": revision, "commit": commit, "files": len(files), "bytes": total,
              "tiktoken": list(encodings)}
    s3.put_object(Bucket=bucket, Key=marker, Body=json.dumps(record).encode(), ContentType="application/json")
    log(f"staged {len(files)} files, {total / 1e9:.1f} GB, of commit {commit} to s3://{bucket}/{prefix}")
    return record


def _check_and_upload(s3: Any, path: str, bucket: str, key: str, expected: str, commit: str, *, what: str) -> None:
    try:
        got = file_digest(path, expected.split(":", 1)[0])
        if got != expected:
            raise StagingError(f"{what}: downloaded content has {got}, the source says {expected}; not uploaded")
        _upload(s3, path, bucket, key, expected, commit)
    finally:
        os.remove(path)


def job_path(namespace: str, name: str) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"


def release_compile_job(name: str, *, account_dir: str, host: str, port: str, attempts: int = kube_patch.ATTEMPTS,
                        sleep: Callable[[float], None] = time.sleep, log=print) -> None:
    """Un-suspend the compile Job ``name`` (``spec.suspend=false``) in this pod's namespace."""
    namespace = kube_patch.namespace(account_dir)
    path = job_path(namespace, name)
    try:
        job = kube_patch.merge_patch(path, {"spec": {"suspend": False}}, account_dir=account_dir, host=host, port=port,
                                     attempts=attempts, sleep=sleep, log=log)
    except kube_patch.Refused as exc:
        raise StagingError(
            f"could not release compile Job {name}: {exc}. The staging ServiceAccount needs patch on jobs/{name} (Role "
            "gennstack-serving-release-compile-jobs); the model is staged, so once that is fixed this Job's retry only "
            "releases the compile Job.") from None
    except kube_patch.Unreachable as exc:
        raise StagingError(f"could not release compile Job {name}: {exc}") from None
    if (job.get("spec") or {}).get("suspend") is not False:
        raise StagingError(f"PATCH {path} answered, but the Job's spec.suspend is {job.get('spec', {}).get('suspend')!r}, not false")
    log(f"released compile Job {namespace}/{name} (spec.suspend=false)")


def main() -> None:
    import boto3
    from huggingface_hub import HfApi

    env = os.environ
    region = env["AWS_REGION"]
    token = hf_token(boto3.client("secretsmanager", region_name=region), env["HF_TOKEN_SECRET"])
    stage(
        hub=HfApi(token=token), s3=boto3.client("s3", region_name=region), bucket=env["MODELS_BUCKET"],
        prefix=env["MODEL_PREFIX"], model_id=env["MODEL_ID"], revision=env["MODEL_REVISION"],
        scratch=env.get("HF_HOME", "/scratch"), encodings=tuple(env.get("TIKTOKEN_ENCODINGS", "").split()),
        tiktoken_source=env.get("TIKTOKEN_SOURCE", TIKTOKEN_SOURCE),
    )
    api = {"account_dir": env.get("SERVICE_ACCOUNT_DIR", kube_patch.SERVICE_ACCOUNT_DIR),
           "host": env["KUBERNETES_SERVICE_HOST"], "port": env.get("KUBERNETES_SERVICE_PORT", "443")}
    if env.get("COMPILE_JOB"):
        release_compile_job(env["COMPILE_JOB"], **api)
    # The weights are complete in S3: record it in the generation's marker, which the chart's gate reads,
    # and open the gate if nothing else is missing (g6e, multi-node; Neuron waits for its compile's upload).
    try:
        kube_patch.record_and_open(env["STAGED_CONFIGMAP"], "model", env["MODEL_PREFIX"], env.get("STAGED_GATE"), **api)
    except RuntimeError as exc:
        raise StagingError(str(exc)) from None


if __name__ == "__main__":
    sys.exit(main())
