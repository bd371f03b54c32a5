"""``--upload s3://bucket/prefix``: copy a run's output directory to S3.

Files land under ``s3://bucket/prefix/<output directory name>/`` with the same relative
paths. The S3 client is an argument so tests can hand in one backed by moto; the default
uses boto3's credential chain (IRSA or EKS Pod Identity in the cluster).
"""

from __future__ import annotations

import mimetypes
from pathlib import Path
from urllib.parse import urlparse

_CONTENT_TYPES = {".json": "application/json", ".csv": "text/csv", ".html": "text/html; charset=utf-8"}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"--upload={uri!r}: expected s3://BUCKET or s3://BUCKET/PREFIX")
    return parsed.netloc, parsed.path.strip("/")


def upload_directory(directory: Path, uri: str, *, client=None) -> list[str]:
    """Upload every file under ``directory``; return the object keys written."""
    bucket, prefix = parse_s3_uri(uri)
    if client is None:
        import boto3  # imported here: only runs that upload need it

        client = boto3.client("s3")
    base = "/".join(part for part in (prefix, directory.name) if part)
    keys = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        key = f"{base}/{path.relative_to(directory).as_posix()}"
        content_type = _CONTENT_TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        client.upload_file(str(path), bucket, key, ExtraArgs={"ContentType": content_type})
        keys.append(key)
    return keys
