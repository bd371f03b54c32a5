"""The rate-limit Redis, run for real: Debian's redis-server started on 127.0.0.1 with exactly the
arguments and environment the chart renders for the container (the kubelet's ``$(VAR)`` expansion
done the way Kubernetes does it), plus only a loopback bind and a free port. An unauthenticated
client is refused; the password from the Secret works; the readiness probe passes only with it.

redis-server and redis-cli come from Debian (``apt-get install redis-server``, which .ci/run does);
without them the test skips, and fails under CI=true."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.gateway.conftest import RELAY_IMAGE, without_resume
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.values import gateway_chart_values

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway"
# What the construct's generated secret looks like: 48 letters and digits.
PASSWORD = "Zq7" * 16


def _binaries() -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not (server and cli):
        message = "redis-server/redis-cli not found: apt-get install redis-server (Debian), as .ci/run does"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return server, cli


def _container(helm: Path) -> dict:
    gateway = GatewayConfig()
    values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", resume_image=RELAY_IMAGE, api_keys_secret_name="k",
                                  redis_secret_name="gennstack/gateway-redis")
    proc = subprocess.run([str(helm), "template", "gennstack-gateway", str(CHART), "--namespace", gateway.namespace,
                           "--values", "-"], input=json.dumps(values), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (deployment,) = [d for d in without_resume([d for d in yaml.safe_load_all(proc.stdout) if d]) if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's dependent-variable expansion: ``$(NAME)`` of a defined variable becomes its value."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send(port: int, *commands: bytes) -> list[bytes]:
    """Raw RESP inline commands on one connection; one reply line each."""
    replies = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        reader = conn.makefile("rb")
        for command in commands:
            conn.sendall(command + b"\r\n")
            replies.append(reader.readline().rstrip(b"\r\n"))
    return replies


@pytest.fixture(scope="module")
def redis(helm, tmp_path_factory) -> Iterator[tuple[int, dict, str]]:
    server, cli = _binaries()
    container = _container(helm)
    secret = {"password": PASSWORD}  # the synced Secret's data
    env = {e["name"]: secret[e["valueFrom"]["secretKeyRef"]["key"]] for e in container["env"]}
    args = [_expand(a, env) for a in container["args"]]
    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([server, *args, "--bind", "127.0.0.1", "--port", str(port)], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.1)
        yield port, container, cli
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unauthenticated_clients_are_refused(redis) -> None:
    port, _, _ = redis
    ping, incr, auth = _send(port, b"PING", b"INCRBY budget 1000", b"AUTH wrong-password")
    assert ping.startswith(b"-NOAUTH") and incr.startswith(b"-NOAUTH")
    assert auth.startswith(b"-WRONGPASS")
    # nothing was counted
    assert _send(port, b"AUTH " + PASSWORD.encode(), b"GET budget") == [b"+OK", b"$-1"]


def test_the_password_from_the_secret_works(redis) -> None:
    """envoyproxy/ratelimit sends ``AUTH <REDIS_AUTH>`` (no user: the value has no ``:``), then INCRBY."""
    port, _, _ = redis
    assert _send(port, b"AUTH " + PASSWORD.encode(), b"INCRBY counter 5", b"INCRBY counter 7") == [b"+OK", b":5", b":12"]


def test_readiness_probe_needs_the_password(redis) -> None:
    port, container, cli = redis
    (shell, flag, script) = container["readinessProbe"]["exec"]["command"]
    assert (shell, flag) == ("sh", "-c") and script.startswith("redis-cli ")
    script = script.replace("redis-cli", f"{cli} -p {port}", 1)  # the test's port; the pod's is 6379

    def probe(extra_env: dict[str, str]) -> int:
        clean = {k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"}
        return subprocess.run([shell, flag, script], env={**clean, **extra_env}, timeout=30).returncode

    assert {e["name"] for e in container["env"]} == {"REDIS_PASSWORD", "REDISCLI_AUTH"}
    assert probe({"REDISCLI_AUTH": PASSWORD}) == 0
    assert probe({}) != 0
    assert probe({"REDISCLI_AUTH": "wrong"}) != 0
