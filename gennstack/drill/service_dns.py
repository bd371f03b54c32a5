"""A headless Service's DNS answer, served locally: the part of Kubernetes the gateway sees when a
serving pod's labels change.

In a cluster, the gateway reaches each model through a headless Service (``clusterIP: None``, the
serving chart's ``vllm-servers.yaml``): the EndpointSlice controller lists the pods that match the
Service's selector, and CoreDNS answers the Service's name with their addresses. Envoy Gateway
builds the AI Gateway's Backends (``fqdn``) as STRICT_DNS clusters that re-resolve at the records'
TTL (``internal/xds/translator/cluster.go`` at v1.8.3). Drain routing works through that chain: the
interruption handler sets ``gennstack.io/routable: "false"`` on a doomed node's pods, the Service's
selector asks for ``"true"``, so the pods drop out of the answer and Envoy removes them.

:class:`ServiceDNS` plays the EndpointSlice controller and CoreDNS together for the local gateway:
a DNS server on 127.0.0.1 (dnslib's, UDP and TCP) that answers each Service's name with the
``status.podIP`` of every Ready pod, read from ``pods()`` at the time of the query, whose labels match
the Service's selector and that is not being deleted; a Service with no such pod gets NXDOMAIN, as from
CoreDNS. What it leaves out: the controller's own delay
(about a second in a cluster, none here), readiness (a pod here is always ready; drain routing does
not touch readiness) and ports (STRICT_DNS takes the port from the Backend, as here).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

# CoreDNS's kubernetes plugin answers with a TTL of 5 s unless its Corefile says otherwise
# (coredns plugin/kubernetes README, "ttl": default 5, allowed 0 to 3600).
COREDNS_DEFAULT_TTL_S = 5

Pod = Mapping[str, Any]


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    """A Service's selector (equality on every key; Services have no set-based selectors) against a
    pod's labels. An empty selector selects nothing here: Kubernetes manages no endpoints for a
    Service without one."""
    labels = labels or {}
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def pod_ready(pod: Pod) -> bool:
    """The pod's ``Ready`` condition is ``"True"``. Kubernetes v1.36,
    ``staging/src/k8s.io/endpointslice/utils.go`` ``podToEndpoint``: ``ready :=
    service.Spec.PublishNotReadyAddresses || (serving && !terminating)`` with ``serving`` the pod's
    Ready condition and ``terminating`` its deletionTimestamp (the serving chart does not publish
    not-ready addresses); only ready endpoints are in a headless Service's answer."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def service_addresses(selector: Mapping[str, str], pods: Iterable[Pod]) -> list[str]:
    """The addresses the Service's name resolves to: matching Ready pods with an IPv4 ``status.podIP``,
    not being deleted, in pod-name order."""
    found = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        metadata = pod.get("metadata") or {}
        if metadata.get("deletionTimestamp") or not selector_matches(selector, metadata.get("labels")) or not pod_ready(pod):
            continue
        ip = (pod.get("status") or {}).get("podIP")
        if isinstance(ip, str):
            try:
                found.append(str(ipaddress.IPv4Address(ip)))
            except ValueError:
                continue
    return found


@dataclass(frozen=True)
class Service:
    """A headless Service: the name it is resolved by, and its selector."""

    hostname: str
    selector: Mapping[str, str]


class _Resolver(BaseResolver):
    def __init__(self, services: Mapping[str, Service], pods: Callable[[], Iterable[Pod]], ttl_s: int) -> None:
        self._services = {name.rstrip(".").lower(): service for name, service in services.items()}
        self._pods = pods
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self.queries = 0
        # (time.monotonic() at the query, its type, the addresses answered) for every query, in order:
        # what the gateway asked and when, as this server saw it
        self.answered: list[tuple[float, str, tuple[str, ...]]] = []

    def resolve(self, request: Any, handler: Any) -> Any:
        at = time.monotonic()
        with self._lock:
            self.queries += 1
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        service = self._services.get(name)
        addresses = [] if service is None else service_addresses(service.selector, self._pods())
        with self._lock:
            self.answered.append((at, QTYPE.get(request.q.qtype), tuple(addresses)))
        if not addresses:
            # CoreDNS's kubernetes plugin answers a headless Service without ready endpoints as it
            # answers an unknown name: NXDOMAIN.
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        if request.q.qtype in (QTYPE.A, QTYPE.ANY):
            for address in addresses:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=self._ttl))
        # AAAA and other types: the name exists, no records of that type (NOERROR, empty answer).
        return reply


class ServiceDNS:
    """DNS for headless Services over a pod source; ``with ServiceDNS(...) as dns:``, then give the
    local gateway ``dns.address`` as its resolver (``LocalSettings.dns_resolver``)."""

    def __init__(self, services: Iterable[Service], pods: Callable[[], Iterable[Pod]], *,
                 ttl_s: int = COREDNS_DEFAULT_TTL_S, attempts: int = 5) -> None:
        if not 1 <= ttl_s <= 3600:
            raise ValueError(f"ttl_s {ttl_s}: allowed 1 to 3600 (CoreDNS allows 0, but Envoy's STRICT_DNS cluster "
                             "re-resolves a TTL of 0 only at its dns_refresh_rate)")
        services = list(services)
        names = [s.hostname.rstrip(".").lower() for s in services]
        if len(set(names)) != len(names):
            raise ValueError(f"services {names}: a name is given twice")
        self.resolver = _Resolver({s.hostname: s for s in services}, pods, ttl_s)
        quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
        for _ in range(attempts):  # UDP and TCP on one port: the TCP bind can find the UDP port taken
            udp = DNSServer(self.resolver, address="127.0.0.1", port=0, logger=quiet)
            port = udp.server.server_address[1]
            try:
                tcp = DNSServer(self.resolver, address="127.0.0.1", port=port, tcp=True, logger=quiet)
            except OSError:
                udp.server.server_close()
                continue
            break
        else:
            raise OSError(f"no port free for both UDP and TCP on 127.0.0.1 in {attempts} attempts")
        self._udp, self._tcp = udp, tcp
        self.address = ("127.0.0.1", port)

    def start(self) -> ServiceDNS:
        self._udp.start_thread()
        self._tcp.start_thread()
        return self

    def stop(self) -> None:
        for server in (self._udp, self._tcp):
            if server.isAlive():
                server.stop()
            server.server.server_close()

    def __enter__(self) -> ServiceDNS:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
