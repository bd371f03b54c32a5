"""Several hosts on one machine: Linux network namespaces on a bridge, and a Service's ClusterIP as
kube-proxy's iptables mode builds it.

Every address lives inside namespaces the test makes (``SUBNET``), on a bridge inside the first of
them, the "host" namespace: nothing is added to the machine's own network, and no route leads out
(each node's default route points at the host namespace, which has none beyond the bridge; Ray
finds a node's address by a UDP ``connect``, which sends nothing). Needs root, iproute2 and
iptables; skips without them, and fails under CI=true (.ci/run installs iptables).

kube-proxy's iptables mode (kubernetes v1.36 pkg/proxy/iptables/proxier.go, writeServiceToEndpointRules):
a Service chain sends each new connection to endpoint i of n with ``-m statistic --mode random
--probability 1/(n-i)`` (the last without), each a DNAT to the endpoint. The nat table sees only a
connection's first packet; conntrack keeps an open connection on the endpoint it got, after its
rule is gone (TCP conntrack entries are not flushed when an endpoint leaves: only UDP's are,
pkg/proxy/conntrack/cleanup.go)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

SUBNET = "10.99.0"
HOST_IP = f"{SUBNET}.1"


def require() -> None:
    """Skip (fail under CI=true) unless this process may make namespaces and has ip and iptables."""
    missing = [tool for tool in ("ip", "iptables") if not shutil.which(tool)]
    reason = ""
    if os.geteuid() != 0:
        reason = "network namespaces need root"
    elif missing:
        reason = f"{', '.join(missing)} not installed (apt-get install iproute2 iptables)"
    else:
        probe = f"gsdprobe{os.getpid()}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
        if made.returncode != 0:
            reason = f"cannot make a network namespace: {made.stderr.strip()}"
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass(frozen=True)
class Node:
    netns: str
    ip: str

    @property
    def exec(self) -> list[str]:
        """The command prefix that runs a program inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns]


@dataclass(frozen=True)
class Lab:
    host: Node
    nodes: dict[str, Node]


@contextlib.contextmanager
def lab(names: Sequence[str]) -> Iterator[Lab]:
    """A host namespace with the bridge (HOST_IP) and one namespace per name (SUBNET.11, .12, ...),
    each on the bridge by a veth pair; deleted on exit (a namespace whose processes still run goes
    when they end)."""
    tag = f"gsd{os.getpid()}"
    host = Node(f"{tag}h", HOST_IP)
    nodes = {name: Node(f"{tag}n{i}", f"{SUBNET}.{11 + i}") for i, name in enumerate(names)}
    made: list[str] = []
    try:
        _ip("netns", "add", host.netns)
        made.append(host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", host.netns, "link", "add", "br0", "type", "bridge")
        _ip("-n", host.netns, "addr", "add", f"{HOST_IP}/24", "dev", "br0")
        _ip("-n", host.netns, "link", "set", "br0", "up")
        for i, node in enumerate(nodes.values()):
            _ip("netns", "add", node.netns)
            made.append(node.netns)
            _ip("-n", node.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            _ip("-n", host.netns, "link", "set", f"v{i}", "master", "br0", "up")
            _ip("-n", node.netns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "eth0", "up")
            _ip("-n", node.netns, "route", "add", "default", "via", HOST_IP)
        # The host namespace's own default route stays on the bridge (Ray's address probe needs one).
        _ip("-n", host.netns, "route", "add", "default", "dev", "br0")
        yield Lab(host, nodes)
    finally:
        for netns in reversed(made):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


class ClusterIP:
    """One Service port's ClusterIP in the namespace this process runs in, as kube-proxy's
    iptables mode writes it (see the module's docstring); ``set_endpoints`` is an endpoint update."""

    def __init__(self, vip: str, port: int, chain: str = "GSD-SVC") -> None:
        self.vip, self.port, self.chain = vip, port, chain
        self.endpoints: tuple[str, ...] = ()
        self._iptables("-N", chain)
        self._iptables("-A", "OUTPUT", "-d", f"{vip}/32", "-p", "tcp", "--dport", str(port), "-j", chain)

    @staticmethod
    def _iptables(*args: str) -> str:
        done = subprocess.run(["iptables", "-w", "-t", "nat", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"iptables -t nat {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def set_endpoints(self, endpoints: Sequence[str]) -> None:
        """Rewrite the Service chain for ``endpoints`` (``ip:port``) in one transaction, as kube-proxy
        does (iptables-restore): no new connection sees a half-written chain. Without endpoints every
        new connection is refused at once (kube-proxy REJECTs them); open connections keep theirs."""
        n = len(endpoints)
        rules = [f":{self.chain} - [0:0]"]
        for i, endpoint in enumerate(endpoints):
            pick = f" -m statistic --mode random --probability {1 / (n - i):.10f}" if i < n - 1 else ""
            rules.append(f"-A {self.chain} -p tcp{pick} -j DNAT --to-destination {endpoint}")
        if not endpoints:
            rules.append(f"-A {self.chain} -p tcp -j DNAT --to-destination 127.0.0.1:1")
        restore = "\n".join(["*nat", *rules, "COMMIT", ""])
        done = subprocess.run(["iptables-restore", "-w", "--noflush"], input=restore, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"iptables-restore: {done.stderr.strip()}\n{restore}")
        self.endpoints = tuple(endpoints)
