"""Prometheus' own promtool, run on rule files: `check rules` (parse) and `test rules` (unit tests).

Debian's `prometheus` package ships it (.ci/run installs it). Without it the tests skip locally
and fail under CI=true, so CI can never pass without having run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml


def binary() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool not found: install Debian's `prometheus` package (apt-get install prometheus), as .ci/run does"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([binary(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def write_rules(directory: Path, groups: list[dict[str, Any]], name: str = "rules.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False), encoding="utf-8")
    return path


def check_rules(directory: Path, groups: list[dict[str, Any]]) -> subprocess.CompletedProcess:
    path = write_rules(directory, groups, "check.yaml")
    return run("check", "rules", path.name, cwd=directory)
