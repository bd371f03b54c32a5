"""A Kubernetes API server on 127.0.0.1 (HTTPS) for the chart's compile gate: enough for helm's
``lookup`` and for stage.py's PATCH of a Job, and strict where those rely on the real one.

- Discovery (``/version``, ``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``) lists the
  kinds it is given, so helm can map every object of the chart (``helm template --dry-run=server``).
- Jobs live in ``jobs`` (``(namespace, name) -> object``); GET returns one or a 404 ``Status``.
- PATCH of a Job needs a known bearer token (else 401), ``Content-Type:
  application/merge-patch+json`` (else 415), and RBAC: the token's ServiceAccount must be bound to a
  Role whose rule allows ``patch`` on ``jobs`` in group ``batch`` for that name (else 403 with the
  API server's wording). Rules are evaluated as Kubernetes does (k8s.io/kubernetes
  pkg/apis/rbac/v1/evaluation_helpers.go: VerbMatches, APIGroupMatches, ResourceMatches,
  ResourceNameMatches, where an empty resourceNames allows every name). The body is applied as an
  RFC 7386 JSON merge patch and the Job is returned.
- Every request is recorded in ``requests``; ``faults`` makes the next PATCHes fail with a status.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from tests.local_https import LocalHttpsServer, Seen, read_request, send

MERGE_PATCH = "application/merge-patch+json"
# Kinds that are not namespaced, among those the chart renders.
CLUSTER_SCOPED = {"PriorityClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + ("es" if lower.endswith("s") else "s")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def rule_allows(rule: dict[str, Any], *, verb: str, group: str, resource: str, name: str) -> bool:
    """One PolicyRule against one request, as rbac/v1 evaluation_helpers.go matches them."""
    return (
        any(v in ("*", verb) for v in rule.get("verbs", []))
        and any(g in ("*", group) for g in rule.get("apiGroups", []))
        and any(r in ("*", resource) for r in rule.get("resources", []))
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
    )


@dataclass
class FakeKubeApi:
    certfile: str
    keyfile: str
    kinds: set[tuple[str, str]]  # (apiVersion, kind) to serve in discovery
    tokens: dict[str, str]  # bearer token -> user name ("system:serviceaccount:<ns>:<name>", or "admin")
    roles: list[dict[str, Any]] = field(default_factory=list)  # rendered Role objects, with .metadata.namespace
    bindings: list[dict[str, Any]] = field(default_factory=list)  # rendered RoleBinding objects, likewise
    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    deployments: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # served to GET only
    requests: list[Seen] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)  # statuses the next PATCHes answer instead (503: overloaded)

    def start(self) -> str:
        self._lock = threading.Lock()
        self._https = LocalHttpsServer(self._serve, certfile=self.certfile, keyfile=self.keyfile)
        return self._https.url

    @property
    def port(self) -> int:
        return self._https.port

    def stop(self) -> None:
        self._https.stop()

    def patches(self) -> list[Seen]:
        return [r for r in self.requests if r.method == "PATCH"]

    # -- the API
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        seen = read_request(h)
        body = seen.body
        with self._lock:
            self.requests.append(seen)
        auth = seen.headers.get("authorization", "")
        user = self.tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
        if user is None:
            return self._send(h, seen, 401, _status(401, "Unauthorized", "Unauthorized"))
        path = urlsplit(h.path).path
        discovery = self._discovery(path)
        if discovery is not None:
            if h.command != "GET":
                return self._send(h, seen, 405, _status(405, "method not allowed", "MethodNotAllowed"))
            return self._send(h, seen, 200, json.dumps(discovery).encode())
        parts = path.split("/")
        # ['', 'apis', 'apps', 'v1', 'namespaces', ns, 'deployments', name]: what helm's lookup reads
        if len(parts) == 8 and parts[1:5] == ["apis", "apps", "v1", "namespaces"] and parts[6] == "deployments":
            deployment = self.deployments.get((parts[5], parts[7]))
            if h.command != "GET":
                return self._send(h, seen, 405, _status(405, "method not allowed", "MethodNotAllowed"))
            if deployment is None:
                return self._send(h, seen, 404, _status(404, f'deployments.apps "{parts[7]}" not found', "NotFound"))
            return self._send(h, seen, 200, json.dumps(deployment).encode())
        # ['', 'apis', 'batch', 'v1', 'namespaces', ns, 'jobs', name]
        if len(parts) != 8 or parts[1:4] != ["apis", "batch", "v1"] or parts[4] != "namespaces":
            return self._send(h, seen, 404, _status(404, f"{path} not found", "NotFound"))
        namespace, resource, name = parts[5], parts[6], parts[7]
        if resource != "jobs":
            return self._send(h, seen, 404, _status(404, f"{resource} \"{name}\" not found", "NotFound"))
        with self._lock:
            job = self.jobs.get((namespace, name))
            if h.command == "GET":
                if job is None:
                    return self._send(h, seen, 404, _status(404, f'jobs.batch "{name}" not found', "NotFound"))
                return self._send(h, seen, 200, json.dumps(job).encode())
            if h.command != "PATCH":
                return self._send(h, seen, 405, _status(405, "method not allowed", "MethodNotAllowed"))
            if self.faults:
                code = self.faults.pop(0)
                return self._send(h, seen, code, _status(code, f"injected {code}", "ServiceUnavailable"))
            if not self._allowed(user, verb="patch", namespace=namespace, group="batch", resource="jobs", name=name):
                message = (f'jobs.batch "{name}" is forbidden: User "{user}" cannot patch resource "jobs" in API group '
                           f'"batch" in the namespace "{namespace}"')
                return self._send(h, seen, 403, _status(403, message, "Forbidden"))
            if seen.headers.get("content-type") != MERGE_PATCH:
                return self._send(h, seen, 415, _status(415, "the body of the request was in an unknown format", "UnsupportedMediaType"))
            if job is None:
                return self._send(h, seen, 404, _status(404, f'jobs.batch "{name}" not found', "NotFound"))
            patched = merge_patch(job, body)
            self.jobs[(namespace, name)] = patched
        return self._send(h, seen, 200, json.dumps(patched).encode())

    def _allowed(self, user: str, *, verb: str, namespace: str, group: str, resource: str, name: str) -> bool:
        if user == "admin":
            return True
        roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in self.roles}
        for binding in self.bindings:
            ns = binding["metadata"]["namespace"]
            if ns != namespace or binding["roleRef"]["kind"] != "Role":
                continue
            subjects = {f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"]
                        if s["kind"] == "ServiceAccount"}
            role = roles.get((ns, binding["roleRef"]["name"]))
            if user in subjects and role is not None and any(
                    rule_allows(rule, verb=verb, group=group, resource=resource, name=name) for rule in role["rules"]):
                return True
        return False

    def _discovery(self, path: str) -> dict[str, Any] | None:
        versions: dict[str, list[str]] = {}
        for api_version, _ in sorted(self.kinds):
            group, _, version = api_version.rpartition("/")
            if version not in versions.setdefault(group, []):
                versions[group].append(version)
        if path == "/version":
            return {"major": "1", "minor": "36", "gitVersion": "v1.36.0", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": versions.get("", []), "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups = [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                       "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                      for g, vs in sorted(versions.items()) if g]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if path == "/api/v1" or path.startswith("/apis/") and path.count("/") == 3:
            group_version = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
            resources = [{"name": plural(kind), "singularName": kind.lower(), "namespaced": kind not in CLUSTER_SCOPED,
                          "kind": kind, "verbs": ["get", "list", "create", "patch", "update", "delete"]}
                         for api_version, kind in sorted(self.kinds) if api_version == group_version]
            if not resources:
                return None
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}
        return None

    def _send(self, h: BaseHTTPRequestHandler, seen: Seen, status: int, body: bytes) -> None:
        send(h, seen, status, body)


def _status(code: int, message: str, reason: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                       "reason": reason, "code": code}).encode()


def write_kubeconfig(path: Any, *, server: str, ca_b64: str, namespace: str, token: str = "helm-admin") -> Any:
    """A kubeconfig for helm/kubectl against a fake API server on 127.0.0.1 (one user, one context)."""
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                  "clusters": [{"name": "fake", "cluster": {"server": server, "certificate-authority-data": ca_b64}}],
                  "users": [{"name": "helm", "user": {"token": token}}],
                  "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "helm", "namespace": namespace}}]}
    path.write_text(json.dumps(kubeconfig))
    return path
