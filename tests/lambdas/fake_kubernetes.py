"""A local HTTPS server on 127.0.0.1 that plays the Kubernetes API for deployments/scale and
leaderworkersets/scale, and for listing nodes and pods (equality label selectors) and merge-patching a
pod's labels, and for getting and merge-patching a KEDA ScaledObject. Pods are Ready (``status.conditions``) unless added with ``ready=False``.

A LeaderWorkerSet's scale is the CRD's scale subresource (LWS v0.10.0, the CRD in
../shared/crds/leaderworkerset.x-k8s.io: ``subresources.scale`` with specReplicasPath
``.spec.replicas``, statusReplicasPath ``.status.replicas``, labelSelectorPath
``.status.hpaPodSelector``; ``spec.replicas`` minimum 0, maximum 1000000): an ``autoscaling/v1``
Scale whose replicas are the number of groups, conditional on ``metadata.resourceVersion`` like a
Deployment's (409), and a count outside the schema's bounds is refused (422) as the API server's
validation of the resulting object refuses it.

It authenticates like EKS would (a ``k8s-aws-v1.`` token whose presigned STS URL is correctly signed
for this cluster, else 401), keeps each Deployment's replicas and resourceVersion, honours the
resourceVersion precondition of a merge patch (409), and can be told to fail the next requests.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.lambdas.field_ownership import FieldManager
from tests.lambdas.sigv4 import BadSignature, verify_presigned_url
from tests.local_https import LocalHttpsServer, Seen, read_request, send

SCALE_PATH = "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale"
LWS_SCALE_PATH = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}/scale"
LWS_MAX_REPLICAS = 1_000_000  # the CRD's spec.replicas maximum


@dataclass
class Deployment:
    replicas: int = 0
    resource_version: int = 1


Fault = int | str | Callable[["FakeKubernetes", Seen], None]


@dataclass
class FakeKubernetes:
    cluster_name: str
    secret_key: Callable[[], str]  # the secret the signer used (moto swaps in its own credentials)
    certfile: str
    keyfile: str
    deployments: dict[tuple[str, str], Deployment] = field(default_factory=dict)
    # (namespace, name) -> a LeaderWorkerSet's replicas (groups) and resourceVersion
    leaderworkersets: dict[tuple[str, str], Deployment] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> Node
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (namespace, name) -> Pod
    # (namespace, name) -> a KEDA ScaledObject (keda.sh/v1alpha1; metadata.resourceVersion a string)
    scaled_objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    # server-side apply's ownership of ScaledObject fields (tests/lambdas/field_ownership.py), when set
    field_manager: FieldManager | None = None
    faults: deque[Fault] = field(default_factory=deque)
    hang_seconds: float = 1.0

    def start(self) -> str:
        self._lock = threading.Lock()
        self._https = LocalHttpsServer(
            self._serve, certfile=self.certfile, keyfile=self.keyfile, methods=("GET", "PATCH", "PUT")
        )
        return self._https.url

    def stop(self) -> None:
        self._https.stop()

    # -- views for the tests
    def patches(self) -> list[Seen]:
        return [r for r in self.requests if r.method == "PATCH"]

    def add_node(self, name: str, *, pool: str, instance_id: str, zone: str = "us-east-1a",
                 labels: dict[str, str] | None = None) -> None:
        """A node as Karpenter registers it; ``labels``: more of its labels (its NodePool template's
        ``gennstack.io/generation``, Karpenter's ``karpenter.sh/capacity-type``)."""
        self.nodes[name] = {"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": pool, **(labels or {})}},
                            "spec": {"providerID": f"aws:///{zone}/{instance_id}"}}

    def add_pod(self, namespace: str, name: str, *, node: str, labels: dict[str, str], ready: bool = True) -> None:
        """A scheduled pod whose ``Ready`` condition is ``"True"`` (``ready``) or ``"False"`` (a model still loading)."""
        condition = {"type": "Ready", "status": "True" if ready else "False"}
        self.pods[(namespace, name)] = {"metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                                        "spec": {"nodeName": node}, "status": {"phase": "Running", "conditions": [condition]}}

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        for condition in self.pods[(namespace, name)]["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition["status"] = "True" if ready else "False"

    def pod_labels(self, namespace: str, name: str) -> dict[str, str]:
        return self.pods[(namespace, name)]["metadata"]["labels"]

    def pod_patches(self) -> list[Seen]:
        return [r for r in self.requests if r.method == "PATCH" and "/pods/" in r.path]

    def replicas(self, namespace: str, name: str) -> int:
        return self.deployments[(namespace, name)].replicas

    # -- the API
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        seen = read_request(h)
        body = seen.body
        with self._lock:
            self.requests.append(seen)
            fault = self.faults.popleft() if self.faults else None
        if callable(fault):
            fault(self, seen)
            fault = None
        if fault == "hang":
            time.sleep(self.hang_seconds)
            self._send(h, seen, 504, _status(504, "too late"))
            return
        if isinstance(fault, int):
            self._send(h, seen, fault, _status(fault, f"injected {fault}"))
            return
        if fault == "not-json":
            self._send(h, seen, 200, b"<html>proxy</html>", content_type="text/html")
            return
        if not self._authenticated(seen):
            self._send(h, seen, 401, _status(401, "Unauthorized"))
            return
        url = urlsplit(h.path)
        if url.path.startswith("/apis/keda.sh/"):
            self._scaled_object(h, seen, url.path, parse_qs(url.query))
            return
        if url.path == "/api/v1/nodes" or url.path.startswith("/api/v1/namespaces/"):
            self._core(h, seen, url.path, parse_qs(url.query))
            return
        resource, key = _scalable_key(url.path)
        store = self.leaderworkersets if resource == "leaderworkersets" else self.deployments
        if key is None or key not in store:
            self._send(h, seen, 404, _status(404, f"{h.path} not found"))
            return
        with self._lock:
            deployment = store[key]
            if h.command == "PATCH":
                if seen.headers.get("content-type") != "application/merge-patch+json":
                    self._send(h, seen, 415, _status(415, "unsupported media type"))
                    return
                wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
                if wanted_rv is not None and wanted_rv != str(deployment.resource_version):
                    self._send(h, seen, 409, _status(409, "the object has been modified"))
                    return
                replicas = body["spec"]["replicas"]
                if resource == "leaderworkersets" and not 0 <= replicas <= LWS_MAX_REPLICAS:
                    self._send(h, seen, 422, _status(422, f"spec.replicas: Invalid value: {replicas}"))
                    return
                if replicas != deployment.replicas:
                    deployment.replicas = replicas
                    deployment.resource_version += 1
            elif h.command != "GET":
                self._send(h, seen, 405, _status(405, "method not allowed"))
                return
            payload = _scale(key, deployment, resource)
        self._send(h, seen, 200, json.dumps(payload).encode())

    def add_scaled_object(self, namespace: str, name: str, *, min_replicas: int, max_replicas: int) -> None:
        self.scaled_objects[(namespace, name)] = {
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1", "generation": 1},
            "spec": {"scaleTargetRef": {"name": name}, "minReplicaCount": min_replicas, "maxReplicaCount": max_replicas},
        }

    def min_replicas(self, namespace: str, name: str) -> int:
        return self.scaled_objects[(namespace, name)]["spec"]["minReplicaCount"]

    def scaled_object_patches(self) -> list[Seen]:
        return [r for r in self.requests if r.method == "PATCH" and "/scaledobjects/" in r.path]

    def helm_apply(self, config: dict[str, Any]) -> None:
        """Helm 4's server-side apply of the chart's ScaledObject (manager ``helm``, conflicts not
        forced); needs :attr:`field_manager`. :class:`tests.lambdas.field_ownership.Conflict` on a conflict."""
        assert self.field_manager is not None
        metadata = config["metadata"]
        key = (metadata["namespace"], metadata["name"])
        with self._lock:
            live = self.scaled_objects.get(key)
            applied = self.field_manager.apply(live, config, manager="helm")
            meta = applied["metadata"]
            meta["resourceVersion"] = str(int((live or {}).get("metadata", {}).get("resourceVersion", "0")) + 1)
            generation = (live or {}).get("metadata", {}).get("generation", 0)
            meta["generation"] = generation + 1 if live is None or applied.get("spec") != live.get("spec") else generation
            self.scaled_objects[key] = applied

    def _scaled_object(self, h: BaseHTTPRequestHandler, seen: Seen, path: str, query: dict[str, list[str]]) -> None:
        """GET and merge-patch (RFC 7386) a ScaledObject, conditional on ``metadata.resourceVersion`` (409);
        with :attr:`field_manager`, each patch's managedFields as the API server keeps them."""
        parts = path.split("/")  # ['', 'apis', 'keda.sh', 'v1alpha1', 'namespaces', ns, 'scaledobjects', name]
        with self._lock:
            obj = self.scaled_objects.get((parts[5], parts[7])) if len(parts) == 8 and parts[6] == "scaledobjects" else None
            if obj is None:
                self._send(h, seen, 404, _status(404, f"{path} not found"))
                return
            if h.command == "PATCH":
                if seen.headers.get("content-type") != "application/merge-patch+json":
                    self._send(h, seen, 415, _status(415, "unsupported media type"))
                    return
                metadata = seen.body.get("metadata") or {}
                if metadata.get("resourceVersion") not in (None, obj["metadata"]["resourceVersion"]):
                    self._send(h, seen, 409, _status(409, "the object has been modified"))
                    return
                live = copy.deepcopy(obj)
                if "managedFields" in metadata:  # a merge patch replaces a list whole
                    obj["metadata"]["managedFields"] = metadata["managedFields"]
                for key, value in (metadata.get("annotations") or {}).items():
                    target = obj["metadata"].setdefault("annotations", {})
                    if value is None:
                        target.pop(key, None)
                    else:
                        target[key] = value
                if "spec" in seen.body:
                    obj["spec"].update(seen.body["spec"])
                    obj["metadata"]["generation"] += 1
                if self.field_manager is not None:
                    manager = (query.get("fieldManager") or ["unknown"])[0]
                    obj["metadata"]["managedFields"] = self.field_manager.update(live, obj, manager=manager)
                obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            elif h.command != "GET":
                self._send(h, seen, 405, _status(405, "method not allowed"))
                return
            payload = json.dumps(obj).encode()
        self._send(h, seen, 200, payload)

    def _core(self, h: BaseHTTPRequestHandler, seen: Seen, path: str, query: dict[str, list[str]]) -> None:
        parts = path.split("/")
        with self._lock:
            if h.command == "GET" and path == "/api/v1/nodes":
                items = [n for n in self.nodes.values() if _matches(n, query)]
            elif h.command == "GET" and len(parts) == 6 and parts[5] == "pods":
                items = [p for (ns, _), p in self.pods.items() if ns == parts[4] and _matches(p, query)]
            elif h.command == "PATCH" and len(parts) == 7 and parts[5] == "pods":
                pod = self.pods.get((parts[4], parts[6]))
                if pod is None:
                    self._send(h, seen, 404, _status(404, f"pods {parts[6]!r} not found"))
                    return
                if seen.headers.get("content-type") != "application/merge-patch+json":
                    self._send(h, seen, 415, _status(415, "unsupported media type"))
                    return
                for field in ("labels", "annotations"):  # a JSON merge patch (RFC 7386): null removes
                    for key, value in (seen.body.get("metadata") or {}).get(field, {}).items():
                        target = pod["metadata"].setdefault(field, {})
                        if value is None:
                            target.pop(key, None)
                        else:
                            target[key] = value
                self._send(h, seen, 200, json.dumps(pod).encode())
                return
            else:
                self._send(h, seen, 404, _status(404, f"{h.command} {path} not found"))
                return
            body = {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}
        self._send(h, seen, 200, json.dumps(body).encode())

    def _authenticated(self, seen: Seen) -> bool:
        auth = seen.headers.get("authorization", "")
        prefix = "Bearer k8s-aws-v1."
        if not auth.startswith(prefix):
            return False
        encoded = auth[len(prefix) :]
        if "=" in encoded:
            return False
        try:
            url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            query = verify_presigned_url(url, secret_key=self.secret_key(), headers={"x-k8s-aws-id": self.cluster_name})
        except (ValueError, KeyError, BadSignature):
            return False
        return (
            query.get("Action") == "GetCallerIdentity"
            and "x-k8s-aws-id" in query["X-Amz-SignedHeaders"].split(";")  # EKS refuses tokens not bound to a cluster
            and (urlsplit(url).hostname or "").startswith("sts.")
        )

    def _send(self, h: BaseHTTPRequestHandler, seen: Seen, status: int, body: bytes, content_type: str = "application/json") -> None:
        send(h, seen, status, body, content_type)


def _matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """Equality label selectors, as the API server applies them (the handler sends no field selector)."""
    if query.get("fieldSelector"):
        raise AssertionError(f"the fake supports no field selector, got {query['fieldSelector']!r}")
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, ",".join(query.get("labelSelector", [])).split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _scalable_key(path: str) -> tuple[str, tuple[str, str] | None]:
    parts = path.split("/")
    # ['', 'apis', 'apps', 'v1', 'namespaces', ns, 'deployments', name, 'scale']
    # ['', 'apis', 'leaderworkerset.x-k8s.io', 'v1', 'namespaces', ns, 'leaderworkersets', name, 'scale']
    if len(parts) == 9 and parts[4] == "namespaces" and parts[8] == "scale":
        for group, resource in (("apps", "deployments"), ("leaderworkerset.x-k8s.io", "leaderworkersets")):
            if parts[1:4] == ["apis", group, "v1"] and parts[6] == resource:
                return resource, (parts[5], parts[7])
    return "", None


def _scale(key: tuple[str, str], deployment: Deployment, resource: str = "deployments") -> dict[str, Any]:
    # autoscaling/v1 ScaleSpec.replicas is omitempty: 0 is left out, for a CRD's scale as for a Deployment's.
    spec = {"replicas": deployment.replicas} if deployment.replicas else {}
    # A LeaderWorkerSet's selector is its status.hpaPodSelector (the leaders: worker-index 0).
    selector = (f"leaderworkerset.sigs.k8s.io/name={key[1]},leaderworkerset.sigs.k8s.io/worker-index=0"
                if resource == "leaderworkersets" else f"app={key[1]}")
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": key[1], "namespace": key[0], "resourceVersion": str(deployment.resource_version)},
        "spec": spec,
        "status": {"replicas": deployment.replicas, "selector": selector},
    }


def _status(code: int, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}).encode()
