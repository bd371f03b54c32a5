"""gen1-inf2's drain when the drained node's own Serve proxy carries the traffic, through the real
local Envoy and a ClusterIP built as kube-proxy builds it.

In the cluster every gen1 worker runs a Serve proxy (``proxy_location: EveryNode``) behind one
ClusterIP Service (KubeRay's gen1-inf2-serve-svc), and the gateway's Envoy pools keep-alive
connections to that ClusterIP. A draining node's proxy answers ``/-/healthz`` 503 (Ray 2.60.0
serve/_private/proxy.py ``_get_health_or_routes_reponse``), so readiness takes the pod out of the
Service, but kube-proxy picks the endpoint per connection and conntrack keeps an open connection on
its pod: pooled connections keep bringing new requests to the draining proxy, which Ray counts
drained only with no ongoing request after PROXY_MIN_DRAINING_PERIOD_S (``is_drained``). The
gateway therefore bounds every upstream connection's life (``max_connection_duration``, the chart's
``resilience.maxConnectionDuration``): after it, new requests open new connections, which go to
ready pods, and the node drains under steady traffic.

Here each Ray node has a host of its own (a network namespace on a bridge, tests/serving/netns.py),
so each worker's proxy binds port 8000 as in a pod; the head, the driver, the local gateway's Envoy
and the clients run in the host namespace, which holds the ClusterIP (iptables DNAT per connection,
as kube-proxy's iptables mode). A readiness loop plays kubelet, the endpoints controller and
kube-proxy: it probes each worker's ``/-/healthz`` and takes a failing one out of the Service. The
chart's files/ray_drain.py runs in the drained worker's namespace and finds its node by its own IP,
as the preStop does.

Asserted, from the replicas' own records (which proxy and replica each request passed) and the
programs' answers: the drained node's proxy carried requests before the drain; the node drains
while the clients keep sending; every request the clients sent is answered 200, the held ones too;
and Envoy retired connections at their lifetime. Nothing is asserted about how long a step took."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.serving import netns
from tests.serving.conftest import SCRIPTS
from tests.serving.ray_local import PATIENCE_S, Cluster, cluster_dir, drill_in_child, ray_binary, wait

pytestmark = [pytest.mark.slow]

# Every request records its arrival: which proxy took it (the ASGI scope's server address, the
# proxy's own socket), which node and replica ran it, and when. A held request waits for the test.
APP = '''\
import asyncio, json, os, time
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

LEDGER = os.environ["DRAIN_TEST_LEDGER"]

@serve.deployment(num_replicas=2, max_ongoing_requests=100, graceful_shutdown_wait_loop_s=1,
                  graceful_shutdown_timeout_s=int(os.environ["DRAIN_TEST_GRACE_S"]),
                  ray_actor_options={"num_cpus": 0, "resources": {"slot": 1}})
class Chat:
    def __init__(self):
        self.node = ray.get_runtime_context().get_node_id()
        self.replica = serve.get_replica_context().replica_id.unique_id

    async def __call__(self, request: Request):
        if request.url.path == "/health":  # the gateway's health check, as vLLM's
            return JSONResponse({})
        req = request.headers["x-drain-req"]
        record = {"req": req, "node": self.node, "replica": self.replica,
                  "proxy": request.scope["server"][0], "at": time.time()}
        path = os.path.join(LEDGER, "arrived", req)
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        if request.headers.get("x-drain-hold") == "1":
            while not os.path.exists(os.path.join(LEDGER, "release")):
                await asyncio.sleep(0.2)
        else:
            await asyncio.sleep(float(os.environ["DRAIN_TEST_WORK_S"]))
        return JSONResponse({"id": "chatcmpl-" + req, "object": "chat.completion", "model": "m",
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": json.dumps(record)}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

app = Chat.bind()
'''

MODEL = "llama-3-70b-instruct"
GRACE_S = 120  # the replicas' graceful_shutdown_timeout_s and the drain's deadline, as the chart
WORK_S = 0.3  # how long a steady request runs on its replica: the proxy is rarely without one
SERVE_PORT = 8000
VIP = f"{netns.SUBNET}.100"  # the Service's ClusterIP, inside the host namespace
CLIENTS = 12  # steady senders: some of their pooled connections are on a's proxy when it leaves
HELD = 12
IN_CHILD = "GENNSTACK_RAY_PROXY_DRAIN_CHILD"
RAY_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def test_a_node_whose_proxy_carries_the_traffic_drains_and_no_request_is_lost() -> None:
    if os.environ.get(IN_CHILD) == "1":
        lab = netns.Lab(netns.Node(**json.loads(os.environ["GSD_HOST"])),
                        {k: netns.Node(**v) for k, v in json.loads(os.environ["GSD_NODES"]).items()})
        with ray_cluster(lab) as cluster:
            _drill(cluster, lab)
        return
    ray_binary()
    netns.require()
    with netns.lab(["a", "b"]) as lab:
        env = {**RAY_AUTH, "GSD_HOST": json.dumps(vars(lab.host)),
               "GSD_NODES": json.dumps({k: vars(v) for k, v in lab.nodes.items()})}
        child = drill_in_child(f"{__file__}::{test_a_node_whose_proxy_carries_the_traffic_drains_and_no_request_is_lost.__name__}",
                               IN_CHILD, env, timeout_s=3 * PATIENCE_S + 2 * GRACE_S, prefix=lab.host.exec)
    print("\n".join(line for line in child.stdout.splitlines() if line.startswith("drill: ")))


@contextlib.contextmanager
def ray_cluster(lab: netns.Lab) -> Iterator[Cluster]:
    """The head in the host namespace (no replica: no ``slot``), a worker in each node's namespace."""
    with cluster_dir() as tmp:
        c = Cluster(ray_binary(), tmp, APP, {"DRAIN_TEST_GRACE_S": str(GRACE_S), "DRAIN_TEST_WORK_S": str(WORK_S)})
        try:
            c.start_head(node_ip=lab.host.ip)
            for node in lab.nodes.values():
                c.start_worker(node_ip=node.ip, prefix=node.exec)
            yield c
        finally:
            c.stop()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


class Readiness(threading.Thread):
    """kubelet's readiness probe of each worker's /-/healthz, the endpoints controller and
    kube-proxy in one: a pod whose probe failed FAILURES times in a row leaves the Service, one that
    passes again comes back (the chart's probe: failureThreshold 2). ``left`` holds when each
    endpoint first left (time.time(), to compare with the ledger)."""

    FAILURES = 2

    def __init__(self, service: netns.ClusterIP, endpoints: list[str]) -> None:
        super().__init__(daemon=True)
        self.service = service
        self.endpoints = endpoints
        self.failures = dict.fromkeys(endpoints, 0)
        self.left: dict[str, float] = {}
        self.stopped = threading.Event()
        service.set_endpoints(endpoints)

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            for endpoint in self.endpoints:
                ok = _status(f"http://{endpoint}/-/healthz") == 200
                self.failures[endpoint] = 0 if ok else self.failures[endpoint] + 1
            ready = [e for e in self.endpoints if self.failures[e] < self.FAILURES]
            if tuple(ready) != self.service.endpoints:
                for endpoint in set(self.service.endpoints) - set(ready):
                    self.left.setdefault(endpoint, time.time())
                self.service.set_endpoints(ready)


class Clients:
    """Requests through the gateway: CLIENTS steady senders until stopped, and held ones."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.results: dict[str, int | BaseException] = {}
        self.sent: list[str] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def _send(self, req: str, hold: bool) -> None:
        self.sent.append(req)
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": req}], "max_tokens": 1}).encode()
        headers = {"content-type": "application/json", "x-drain-req": req, "x-drain-hold": "1" if hold else "0"}
        request = urllib.request.Request(self.base_url + "/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=PATIENCE_S + GRACE_S) as response:
                response.read()
                self.results[req] = response.status
        except BaseException as error:  # noqa: BLE001 - recorded and asserted
            self.results[req] = error

    def _steady(self, client: int) -> None:
        n = 0
        while not self.stop.is_set():
            self._send(f"steady-{client}-{n}", hold=False)
            n += 1

    def start(self) -> None:
        for client in range(CLIENTS):
            self._spawn(self._steady, client)

    def hold(self, count: int) -> None:
        for i in range(count):
            self._spawn(self._send, f"held-{i}", True)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def finish(self) -> list[str]:
        """Stop the steady senders and wait for every request; the ones still unanswered."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=PATIENCE_S)
        return [req for req in self.sent if req not in self.results]


def _drill(cluster: Cluster, lab: netns.Lab) -> None:
    import ray
    from ray import serve

    from gennstack.config_base import frozen
    from gennstack.gateway.config import GatewayConfig
    from tests.gateway.conftest import start_local_gateway

    sys.path.insert(0, str(cluster.tmp / "app"))
    os.environ.update({"DRAIN_TEST_LEDGER": str(cluster.ledger), "DRAIN_TEST_GRACE_S": str(GRACE_S),
                       "DRAIN_TEST_WORK_S": str(WORK_S)})
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    a, b = lab.nodes["a"], lab.nodes["b"]
    service = netns.ClusterIP(VIP, SERVE_PORT)
    readiness: Readiness | None = None
    drain: subprocess.Popen | None = None
    try:
        import drain_app

        serve.start(proxy_location="EveryNode", http_options={"host": "0.0.0.0", "port": SERVE_PORT})
        serve.run(drain_app.app, name="llm", route_prefix="/")
        for node in (a, b):
            wait(f"the Serve proxy on {node.ip}", lambda n=node: _status(f"http://{n.ip}:{SERVE_PORT}/-/healthz") == 200)
        readiness = Readiness(service, [f"{a.ip}:{SERVE_PORT}", f"{b.ip}:{SERVE_PORT}"])
        readiness.start()

        gateway = GatewayConfig.model_validate(frozen({
            "models": {MODEL: {"generation": "inf2", "service": "gen1-inf2-serve-svc"}}, "aliases": {}, "fallbacks": {},
            "resilience": {"health_interval_s": 1}}))
        gw = start_local_gateway(gateway, {MODEL: f"http://{VIP}:{SERVE_PORT}/v1"}, rate_limit_requests=0)
        try:
            clients = Clients(gw.base_url)
            clients.start()
            clients.hold(HELD)

            # Before the drain: worker a's proxy carries requests, and a held one runs on a's node.
            nodes = {r["proxy"]: r["node"] for r in wait("requests through both workers' proxies", lambda: (
                lambda arrived: arrived if {r["proxy"] for r in arrived} >= {a.ip, b.ip} else None)(
                    list(cluster.arrivals().values())))}
            a_node = nodes[a.ip]
            wait("a held request on a's node", lambda: any(
                r["node"] == a_node for k, r in cluster.arrivals().items() if k.startswith("held-")))

            # The preStop, in a's namespace: it finds its node by its own IP.
            drain = subprocess.Popen(
                [*a.exec, sys.executable, str(SCRIPTS / "ray_drain.py")],
                env={**cluster.env, "RAY_ADDRESS": cluster.address, "GENNSTACK_DRAIN_DEADLINE_S": str(GRACE_S),
                     "GENNSTACK_DRAIN_WAIT_S": str(PATIENCE_S + GRACE_S)},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            endpoint = f"{a.ip}:{SERVE_PORT}"
            wait("a's pod to leave the Service", lambda: endpoint in readiness.left)
            (cluster.ledger / "release").touch()

            # The node drains while the clients keep sending.
            out, _ = drain.communicate(timeout=PATIENCE_S + GRACE_S)
            assert drain.returncode == 0, out
            assert f"{a_node} drained" in out, out
            assert a_node not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            after_drain = len(clients.sent)
            wait("requests after the drain", lambda: len(clients.results) >= after_drain + 2 * CLIENTS)
            unanswered = clients.finish()
            stats = gw.stats("cluster.")
        finally:
            gw.stop()

        failed = {k: v for k, v in clients.results.items() if v != 200}
        assert not unanswered, f"{len(unanswered)} requests never answered: {unanswered[:10]}"
        assert not failed, failed
        arrived = cluster.arrivals()
        held = {k: r for k, r in arrived.items() if k.startswith("held-")}
        assert len(held) == HELD and all(clients.results[k] == 200 for k in held)
        # Envoy retired connections at their lifetime (the mechanism that lets the proxy drain).
        retired = sum(v for k, v in stats.items() if k.endswith(".upstream_cx_max_duration_reached"))
        assert retired >= 1, stats
        left_at = readiness.left[endpoint]
        through_a = [r for r in arrived.values() if r["proxy"] == a.ip]
        late = [r for r in through_a if r["at"] > left_at]
        # The case this test is for: the pooled connections brought requests to the proxy after it left.
        assert late, "no request reached a's proxy after it left the Service: the drill did not load it"
        print(f"drill: requests {len(clients.results)}, all answered 200; through a's proxy {len(through_a)}, "
              f"of which {len(late)} after a left the Service (pooled connections); connections retired at "
              f"their lifetime {retired}")
    finally:
        if readiness is not None:
            readiness.stopped.set()
        if drain is not None and drain.poll() is None:
            drain.kill()
        ray.shutdown()
