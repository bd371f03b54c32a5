"""A real Ray 2.60.0 cluster of ``ray start`` processes for the drain tests, and the child pytest that
drives it.

The drills run in a child pytest, which is the Ray driver: Ray's core worker ends its process when
the GCS has been unreachable for 60 s, so a GCS that dies (Ray 2.60.0's aborted once here, in gRPC,
0.1 s after a drained node unregistered) would otherwise take the parent's pytest worker with it
and leave pytest-xdist waiting on it for good. A cluster is stopped through the process groups of
its own ``ray start`` calls, not ``ray stop``, which would stop every Ray on the host (another
test's may be running beside it)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

PATIENCE_S = 240  # how long a test waits for any one thing on a busy machine
ROOT = Path(__file__).resolve().parents[2]


def ray_binary() -> Path:
    """The ``ray`` console script beside this Python; skips without ray[serve], fails under CI=true."""
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        message = "ray[serve] not installed: pip install -r requirements-dev.txt (ray[serve]==2.60.0)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    binary = Path(sys.executable).parent / "ray"
    if not binary.exists():
        found = shutil.which("ray")
        if not found:
            pytest.fail("the ray console script is not on PATH")
        binary = Path(found)
    return binary


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what: str, check: Callable[[], object], patience: float = PATIENCE_S) -> object:
    end = time.monotonic() + patience
    while time.monotonic() < end:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"gave up waiting for {what}")


class Cluster:
    """A Ray cluster of ``ray start`` processes; ``app`` (module source) is importable as
    ``drain_app`` on every node; each request of it records its arrival under ``ledger/arrived``."""

    def __init__(self, ray: Path, tmp: Path, app: str, env: dict[str, str]) -> None:
        self.ray = ray
        self.tmp = tmp
        self.ledger = tmp / "ledger"
        (self.ledger / "arrived").mkdir(parents=True)
        (tmp / "app").mkdir()
        (tmp / "app" / "drain_app.py").write_text(app)
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp / "app"), os.environ.get("PYTHONPATH", "")]),
            "DRAIN_TEST_LEDGER": str(self.ledger),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
            **env,
        }
        self.address = ""
        self.groups: list[int] = []

    def start(self, *args: str, node_ip: str = "127.0.0.1", prefix: Sequence[str] = ()) -> str:
        """``ray start`` in a session of its own (``prefix``, e.g. ``ip netns exec NS``, execs it):
        the daemons it leaves behind (GCS, raylet, their workers) keep its process group, which is how
        ``stop`` finds this cluster's processes alone."""
        proc = subprocess.Popen(
            [*prefix, str(self.ray), "start", "--node-ip-address", node_ip, "--object-store-memory", "78643200",
             "--disable-usage-stats", *args],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.groups.append(proc.pid)
        out, err = proc.communicate(timeout=PATIENCE_S)
        assert proc.returncode == 0, f"ray start {args}: {out}\n{err}"
        return out

    def start_head(self, node_ip: str = "127.0.0.1") -> None:
        head = self.start("--head", "--port", "0", "--num-cpus", "1", "--include-dashboard", "false",
                          "--temp-dir", str(self.tmp / "ray"), node_ip=node_ip)
        match = re.search(r"--address='([^']+)'", head)
        assert match, head
        self.address = match.group(1)

    def start_worker(self, node_ip: str = "127.0.0.1", prefix: Sequence[str] = ()) -> None:
        """A worker node with one ``slot``: a deployment of one ``slot`` per replica puts one on each."""
        self.start("--address", self.address, "--num-cpus", "1", "--resources", '{"slot": 1}',
                   node_ip=node_ip, prefix=prefix)

    def stop(self) -> None:
        """This cluster's processes only: ``ray stop`` would stop every Ray on the host."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in self.groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, sig)
            end = time.monotonic() + 15
            while time.monotonic() < end and any(group_alive(g) for g in self.groups):
                time.sleep(0.2)

    def arrivals(self) -> dict[str, dict]:
        out = {}
        for path in (self.ledger / "arrived").iterdir():
            if not path.name.endswith(".tmp"):
                out[path.name] = json.loads(path.read_text())
        return out


@contextlib.contextmanager
def cluster_dir() -> Iterator[Path]:
    """The cluster's folder: the child's DRAIN_TEST_TMP (its parent reads the logs, then removes it)
    or a short one of its own (the raylet's unix sockets live below it: 108-byte limit)."""
    given = os.environ.get("DRAIN_TEST_TMP")
    tmp = Path(given or "/tmp") / f"gsd{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        if not given:
            shutil.rmtree(tmp, ignore_errors=True)


def gcs_aborts(tmp: Path) -> list[str]:
    """Lines of the cluster's GCS log that say it aborted (Ray's own crash handler writes them)."""
    return [line for log in tmp.glob("gsd*/ray/session_*/logs/gcs_server.out")
            for line in log.read_text(errors="replace").splitlines() if "SIGABRT received" in line][:3]


def kill_processes_under(folder: Path) -> None:
    """SIGKILL every process whose command line names ``folder`` (the Ray daemons of a cluster whose
    session lives there: GCS, raylets, their workers), with its process group."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                group = os.getpgid(int(proc.name))
                if group != os.getpgrp():  # never this test's own group
                    os.killpg(group, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)


def run_child(node_id: str, in_child: str, env: dict[str, str], timeout_s: float,
              prefix: Sequence[str] = ()) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The test ``node_id`` in a child pytest (``in_child`` set to 1, run through ``prefix``), on a
    cluster of its own below a fresh DRAIN_TEST_TMP; its result and the GCS's abort lines."""
    short = Path(tempfile.mkdtemp(prefix="gsd", dir="/tmp"))
    try:
        child = subprocess.run(
            [*prefix, sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:warnings",
             node_id],
            env={**os.environ, in_child: "1", "DRAIN_TEST_TMP": str(short), **env}, cwd=str(ROOT),
            capture_output=True, text=True, timeout=timeout_s, check=False)
        return child, gcs_aborts(short)
    finally:
        kill_processes_under(short)  # a child that died as the driver left its cluster running
        shutil.rmtree(short, ignore_errors=True)


def drill_in_child(node_id: str, in_child: str, env: dict[str, str], timeout_s: float,
                   prefix: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """``run_child``, once more on a new cluster only when Ray's GCS aborted (an upstream crash, not
    an assertion of the drill); a drill that fails for any other reason, or a second abort, fails."""
    child, aborts = run_child(node_id, in_child, env, timeout_s, prefix)
    if child.returncode != 0 and aborts:
        print(f"Ray's GCS aborted in the first run, ran the drill again on a new cluster: {aborts}")
        child, aborts = run_child(node_id, in_child, env, timeout_s, prefix)
    assert child.returncode == 0 and "1 passed" in child.stdout, (
        (f"Ray's GCS aborted: {aborts}\n" if aborts else "") + child.stdout[-8000:] + child.stderr[-3000:])
    return child
