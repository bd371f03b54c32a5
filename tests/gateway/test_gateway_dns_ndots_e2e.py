"""The proxies' resolver ``ndots``: a Backend host name is looked up as it is, not first under every
search domain of the pod, measured on real Envoy (its c-ares resolver) against a real DNS server
that records each name it is asked.

Pinned upstream:

* Kubernetes v1.36, ``pkg/kubelet/network/dns/dns.go``: a ``ClusterFirst`` pod's resolv.conf searches
  ``<namespace>.svc.cluster.local svc.cluster.local cluster.local`` plus the node's own search
  domains (on EC2 the VPC's, e.g. ``ec2.internal``) with ``options ndots:5``; ``mergeDNSOptions``
  lets a pod's ``dnsConfig.options`` entry of the same name overwrite it.
* Envoy Gateway v1.8.3: the proxies' Deployment has ``DNSPolicy: ClusterFirst``
  (``internal/infrastructure/kubernetes/proxy/resource_provider.go``), the EnvoyProxy's pod spec has
  no dnsConfig (``api/v1alpha1``; the CRD in ../shared/crds), and ``envoyDeployment.patch`` is a
  strategic merge patch (the default type) over the generated Deployment (``internal/utils/merge.go``
  ``MergeWithPatch``).
* resolv.conf(5) (c-ares follows it): a name with fewer dots than ``ndots`` is tried under each
  search domain before it is tried as it is; with at least ``ndots`` dots it is tried as it is first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.local import envoy_binary
from gennstack.gateway.names import backend_host
from gennstack.gateway.values import ENVOY_GATEWAY_NAMESPACE, PROXY_DNS_NDOTS, gateway_chart_values
from tests.gateway.test_gateway_chart import _by_kind, render

pytestmark = [pytest.mark.slow]

HOST = backend_host("gen3-g6e", "gennstack-serving")
# The search list the kubelet writes for a pod of the proxies' namespace on an EKS node in us-east-1.
POD_SEARCH = [f"{ENVOY_GATEWAY_NAMESPACE}.svc.cluster.local", "svc.cluster.local", "cluster.local", "ec2.internal"]
CLUSTER_FIRST_NDOTS = 5


class _Recorder(BaseResolver):
    """CoreDNS for one headless Service: HOST answers 127.0.0.1, every other name NXDOMAIN."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def resolve(self, request, handler):
        name = str(request.q.qname).rstrip(".").lower()
        if request.q.qtype == QTYPE.A:
            self.names.append(name)
        reply = request.reply()
        if name == HOST:
            if request.q.qtype == QTYPE.A:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("127.0.0.1"), ttl=5))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


def _bootstrap(dns_port: int) -> dict:
    """One STRICT_DNS cluster for HOST as Envoy Gateway builds a Backend's (test_gateway_dns_discovery_e2e.py),
    with c-ares using the pod's search domains (no_default_search_domain false, as in the cluster)."""
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"clusters": [{
            "name": "backend", "type": "STRICT_DNS", "connect_timeout": "1s", "dns_refresh_rate": "5s",
            "respect_dns_ttl": True, "dns_lookup_family": "V4_PREFERRED",
            "typed_dns_resolver_config": {"name": "envoy.network.dns_resolver.cares", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
                "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": dns_port}}],
                "use_resolvers_as_fallback": False,
                "dns_resolver_options": {"no_default_search_domain": False}}},
            "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": HOST, "port_value": 8000}}}}]}]},
        }]},
    }


def _lookups(prefix: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The A queries Envoy sends until HOST resolves (its first refresh), started with ``prefix``."""
    recorder = _Recorder()
    server = DNSServer(recorder, address="127.0.0.1", port=0,
                       logger=DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False))
    server.start_thread()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "envoy.json"
        config.write_text(json.dumps(_bootstrap(server.server.server_address[1])))
        proc = subprocess.Popen([*prefix, str(envoy_binary()), "-c", str(config), "--log-level", "error",
                                 "--disable-hot-restart"], env={**os.environ, **(env or {})},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while HOST not in recorder.names:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, f"Envoy never asked for {HOST}: {recorder.names}"
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            server.stop()
            server.server.server_close()
    return recorder.names[:recorder.names.index(HOST) + 1]


def test_backend_hosts_have_ndots_dots_and_the_proxies_resolve_them_as_they_are(helm) -> None:
    """Every Backend host has PROXY_DNS_NDOTS dots, and the EnvoyProxy patches its Deployment's pod
    spec with dnsConfig ndots of that value (a strategic merge patch: the kubelet merges the option
    over ClusterFirst's ndots:5)."""
    gateway = GatewayConfig()
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", api_keys_secret_name="k")
    assert PROXY_DNS_NDOTS == 4 == HOST.count(".")
    assert {b["host"].count(".") for b in values["backends"]} == {PROXY_DNS_NDOTS}
    (proxy,) = _by_kind(render(helm, gateway))["EnvoyProxy"]
    patch = proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"]["patch"]
    assert patch["type"] == "StrategicMerge"
    assert patch["value"] == {"spec": {"template": {"spec": {"dnsConfig": {
        "options": [{"name": "ndots", "value": str(PROXY_DNS_NDOTS)}]}}}}}


def _can_bind_resolv_conf() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount --bind /dev/null /etc/resolv.conf"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.parametrize("ndots, failed", [(CLUSTER_FIRST_NDOTS, len(POD_SEARCH)), (PROXY_DNS_NDOTS, 0)])
def test_a_pods_resolv_conf_costs_a_failed_lookup_per_search_domain_unless_ndots_fits(ndots, failed) -> None:
    """Envoy reads the pod's resolv.conf (here bind-mounted over /etc/resolv.conf in a user and mount
    namespace): with ClusterFirst's ndots:5 each refresh of a 4-dot name first asks it under all 4
    search domains (4 NXDOMAINs), with the chart's ndots it asks the name alone."""
    if not _can_bind_resolv_conf():
        pytest.skip("needs unprivileged user namespaces (unshare -rm) to give Envoy a pod's resolv.conf")
    with tempfile.TemporaryDirectory() as tmp:
        resolv = Path(tmp) / "resolv.conf"
        resolv.write_text(f"nameserver 127.0.0.1\nsearch {' '.join(POD_SEARCH)}\noptions ndots:{ndots}\n")
        os.chmod(tmp, 0o755)
        prefix = ["unshare", "-rm", "sh", "-c", f"mount --bind {resolv} /etc/resolv.conf && exec \"$@\"", "sh"]
        names = _lookups(prefix)
    assert names == [f"{HOST}.{domain}" for domain in POD_SEARCH[:failed]] + [HOST]


@pytest.mark.parametrize("ndots, failed", [(CLUSTER_FIRST_NDOTS, 1), (PROXY_DNS_NDOTS, 0)])
def test_search_domain_from_the_environment_costs_a_failed_lookup_unless_ndots_fits(ndots, failed) -> None:
    """The same without namespaces: c-ares also takes a search domain from LOCALDOMAIN (only its
    first one, measured) and options from RES_OPTIONS, as from resolv.conf."""
    names = _lookups([], {"LOCALDOMAIN": POD_SEARCH[0], "RES_OPTIONS": f"ndots:{ndots}"})
    assert names == [f"{HOST}.{POD_SEARCH[0]}"] * failed + [HOST]
