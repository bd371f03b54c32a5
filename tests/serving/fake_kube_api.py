"""A Kubernetes API server on 127.0.0.1 (HTTPS) for the chart's compile and staged gates: enough for
helm's ``lookup``, stage.py's PATCH of a Job and the staged markers' PATCH of a ConfigMap, and strict
where those rely on the real one.

- Discovery (``/version``, ``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``) lists the
  kinds it is given, so helm can map every object of the chart (``helm template --dry-run=server``).
- Jobs, ConfigMaps, Deployments, RayServices, LeaderWorkerSets and Secrets live in ``jobs``,
  ``configmaps``, ``deployments``, ``rayservices``, ``leaderworkersets``, ``secrets``
  (``(namespace, name) -> object``); GET and (but for Secrets, which helm's lookup only reads) PATCH
  of one need a known
  bearer token (else 401) and RBAC: the token's user is "admin" or a ServiceAccount bound to a Role
  whose rule allows that verb on that resource in its group for that name (else 403 with the API
  server's wording, before the object is looked up). Rules are evaluated as Kubernetes does
  (k8s.io/kubernetes pkg/apis/rbac/v1/evaluation_helpers.go: VerbMatches, APIGroupMatches,
  ResourceMatches, ResourceNameMatches, where an empty resourceNames allows every name). A PATCH
  needs ``Content-Type: application/merge-patch+json`` (else 415), never creates (404), and applies
  the body as an RFC 7386 JSON merge patch, as the API server's merge-patch handler does
  (k8s.io/apiserver pkg/endpoints/handlers/patch.go, jsonpatch.MergePatch): maps merge key by key,
  so a patch of one ConfigMap ``data`` key keeps the others; the object is returned. A patch that
  carries ``metadata.resourceVersion`` is a precondition: another value than the stored one answers
  409 Conflict, as the API server's update does (k8s.io/apiserver pkg/registry/generic/registry/store.go
  Update: "the object has been modified; please apply your changes to the latest version and try
  again"); every applied patch bumps the stored resourceVersion.
- Every request is recorded in ``requests``; ``faults`` makes the next PATCHes fail with a status;
  ``races`` has another writer change an object just before the next PATCHes of its path.
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
    deployments: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    secrets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # served to GET only (helm's lookup)
    configmaps: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    rayservices: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    leaderworkersets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)  # statuses the next PATCHes answer instead (503: overloaded)
    # path -> how many of its next PATCHes another writer beats (the stored resourceVersion moves first)
    races: dict[str, int] = field(default_factory=dict)

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
        target = self._object_path(path)
        if target is None:
            return self._send(h, seen, 404, _status(404, f"{path} not found", "NotFound"))
        group, resource, namespace, name = target
        qualified = f"{resource}.{group}" if group else resource
        store = {("batch", "jobs"): self.jobs, ("", "configmaps"): self.configmaps, ("apps", "deployments"): self.deployments,
                 ("", "secrets"): self.secrets, ("ray.io", "rayservices"): self.rayservices,
                 ("leaderworkerset.x-k8s.io", "leaderworkersets"): self.leaderworkersets}[(group, resource)]
        verb = {"GET": "get", "PATCH": "patch"}.get(h.command)
        if verb is None or (verb == "patch" and resource == "secrets"):  # secrets: helm's lookup only
            return self._send(h, seen, 405, _status(405, "method not allowed", "MethodNotAllowed"))
        with self._lock:
            if verb == "patch" and self.faults:
                code = self.faults.pop(0)
                return self._send(h, seen, code, _status(code, f"injected {code}", "ServiceUnavailable"))
            # Authorization comes before the object is looked up: a 403 never says whether it exists.
            if not self._allowed(user, verb=verb, namespace=namespace, group=group, resource=resource, name=name):
                message = (f'{qualified} "{name}" is forbidden: User "{user}" cannot {verb} resource "{resource}" in API group '
                           f'"{group}" in the namespace "{namespace}"')
                return self._send(h, seen, 403, _status(403, message, "Forbidden"))
            if verb == "patch" and seen.headers.get("content-type") != MERGE_PATCH:
                return self._send(h, seen, 415, _status(415, "the body of the request was in an unknown format", "UnsupportedMediaType"))
            obj = store.get((namespace, name))
            if obj is None:  # a merge patch never creates
                return self._send(h, seen, 404, _status(404, f'{qualified} "{name}" not found', "NotFound"))
            if verb == "patch" and self.races.get(path):
                self.races[path] -= 1
                obj["metadata"]["resourceVersion"] = str(int(obj["metadata"].get("resourceVersion", "1")) + 1)
            if verb == "patch":
                current = str(obj["metadata"].get("resourceVersion", "1"))
                wanted = (body.get("metadata") or {}).get("resourceVersion")
                if wanted is not None and str(wanted) != current:
                    message = (f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; '
                               "please apply your changes to the latest version and try again")
                    return self._send(h, seen, 409, _status(409, message, "Conflict"))
                obj = merge_patch(obj, body)
                obj["metadata"]["resourceVersion"] = str(int(current) + 1)
                store[(namespace, name)] = obj
        return self._send(h, seen, 200, json.dumps(obj).encode())

    @staticmethod
    def _object_path(path: str) -> tuple[str, str, str, str] | None:
        """``(group, resource, namespace, name)`` of a namespaced object path this fake serves."""
        parts = path.split("/")
        # ['', 'api', 'v1', 'namespaces', ns, 'configmaps', name]
        if len(parts) == 7 and parts[1:4] == ["api", "v1", "namespaces"] and parts[5] in ("configmaps", "secrets"):
            return "", parts[5], parts[4], parts[6]
        # ['', 'apis', <group>, 'v1', 'namespaces', ns, <resource>, name]
        if len(parts) == 8 and parts[1] == "apis" and parts[3:5] == ["v1", "namespaces"] and \
                (parts[2], parts[6]) in (("batch", "jobs"), ("apps", "deployments"), ("ray.io", "rayservices"),
                                         ("leaderworkerset.x-k8s.io", "leaderworkersets")):
            return parts[2], parts[6], parts[5], parts[7]
        return None

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


WORKLOADS = {"Deployment": "deployments", "RayService": "rayservices", "LeaderWorkerSet": "leaderworkersets"}


def install(api: FakeKubeApi, rendered: list[dict[str, Any]], namespace: str, release: str = "gennstack",
            workloads: bool = False) -> None:
    """What `helm install` of ``rendered`` leaves for the fake to enforce and serve: its Roles and
    RoleBindings, its ConfigMaps and Secrets and, with ``workloads``, its Deployments, RayServices and
    LeaderWorkerSets (as the API server returns them: in ``namespace`` unless the object names its
    own, with a resourceVersion, and with the ownership annotations helm v4 sets and checks before it
    adopts an existing object: pkg/action/validate.go checkOwnership)."""
    for obj in rendered:
        obj = json.loads(json.dumps(obj))
        obj["metadata"].setdefault("namespace", namespace)
        obj["metadata"]["resourceVersion"] = "1"
        obj["metadata"].setdefault("annotations", {}).update(
            {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace})
        where = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if obj["kind"] == "Role":
            api.roles.append(obj)
        elif obj["kind"] == "RoleBinding":
            api.bindings.append(obj)
        elif obj["kind"] == "ConfigMap":
            api.configmaps[where] = obj
        elif obj["kind"] == "Secret":
            api.secrets[where] = obj
        elif workloads and obj["kind"] in WORKLOADS:
            if obj["kind"] == "Deployment":  # apps/v1 SetDefaults_Deployment: an absent replicas is 1
                obj["spec"].setdefault("replicas", 1)
            getattr(api, WORKLOADS[obj["kind"]])[where] = obj


def service_account_dir(root: Any, *, token: str, namespace: str, ca_file: str) -> Any:
    """The files the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
    from pathlib import Path

    account = Path(root) / "serviceaccount"
    account.mkdir(parents=True, exist_ok=True)
    (account / "token").write_text(token + "\n")
    (account / "namespace").write_text(namespace)
    (account / "ca.crt").write_text(Path(ca_file).read_text())
    return account


def in_cluster_env(api: FakeKubeApi, account: Any) -> dict[str, str]:
    """What the kubelet sets for a pod to reach this API (and where its ServiceAccount files are)."""
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port), "SERVICE_ACCOUNT_DIR": str(account)}
