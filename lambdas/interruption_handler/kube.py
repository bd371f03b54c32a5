"""The Kubernetes calls the handler makes: get and patch the ``scale`` subresource of a Deployment or
of a LeaderWorkerSet (warm-spare groups); list nodes and pods and set one label on a pod (drain
routing, see ``drain.py``).

A LeaderWorkerSet's scale (LWS v0.10.0, ``api/leaderworkerset/v1/leaderworkerset_types.go``:
``+kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.hpaPodSelector``)
is the same ``autoscaling/v1`` Scale the API server serves for a Deployment, its replicas the number
of groups, at ``/apis/leaderworkerset.x-k8s.io/v1/namespaces/<ns>/leaderworkersets/<name>/scale``.

Standard library only: ``http.client`` over TLS verified against the cluster CA, a timeout on every
call, a fresh EKS token per request. Transient failures (429, 5xx, timeouts, dropped connections) are
retried a few times within the invocation's deadline, because Lambda's own retries come minutes
later, after a two-minute warning has run out. Everything else raises at once with a reason.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from .errors import HandlerError, Reason
from .field_owners import FIELD_MANAGER

MERGE_PATCH = "application/merge-patch+json"
MAX_BODY = 1 << 20
_STATUS_REASONS = {
    401: Reason.KUBE_UNAUTHORIZED,
    403: Reason.KUBE_FORBIDDEN,
    404: Reason.KUBE_NOT_FOUND,
    409: Reason.KUBE_CONFLICT,
}


# The workload resources whose scale the handler sets, and their API group paths.
SCALABLE = {"deployments": "/apis/apps/v1", "leaderworkersets": "/apis/leaderworkerset.x-k8s.io/v1"}


@dataclass(frozen=True)
class Scale:
    replicas: int
    resource_version: str


class _Transient(Exception):
    def __init__(self, error: HandlerError) -> None:
        self.error = error


class KubeClient:
    def __init__(
        self,
        *,
        endpoint: str,
        ca_pem: str,
        token: Callable[[], str],
        timeout: float,
        attempts: int = 3,
        backoff: float = 0.2,
        deadline: Callable[[], float] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``deadline()`` returns the seconds left for this invocation (None: unbounded)."""
        parts = urlsplit(endpoint)
        self._host = parts.hostname or ""
        self._port = parts.port or 443
        self._ssl = ssl.create_default_context(cadata=ca_pem)  # verifies the chain and the host name
        self._token = token
        self._timeout = timeout
        self._attempts = attempts
        self._backoff = backoff
        self._deadline = deadline
        self._sleep = sleep

    @staticmethod
    def scale_path(namespace: str, deployment: str, resource: str = "deployments") -> str:
        return f"{SCALABLE[resource]}/namespaces/{quote(namespace, safe='')}/{resource}/{quote(deployment, safe='')}/scale"

    def get_scale(self, namespace: str, deployment: str, resource: str = "deployments") -> Scale:
        return _scale(self._call("GET", self.scale_path(namespace, deployment, resource), None), namespace, deployment)

    def patch_scale(self, namespace: str, deployment: str, replicas: int, resource_version: str,
                    resource: str = "deployments") -> Scale:
        """Set ``spec.replicas``; the ``resourceVersion`` makes it conditional (409 when the scale moved)."""
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"replicas": replicas}}
        return _scale(self._call("PATCH", self.scale_path(namespace, deployment, resource), body), namespace, deployment)

    def list_items(self, path: str, *, label_selector: str) -> list[dict[str, Any]]:
        """``GET`` a collection (``/api/v1/nodes``, ``/api/v1/namespaces/<ns>/pods``) filtered by a label selector."""
        body = self._call("GET", f"{path}?{urlencode({'labelSelector': label_selector})}", None)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise HandlerError(Reason.KUBE_BAD_RESPONSE, "response is not a list (no items)", method="GET", path=path)
        return items

    @staticmethod
    def scaled_object_path(namespace: str, name: str) -> str:
        return f"/apis/keda.sh/v1alpha1/namespaces/{quote(namespace, safe='')}/scaledobjects/{quote(name, safe='')}"

    def get_scaled_object(self, namespace: str, name: str) -> dict[str, Any]:
        """A KEDA ScaledObject (return to spot reads its ``spec.minReplicaCount`` and its state annotation)."""
        return _scaled_object(self._call("GET", self.scaled_object_path(namespace, name), None), namespace, name)

    def patch_scaled_object(self, namespace: str, name: str, *, resource_version: str, annotations: dict[str, str],
                            min_replica_count: int | None = None) -> dict[str, Any]:
        """Merge-patch a ScaledObject's annotations (and ``spec.minReplicaCount``) at ``resource_version``:
        409 (``Reason.KUBE_CONFLICT``) when it changed since that read."""
        body: dict[str, Any] = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}
        if min_replica_count is not None:
            body["spec"] = {"minReplicaCount": min_replica_count}
        return self._scaled_object_patch(namespace, name, body)

    def put_scaled_object_managed_fields(self, namespace: str, name: str, *, resource_version: str,
                                         managed_fields: list[dict[str, Any]]) -> dict[str, Any]:
        """Replace a ScaledObject's ``metadata.managedFields`` (a merge patch replaces a list whole) at
        ``resource_version``, no value changed: the move's hand-back (field_owners.py)."""
        body = {"metadata": {"resourceVersion": resource_version, "managedFields": managed_fields}}
        return self._scaled_object_patch(namespace, name, body)

    def _scaled_object_patch(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"{self.scaled_object_path(namespace, name)}?{urlencode({'fieldManager': FIELD_MANAGER})}"
        return _scaled_object(self._call("PATCH", path, body), namespace, name)

    @staticmethod
    def pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"

    def patch_pod_labels(self, namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
        """Merge-patch ``metadata.labels`` of one pod (other labels untouched)."""
        return self._call("PATCH", self.pod_path(namespace, name), {"metadata": {"labels": labels}})

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        """Merge-patch ``metadata.annotations`` of one pod (other annotations untouched)."""
        return self._call("PATCH", self.pod_path(namespace, name), {"metadata": {"annotations": annotations}})

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        if not self._time_left(self._timeout):
            # Fail with a reason now rather than be cut off by Lambda's timeout mid-request.
            raise HandlerError(Reason.KUBE_TIMEOUT, "the invocation has no time left for another call", method=method, path=path)
        last: HandlerError | None = None
        for attempt in range(1, self._attempts + 1):
            try:
                return self._once(method, path, body)
            except _Transient as transient:
                last = transient.error
                last.context["attempts"] = attempt
                pause = self._backoff * 2 ** (attempt - 1)
                if attempt == self._attempts or not self._time_left(pause + self._timeout):
                    break
                self._sleep(pause)
        assert last is not None
        raise last

    def _time_left(self, needed: float) -> bool:
        return self._deadline is None or self._deadline() > needed

    def _once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        where = {"method": method, "path": path}
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = MERGE_PATCH
        connection = http.client.HTTPSConnection(self._host, self._port, context=self._ssl, timeout=self._timeout)
        try:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read(MAX_BODY + 1)
        except ssl.SSLCertVerificationError as exc:
            raise HandlerError(Reason.KUBE_UNREACHABLE, f"TLS verification against CLUSTER_CA failed: {exc.verify_message}", **where) from exc
        except (TimeoutError, socket.timeout) as exc:
            raise _Transient(HandlerError(Reason.KUBE_TIMEOUT, f"no answer within {self._timeout}s", **where)) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise _Transient(HandlerError(Reason.KUBE_UNREACHABLE, f"{type(exc).__name__}: {exc}", **where)) from exc
        finally:
            connection.close()
        status = response.status
        if 200 <= status < 300:
            if len(raw) > MAX_BODY:
                raise HandlerError(Reason.KUBE_BAD_RESPONSE, "response body over 1 MiB", status=status, **where)
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise HandlerError(Reason.KUBE_BAD_RESPONSE, "response is not JSON", status=status, **where) from exc
        error = HandlerError(
            _STATUS_REASONS.get(status, Reason.KUBE_SERVER_ERROR if status == 429 or status >= 500 else Reason.KUBE_BAD_RESPONSE),
            f"HTTP {status}: {_status_message(raw)}",
            status=status,
            **where,
        )
        if error.reason is Reason.KUBE_SERVER_ERROR:
            raise _Transient(error)
        raise error


def _scaled_object(body: Any, namespace: str, name: str) -> dict[str, Any]:
    """A ScaledObject answer (one with a ``metadata.resourceVersion``), else ``KUBE_BAD_RESPONSE``."""
    if not isinstance(body, dict) or not isinstance((body.get("metadata") or {}).get("resourceVersion"), str):
        raise HandlerError(Reason.KUBE_BAD_RESPONSE, "response is not a ScaledObject", namespace=namespace, name=name)
    return body


def _status_message(raw: bytes) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, or the start of whatever came back."""
    try:
        message = json.loads(raw).get("message")
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) else raw[:200].decode("utf-8", "replace")
    return text[:300]


def _scale(body: Any, namespace: str, deployment: str) -> Scale:
    try:
        replicas = body.get("spec", {}).get("replicas", 0)
        version = body["metadata"]["resourceVersion"]
    except (AttributeError, KeyError, TypeError) as exc:
        raise HandlerError(Reason.KUBE_BAD_RESPONSE, "response is not an autoscaling/v1 Scale", namespace=namespace, deployment=deployment) from exc
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not isinstance(version, str):
        raise HandlerError(Reason.KUBE_BAD_RESPONSE, "Scale has a non-integer replicas or no resourceVersion", namespace=namespace, deployment=deployment)
    return Scale(replicas, version)
