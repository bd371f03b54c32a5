"""The container scripts the serving pods run (assets/charts/gennstack-serving/files), run as real
processes against fakes of what they call: a fake `vllm` executable on PATH that records how it was
started and spawns a child of its own, a local health endpoint, and a local HTTPS server standing in
for the Kubernetes API. Everything binds to 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.lambdas.lambda_support import make_certificate
from tests.serving.aws_fakes import free_port
from tests.serving.conftest import CHART, load_script
from tests.serving.containers import SERVE_HEALTH, alive, wait_for

FILES = CHART / "files"

# A stand-in for the `vllm` console script: records its arguments, pid and environment, starts a
# child process (as vLLM starts its engine core), then serves /health on --port or exits.
FAKE_VLLM = '''\
import http.server, json, os, signal, subprocess, sys, time
stubborn = os.environ.get("FAKE_CHILD_IGNORES_SIGTERM") == "1"
child_code = "import signal, time\\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" if stubborn else "") + "time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", child_code])
record = {"argv": sys.argv[1:], "pid": os.getpid(), "child": child.pid, "env": dict(os.environ)}
path = os.environ["FAKE_VLLM_RECORD"]
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
if os.environ.get("FAKE_VLLM_EXIT"):
    child.kill()
    sys.exit(int(os.environ["FAKE_VLLM_EXIT"]))
port = int(sys.argv[sys.argv.index("--port") + 1])
''' + SERVE_HEALTH


load = load_script


@pytest.fixture
def fake_vllm(tmp_path: Path) -> dict[str, str]:
    """Environment with the fake `vllm` first on PATH; its record lands in tmp_path/record.json."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable = bin_dir / "vllm"
    executable.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
    executable.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_VLLM_RECORD": str(tmp_path / "record.json")}


def record(env: dict[str, str]) -> dict[str, Any]:
    path = Path(env["FAKE_VLLM_RECORD"])
    assert wait_for(path.exists), "the fake vllm never started"
    return json.loads(path.read_text())


# --- vllm_serve.py: the launcher of every vLLM server -----------------------------------------

ARGS = ["--model", "/cache/models/m/main", "--served-model-name", "m", "--max-model-len", "8192",
        "--additional-config", '{"override_neuron_config": {"moe_ep_degree": 16}}']


def test_launcher_execs_vllm_serve_with_the_model_first_and_no_launcher_variables(fake_vllm) -> None:
    env = {**os.environ, **fake_vllm, "VLLM_ARGS": json.dumps(ARGS), "GENNSTACK_VLLM_PORT": "8001", "FAKE_VLLM_EXIT": "0"}
    proc = subprocess.run([sys.executable, str(FILES / "vllm_serve.py"), "0.0.0.0", "8000"], env=env, timeout=30)
    assert proc.returncode == 0
    seen = record(fake_vllm)
    # `vllm serve <model> ...`: the positional model, every other argument unsplit, in order.
    assert seen["argv"] == ["serve", "/cache/models/m/main", "--served-model-name", "m", "--max-model-len", "8192",
                            "--additional-config", '{"override_neuron_config": {"moe_ep_degree": 16}}',
                            "--host", "0.0.0.0", "--port", "8000"]
    # The launcher became vLLM (exec): Kubernetes' SIGTERM reaches vLLM itself.
    launcher = subprocess.Popen([sys.executable, str(FILES / "vllm_serve.py"), "0.0.0.0", "8000"], env=env)
    launcher.wait(timeout=30)
    assert record(fake_vllm)["pid"] == launcher.pid
    assert "VLLM_ARGS" not in seen["env"] and "GENNSTACK_VLLM_PORT" not in seen["env"]


@pytest.mark.parametrize("args, message", [
    (["--served-model-name", "m"], "must name the model with --model"),
    ({"model": "m"}, "JSON list of strings"),
])
def test_launcher_rejects_arguments_it_cannot_start(args, message) -> None:
    launcher = load("vllm_serve")
    with pytest.raises(ValueError, match=message):
        launcher.command("0.0.0.0", "8000", {"VLLM_ARGS": json.dumps(args)})


def test_launcher_accepts_the_model_as_one_argument() -> None:
    launcher = load("vllm_serve")
    command = launcher.command("127.0.0.1", "1", {"VLLM_ARGS": json.dumps(["--model=/m", "--max-num-seqs", "4"])})
    assert command == ["vllm", "serve", "/m", "--max-num-seqs", "4", "--host", "127.0.0.1", "--port", "1"]


# --- gennstack_serve.py: the vLLM child of each Ray Serve replica -------------------------------


@pytest.fixture
def serve_app(monkeypatch):
    monkeypatch.syspath_prepend(str(FILES))
    load("vllm_serve")
    return load("gennstack_serve")


@pytest.mark.parametrize("stubborn", [False, True], ids=["child-exits-on-sigterm", "child-ignores-sigterm"])
def test_replica_stops_the_whole_vllm_process_group(serve_app, fake_vllm, stubborn) -> None:
    port = str(free_port())
    # As inside a Ray actor that asked for one CPU: Ray has set OMP_NUM_THREADS=1.
    environ = {**os.environ, **fake_vllm, "OMP_NUM_THREADS": "1", "GENNSTACK_OMP_NUM_THREADS": "160",
               "GENNSTACK_VLLM_PORT": port, "VLLM_ARGS": json.dumps(ARGS),
               "FAKE_CHILD_IGNORES_SIGTERM": "1" if stubborn else "0"}
    server = serve_app.ServerProcess(serve_app.command("127.0.0.1", port, environ), serve_app.server_environment(environ))
    try:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", interval=0.05)
        seen = record(fake_vllm)
        assert seen["env"]["OMP_NUM_THREADS"] == "160"
        assert "VLLM_ARGS" not in seen["env"] and not any(k.startswith("GENNSTACK_") for k in seen["env"])
        assert seen["argv"][:2] == ["serve", "/cache/models/m/main"]
        leader, child = seen["pid"], seen["child"]
        assert alive(leader) and alive(child)
        assert os.getpgid(child) == leader != os.getpgid(os.getpid())  # its own group, not the replica's
    finally:
        started = time.monotonic()
        server.stop(timeout=1.0)
    assert wait_for(lambda: not alive(leader) and not alive(child), timeout=5), "a vLLM process survived stop()"
    # A child that ignores SIGTERM is killed once the timeout passes, not waited for forever.
    assert time.monotonic() - started < 5


def test_replica_stops_the_group_when_vllm_dies_while_loading(serve_app, fake_vllm) -> None:
    environ = {**os.environ, **fake_vllm, "GENNSTACK_OMP_NUM_THREADS": "4", "VLLM_ARGS": json.dumps(ARGS),
               "FAKE_VLLM_EXIT": "3"}
    server = serve_app.ServerProcess(serve_app.command("127.0.0.1", "1", environ), serve_app.server_environment(environ))
    with pytest.raises(RuntimeError, match="vLLM exited with 3 while loading"):
        server.wait_healthy(f"http://127.0.0.1:{free_port()}/health", interval=0.05)
    server.stop(timeout=1.0)
    assert not alive(record(fake_vllm)["child"])


def test_replica_environment_needs_the_thread_count(serve_app) -> None:
    with pytest.raises(KeyError, match="GENNSTACK_OMP_NUM_THREADS"):
        serve_app.server_environment({"VLLM_ARGS": "[]"})


# --- release_do_not_disrupt.py: the native sidecar --------------------------------------------


class FakeApi:
    """127.0.0.1 HTTPS server for the pod PATCH, and a plain-HTTP health endpoint."""

    def __init__(self, tls, healthy: bool) -> None:
        self.patches: list[dict[str, Any]] = []
        self.healthy = healthy
        fake = self

        class Api(BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.patches.append({"path": self.path, "headers": dict(self.headers), "body": body})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        class Health(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if fake.healthy else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.certfile, tls.keyfile)
        self.api = ThreadingHTTPServer(("127.0.0.1", 0), Api)
        self.api.socket = context.wrap_socket(self.api.socket, server_side=True)
        self.health = ThreadingHTTPServer(("127.0.0.1", 0), Health)
        for server in (self.api, self.health):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.api, self.health):
            server.shutdown()
            server.server_close()


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator:
    tls = make_certificate(tmp_path, "kubernetes")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-bound-token\n")
    (account / "namespace").write_text("gennstack-serving\n")
    (account / "ca.crt").write_text(Path(tls.certfile).read_text())
    started: list[tuple[subprocess.Popen, FakeApi]] = []

    def start(healthy: bool) -> tuple[subprocess.Popen, FakeApi]:
        fake = FakeApi(tls, healthy)
        env = {**os.environ, "HEALTH_URL": f"http://127.0.0.1:{fake.health.server_address[1]}/health",
               "POD_NAME": "gen3-g6e-7d9f8c-abcde", "SERVICE_ACCOUNT_DIR": str(account),
               "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(fake.api.server_address[1])}
        proc = subprocess.Popen([sys.executable, str(FILES / "release_do_not_disrupt.py")], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append((proc, fake))
        return proc, fake

    yield start
    for proc, fake in started:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        fake.close()


def test_sidecar_removes_only_its_pods_annotation_once_healthy(sidecar) -> None:
    proc, fake = sidecar(healthy=True)
    assert wait_for(lambda: fake.patches, timeout=15), "the sidecar never patched its pod"
    patch = fake.patches[0]
    assert patch["path"] == "/api/v1/namespaces/gennstack-serving/pods/gen3-g6e-7d9f8c-abcde"
    assert patch["body"] == {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": None}}}
    assert patch["headers"]["Content-Type"] == "application/merge-patch+json"
    assert patch["headers"]["Authorization"] == "Bearer pod-bound-token"
    time.sleep(0.5)
    assert len(fake.patches) == 1 and proc.poll() is None  # patched once, then idles (a sidecar)


def test_sidecar_leaves_the_annotation_while_the_server_loads(sidecar) -> None:
    proc, fake = sidecar(healthy=False)
    time.sleep(2)
    assert fake.patches == [] and proc.poll() is None
