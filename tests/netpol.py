"""A small evaluator of Kubernetes NetworkPolicy (networking.k8s.io/v1) semantics, for tests.

Given the rendered NetworkPolicies and the endpoints of the system (pods with their namespace,
labels and address; addresses outside any pod: S3, the internet, the EKS Pod Identity agent, the API
server's ClusterIP, nodes), :func:`allowed` says whether a connection from one to another on a port
is let through, as the Kubernetes documentation defines it
(kubernetes/website content/en/docs/concepts/services-networking/network-policies.md):

* a pod is isolated for ingress (egress) when a policy in its namespace selects it and has
  ``Ingress`` (``Egress``) among its policyTypes (policyTypes defaults to Ingress, plus Egress when
  the policy has egress rules); an isolated pod accepts (sends) only what some such policy's rule
  allows, the union of them all;
* a connection needs both: the source's egress and the destination's ingress;
* a rule with no ``from``/``to`` matches every peer, with no ``ports`` every port and protocol;
  a peer is a podSelector (the policy's namespace), a namespaceSelector (with an optional
  podSelector), or an ipBlock (``cidr`` less ``except``), which the VPC CNI's agent applies to pod
  addresses as to any other (an LPM trie of addresses: aws/aws-network-policy-agent v1.4.1
  pkg/fwruleprocessor/fw_rule_processor.go).

It refuses what the VPC CNI would resolve differently from the specification: named ports
(skipped for ipBlock peers by aws/amazon-network-policy-controller-k8s v1.1.7
pkg/resolvers/endpoints.go convertToPolicyInfoPortForCIDRs), so every port must be a number.
Not modelled: the agent always lets a pod's own node in (kubelet probes), and a Service's ClusterIP
is reached only through a rule whose podSelector matches the Service's selector (the policies here
reach ClusterIP Services that way, or by ipBlock for the API server).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """A pod (``namespace`` set) or an address outside every pod (``namespace`` None)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def namespace_labels(self) -> dict[str, str]:
        # Kubernetes labels every namespace with its name (kubernetes.io/metadata.name, since 1.22).
        return {"kubernetes.io/metadata.name": self.namespace} if self.namespace else {}


class UnsupportedPolicy(ValueError):
    """A policy the VPC CNI would not enforce as written (a named port)."""


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions); an empty one selects everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise UnsupportedPolicy(f"matchExpressions operator {operator!r}")
    return True


def _in_block(ip: str, block: Mapping[str, Any]) -> bool:
    address = ipaddress.ip_address(ip)
    network = ipaddress.ip_network(block["cidr"], strict=False)
    if address.version != network.version or address not in network:
        return False
    return not any(address in ipaddress.ip_network(cidr, strict=False)
                   for cidr in block.get("except") or [] if ipaddress.ip_network(cidr, strict=False).version == address.version)


def peer_matches(peer: Mapping[str, Any], policy_namespace: str, endpoint: Endpoint) -> bool:
    if "ipBlock" in peer:
        return _in_block(endpoint.ip, peer["ipBlock"])
    if endpoint.namespace is None:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], endpoint.namespace_labels):
            return False
    elif endpoint.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector"), endpoint.labels)


def port_matches(ports: Iterable[Mapping[str, Any]] | None, port: int, protocol: str) -> bool:
    ports = list(ports or [])
    if not ports:
        return True
    for entry in ports:
        number = entry.get("port")
        if isinstance(number, str):
            raise UnsupportedPolicy(f"named port {number!r}: the VPC CNI skips it for ipBlock peers; use the number")
        if entry.get("protocol", "TCP") != protocol:
            continue
        if number is None or number <= port <= entry.get("endPort", number):
            return True
    return False


def policy_types(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress", "Egress"] if spec.get("egress") else ["Ingress"])


def _selecting(policies: Iterable[Mapping[str, Any]], pod: Endpoint, direction: str) -> list[Mapping[str, Any]]:
    return [p for p in policies if p["metadata"]["namespace"] == pod.namespace and direction in policy_types(p)
            and selects(p["spec"]["podSelector"], pod.labels)]


def _direction_allows(policies: list[Mapping[str, Any]], pod: Endpoint, other: Endpoint, port: int, protocol: str,
                      direction: str) -> bool:
    selecting = _selecting(policies, pod, direction)
    if not selecting:
        return True  # not isolated in this direction
    rules_key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for policy in selecting:
        for rule in policy["spec"].get(rules_key) or []:
            peers = rule.get(peers_key)
            if (not peers or any(peer_matches(peer, policy["metadata"]["namespace"], other) for peer in peers)) \
                    and port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def allowed(policies: list[Mapping[str, Any]], source: Endpoint, destination: Endpoint, port: int,
            protocol: str = "TCP") -> bool:
    """Whether ``source`` may open a connection to ``destination`` on ``port``/``protocol``."""
    egress = source.namespace is None or _direction_allows(policies, source, destination, port, protocol, "Egress")
    ingress = destination.namespace is None or _direction_allows(policies, destination, source, port, protocol, "Ingress")
    return egress and ingress


def network_policies(objects: Iterable[Mapping[str, Any]], default_namespace: str) -> list[dict[str, Any]]:
    """The NetworkPolicies among rendered objects, each with its namespace filled in (helm leaves
    it out of objects in the release's namespace)."""
    out = []
    for obj in objects:
        if obj.get("kind") == "NetworkPolicy":
            copy = {**obj, "metadata": {**obj["metadata"]}}
            copy["metadata"].setdefault("namespace", default_namespace)
            out.append(copy)
    return out
