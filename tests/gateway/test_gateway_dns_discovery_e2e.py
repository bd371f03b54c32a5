"""The local gateway finding its servers through DNS, as the cluster's does, with real Envoy and a
real DNS server (dnslib's, in gennstack.drill.service_dns) answering a headless Service's name from
the pods' labels.

The cluster side is pinned to Envoy Gateway v1.8.3, ``internal/xds/translator/cluster.go``
(``buildXdsCluster``): a Backend's fqdn endpoint becomes a STRICT_DNS cluster with ``DnsRefreshRate``
30 s, ``RespectDnsTtl: true``, ``DnsLookupFamily`` V4_PREFERRED (``computeDNSLookupFamily`` without a
DNS policy), and every cluster has ``IgnoreHealthOnHostRemoval: true``. What is exercised here, on
Envoy itself: a pod whose ``gennstack.io/routable`` label turns "false" leaves the answer, Envoy
drops it within the TTL although its health checks pass, takes no new request on it, and lets the
streams it holds finish; without ``ignore_health_on_host_removal`` (Envoy's default) the same host
would keep taking requests while healthy, which is why the setting matters.
"""

from __future__ import annotations

import threading
import time

import pytest

from gennstack.config_base import frozen
from gennstack.drill.local import ROUTABLE_LABEL, replica_pods, service_for, start_replicas
from gennstack.drill.service_dns import ServiceDNS
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.envoy_common import DNS_REFRESH_S
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap
from tests.mock_llm import stream_chat, wait_arrived

pytestmark = [pytest.mark.slow]

MODEL = "gpt-oss-20b"
TTL_S = 1


def _gateway_config() -> GatewayConfig:
    # least request: these tests spread identical requests over the replicas (prefix routing would
    # keep them on one; test_gateway_prefix_routing.py tests that)
    return GatewayConfig.model_validate(frozen({"resilience": {"health_interval_s": 1},
                                                "routing": {"generations": {"g6e": "least_request"}}}))


def _bootstrap(hostname: str, port: int, dns: ServiceDNS, **settings) -> dict:
    gateway = _gateway_config()
    return envoy_bootstrap(routing_table(gateway), {MODEL: f"http://{hostname}:{port}/v1"}, gateway,
                           LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0,
                                         dns_resolver=dns.address, **settings))


def test_dns_clusters_are_built_as_envoy_gateway_builds_fqdn_backends() -> None:
    """Envoy Gateway v1.8.3 cluster.go, buildXdsCluster: STRICT_DNS, RespectDnsTtl, V4_PREFERRED,
    IgnoreHealthOnHostRemoval, and DnsRefreshRate 30 s unless the BackendTrafficPolicy's dns.dnsRefreshRate
    says otherwise (``if args.dns.DNSRefreshRate != nil``; gatewayapi/clustersettings.go copies it from the
    policy): GenNStack's says DNS_REFRESH_S (test_gateway_chart.py renders it). The name is kept for Envoy
    to resolve at the given server."""
    gateway = _gateway_config()
    bootstrap = envoy_bootstrap(routing_table(gateway), {MODEL: "http://gpt-oss-20b.example.internal:8000/v1"}, gateway,
                                LocalSettings(dns_resolver=("127.0.0.1", 5353)))
    (cluster,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "route-0"]
    assert cluster["type"] == "STRICT_DNS"
    assert (cluster["dns_refresh_rate"], cluster["respect_dns_ttl"], cluster["dns_lookup_family"]) == ("5s", True, "V4_PREFERRED")
    assert DNS_REFRESH_S == 5
    assert cluster["ignore_health_on_host_removal"] is True
    resolver = cluster["typed_dns_resolver_config"]["typed_config"]
    assert resolver["resolvers"] == [{"socket_address": {"address": "127.0.0.1", "port_value": 5353}}]
    assert resolver["use_resolvers_as_fallback"] is False
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert endpoint["endpoint"]["address"]["socket_address"] == {"address": "gpt-oss-20b.example.internal", "port_value": 8000}
    static = envoy_bootstrap(routing_table(gateway), {MODEL: "http://127.0.0.1:8000/v1"}, gateway, LocalSettings())
    (cluster,) = [c for c in static["static_resources"]["clusters"] if c["name"] == "route-0"]
    assert (cluster["type"], cluster["ignore_health_on_host_removal"]) == ("STATIC", True)


def _stream(base_url: str, tokens: int, results: list, index: int) -> None:
    results[index] = stream_chat(base_url, MODEL, tokens)


def _addresses(gw: LocalGateway) -> set[str]:
    return {key.rsplit(":", 1)[0] for key in gw.host_health()}


def _wait_addresses(gw: LocalGateway, wanted: set[str], timeout_s: float) -> float:
    start = time.monotonic()
    while _addresses(gw) != wanted:
        assert time.monotonic() - start < timeout_s, f"Envoy's hosts {_addresses(gw)}, wanted {wanted}"
        time.sleep(0.02)
    return time.monotonic() - start


# Deadlines for what Envoy does at its own pace (a DNS answer every TTL, or every DNS_REFRESH_S): generous,
# so that a busy machine only makes the test slower. What Envoy did is asserted from its own counts.
DEADLINE_S = 30.0


def _dns_updates(gw: LocalGateway) -> dict[str, int]:
    """Per DNS-resolved cluster, the answers Envoy has processed (its ``update_success`` counter)."""
    return {name.split(".")[1]: value for name, value in gw.stats("cluster.").items() if name.endswith(".update_success")}


def _updates_since(gw: LocalGateway, before: dict[str, int]) -> dict[str, int]:
    return {name: value - before[name] for name, value in _dns_updates(gw).items()}


def _members(gw: LocalGateway) -> dict[str, int]:
    """Per cluster, the hosts it holds (Envoy's ``membership_total``)."""
    return {name.split(".")[1]: value for name, value in gw.stats("cluster.").items() if name.endswith(".membership_total")}


@pytest.mark.timing
def test_a_pod_labelled_unroutable_takes_no_new_request_and_its_streams_finish(tmp_path) -> None:
    with start_replicas(2, "--ttft", "0.02", "--itl", "0.05") as replicas:
        doomed, survivor = replicas
        pods = replica_pods(MODEL, replicas)
        service = service_for(MODEL)
        with ServiceDNS([service], lambda: pods, ttl_s=TTL_S) as dns, \
                LocalGateway.start(_bootstrap(service.hostname, doomed.port, dns)) as gw:
            gw.wait_healthy(expect={f"{doomed.host}:{doomed.port}": True, f"{survivor.host}:{survivor.port}": True})
            # 6 streams of 3 s: least request over two hosts puts 3 on each
            results: list = [None] * 6
            threads = [threading.Thread(target=_stream, args=(gw.base_url, 60, results, i)) for i in range(6)]
            for thread in threads:
                thread.start()
            held = wait_arrived(replicas, 6)
            assert held >= 1, "no stream reached the doomed replica"
            before = _dns_updates(gw)
            pods[0]["metadata"]["labels"][ROUTABLE_LABEL] = "false"
            removed_after = _wait_addresses(gw, {survivor.host}, timeout_s=DEADLINE_S)
            # at the first answer without it (the second, if one was on its way when the label changed), as
            # Envoy counts its answers: not after its health checks fail (they pass)
            assert all(1 <= n <= 2 for n in _updates_since(gw, before).values()), _updates_since(gw, before)
            assert gw.host_health() == {f"{survivor.host}:{survivor.port}": True}
            before = doomed.stats()["chat_requests"]
            more: list = [None] * 10
            for i in range(10):
                _stream(gw.base_url, 2, more, i)
            for thread in threads:
                thread.join(timeout=30)
            print(f"doomed replica held {held} streams; Envoy dropped it {removed_after:.2f} s after the label "
                  f"changed (TTL {TTL_S} s); streams {results}")
            assert doomed.stats()["chat_requests"] == before == held
            assert [r[0] for r in more] == ["ok"] * 10
            # every stream the doomed replica held ran to its end after it left rotation
            assert results == [("ok", 60, True)] * 6
            assert doomed.stats()["completed_streams"] == held
            # back in rotation when the label returns (a rebalance that did not become an interruption)
            before = _dns_updates(gw)
            pods[0]["metadata"]["labels"][ROUTABLE_LABEL] = "true"
            # every cluster has it again (each resolves on its own schedule), at its first or second answer
            deadline = time.monotonic() + DEADLINE_S
            while set(_members(gw).values()) != {2}:
                assert time.monotonic() < deadline, (_members(gw), _updates_since(gw, before))
                time.sleep(0.02)
            assert all(1 <= n <= 2 for n in _updates_since(gw, before).values()), _updates_since(gw, before)
            assert _addresses(gw) == {doomed.host, survivor.host}


@pytest.mark.timing
def test_without_ignore_health_on_host_removal_a_healthy_removed_host_keeps_its_traffic(tmp_path) -> None:
    """Envoy's default, which Envoy Gateway turns off: a host gone from DNS stays while it passes its
    health checks (``pending_dynamic_removal``), so the label alone would not drain it."""
    with start_replicas(2, "--ttft", "0.01", "--itl", "0.01") as replicas:
        doomed, survivor = replicas
        pods = replica_pods(MODEL, replicas)
        service = service_for(MODEL)
        with ServiceDNS([service], lambda: pods, ttl_s=TTL_S) as dns:
            bootstrap = _bootstrap(service.hostname, doomed.port, dns)
            for cluster in bootstrap["static_resources"]["clusters"]:
                cluster["ignore_health_on_host_removal"] = False
            with LocalGateway.start(bootstrap) as gw:
                gw.wait_healthy(expect={f"{doomed.host}:{doomed.port}": True, f"{survivor.host}:{survivor.port}": True})
                before = _dns_updates(gw)
                pods[0]["metadata"]["labels"][ROUTABLE_LABEL] = "false"
                # until every cluster has processed two answers since the change: the second was asked for
                # after the first came back, so after the change, and it did not hold the pod
                deadline = time.monotonic() + DEADLINE_S
                while min(_updates_since(gw, before).values()) < 2:
                    assert time.monotonic() < deadline, _updates_since(gw, before)
                    time.sleep(0.05)
                assert _addresses(gw) == {doomed.host, survivor.host}
                before = doomed.stats()["chat_requests"]
                more: list = [None] * 10
                for i in range(10):
                    _stream(gw.base_url, 2, more, i)
                assert doomed.stats()["chat_requests"] > before


@pytest.mark.timing
def test_with_no_ready_pod_the_cluster_empties_and_comes_back_at_the_refresh_rate_not_the_ttl() -> None:
    """With no ready pod the Service's name is NXDOMAIN (CoreDNS's kubernetes plugin), Envoy's c-ares
    resolver takes that as an empty answer and removes every host, and a STRICT_DNS cluster re-resolves
    after an empty answer at ``dns_refresh_rate``, not at the TTL (envoy
    source/extensions/clusters/strict_dns/strict_dns_cluster.cc, startResolve: the TTL is used only for a
    non-empty response). So a model left without a ready pod answers 503 until a pod is back AND the
    refresh comes: up to DNS_REFRESH_S (5 s, GenNStack's BackendTrafficPolicy; Envoy Gateway's default
    30 s). And it is why the interruption handler never drains a generation's last serving replica."""
    with start_replicas(1, "--ttft", "0.01", "--itl", "0.01") as replicas:
        (only,) = replicas
        pods = replica_pods(MODEL, replicas)
        service = service_for(MODEL)
        with ServiceDNS([service], lambda: pods, ttl_s=TTL_S) as dns, \
                LocalGateway.start(_bootstrap(service.hostname, only.port, dns)) as gw:
            gw.wait_healthy(expect={f"{only.host}:{only.port}": True})
            changed = time.monotonic()
            pods[0]["metadata"]["labels"][ROUTABLE_LABEL] = "false"
            _wait_addresses(gw, set(), timeout_s=DEADLINE_S)
            assert stream_chat(gw.base_url, MODEL, 2)[0] == "error"  # 503: no host at all
            pods[0]["metadata"]["labels"][ROUTABLE_LABEL] = "true"
            _wait_addresses(gw, {only.host}, timeout_s=DEADLINE_S)
            # When Envoy asked again, as the DNS server saw it: not at the TTL (1 s) after the empty answer, at the
            # refresh rate (its timer is never early; how late on a busy machine is bounded generously)
            asked = [(at, addresses) for at, qtype, addresses in list(dns.resolver.answered) if qtype == "A" and at >= changed]
            first_empty = min(at for at, addresses in asked if not addresses)
            last_empty = max(at for at, addresses in asked if not addresses)
            asked_again = min(at for at, addresses in asked if at > last_empty)
            print(f"asked again {asked_again - first_empty:.2f} s after the empty answer (TTL {TTL_S} s, refresh {DNS_REFRESH_S} s)")
            assert DNS_REFRESH_S - 0.1 <= asked_again - first_empty <= DNS_REFRESH_S + 3.0
