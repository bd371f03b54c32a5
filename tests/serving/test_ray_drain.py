"""gen1-inf2's drain on a real Ray cluster: the chart's preStop script (files/ray_drain.py) drains a
worker node while a client sends requests; no new request reaches the drained node's replica, and
the requests it was running finish.

Ray 2.60.0 (the Ray of assets/images/inf2-ray-serve/Dockerfile; pinned in requirements-dev.txt)
runs on CPU: a head and two worker nodes are `ray start` processes on 127.0.0.1, each worker with one
``slot`` so that the Serve deployment (two replicas, one ``slot`` each) puts a replica on each. The
proxy runs on the head only (all nodes share 127.0.0.1, so one proxy port) and routes to both
replicas, as every gen1 proxy does (test_ray_drain_proxy.py drains a node whose own proxy carries the
traffic, each node in a network namespace). What Serve does with replicas on a draining node is upstream's
(ray-project/ray at ray-2.60.0, python/ray/serve/_private/deployment_state.py
migrate_replicas_on_draining_nodes / _partition_groups_to_stop; ray/scripts/scripts.py drain_node):
a PENDING_MIGRATION replica is stopped gracefully once ``deadline - graceful_shutdown_timeout_s``
has come, which the chart's deadline (= graceful_shutdown_timeout_s) makes at once.

The cluster runs with Ray's token authentication on (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN), as
gen1's does: the drain script reaches the GCS with the pod's token.

Every count is by replica, from the responses and from each replica's own record of the requests
it received; no assertion depends on how long anything took. Without ray installed the test
skips, and fails under CI=true. The drill runs in a child pytest, the Ray driver (tests/serving/ray_local.py
says why), and its cluster is stopped through the process groups of its own ``ray start`` calls."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.serving.conftest import SCRIPTS, load_script
from tests.serving.ray_local import PATIENCE_S, Cluster, cluster_dir, drill_in_child, free_port, ray_binary, wait

# The deployment: each request records its arrival (by replica) in a file, and a held request
# waits until the test releases it, so "in flight" is a fact, not a timing.
APP = '''\
import json, os, time
import ray
from ray import serve
from starlette.requests import Request

LEDGER = os.environ["DRAIN_TEST_LEDGER"]

@serve.deployment(num_replicas=2, max_ongoing_requests=100, graceful_shutdown_wait_loop_s=1,
                  graceful_shutdown_timeout_s=int(os.environ["DRAIN_TEST_GRACE_S"]),
                  ray_actor_options={"num_cpus": 0, "resources": {"slot": 1}})
class Echo:
    def __init__(self):
        self.node = ray.get_runtime_context().get_node_id()
        self.replica = serve.get_replica_context().replica_id.unique_id

    async def __call__(self, request: Request):
        import asyncio
        req = request.query_params["req"]
        record = {"req": req, "node": self.node, "replica": self.replica}
        path = os.path.join(LEDGER, "arrived", req)
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        if request.query_params.get("hold") == "1":
            while not os.path.exists(os.path.join(LEDGER, "release")):
                await asyncio.sleep(0.2)
        return record

app = Echo.bind()
'''

GRACE_S = 120  # the replica's graceful_shutdown_timeout_s, and the drain's deadline (as the chart)


@contextlib.contextmanager
def ray_cluster() -> Iterator[Cluster]:
    """A head and two workers on 127.0.0.1, each worker with one ``slot``."""
    ray = ray_binary()
    with cluster_dir() as tmp:
        c = Cluster(ray, tmp, APP, {"DRAIN_TEST_GRACE_S": str(GRACE_S)})
        try:
            c.start_head()
            for _ in range(2):
                c.start_worker()
            yield c
        finally:
            c.stop()


def _get(port: int, req: str, hold: bool = False) -> dict:
    url = f"http://127.0.0.1:{port}/?req={req}" + ("&hold=1" if hold else "")
    with urllib.request.urlopen(url, timeout=PATIENCE_S + GRACE_S) as response:
        assert response.status == 200
        return json.loads(response.read())


# Set in the child pytest that runs the drill (see the test): the Ray driver lives there.
IN_CHILD = "GENNSTACK_RAY_DRAIN_CHILD"
# The cluster runs with token authentication, as gen1's does (KubeRay v1.7.0 authOptions gives every
# Ray container these two: tests/serving/test_ray_auth.py): the preStop's drain calls the GCS with
# the pod's token, and the Serve proxy's HTTP needs none (the clients here send none).
RAY_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@pytest.mark.slow
def test_drained_node_takes_no_new_request_and_finishes_its_own() -> None:
    """The drill runs in a child pytest, which is the Ray driver: Ray's core worker ends its process
    when the GCS has been unreachable for 60 s, so a GCS that dies (Ray 2.60.0's aborted once here, in
    gRPC, 0.1 s after the drained node unregistered) would otherwise take this test's pytest worker with
    it and leave pytest-xdist waiting on it for good. The child's failure, with the GCS's abort lines if
    it aborted, is this test's failure; only a run in which the GCS aborted is run once more."""
    if os.environ.get(IN_CHILD) == "1":
        assert os.environ.get("RAY_AUTH_MODE") == "token" and os.environ.get("RAY_AUTH_TOKEN")
        with ray_cluster() as cluster:
            _drill(cluster)
        return
    ray_binary()
    drill_in_child(f"{__file__}::test_drained_node_takes_no_new_request_and_finishes_its_own", IN_CHILD, RAY_AUTH,
                   timeout_s=3 * PATIENCE_S + 2 * GRACE_S)


def _drill(cluster: Cluster) -> None:
    import ray
    from ray import serve

    sys.path.insert(0, str(cluster.tmp / "app"))
    os.environ["DRAIN_TEST_LEDGER"] = str(cluster.ledger)
    os.environ["DRAIN_TEST_GRACE_S"] = str(GRACE_S)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        import drain_app

        port = free_port()
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        serve.run(drain_app.app, name="llm", route_prefix="/")

        # Both replicas answer, one on each worker.
        seen: dict[str, str] = {}
        for i in range(200):
            record = _get(port, f"warm-{i}")
            seen[record["replica"]] = record["node"]
            if len(seen) == 2:
                break
        assert len(seen) == 2 and len(set(seen.values())) == 2, seen
        drained_replica, drained_node = sorted(seen.items())[0]
        kept_replica = next(r for r in seen if r != drained_replica)

        # Requests in flight on both replicas (held until released).
        results: dict[str, dict | BaseException] = {}

        def send(req: str, hold: bool) -> None:
            try:
                results[req] = _get(port, req, hold)
            except BaseException as error:  # noqa: BLE001 - recorded and asserted below
                results[req] = error

        threads = []
        for i in range(40):
            thread = threading.Thread(target=send, args=(f"held-{i}", True), daemon=True)
            thread.start()
            threads.append(thread)
        held = wait("held requests on both replicas", lambda: (
            lambda a: a if {r["replica"] for k, r in a.items() if k.startswith("held-")} == set(seen)
            and len([k for k in a if k.startswith("held-")]) == 40 else None)(cluster.arrivals()))
        held_on_drained = {k for k, r in held.items() if k.startswith("held-") and r["replica"] == drained_replica}
        assert held_on_drained

        # The preStop: drain the node (as the pod would, with its node id given explicitly, as
        # every node here shares 127.0.0.1).
        drain = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "ray_drain.py")],
            env={**cluster.env, "RAY_ADDRESS": cluster.address, "GENNSTACK_RAY_NODE_ID": drained_node,
                 "GENNSTACK_DRAIN_DEADLINE_S": str(GRACE_S), "GENNSTACK_DRAIN_WAIT_S": str(PATIENCE_S + GRACE_S)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # Serve stops the drained replica (gracefully: it is still running its held requests).
            def stopping() -> bool:
                status = serve.status().applications["llm"].deployments["Echo"]
                return status.replica_states.get("STOPPING", 0) >= 1
            wait("the drained replica to stop", stopping)

            # New requests all land on the other replica. The first of these may reach a proxy
            # whose replica set the controller has not updated yet: Serve's long poll delivers it.
            wait("the routers to drop the stopping replica", lambda: all(
                _get(port, f"probe-{time.monotonic_ns()}-{i}")["replica"] == kept_replica for i in range(10)))
            after = [_get(port, f"after-{i}") for i in range(30)]
            assert {r["replica"] for r in after} == {kept_replica}
            assert drain.poll() is None, "the drain ended while its replica still had requests in flight"
            arrived = cluster.arrivals()
            assert not [k for k, r in arrived.items() if k.startswith("after-") and r["replica"] == drained_replica]

            # Released, every held request finishes, each answered by the replica it was on.
            (cluster.ledger / "release").touch()
            for thread in threads:
                thread.join(timeout=PATIENCE_S)
            failures = {k: v for k, v in results.items() if isinstance(v, BaseException)}
            assert not failures, failures
            assert len(results) == 40
            answered_by_drained = {k for k, v in results.items() if v["replica"] == drained_replica}
            assert answered_by_drained == held_on_drained

            # The node drains (its raylet goes once idle) and the preStop returns.
            out, _ = drain.communicate(timeout=PATIENCE_S + GRACE_S)
            assert drain.returncode == 0, out
            assert f"{drained_node} drained" in out, out
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            assert drained_node not in alive
        finally:
            if drain.poll() is None:
                drain.kill()
    finally:
        ray.shutdown()


class _Node:
    def __init__(self, ip: str, head: bool, alive: bool = True) -> None:
        from ray.core.generated.gcs_pb2 import GcsNodeInfo

        self.node_manager_address, self.is_head_node = ip, head
        self.state = GcsNodeInfo.ALIVE if alive else GcsNodeInfo.DEAD


class _Id:
    def __init__(self, hex_id: str) -> None:
        self._hex = hex_id

    def hex(self) -> str:
        return self._hex


class _Gcs:
    def __init__(self, nodes: dict[str, _Node]) -> None:
        self.nodes = nodes

    def get_all_node_info(self, timeout: float) -> dict:
        return {_Id(k): v for k, v in self.nodes.items()}


def test_the_pod_finds_its_own_worker_node_by_ip_or_refuses(monkeypatch) -> None:
    """Without GENNSTACK_RAY_NODE_ID the script drains the one alive, non-head node at this host's
    IP (ray.util.get_node_ip_address, the address the raylet registered, GcsNodeInfo
    node_manager_address); none or several is refused, naming the setting that resolves it."""
    ray_binary()
    import ray.util

    drain = load_script("ray_drain")
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.3.7")
    gcs = _Gcs({"aa": _Node("10.0.3.7", head=False), "bb": _Node("10.0.3.8", head=False),
                "cc": _Node("10.0.3.7", head=True), "dd": _Node("10.0.3.7", head=False, alive=False)})
    assert drain.local_node_id(gcs, {}) == "aa"
    assert drain.local_node_id(gcs, {"GENNSTACK_RAY_NODE_ID": "bb"}) == "bb"
    gcs.nodes["ee"] = _Node("10.0.3.7", head=False)
    with pytest.raises(SystemExit, match="2 alive Ray worker nodes at 10.0.3.7, expected 1: set GENNSTACK_RAY_NODE_ID"):
        drain.local_node_id(gcs, {})
    with pytest.raises(SystemExit, match=r"GENNSTACK_DRAIN_DEADLINE_S='soon' is not a number of seconds"):
        drain.drain({"RAY_ADDRESS": "127.0.0.1:1", "GENNSTACK_DRAIN_DEADLINE_S": "soon"})
