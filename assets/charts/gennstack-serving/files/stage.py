"""Copies one model revision from the Hugging Face Hub into the models bucket, once.

Runs in the staging Job with the staging ServiceAccount's Pod Identity role. The Hub token is
read here, at run time, from AWS Secrets Manager (its SecretString: the token, or JSON with a
"token" key) and lives only in this process. Files go one at a time (download, upload with
boto3's managed multipart transfer, delete), so the pod's disk needs room for the largest file,
not the model. A `.gennstack-complete` object written last marks the revision complete; with it
present the Job does nothing, and files already uploaded with the right size are not copied again.

    env: AWS_REGION MODELS_BUCKET MODEL_PREFIX MODEL_ID MODEL_REVISION HF_TOKEN_SECRET, HF_HOME (scratch)
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from typing import Any

MARKER = ".gennstack-complete"
# Llama repositories also carry Meta's original consolidated checkpoints under original/
# (another full copy of the weights that vLLM never reads).
SKIP = ("original/*", "*.pth", ".gitattributes")


def hf_token(secrets: Any, secret_id: str) -> str:
    value = secrets.get_secret_value(SecretId=secret_id)["SecretString"].strip()
    if value.startswith("{"):
        value = json.loads(value)["token"]
    if not value:
        raise SystemExit(f"secret {secret_id} holds an empty token")
    return value


def _size(s3: Any, bucket: str, key: str) -> int | None:
    try:
        return s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    except s3.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def stage(*, hub: Any, s3: Any, bucket: str, prefix: str, model_id: str, revision: str, scratch: str, log=print) -> dict:
    """Copy ``model_id@revision`` to ``s3://bucket/prefix``; return what the marker records.

    ``hub`` is a ``huggingface_hub.HfApi`` with the token set; ``s3`` a boto3 S3 client.
    """
    marker = prefix + MARKER
    if _size(s3, bucket, marker) is not None:
        log(f"s3://{bucket}/{marker} exists: already staged")
        return json.loads(s3.get_object(Bucket=bucket, Key=marker)["Body"].read())
    info = hub.model_info(model_id, revision=revision, files_metadata=True)
    files = [f for f in info.siblings if not any(fnmatch.fnmatch(f.rfilename, p) for p in SKIP)]
    total = 0
    for file in files:
        key = prefix + file.rfilename
        total += file.size or 0
        if file.size is not None and _size(s3, bucket, key) == file.size:
            log(f"{key}: already uploaded")
            continue
        path = hub.hf_hub_download(model_id, file.rfilename, revision=info.sha, local_dir=scratch)
        s3.upload_file(path, bucket, key)
        os.remove(path)
        log(f"{key}: {file.size} bytes")
    record = {"model_id": model_id, "revision": revision, "commit": info.sha, "files": len(files), "bytes": total}
    s3.put_object(Bucket=bucket, Key=marker, Body=json.dumps(record).encode(), ContentType="application/json")
    log(f"staged {len(files)} files, {total / 1e9:.1f} GB, to s3://{bucket}/{prefix}")
    return record


def main() -> None:
    import boto3
    from huggingface_hub import HfApi

    env = os.environ
    region = env["AWS_REGION"]
    token = hf_token(boto3.client("secretsmanager", region_name=region), env["HF_TOKEN_SECRET"])
    stage(
        hub=HfApi(token=token), s3=boto3.client("s3", region_name=region), bucket=env["MODELS_BUCKET"],
        prefix=env["MODEL_PREFIX"], model_id=env["MODEL_ID"], revision=env["MODEL_REVISION"],
        scratch=env.get("HF_HOME", "/scratch"),
    )


if __name__ == "__main__":
    sys.exit(main())
