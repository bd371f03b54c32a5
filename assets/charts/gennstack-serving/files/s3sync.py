"""Copies model data between S3 and a node's cache for the chart's Neuron pods, with boto3.

Runs with the `python3` of the pod's own image (the Neuron vLLM DLC installs boto3), so the init
container needs no other image and, like every boto3 client, takes its credentials from EKS Pod
Identity through botocore's container provider (`AWS_CONTAINER_CREDENTIALS_FULL_URI` +
`AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`, injected by the Pod Identity webhook). Transfers use
s3transfer's classic threaded manager: `S3_CONCURRENCY` parallel requests, 64 MiB parts.

    python3 s3sync.py pull   (init container sync-from-s3)
        env: MODELS_BUCKET MODEL_PREFIX MODEL_DIR [COMPILE_BUCKET COMPILE_PREFIX COMPILED_DIR]
             S3_CONCURRENCY, MODE = serve (default) | compile,
             MARKER_PREFIX (where the staging marker is, when MODEL_PREFIX is a part of the model:
             g6e copies only `<model prefix>tiktoken/`),
             MODEL_EXCLUDE (serve only: comma-separated fnmatch patterns of model keys not to copy;
             trn2 and inf2 serve from the presharded checkpoint in their compiled artifacts, so they leave
             the model's `*.safetensors` in S3 and copy only config and tokenizer files),
             COMPILE_OPTIONAL = true (serve, g6e: the compile set is vLLM's compile cache, a head
             start: when it is not in S3 yet the server starts without it and compiles itself),
             NEURON_CHECK = true (Neuron pods: first log the node's Neuron driver and the image's
             Neuron runtime, and exit 1 on a pair upstream says fails, files/neuron_compat.py;
             NEURON_DRIVER_FILE and DPKG_STATUS name where they are read, tests point them elsewhere)
        serve: the staged model (and, for Neuron, its compiled artifacts) must be complete in S3,
               else exit 1 naming the Job to run; then copy what is missing or differs.
        compile: exit 0 with /work/skip when the compile is already in S3; else the staging
               Job's marker must exist (that Job releases the suspended compile Job only after
               writing it, so there is nothing to wait for), then copy the weights.
    python3 s3sync.py push   (compile Job's upload container)
        env: COMPILE_BUCKET COMPILE_PREFIX COMPILED_DIR S3_CONCURRENCY STAGED_CONFIGMAP STAGED_GATE,
             KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT (set by the kubelet), SERVICE_ACCOUNT_DIR
        uploads a finished compile, then writes the marker serving requires; then (also when the
        compile was already in S3) records the prefix in the generation's `<pool>-staged`
        ConfigMap and, once it holds the weights too, opens the generation's gate
        (files/kube_patch.py record_and_open): no deploy needed.

Staged data is complete once its `.gennstack-complete` object exists. Only a missing object (404)
counts as "not there yet": any other error (no credentials, access denied) stops the pod at once
with the reason, so a broken credential chain never looks like "still waiting".
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MARKER = ".gennstack-complete"
PART = 64 * 1024 * 1024


class SyncError(Exception):
    """A condition the pod cannot serve or compile with; the message says what to do."""


def s3_client(concurrency: int) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(max_pool_connections=concurrency, retries={"max_attempts": 10, "mode": "standard"}))


def _transfer_config(concurrency: int) -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=concurrency,
                          use_threads=True, preferred_transfer_client="classic")


def exists(s3: Any, bucket: str, key: str) -> bool:
    """True when the object exists, False when S3 says 404; any other error is raised."""
    from botocore.exceptions import ClientError

    try:
        s3.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def listing(s3: Any, bucket: str, prefix: str) -> dict[str, tuple[int, float]]:
    """``{relative key: (size, last-modified epoch)}`` of every object under ``prefix`` but the marker."""
    out: dict[str, tuple[int, float]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if rel and rel != MARKER and not rel.endswith("/"):
                out[rel] = (obj["Size"], obj["LastModified"].timestamp())
    return out


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if root.resolve() not in path.parents:
        raise SyncError(f"refusing key {rel!r}: it would be written outside {root}")
    return path


def pull(s3: Any, bucket: str, prefix: str, dest: Path, concurrency: int, log: Callable[[str], None] = print,
         exclude: tuple[str, ...] = ()) -> int:
    """Copy ``s3://bucket/prefix`` into ``dest``: objects whose local copy is missing or differs in
    size or modification time, less those whose relative key matches an ``exclude`` pattern.
    Returns the bytes copied."""
    from boto3.s3.transfer import create_transfer_manager

    objects = listing(s3, bucket, prefix)
    skipped = {rel: size for rel, (size, _) in objects.items() if any(fnmatch.fnmatchcase(rel, p) for p in exclude)}
    if skipped:
        log(f"left {len(skipped)} files ({sum(skipped.values()) / 1e9:.2f} GB) matching {', '.join(exclude)} "
            f"in s3://{bucket}/{prefix}: the server does not read them")
        objects = {rel: meta for rel, meta in objects.items() if rel not in skipped}
    todo = []
    for rel, (size, mtime) in sorted(objects.items()):
        path = _inside(dest, rel)
        if path.is_file() and path.stat().st_size == size and int(path.stat().st_mtime) == int(mtime):
            continue
        todo.append((rel, path, size, mtime))
    started = time.monotonic()
    copied = sum(size for _, _, size, _ in todo)
    with create_transfer_manager(s3, _transfer_config(concurrency)) as manager:
        futures = []
        for rel, path, _, _ in todo:
            path.parent.mkdir(parents=True, exist_ok=True)
            futures.append(manager.download(bucket, prefix + rel, str(path)))
        for future in futures:
            future.result()
    for _, path, _, mtime in todo:
        os.utime(path, (mtime, mtime))  # what the next sync compares against
    _report(log, "pulled", len(todo), len(objects), copied, time.monotonic() - started, f"s3://{bucket}/{prefix}", str(dest))
    return copied


def push(s3: Any, src: Path, bucket: str, prefix: str, concurrency: int, log: Callable[[str], None] = print) -> int:
    """Upload every file under ``src`` to ``s3://bucket/prefix`` (those not already there with the
    same size), then write the marker. Returns the bytes uploaded."""
    from boto3.s3.transfer import create_transfer_manager

    # The compile (the model's code, without credentials) wrote src: a link out of it would make this
    # upload, which has credentials, copy another file of its container (its tokens) to S3.
    root = src.resolve()
    tree = _walk(src)
    for path in tree:
        if path.is_symlink() and root not in path.resolve().parents:
            raise SyncError(f"refusing to upload {path}: a link to {path.resolve()}, outside {src}")
    remote = listing(s3, bucket, prefix)
    files = sorted(p for p in tree if p.is_file())
    unreadable = [p for p in files if not os.access(p, os.R_OK)]
    if unreadable:
        raise SyncError(f"cannot read {len(unreadable)} compiled file(s), e.g. {unreadable[0]}: an incomplete set is never uploaded")
    if not files:
        raise SyncError(f"{src} holds no files: nothing compiled to upload")
    todo = [p for p in files if remote.get(p.relative_to(src).as_posix(), (None,))[0] != p.stat().st_size]
    started = time.monotonic()
    with create_transfer_manager(s3, _transfer_config(concurrency)) as manager:
        futures = [manager.upload(str(p), bucket, prefix + p.relative_to(src).as_posix()) for p in todo]
        for future in futures:
            future.result()
    uploaded = sum(p.stat().st_size for p in todo)
    record = {"compiled_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "files": len(files)}
    s3.put_object(Bucket=bucket, Key=prefix + MARKER, Body=json.dumps(record).encode(), ContentType="application/json")
    _report(log, "pushed", len(todo), len(files), uploaded, time.monotonic() - started, str(src), f"s3://{bucket}/{prefix}")
    return uploaded


def _walk(src: Path) -> list[Path]:
    """Every path under ``src``. Unlike ``Path.rglob``, which skips a directory it cannot list, a
    directory this process cannot read fails the upload (the compile runs as root and the upload
    does not: a set with a file left out must never be marked complete)."""
    def refuse(error: OSError) -> None:
        raise SyncError(f"cannot list {error.filename}: {error.strerror}; an incomplete set is never uploaded")

    paths: list[Path] = []
    for folder, dirs, names in os.walk(src, onerror=refuse):
        paths += [Path(folder) / name for name in dirs + names]
    return paths


def _report(log: Callable[[str], None], verb: str, done: int, total: int, size: int, seconds: float, src: str, dst: str) -> None:
    rate = size / seconds / 1e6 if seconds > 0 else 0.0
    log(f"{verb} {done} of {total} files ({size / 1e9:.2f} GB) from {src} to {dst} in {seconds:.1f} s ({rate:.0f} MB/s)")


def check_neuron(env: Mapping[str, str], log: Callable[[str], None] = print) -> None:
    """Before any copy: the node's Neuron driver must accept the image's Neuron runtime (a known-bad
    pair fails only at the server's nrt_init(), after the copy and the long load)."""
    import neuron_compat

    try:
        neuron_compat.check(log, Path(env.get("NEURON_DRIVER_FILE", str(neuron_compat.DRIVER_FILE))),
                            Path(env.get("DPKG_STATUS", str(neuron_compat.DPKG_STATUS))))
    except neuron_compat.IncompatibleNeuron as exc:
        raise SyncError(str(exc)) from None


def run_pull(env: Mapping[str, str], s3: Any, work: Path, log: Callable[[str], None] = print) -> None:
    mode = env.get("MODE", "serve")
    if mode not in ("serve", "compile"):
        raise SyncError(f"MODE: got {mode!r}; allowed: 'serve' or 'compile'")
    if env.get("NEURON_CHECK") == "true":
        check_neuron(env, log)
    concurrency = int(env["S3_CONCURRENCY"])
    bucket, prefix = env["MODELS_BUCKET"], env["MODEL_PREFIX"]
    marker = env.get("MARKER_PREFIX", prefix) + MARKER
    if mode == "compile":
        compile_bucket, compile_prefix = env["COMPILE_BUCKET"], env["COMPILE_PREFIX"]
        if exists(s3, compile_bucket, compile_prefix + MARKER):
            log(f"compiled artifacts already in s3://{compile_bucket}/{compile_prefix}: nothing to do")
            (work / "skip").touch()
            return
        if not exists(s3, bucket, marker):
            raise SyncError(f"s3://{bucket}/{marker} is missing, yet this compile Job runs: its staging Job releases it "
                            "(spec.suspend=false) only after writing that marker, so it was released by hand or the marker "
                            "was deleted. Let the staging Job finish (kubectl get jobs), then delete this compile Job and "
                            "deploy again: it is recreated suspended.")
    elif not exists(s3, bucket, marker):
        raise SyncError(f"s3://{bucket}/{marker} is missing: stage the model first (staging.enabled=true, see docs/serving.md)")
    # The compile Job reads every weight; only a server may leave some in S3.
    exclude = tuple(p for p in env.get("MODEL_EXCLUDE", "").split(",") if p) if mode == "serve" else ()
    pull(s3, bucket, prefix, Path(env["MODEL_DIR"]), concurrency, log, exclude)
    if mode == "serve" and env.get("COMPILE_PREFIX"):
        compile_bucket, compile_prefix = env["COMPILE_BUCKET"], env["COMPILE_PREFIX"]
        if env.get("COMPILE_OPTIONAL") == "true":
            pull_optional_cache(s3, compile_bucket, compile_prefix, Path(env["COMPILED_DIR"]), concurrency, log)
            return
        if not exists(s3, compile_bucket, compile_prefix + MARKER):
            raise SyncError(f"s3://{compile_bucket}/{compile_prefix}{MARKER} is missing: run the compile Job first "
                            "(staging.enabled=true); serving never compiles")
        pull(s3, compile_bucket, compile_prefix, Path(env["COMPILED_DIR"]), concurrency, log)


def pull_optional_cache(s3: Any, bucket: str, prefix: str, dest: Path, concurrency: int, log: Callable[[str], None]) -> None:
    """A cache the server does without (g6e: vLLM's compile cache): missing, or failing to come whole (S3
    refusing a read, an incomplete set), the server starts with none and compiles itself, never kept in Init."""
    import shutil

    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if not exists(s3, bucket, prefix + MARKER):
            log(f"no compile cache in s3://{bucket}/{prefix} yet: the server compiles at start "
                "(the compile Job stages one for the next pods)")
            return
        pull(s3, bucket, prefix, dest, concurrency, log)
    except (SyncError, BotoCoreError, ClientError) as exc:
        shutil.rmtree(dest, ignore_errors=True)  # nothing half-restored: vLLM would read what is there
        log(f"compile cache s3://{bucket}/{prefix} not restored ({exc}): the server compiles at start")


def run_push(env: Mapping[str, str], s3: Any, work: Path, log: Callable[[str], None] = print) -> None:
    if (work / "skip").exists():
        log("already compiled: nothing to upload")
    elif not (work / "compiled").exists():
        raise SyncError("no finished compile to upload")
    else:
        push(s3, Path(env["COMPILED_DIR"]), env["COMPILE_BUCKET"], env["COMPILE_PREFIX"], int(env["S3_CONCURRENCY"]), log)
    # Complete in S3 (uploaded now, or found there): record it in the generation's marker, which the
    # chart's gate reads, and open the gate (files/kube_patch.py). Imported here: the servers' pull never talks to the API.
    import kube_patch

    try:
        kube_patch.record_and_open(env["STAGED_CONFIGMAP"], "compiled", env["COMPILE_PREFIX"], env.get("STAGED_GATE"),
                                   account_dir=env.get("SERVICE_ACCOUNT_DIR", kube_patch.SERVICE_ACCOUNT_DIR),
                                   host=env["KUBERNETES_SERVICE_HOST"], port=env.get("KUBERNETES_SERVICE_PORT", "443"), log=log,
                                   role=kube_patch.COMPILE_GATES_ROLE)
    except RuntimeError as exc:
        raise SyncError(str(exc)) from None


def main(argv: list[str], env: Mapping[str, str]) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    commands = {"pull": run_pull, "push": run_push}
    if len(argv) != 1 or argv[0] not in commands:
        print(f"usage: s3sync.py {{{'|'.join(commands)}}}", file=sys.stderr)
        return 2
    work = Path(env.get("WORK_DIR", "/work"))
    try:
        commands[argv[0]](env, s3_client(int(env["S3_CONCURRENCY"])), work)
    except SyncError as exc:
        print(f"s3sync {argv[0]}: {exc}", file=sys.stderr)
        return 1
    except (BotoCoreError, ClientError) as exc:
        print(f"s3sync {argv[0]}: S3 refused or could not be reached: {exc}. Credentials come from the ServiceAccount's "
              "EKS Pod Identity association; check it exists and its role may use these buckets.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
