"""A multi-node replica's bootstrap (files/multinode_bootstrap.py) as real processes on a real local Ray.

Two bootstrap processes play one LeaderWorkerSet group of two pods on 127.0.0.1: the leader starts a
Ray head (ray 2.60.0, the venv's, on CPU), the worker joins it, and only once the Ray cluster has
LWS_GROUP_SIZE live nodes does the leader start `vllm`. vLLM is a stand-in on PATH that checks what
vLLM 0.29.0 would be given: every flag is one its CLI defines (table below), the parallel layout is
TP x PP with the Ray executor, and the Ray cluster it attaches to (through RAY_ADDRESS, as vLLM's
``ray.init(address=None)`` does) has one node per pipeline stage. Then a member leaves and the leader
takes the group down (non-zero exit), as LWS's RecreateGroupOnPodRestart expects.

The LWS variables are the names LWS v0.10.0 sets (api/leaderworkerset/v1/leaderworkerset_types.go:
LwsLeaderAddress "LWS_LEADER_ADDRESS", LwsGroupSize "LWS_GROUP_SIZE", LwsWorkerIndex
"LWS_WORKER_INDEX"; set on every container by pkg/utils/pod/pod_utils.go AddLWSVariables, the worker
index 0 for the leader).

The group runs with Ray's token authentication on, as the chart starts it (RAY_AUTH_MODE=token and
RAY_AUTH_TOKEN, tests/serving/test_ray_auth.py): the worker joins and vLLM attaches with the token,
and a client without it is refused by the group's GCS.

No wall-clock asserts: every wait is for an event (a log line, a file, an exit) with a generous bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.serving.aws_fakes import free_port
from tests.serving.conftest import CHART
from tests.serving.containers import SERVE_HEALTH, alive, wait_for

pytestmark = pytest.mark.slow

BOOTSTRAP = CHART / "files" / "multinode_bootstrap.py"
RAY_CLI = Path(sys.executable).with_name("ray")
# The flags the chart's leader hands `vllm serve`, each defined in vLLM 0.29.0's
# vllm/engine/arg_utils.py (EngineArgs.add_cli_args; --pipeline-parallel-size and
# --distributed-executor-backend in its "ParallelConfig" group) or, for --host/--port,
# vllm/entrypoints/launchers/cli_args.py; read from the vllm-0.29.0 wheel on PyPI.
VLLM_0_29_0_FLAGS = {
    "--served-model-name", "--max-model-len", "--max-num-seqs", "--tensor-parallel-size", "--pipeline-parallel-size",
    "--distributed-executor-backend", "--gpu-memory-utilization", "--load-format", "--shutdown-timeout", "--host",
    "--port",
}
# vllm/config/parallel.py at 0.29.0: DistributedExecutorBackend = Literal["ray", "mp", "uni", "external_launcher"].
VLLM_0_29_0_EXECUTOR_BACKENDS = {"ray", "mp", "uni", "external_launcher"}

# The stand-in for `vllm`: checks its flags against the table, attaches to Ray as vLLM does, records
# what it saw, and serves /health until it is stopped.
FAKE_VLLM = '''\
import http.server, json, os, sys
args = sys.argv[1:]
allowed = set(json.loads(os.environ["FAKE_VLLM_FLAGS"]))
backends = set(json.loads(os.environ["FAKE_VLLM_BACKENDS"]))
assert args[0] == "serve" and not args[1].startswith("--"), args
flags = {}
i = 2
while i < len(args):
    name = args[i]
    if name not in allowed:
        sys.exit(f"fake vllm: unknown flag {name}")
    flags[name] = args[i + 1]
    i += 2
tp, pp = int(flags["--tensor-parallel-size"]), int(flags["--pipeline-parallel-size"])
if flags["--distributed-executor-backend"] not in backends:
    sys.exit("fake vllm: unknown executor backend")
import ray
ray.init(logging_level="WARNING", log_to_driver=False)  # address=None, as vllm/v1/executor/ray_utils.py
nodes = sum(1 for n in ray.nodes() if n["Alive"])
record = {"model": args[1], "flags": flags, "nodes": nodes, "ray_address": os.environ.get("RAY_ADDRESS"),
          "pid": os.getpid(), "env": sorted(os.environ)}
path = os.environ["FAKE_VLLM_RECORD"]
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
if nodes != pp:
    sys.exit(f"fake vllm: {nodes} Ray nodes for pipeline parallel size {pp}")
port = int(flags["--port"])
''' + SERVE_HEALTH

VLLM_ARGS = ["--model", "s3://models/meta-llama/Llama-4-Scout-17B-16E-Instruct/main/", "--load-format", "runai_streamer",
             "--served-model-name", "llama-4-scout", "--max-model-len", "32768", "--max-num-seqs", "16",
             "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "ray",
             "--gpu-memory-utilization", "0.9", "--shutdown-timeout", "75"]


class Member:
    """One bootstrap process (one pod of the group), its stderr in a file."""

    def __init__(self, role: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.process = subprocess.Popen([sys.executable, str(BOOTSTRAP), role], env=env, stdout=self._out,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._out.close()


@pytest.fixture
def group(tmp_path: Path):
    """Environment for a two-pod group on 127.0.0.1 and a way to start its members."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
    (bin_dir / "vllm").chmod(0o755)
    # Ray's socket paths must stay under 107 bytes: a short temp dir, not pytest's long tmp_path.
    ray_tmp = tempfile.mkdtemp(prefix="gnmn", dir="/tmp")
    ray_port, http_port = free_port(), free_port()
    base = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_CLI": str(RAY_CLI),
        "RAY_PORT": str(ray_port),
        "LWS_LEADER_ADDRESS": "127.0.0.1",
        "LWS_GROUP_SIZE": "2",
        "GROUP_TIMEOUT_SECONDS": "300",
        "WATCH_INTERVAL_SECONDS": "1",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(http_port),
        "VLLM_ARGS": json.dumps(VLLM_ARGS),
        "FAKE_VLLM_FLAGS": json.dumps(sorted(VLLM_0_29_0_FLAGS)),
        "FAKE_VLLM_BACKENDS": json.dumps(sorted(VLLM_0_29_0_EXECUTOR_BACKENDS)),
        "FAKE_VLLM_RECORD": str(tmp_path / "record.json"),
        # What the chart gives every member (templates/_multinode.tpl, the token from its Secret).
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "a" * 32 + "b" * 32,
    }
    base.pop("RAY_ADDRESS", None)
    members: list[Member] = []

    def start(index: int) -> Member:
        # Two Ray nodes on one host: each its own dashboard-agent port (52365 by default), one CPU each.
        extra = ["--num-cpus=1", f"--dashboard-agent-listen-port={free_port()}"]
        if index == 0:
            extra.append(f"--temp-dir={ray_tmp}")
        env = {**base, "LWS_WORKER_INDEX": str(index), "RAY_START_ARGS": json.dumps(extra)}
        member = Member("leader" if index == 0 else "worker", env, tmp_path / f"member-{index}.log")
        members.append(member)
        return member

    yield start, base
    for member in reversed(members):
        member.stop()


def test_leader_waits_for_the_group_then_runs_vllm_on_it_and_a_leaving_member_takes_the_group_down(group) -> None:
    start, env = group
    record = Path(env["FAKE_VLLM_RECORD"])
    leader = start(0)
    assert wait_for(lambda: "1 of 2 Ray nodes up" in leader.text(), 180), leader.text()
    # The head is up and alone: vLLM has not been started (the leader waits for the whole group).
    assert not record.exists() and leader.process.poll() is None

    worker = start(1)
    assert wait_for(record.exists, 240), leader.text() + worker.text()
    seen = json.loads(record.read_text())
    # vLLM saw the whole group as one Ray cluster: one node per pipeline stage.
    assert seen["nodes"] == 2
    assert seen["ray_address"] == f"127.0.0.1:{env['RAY_PORT']}"
    assert seen["model"] == VLLM_ARGS[1]
    assert seen["flags"]["--tensor-parallel-size"] == "4" and seen["flags"]["--pipeline-parallel-size"] == "2"
    assert seen["flags"]["--distributed-executor-backend"] == "ray"
    assert seen["flags"]["--host"] == "127.0.0.1" and seen["flags"]["--port"] == env["HTTP_PORT"]
    # The bootstrap's own variables stay out of vLLM's environment (vLLM warns about unknown VLLM_*).
    assert not {"VLLM_ARGS", "RAY_START_ARGS", "GROUP_TIMEOUT_SECONDS"} & set(seen["env"])
    url = f"http://127.0.0.1:{env['HTTP_PORT']}/health"
    assert wait_for(lambda: _status(url) == 200, 60)
    # vLLM (the group's Ray driver) carries the token; a client without it is refused by the head.
    assert {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN"} <= set(seen["env"])
    unauthenticated = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH_")}
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from ray._raylet import GcsClient; "
         "print(len(GcsClient(address=sys.argv[1]).get_all_node_info(timeout=10)), 'nodes')", seen["ray_address"]],
        env=unauthenticated, capture_output=True, text=True, timeout=120)
    assert probe.returncode != 0 and "InvalidAuthToken" in probe.stderr, probe.stdout + probe.stderr

    # The worker pod stops (its node reclaimed): it leaves Ray cleanly and exits 0; the leader sees the
    # group broken, stops vLLM and exits non-zero, so LWS recreates the whole group.
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=120) == 0
    assert leader.process.wait(timeout=180) == 1, leader.text()
    assert "a group member left: 1 of 2 Ray nodes alive" in leader.text()
    assert wait_for(lambda: not alive(seen["pid"]), 60), "vLLM outlived its leader"


def test_worker_that_dies_takes_the_group_down(group) -> None:
    start, env = group
    record = Path(env["FAKE_VLLM_RECORD"])
    leader = start(0)
    worker = start(1)
    assert wait_for(record.exists, 300), leader.text() + worker.text()
    # The worker process is killed outright (OOM, a crash): its Ray node is left without its owner
    # and is killed with its process group by the test, as a node's loss would end it.
    ray_children = _session_children(worker.process.pid)
    os.kill(worker.process.pid, signal.SIGKILL)
    worker.process.wait(timeout=30)
    for pgid in ray_children:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert leader.process.wait(timeout=240) == 1, leader.text()
    assert "a group member left" in leader.text()


def test_a_pod_outside_a_group_or_in_the_wrong_role_fails_with_the_reason(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LWS_")}
    proc = subprocess.run([sys.executable, str(BOOTSTRAP), "worker"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX not set" in proc.stderr
    env = {**env, "LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}
    proc = subprocess.run([sys.executable, str(BOOTSTRAP), "worker"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "worker started with LWS_WORKER_INDEX=0" in proc.stderr
    proc = subprocess.run([sys.executable, str(BOOTSTRAP), "leader"], env={**env, "LWS_WORKER_INDEX": "1"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "leader started with LWS_WORKER_INDEX=1" in proc.stderr
    proc = subprocess.run([sys.executable, str(BOOTSTRAP), "head"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except OSError:
        return None


def _session_children(pid: int) -> set[int]:
    """Process groups of ``pid``'s children that run in sessions of their own (the Ray node)."""
    groups = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # ppid
            groups.add(int(fields[2]))  # pgrp
    return groups
