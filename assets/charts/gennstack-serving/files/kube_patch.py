"""A JSON merge patch to the Kubernetes API with the pod's own ServiceAccount token, and the
``<pool>-staged`` marker ConfigMap that stage.py and ``s3sync.py push`` record into.

Standard library only (the staging Job runs in the vLLM image, the compile Job's upload container
in the Neuron DLC; neither has kubectl). The API server is reached at ``KUBERNETES_SERVICE_HOST``
and ``KUBERNETES_SERVICE_PORT`` (set by the kubelet) over HTTPS, checked against the mounted CA,
never through an HTTP(S)_PROXY from the environment. A refused request (a 4xx other than 429) is
final and raised with the API server's reason; 429, 5xx and connection errors are retried a few
times.

The marker (one ConfigMap per generation, created empty by the chart with
``helm.sh/resource-policy: keep``) holds one key per staged S3 prefix: ``model-<h>`` once the
weights are complete in the models bucket, ``compiled-<h>`` once the compiled artifacts are
complete in the compile-cache bucket, each with the prefix as its value, where ``<h>`` is the
first 16 hex digits of the prefix's sha256 (ConfigMap keys allow only ``[-._a-zA-Z0-9]``; the
chart's ``gennstack-serving.stagedKey`` computes the same). A JSON merge patch of ``data`` adds
the key and keeps every other one (RFC 7386), so revisions staged earlier stay recorded and the
chart's gate (``gennstack-serving.staged``) opens for whichever one a deploy renders.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MERGE_PATCH = "application/merge-patch+json"
ATTEMPTS = 5
MARKER_ROLE = "gennstack-serving-staged-markers"


class Refused(Exception):
    """The API server refused the request (401, 403, 404, 422, ...): retrying cannot help."""

    def __init__(self, path: str, code: int, reason: str) -> None:
        super().__init__(f"PATCH {path} answered HTTP {code}: {reason}")
        self.code = code


class Unreachable(Exception):
    """Every attempt failed with 429, a 5xx or a connection error."""


def namespace(account_dir: str) -> str:
    with open(os.path.join(account_dir, "namespace")) as f:
        return f.read().strip()


def merge_patch(path: str, body: dict[str, Any], *, account_dir: str, host: str, port: str, attempts: int = ATTEMPTS,
                sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> dict[str, Any]:
    """PATCH ``path`` with ``body`` as ``application/merge-patch+json``; return the object the API returns."""
    with open(os.path.join(account_dir, "token")) as f:
        token = f.read().strip()
    url = f"https://{f'[{host}]' if ':' in host else host}:{port}{path}"  # an IPv6 service address needs brackets
    context = ssl.create_default_context(cafile=os.path.join(account_dir, "ca.crt"))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    data = json.dumps(body).encode()
    attempt = 0
    while True:
        attempt += 1
        request = urllib.request.Request(url, data=data, method="PATCH", headers={
            "Authorization": f"Bearer {token}", "Content-Type": MERGE_PATCH, "Accept": "application/json"})
        try:
            with opener.open(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            reason = status_message(exc.read())
            if exc.code != 429 and exc.code < 500:
                raise Refused(path, exc.code, reason) from None
            problem = f"HTTP {exc.code}: {reason}"
        except OSError as exc:  # refused, reset, timed out, TLS
            problem = f"{type(exc).__name__}: {exc}"
        if attempt == attempts:
            raise Unreachable(f"PATCH {path} failed {attempts} times, last with {problem}")
        log(f"PATCH {path}: {problem}; retrying")
        sleep(2 ** attempt)


def status_message(raw: bytes) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, or the start of whatever came back."""
    try:
        message = json.loads(raw).get("message")
    except (ValueError, AttributeError):
        message = None
    return (message if isinstance(message, str) else raw[:200].decode("utf-8", "replace"))[:300]


def staged_key(kind: str, prefix: str) -> str:
    """The marker's key for ``prefix``: ``model-<h>`` or ``compiled-<h>``."""
    if kind not in ("model", "compiled"):
        raise ValueError(f"kind: got {kind!r}; allowed: 'model' or 'compiled'")
    return f"{kind}-{hashlib.sha256(prefix.encode()).hexdigest()[:16]}"


def configmap_path(namespace_: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace_}/configmaps/{name}"


def mark_staged(configmap: str, kind: str, prefix: str, *, account_dir: str, host: str, port: str,
                attempts: int = ATTEMPTS, sleep: Callable[[float], None] = time.sleep,
                log: Callable[[str], None] = print) -> None:
    """Record ``prefix`` as staged in the ConfigMap ``configmap`` of this pod's namespace.

    Raises ``RuntimeError`` with what to do when the API refuses or cannot be reached."""
    ns = namespace(account_dir)
    path = configmap_path(ns, configmap)
    key = staged_key(kind, prefix)
    try:
        got = merge_patch(path, {"data": {key: prefix}}, account_dir=account_dir, host=host, port=port,
                          attempts=attempts, sleep=sleep, log=log)
    except Refused as exc:
        raise RuntimeError(
            f"could not record {prefix} in ConfigMap {configmap}: {exc}. The Job's ServiceAccount needs patch on "
            f"configmaps/{configmap} (Role {MARKER_ROLE} for the stage Jobs, <pool>-compile-marker for a compile "
            "Job's upload), and the chart creates that ConfigMap; what is staged "
            "stays in S3, so once that is fixed a re-run only records it.") from None
    except Unreachable as exc:
        raise RuntimeError(f"could not record {prefix} in ConfigMap {configmap}: {exc}") from None
    if (got.get("data") or {}).get(key) != prefix:
        raise RuntimeError(f"PATCH {path} answered, but data[{key!r}] is {(got.get('data') or {}).get(key)!r}, not {prefix!r}")
    log(f"recorded {kind} {prefix} in ConfigMap {ns}/{configmap} ({key}): the next deploy opens this generation's gate")
