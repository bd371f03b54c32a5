"""Debian's prometheus-alertmanager (the `prometheus-alertmanager` server and `amtool`), as the tests run them.

Debian bookworm ships Alertmanager v0.25.0; the chart deploys v0.33.1 (kube-prometheus-stack 88.3.0
values.yaml alertmanagerSpec.image.tag). The configuration GenNStack renders uses only fields both
versions accept (gennstack/observability/alertmanager.py). Without the package the tests skip
locally and fail under CI=true (.ci/run installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SERVER = "prometheus-alertmanager"


def binary(name: str, package: str = "prometheus-alertmanager") -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found: install Debian's `{package}` package (apt-get install {package}), as .ci/run does"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def amtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([binary("amtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
