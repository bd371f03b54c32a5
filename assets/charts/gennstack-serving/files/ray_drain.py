"""preStop of gen1-inf2's Ray worker pods: drain this Ray node with Ray's own drain, then wait.

A spot reclaim (or any deletion) of a worker pod is not a Serve stop, and every Serve proxy routes
to every replica: without this, the replica on a doomed node keeps taking new requests until the
pod's processes end, and whatever runs on it then is cut off. This asks the GCS to drain the node
(`DrainNode`, reason `DRAIN_NODE_REASON_PREEMPTION`, the request `ray drain-node` sends) with a
deadline of the pod's remaining grace, and returns once the node has drained.

What Ray 2.60.0 does with a draining node (python/ray/serve/_private/deployment_state.py,
migrate_replicas_on_draining_nodes and _partition_groups_to_stop; cluster_node_info_cache.py):
the Serve controller marks the node's replicas PENDING_MIGRATION, starts replacements elsewhere and
stops a PENDING_MIGRATION replica gracefully once its replacement runs or once
`deadline - graceful_shutdown_timeout_s` has come. The chart gives the drain a deadline of
`graceful_shutdown_timeout_s`, so the stop starts at once: the replica leaves every router's
replica set (no new request reaches it) and finishes its in-flight requests within
graceful_shutdown_timeout_s (replica.py, perform_graceful_shutdown). The node's proxy answers
`/-/healthz` 503 while the node drains, so the pod's readiness drops it from the Service. A
draining raylet that has gone idle exits (python/ray/_private/node.py, _drain_node_before_shutdown),
and the GCS reports the node DEAD: that is what this waits for, at most the deadline.

    env: RAY_ADDRESS (the GCS, host:port; KubeRay v1.7.0 sets it on every Ray container),
    GENNSTACK_DRAIN_DEADLINE_S (seconds), GENNSTACK_DRAIN_WAIT_S (the longest this waits; default
    the deadline); GENNSTACK_RAY_NODE_ID (hex) selects the node, else the alive non-head node at
    this host's IP (exactly one, or it refuses).
"""

from __future__ import annotations

import os
import sys
import time

REASON = "DRAIN_NODE_REASON_PREEMPTION"
POLL_S = 1.0


def _setting(environ, key: str, default: str | None = None) -> str:
    value = environ.get(key, default)
    if value is None or value == "":
        raise SystemExit(f"ray_drain: {key} is not set")
    return value


def _seconds(environ, key: str, default: str | None = None) -> float:
    value = _setting(environ, key, default)
    try:
        seconds = float(value)
    except ValueError:
        raise SystemExit(f"ray_drain: {key}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise SystemExit(f"ray_drain: {key}={value!r} must be more than 0 seconds")
    return seconds


def _alive_nodes(gcs) -> dict[str, object]:
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    nodes = gcs.get_all_node_info(timeout=10)
    return {node_id.hex(): info for node_id, info in nodes.items() if info.state == GcsNodeInfo.ALIVE}


def local_node_id(gcs, environ) -> str:
    """This pod's Ray node: GENNSTACK_RAY_NODE_ID, else the one alive worker node at our IP."""
    explicit = environ.get("GENNSTACK_RAY_NODE_ID")
    if explicit:
        return explicit
    import ray.util

    ip = ray.util.get_node_ip_address()
    here = [nid for nid, info in _alive_nodes(gcs).items()
            if info.node_manager_address == ip and not info.is_head_node]
    if len(here) != 1:
        raise SystemExit(f"ray_drain: {len(here)} alive Ray worker nodes at {ip}, expected 1: "
                         "set GENNSTACK_RAY_NODE_ID")
    return here[0]


def drain(environ=os.environ) -> int:
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    address = _setting(environ, "RAY_ADDRESS")
    deadline_s = _seconds(environ, "GENNSTACK_DRAIN_DEADLINE_S")
    wait_s = _seconds(environ, "GENNSTACK_DRAIN_WAIT_S", str(deadline_s))
    gcs = GcsClient(address=address)
    node_id = local_node_id(gcs, environ)
    started = time.monotonic()
    deadline_ms = int(time.time() * 1000 + deadline_s * 1000)
    accepted, message = gcs.drain_node(
        node_id, autoscaler_pb2.DrainNodeReason.Value(REASON),
        "pod terminating (gennstack preStop)", deadline_ms)
    if not accepted:
        print(f"ray_drain: the GCS refused to drain {node_id}: {message}", flush=True)
        return 1
    print(f"ray_drain: draining {node_id}, deadline in {deadline_s:g}s", flush=True)
    while time.monotonic() - started < wait_s:
        try:
            if node_id not in _alive_nodes(gcs):
                print(f"ray_drain: {node_id} drained", flush=True)
                return 0
        except Exception as error:  # a slow GCS: keep waiting, the pod's grace bounds us
            print(f"ray_drain: node state unknown ({error}); waiting", flush=True)
        time.sleep(POLL_S)
    print(f"ray_drain: {node_id} still draining after {wait_s:g}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(drain())
