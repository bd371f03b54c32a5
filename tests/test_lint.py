"""The code base passes ruff's pyflakes rules (pyproject.toml [tool.ruff]): no unused imports, no undefined names."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def test_ruff_reports_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
