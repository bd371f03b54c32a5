"""How long the first Ready pod of a model waits for traffic when CoreDNS's cache holds the Service's
NXDOMAIN: real Envoy (the local gateway with the cluster's STRICT_DNS settings) behind two caching
DNS replicas that cache as CoreDNS v1.14.7 does, in front of gennstack.drill.service_dns.

Pinned upstream (coredns/coredns v1.14.7, the coredns add-on's v1.14.7-eksbuild.11):

* ``plugin/kubernetes/kubernetes.go``: answers carry ``defaultTTL`` 5 s unless the Corefile says
  ``ttl``; a headless Service without ready endpoints is NXDOMAIN with an SOA whose TTL and
  ``Minttl`` are that TTL (``plugin/backend_lookup.go`` ``SOA``: ``min(MinTTL, 300)``).
* ``plugin/cache/cache.go``: a denial (NXDOMAIN, NODATA) is kept for
  ``computeTTL(MinimalTTLWithMaximum(msg), minnttl, nttl)``, the SOA's TTL clamped to at least
  ``minNTTL`` = ``dnsutil.MinimalDefaultTTL`` 5 s (at most 30 s with EKS's ``cache 30``): 5 s; a
  cached answer is served with the TTL left (``item.go`` ``ttl``), keyed by name and type.
* EKS runs two CoreDNS replicas behind the ``kube-dns`` Service, each with its own cache; kube-proxy
  picks one per query flow. Here Envoy's queries go to them in turn, and the test itself plays
  another client (the other proxy) whose query puts the NXDOMAIN in the second replica's cache.

Envoy re-resolves an empty answer only after ``dns_refresh_rate`` (5 s, the chart's
``dns.dnsRefreshRate``), whatever its TTL (envoy ``strict_dns_cluster.cc``; measured in
test_gateway_dns_discovery_e2e.py). So a refresh that meets a cached NXDOMAIN left from before the
pod became Ready waits one more refresh: the worst case is about DNS_REFRESH_S + the 5 s negative
cache, about 10 s, not 5 s.
"""

from __future__ import annotations

import threading
import time

import pytest
from dnslib import QTYPE, RCODE, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from gennstack.config_base import frozen
from gennstack.drill.local import replica_pods, service_for, start_replicas
from gennstack.drill.service_dns import COREDNS_DEFAULT_TTL_S, ServiceDNS
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.envoy_common import DNS_REFRESH_S
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap

pytestmark = [pytest.mark.slow]

MODEL = "gpt-oss-20b"
# coredns v1.14.7 plugin/cache/cache.go minNTTL (dnsutil.MinimalDefaultTTL): the shortest a denial is kept.
COREDNS_MIN_NEGATIVE_TTL_S = 5
NEGATIVE_TTL_S = max(COREDNS_DEFAULT_TTL_S, COREDNS_MIN_NEGATIVE_TTL_S)
DEADLINE_S = 60.0


class CachingReplica:
    """One CoreDNS replica's cache in front of the Service DNS: denials kept NEGATIVE_TTL_S from when
    they were stored, answers for their TTL, per (name, type)."""

    def __init__(self, name: str, upstream: BaseResolver) -> None:
        self.name = name
        self._upstream = upstream
        self._cache: dict[tuple[str, int], tuple[float, DNSRecord]] = {}
        self._lock = threading.Lock()

    def resolve(self, request: DNSRecord, handler) -> tuple[DNSRecord, bool]:
        key = (str(request.q.qname).lower(), request.q.qtype)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now < hit[0]:
                reply = request.reply()
                reply.header.rcode = hit[1].header.rcode
                for rr in hit[1].rr:
                    reply.add_answer(rr)
                return reply, True
        reply = self._upstream.resolve(request, handler)
        ttl = NEGATIVE_TTL_S if reply.header.rcode == RCODE.NXDOMAIN or not reply.rr else min(r.ttl for r in reply.rr)
        with self._lock:
            self._cache[key] = (now + ttl, reply)
        return reply, False

    def fill(self, hostname: str) -> None:
        """Another client's query (A and AAAA) through this replica."""
        for qtype in ("A", "AAAA"):
            self.resolve(DNSRecord.question(hostname, qtype), None)


class KubeDNS(BaseResolver):
    """The kube-dns Service: each A query of Envoy (a refresh) to the next replica, its AAAA to the same one."""

    def __init__(self, replicas: list[CachingReplica]) -> None:
        self.replicas = replicas
        self.log: list[tuple[float, str, str, int, bool]] = []  # (time, replica, type, rcode, from cache)
        self._next = 0
        self._current = replicas[0]

    def resolve(self, request, handler):
        qtype = QTYPE[request.q.qtype]
        if qtype == "A":
            self._current = self.replicas[self._next % len(self.replicas)]
            self._next += 1
        reply, cached = self._current.resolve(request, handler)
        self.log.append((time.monotonic(), self._current.name, qtype, reply.header.rcode, cached))
        return reply


def _a_queries(dns: KubeDNS) -> list[tuple[float, str, str, int, bool]]:
    return [entry for entry in dns.log if entry[2] == "A"]


@pytest.mark.timing
def test_a_cached_nxdomain_holds_the_first_ready_pod_back_one_more_refresh() -> None:
    # no aliases: one route, so one STRICT_DNS cluster asks for the name (an alias to the model would be a second)
    gateway = GatewayConfig.model_validate(frozen({"resilience": {"health_interval_s": 1}, "aliases": {}}))
    with start_replicas(1, "--ttft", "0.01", "--itl", "0.01") as replicas:
        (replica,) = replicas
        pods = replica_pods(MODEL, replicas)
        for pod in pods:
            pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        service = service_for(MODEL)
        with ServiceDNS([service], lambda: pods) as service_dns:
            kube_dns = KubeDNS([CachingReplica("coredns-a", service_dns.resolver),
                                CachingReplica("coredns-b", service_dns.resolver)])
            server = DNSServer(kube_dns, address="127.0.0.1", port=0,
                               logger=DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False))
            server.start_thread()
            try:
                bootstrap = envoy_bootstrap(
                    routing_table(gateway), {MODEL: f"http://{service.hostname}:{replica.port}/v1"}, gateway,
                    LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0,
                                  dns_resolver=("127.0.0.1", server.server.server_address[1])))
                with LocalGateway.start(bootstrap) as gw:
                    deadline = time.monotonic() + DEADLINE_S
                    while not _a_queries(kube_dns):
                        assert time.monotonic() < deadline, "Envoy never asked for the Service"
                        time.sleep(0.02)
                    first = _a_queries(kube_dns)[0]
                    assert (first[1], first[3], first[4]) == ("coredns-a", RCODE.NXDOMAIN, False)
                    # 3 s later the other proxy asks coredns-b, which caches the NXDOMAIN, and the pod turns Ready
                    time.sleep(max(0.0, first[0] + 3.0 - time.monotonic()))
                    kube_dns.replicas[1].fill(service.hostname)
                    pods[0]["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
                    ready_at = time.monotonic()
                    while not gw.host_health():
                        assert time.monotonic() < deadline, f"Envoy never got the pod: {kube_dns.log}"
                        time.sleep(0.02)
                    joined_after = time.monotonic() - ready_at
                    after_ready = [(name, rcode, cached) for t, name, _, rcode, cached in _a_queries(kube_dns) if t > ready_at]
            finally:
                server.stop()
                server.server.server_close()
    print(f"first Ready pod in Envoy {joined_after:.2f} s after it was Ready (refresh {DNS_REFRESH_S} s, "
          f"negative cache {NEGATIVE_TTL_S} s); Envoy's A queries after Ready: {after_ready}")
    # Envoy's next refresh met coredns-b's cached NXDOMAIN, waited a whole refresh more, and the one
    # after that, from coredns-a (its entry from before had expired), brought the pod.
    assert after_ready[:2] == [("coredns-b", RCODE.NXDOMAIN, True), ("coredns-a", RCODE.NOERROR, False)]
    assert DNS_REFRESH_S + NEGATIVE_TTL_S == 10
