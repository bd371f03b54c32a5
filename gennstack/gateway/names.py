"""Kubernetes names the gateway chart gives model names, computed once, in Python.

Model names may hold capitals and ``._:/`` (``meta-llama/Llama-3.1-8B``); Kubernetes object names
and AIGatewayRoute rule names may not. Sanitizing (lowercase, ``._:/`` to ``-``) and truncating to
63 characters can map two model names to one Kubernetes name (``Llama-3`` and ``llama-3``, or two
long names with a common prefix), and the API server then rejects the objects (an AIGatewayRoute's
rule names must be unique: the CRD's ``x-kubernetes-validations``) or one Backend silently replaces
another. So the chart takes these names from its values, and the config refuses collisions
(:meth:`gennstack.gateway.config.GatewayConfig`) before anything is rendered.
"""

from __future__ import annotations

import re

# Envoy Gateway's own namespace, where it runs every Gateway's proxies (the gateway-helm release's).
ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"

# The project chart's release name; its fullname (the prefix of its objects) is the same.
GATEWAY_RELEASE = "gennstack-gateway"
# Kubernetes object names and AIGatewayRoute rule names: RFC 1123 labels, at most 63 characters here.
MAX_NAME = 63
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _slug(name: str) -> str:
    return re.sub(r"[._:/]", "-", name.lower())


def _label(prefix: str, name: str) -> str:
    label = f"{prefix}-{_slug(name)}"[:MAX_NAME].rstrip("-")
    if not _NAME_RE.match(label):  # the model-name pattern in config makes this unreachable
        raise ValueError(f"{name!r} gives {label!r}, not a Kubernetes name")
    return label


def rule_name(model: str) -> str:
    """Name of the AIGatewayRoute rule that matches ``model`` (a model name or an alias)."""
    return _label("model", model)


def backend_object_name(backend: str) -> str:
    """Name of the Backend and the AIServiceBackend of a model server (a model name from ``models``)."""
    return _label(GATEWAY_RELEASE, backend)


def collisions(names: list[str], to_name) -> dict[str, list[str]]:
    """Kubernetes names that more than one of ``names`` maps to, with the names that map to each."""
    by_name: dict[str, list[str]] = {}
    for name in names:
        by_name.setdefault(to_name(name), []).append(name)
    return {k8s: sorted(sources) for k8s, sources in by_name.items() if len(sources) > 1}


def backend_host(service: str, serving_namespace: str) -> str:
    """The name a model's Backend resolves: its headless Service in the serving namespace (the
    serving chart's ``vllm-servers.yaml``), whose DNS answer is the routable pods' addresses."""
    return f"{service}.{serving_namespace}.svc.cluster.local"
