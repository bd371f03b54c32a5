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

The Job that records opens the gate too (``open_gate``): a deploy alone would not, since
CloudFormation re-runs the chart's ``helm upgrade`` only when the HelmChart resource's properties
change (aws-cdk-lib 2.275.0 aws-eks-v2/lib/helm-chart.js: ClusterName, Release, ChartAssetURL,
Values, ... all deterministic), so "deploy again" after staging was a no-op. The chart renders, per
generation whose gate is ``auto``, what its gate holds closed (ConfigMap
``gennstack-serving-staged-gates``, key ``<pool>.json``, mounted at /gates): the marker keys it needs
and the objects it closes. The stage Jobs (the staging account) may change them within Role
``gennstack-serving-open-staged-gates``, a compile Job's upload (its generation's own compile account)
within ``<pool>-compile-open-gate``, which names that generation's objects only. Once the marker the PATCH returned holds every key, each object gets the
change that a deploy with the gate open renders, and nothing else: the servers' and warm spares'
Deployments and the multi-node LeaderWorkerSets lose the pod templates' scheduling gate
``gennstack.io/staged`` and label ``gennstack.io/staged`` (a JSON merge patch of nulls: idempotent);
gen1-inf2's RayService (read first: a merge patch replaces a list whole, RFC 7386) gets its worker
group's counts, loses the worker template's gate and annotation and the head's label, sent with the
``resourceVersion`` it read, so a concurrent change answers 409 and is read again. The controllers
replace their gated pods (the Job patches no pod, whose own schedulingGates could only be removed
and whose template hash would still differ); LWS v0.10.0 accepts a template change
(pkg/webhooks/leaderworkerset_webhook.go ValidateUpdate guards only subGroupSize and subdomainPolicy)
and rolls its groups. A stale ``resourceVersion`` is refused as the API server's optimistic lock
does (k8s.io/apiserver pkg/storage OptimisticLockErrorMsg, apierrors.NewConflict: 409). The next ``helm upgrade`` reads the same marker, renders the gate open
and so changes nothing (tests/serving/test_staged_gate.py holds the patched objects to that render).
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
GATES_ROLE = "gennstack-serving-open-staged-gates"  # the stage Jobs' (staging account)
COMPILE_GATES_ROLE = "{pool}-compile-open-gate"  # a compile Job's upload's (its generation's compile account)
GATE = "gennstack.io/staged"  # the scheduling gate's name, and the label and annotation a closed gate sets
# Where each kind the gate closes lives in the API (group/version, plural).
KINDS = {"Deployment": "/apis/apps/v1", "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1",
         "RayService": "/apis/ray.io/v1"}
PLURALS = {"Deployment": "deployments", "LeaderWorkerSet": "leaderworkersets", "RayService": "rayservices"}


class Refused(Exception):
    """The API server refused the request (401, 403, 404, 422, ...): retrying cannot help."""

    def __init__(self, path: str, code: int, reason: str, method: str = "PATCH") -> None:
        super().__init__(f"{method} {path} answered HTTP {code}: {reason}")
        self.code = code


class Unreachable(Exception):
    """Every attempt failed with 429, a 5xx or a connection error."""


def namespace(account_dir: str) -> str:
    with open(os.path.join(account_dir, "namespace")) as f:
        return f.read().strip()


def merge_patch(path: str, body: dict[str, Any], *, account_dir: str, host: str, port: str, attempts: int = ATTEMPTS,
                sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> dict[str, Any]:
    """PATCH ``path`` with ``body`` as ``application/merge-patch+json``; return the object the API returns."""
    return call("PATCH", path, body, account_dir=account_dir, host=host, port=port, attempts=attempts, sleep=sleep, log=log)


def get(path: str, *, account_dir: str, host: str, port: str, attempts: int = ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] = print) -> dict[str, Any]:
    """GET ``path``; return the object."""
    return call("GET", path, None, account_dir=account_dir, host=host, port=port, attempts=attempts, sleep=sleep, log=log)


def call(method: str, path: str, body: dict[str, Any] | None, *, account_dir: str, host: str, port: str,
         attempts: int = ATTEMPTS, sleep: Callable[[float], None] = time.sleep,
         log: Callable[[str], None] = print) -> dict[str, Any]:
    """One request with the pod's token: refused (4xx but 429) is final, the rest is retried."""
    with open(os.path.join(account_dir, "token")) as f:
        token = f.read().strip()
    url = f"https://{f'[{host}]' if ':' in host else host}:{port}{path}"  # an IPv6 service address needs brackets
    context = ssl.create_default_context(cafile=os.path.join(account_dir, "ca.crt"))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = MERGE_PATCH
    attempt = 0
    while True:
        attempt += 1
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with opener.open(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            reason = status_message(exc.read())
            if exc.code != 429 and exc.code < 500:
                raise Refused(path, exc.code, reason, method) from None
            problem = f"HTTP {exc.code}: {reason}"
        except OSError as exc:  # refused, reset, timed out, TLS
            problem = f"{type(exc).__name__}: {exc}"
        if attempt == attempts:
            raise Unreachable(f"{method} {path} failed {attempts} times, last with {problem}")
        log(f"{method} {path}: {problem}; retrying")
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
                log: Callable[[str], None] = print) -> dict[str, str]:
    """Record ``prefix`` as staged in the ConfigMap ``configmap`` of this pod's namespace; return its
    ``data`` as the API answered (every key recorded so far).

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
    log(f"recorded {kind} {prefix} in ConfigMap {ns}/{configmap} ({key})")
    return got["data"]


def read_gate(path: str) -> dict[str, Any] | None:
    """The chart's description of a generation's gate (``/gates/<pool>.json``), or None when the chart
    rendered none (its ``staged`` is forced ``true`` or ``false``: a deploy decides, not the Job)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def template_opened() -> dict[str, Any]:
    """A JSON merge patch of a pod template: without the staged gate's scheduling gate and label."""
    return {"metadata": {"labels": {GATE: None}}, "spec": {"schedulingGates": None}}


def object_path(kind: str, namespace_: str, name: str) -> str:
    return f"{KINDS[kind]}/namespaces/{namespace_}/{PLURALS[kind]}/{name}"


def ray_service_opened(obj: dict[str, Any], target: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that opens a RayService's gate (what the chart renders open), or None if open.

    workerGroupSpecs is a list, which a merge patch replaces whole (RFC 7386), so the patch carries
    every group as read, the gated one changed, and the ``resourceVersion`` read (409 if it moved)."""
    cluster = obj["spec"]["rayClusterConfig"]
    groups = json.loads(json.dumps(cluster["workerGroupSpecs"]))
    matching = [g for g in groups if g.get("groupName") == target["group"]]
    if len(matching) != 1:
        raise RuntimeError(f"RayService {target['name']}: no worker group {target['group']!r} "
                           f"(has {[g.get('groupName') for g in groups]})")
    [group] = matching
    template = group.setdefault("template", {})
    annotations = template.setdefault("metadata", {}).get("annotations") or {}
    head_labels = ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
    gates = template.get("spec", {}).get("schedulingGates") or []
    if GATE not in annotations and GATE not in head_labels and not any(g.get("name") == GATE for g in gates):
        return None
    for count in ("replicas", "minReplicas", "maxReplicas"):
        group[count] = int(target[count])
    annotations.pop(GATE, None)
    template["metadata"]["annotations"] = annotations
    kept = [g for g in gates if g.get("name") != GATE]
    if kept:
        template["spec"]["schedulingGates"] = kept
    else:
        template.get("spec", {}).pop("schedulingGates", None)
    return {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": {"rayClusterConfig": {"workerGroupSpecs": groups,
                                          "headGroupSpec": {"template": {"metadata": {"labels": {GATE: None}}}}}}}


def open_gate(gate: dict[str, Any], data: dict[str, str], *, account_dir: str, host: str, port: str,
              attempts: int = ATTEMPTS, sleep: Callable[[float], None] = time.sleep,
              log: Callable[[str], None] = print, role: str = GATES_ROLE) -> list[str]:
    """Open ``gate`` (read_gate) when the marker's ``data`` holds every key it requires; return the
    objects patched ("Kind namespace/name"), none while something is still missing. ``role``: the
    chart's Role that allows it to this Job's account (``{pool}`` filled in), named when refused.

    Raises ``RuntimeError`` with what to do when the API refuses or cannot be reached."""
    missing = [prefix for key, prefix in sorted(gate["requires"].items()) if data.get(key) != prefix]
    if missing:
        log(f"gate of {gate['pool']} stays closed: ConfigMap {gate['marker']} does not record {', '.join(missing)} yet")
        return []
    api = {"account_dir": account_dir, "host": host, "port": port, "attempts": attempts, "sleep": sleep, "log": log}
    opened = []
    for target in gate["targets"]:
        kind, ns, name = target["kind"], target["namespace"], target["name"]
        path = object_path(kind, ns, name)
        try:
            if kind == "RayService":
                _open_ray_service(path, target, api)
            else:
                template = template_opened()
                spec = ({"template": template} if kind == "Deployment"
                        else {"leaderWorkerTemplate": {"leaderTemplate": template, "workerTemplate": template}})
                merge_patch(path, {"spec": spec}, **api)
        except Refused as exc:
            raise RuntimeError(
                f"could not open the gate of {gate['pool']} on {kind} {ns}/{name}: {exc}. The Job's ServiceAccount needs "
                f"{'get and ' if kind == 'RayService' else ''}patch on {PLURALS[kind]}/{name} (Role "
                f"{role.format(pool=gate['pool'])} in {ns}); the marker records what is staged, so a deploy that runs "
                "helm upgrade opens it too.") from None
        except Unreachable as exc:
            raise RuntimeError(f"could not open the gate of {gate['pool']} on {kind} {ns}/{name}: {exc}") from None
        opened.append(f"{kind} {ns}/{name}")
    log(f"opened the gate of {gate['pool']}: {', '.join(opened)}")
    return opened


def _open_ray_service(path: str, target: dict[str, Any], api: dict[str, Any]) -> None:
    for _ in range(api["attempts"]):
        patch = ray_service_opened(get(path, **api), target)
        if patch is None:
            return
        try:
            merge_patch(path, patch, **api)
            return
        except Refused as exc:
            if exc.code != 409:  # 409: changed since it was read; read it again
                raise
            api["log"](f"PATCH {path}: {exc}; reading it again")
    raise Unreachable(f"PATCH {path} conflicted {api['attempts']} times")


def record_and_open(configmap: str, kind: str, prefix: str, gate_file: str | None, *, account_dir: str, host: str,
                    port: str, attempts: int = ATTEMPTS, sleep: Callable[[float], None] = time.sleep,
                    log: Callable[[str], None] = print, role: str = GATES_ROLE) -> list[str]:
    """mark_staged, then open_gate (within ``role``) with the chart's gate file (if it rendered one)."""
    api = {"account_dir": account_dir, "host": host, "port": port, "attempts": attempts, "sleep": sleep, "log": log}
    data = mark_staged(configmap, kind, prefix, **api)
    gate = read_gate(gate_file) if gate_file else None
    if gate is None:
        log(f"no gate to open from here ({gate_file or 'STAGED_GATE unset'}): its staged value is forced, a deploy sets it")
        return []
    return open_gate(gate, data, **api, role=role)
