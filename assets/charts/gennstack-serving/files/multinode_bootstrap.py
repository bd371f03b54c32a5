"""Entry point of a multi-node replica's pods (templates/multinode-lws.yaml): one LeaderWorkerSet group
is one Ray cluster, and vLLM runs on it with tensor parallelism inside a node and pipeline
parallelism across the nodes (``--distributed-executor-backend ray``).

LWS v0.10.0 gives every container of a group (pkg/utils/pod/pod_utils.go ``AddLWSVariables``, names
in api/leaderworkerset/v1/leaderworkerset_types.go):

* ``LWS_LEADER_ADDRESS``: the leader pod's DNS name, ``<lws>-<group>.<subdomain>.<namespace>``, which
  resolves before the leader is Ready (the headless Service LWS creates publishes not-ready
  addresses: pkg/utils/controller/controller_utils.go ``PublishNotReadyAddresses: true``), so the
  workers can join while the leader is still loading;
* ``LWS_GROUP_SIZE``: the group's pod count (``leaderWorkerTemplate.size``);
* ``LWS_WORKER_INDEX``: 0 for the leader, 1..size-1 for the workers.

leader: starts a Ray head (``ray start --head --block``), waits until the Ray cluster has
LWS_GROUP_SIZE live nodes (at most GROUP_TIMEOUT_SECONDS), then starts vLLM with VLLM_ARGS through
vllm_serve.py (vLLM's Ray executor attaches to the running cluster: vllm/v1/executor/ray_utils.py
``initialize_ray_cluster`` calls ``ray.init(address=None)``, which finds the local head). While vLLM
runs it watches the group: a node that leaves the Ray cluster, the head or vLLM ending, ends the
leader with a non-zero status, and LWS's RecreateGroupOnPodRestart recreates the whole group.

worker: waits until the leader's Ray port accepts connections, then joins (``ray start --address
--block``) and stays until its Ray node ends, which is a failure (exit non-zero) unless the pod was
told to stop (SIGTERM: exit 0).

Both roles refuse to start Ray without token authentication: RAY_AUTH_MODE=token and a non-empty
RAY_AUTH_TOKEN (the chart's Secret). Ray 2.60.0 leaves authentication off unless RAY_AUTH_MODE says
token (python/ray/_private/authentication/authentication_token_setup.py,
maybe_enable_token_auth_if_token_available, called by ``ray start``), and then refuses every GCS call
and dashboard API call without the token; a head without it runs any job from any pod that reaches
its port.

Every child runs in its own session and is killed with its whole process group on exit, so no Ray
daemon outlives the script (``ray stop`` would stop every Ray on the host, not only this one's).

    usage: python3 multinode_bootstrap.py leader|worker

Environment beyond LWS's: VLLM_ARGS (leader), RAY_PORT (6379), GROUP_TIMEOUT_SECONDS (900),
WATCH_INTERVAL_SECONDS (5), RAY_START_ARGS (a JSON list appended to ``ray start``), RAY_CLI (the
``ray`` executable), HTTP_HOST/HTTP_PORT (0.0.0.0:8000, vLLM's); RAY_AUTH_MODE and RAY_AUTH_TOKEN
(required, Ray's own names, passed on to Ray and vLLM).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
GROUP_SIZE = "LWS_GROUP_SIZE"
WORKER_INDEX = "LWS_WORKER_INDEX"
# Variables of this script only: vLLM never sees them (vllm_serve.environment drops GENNSTACK_*
# and VLLM_ARGS; these are dropped here).
OWN_VARIABLES = ("RAY_PORT", "GROUP_TIMEOUT_SECONDS", "WATCH_INTERVAL_SECONDS", "RAY_START_ARGS", "RAY_CLI",
                 "HTTP_HOST", "HTTP_PORT", "SHUTDOWN_GRACE_SECONDS")
# vllm_serve.py sits beside this script (/scripts in the pod).
sys.path.insert(0, str(Path(__file__).resolve().parent))


class GroupError(RuntimeError):
    """The group did not form, or lost a member: the leader exits non-zero."""


def log(message: str) -> None:
    print(f"multinode_bootstrap: {message}", file=sys.stderr, flush=True)


def group(env: Mapping[str, str]) -> tuple[str, int, int]:
    """(leader address, group size, worker index) from LWS's variables, checked."""
    missing = [name for name in (LEADER_ADDRESS, GROUP_SIZE, WORKER_INDEX) if not env.get(name)]
    if missing:
        raise GroupError(f"{', '.join(missing)} not set: this pod is not in a LeaderWorkerSet group")
    size, index = int(env[GROUP_SIZE]), int(env[WORKER_INDEX])
    if size < 2 or not 0 <= index < size:
        raise GroupError(f"{GROUP_SIZE}={size}, {WORKER_INDEX}={index}: allowed: size >= 2, 0 <= index < size")
    return env[LEADER_ADDRESS], size, index


def require_auth(env: Mapping[str, str]) -> None:
    """GroupError unless Ray's token authentication is on (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN set)."""
    mode = env.get("RAY_AUTH_MODE", "")
    if mode.lower() != "token":
        raise GroupError(f"RAY_AUTH_MODE={mode!r}: allowed: token (without it the Ray head takes jobs from anybody "
                         "who reaches its port)")
    if not env.get("RAY_AUTH_TOKEN", "").strip():
        raise GroupError("RAY_AUTH_MODE=token but RAY_AUTH_TOKEN is empty: the group's token Secret "
                         "(<pool>-multinode-ray-auth, key auth_token) did not reach this pod")


def ray_start(env: Mapping[str, str], *args: str) -> list[str]:
    extra = json.loads(env.get("RAY_START_ARGS", "[]"))
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise ValueError("RAY_START_ARGS must be a JSON list of strings")
    return [env.get("RAY_CLI", "ray"), "start", "--block", "--disable-usage-stats", *args, *extra]


def spawn(argv: list[str], env: Mapping[str, str]) -> subprocess.Popen:
    log("starting " + " ".join(argv[:4]) + (" ..." if len(argv) > 4 else ""))
    return subprocess.Popen(argv, env=dict(env), start_new_session=True)


def stop(process: subprocess.Popen | None, grace: float = 10.0) -> None:
    """SIGTERM the process's group, SIGKILL what is left after ``grace`` seconds."""
    if process is None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            if sig == signal.SIGTERM:
                # The leader (ray start) is gone; kill what it left in its group (raylet, GCS).
                os.killpg(process.pid, signal.SIGKILL)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue


def live_nodes(ray_module) -> int:
    return sum(1 for node in ray_module.nodes() if node.get("Alive"))


def wait_for_group(ray_module, size: int, timeout: float, interval: float, head: subprocess.Popen,
                   stopping: list[bool]) -> None:
    """Until the Ray cluster has ``size`` live nodes; GroupError when the head ends or time runs out."""
    deadline = time.monotonic() + timeout
    seen = -1
    while not stopping[0]:
        if head.poll() is not None:
            raise GroupError(f"the Ray head ended (status {head.returncode}) before the group formed")
        count = live_nodes(ray_module)
        if count != seen:
            log(f"{count} of {size} Ray nodes up")
            seen = count
        if count >= size:
            return
        if time.monotonic() > deadline:
            raise GroupError(f"only {count} of {size} Ray nodes joined within {timeout:.0f} s")
        time.sleep(interval)


def connect(ray_module, address: str, timeout: float, head: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if head.poll() is not None:
            raise GroupError(f"the Ray head ended (status {head.returncode}) at start")
        try:
            ray_module.init(address=address, logging_level="WARNING", log_to_driver=False)
            return
        except ConnectionError as error:
            if time.monotonic() > deadline:
                raise GroupError(f"the Ray head at {address} did not answer within {timeout:.0f} s: {error}") from None
            time.sleep(1)


def vllm_environment(env: Mapping[str, str], ray_address: str) -> dict[str, str]:
    """vLLM's environment: the pod's without this script's variables, with RAY_ADDRESS naming the
    group's head (vLLM's ``ray.init(address=None)`` reads it) so vLLM never starts a Ray of its own."""
    import vllm_serve

    own = {k: v for k, v in vllm_serve.environment(env).items() if k not in OWN_VARIABLES}
    return {**own, "RAY_ADDRESS": ray_address}


def lead(env: Mapping[str, str], stopping: list[bool]) -> int:
    _, size, index = group(env)
    if index != 0:
        raise GroupError(f"leader started with {WORKER_INDEX}={index}; the leader is worker 0")
    require_auth(env)
    import ray
    import vllm_serve

    port = env.get("RAY_PORT", "6379")
    timeout = float(env.get("GROUP_TIMEOUT_SECONDS", "900"))
    interval = float(env.get("WATCH_INTERVAL_SECONDS", "5"))
    head = spawn(ray_start(env, "--head", f"--port={port}", "--include-dashboard=false"), env)
    server = None
    try:
        connect(ray, f"127.0.0.1:{port}", timeout, head)
        wait_for_group(ray, size, timeout, interval, head, stopping)
        if stopping[0]:
            return 0
        argv = vllm_serve.command(env.get("HTTP_HOST", "0.0.0.0"), env.get("HTTP_PORT", "8000"), env)
        server = spawn(argv, vllm_environment(env, f"127.0.0.1:{port}"))
        while not stopping[0]:
            if head.poll() is not None:
                raise GroupError(f"the Ray head ended (status {head.returncode})")
            if server.poll() is not None:
                raise GroupError(f"vLLM ended (status {server.returncode})")
            count = live_nodes(ray)
            if count < size:
                raise GroupError(f"a group member left: {count} of {size} Ray nodes alive")
            time.sleep(interval)
        return 0
    finally:
        try:
            ray.shutdown()
        finally:
            stop(server, grace=float(env.get("SHUTDOWN_GRACE_SECONDS", "60")))
            stop(head)


def wait_for_port(host: str, port: int, timeout: float, stopping: list[bool]) -> None:
    deadline = time.monotonic() + timeout
    while not stopping[0]:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise GroupError(f"the leader's Ray head {host}:{port} did not open within {timeout:.0f} s") from None
            time.sleep(1)


def work(env: Mapping[str, str], stopping: list[bool]) -> int:
    leader, _, index = group(env)
    if index == 0:
        raise GroupError(f"worker started with {WORKER_INDEX}=0; that is the leader")
    require_auth(env)
    port = int(env.get("RAY_PORT", "6379"))
    wait_for_port(leader, port, float(env.get("GROUP_TIMEOUT_SECONDS", "900")), stopping)
    if stopping[0]:
        return 0
    node = spawn(ray_start(env, f"--address={leader}:{port}"), env)
    try:
        while node.poll() is None and not stopping[0]:
            time.sleep(0.5)
        if stopping[0]:
            return 0
        raise GroupError(f"this worker's Ray node ended (status {node.returncode})")
    finally:
        stop(node)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("leader", "worker"):
        print("usage: multinode_bootstrap.py leader|worker", file=sys.stderr)
        return 2
    stopping = [False]

    def on_term(signum, frame) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        return (lead if argv[1] == "leader" else work)(os.environ, stopping)
    except GroupError as error:
        log(f"group down: {error}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
