"""Snapshot, determinism, and `cdk synth` (the CLI path) giving the same template as the test path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.support import ROOT, Synth, mask_asset_hashes, synthesize


@pytest.fixture
def json_snapshot(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


def _masked(template_file: Path) -> dict:
    return json.loads(mask_asset_hashes(template_file.read_text(encoding="utf-8")))


def test_template_snapshot(synth: Synth, json_snapshot) -> None:
    """One snapshot of the stack, asset hashes masked: a diff shows exactly what changed.

    After an intended change: `.venv/bin/python -m pytest tests/test_synth.py --snapshot-update`.
    """
    assert _masked(synth.outdir / "GenNStack.template.json") == json_snapshot


def test_two_synths_are_byte_identical(synth: Synth, tmp_path: Path) -> None:
    again = synthesize(tmp_path)
    for name in ("GenNStack.template.json", "GenNStack.assets.json"):
        assert (again.outdir / name).read_bytes() == (synth.outdir / name).read_bytes(), name


def test_asset_folders_exclude_local_junk(synth: Synth) -> None:
    """__pycache__ or editor backups inside an asset would change its hash, and the template."""
    for asset_dir in synth.outdir.glob("asset.*"):
        if asset_dir.is_dir():
            junk = [p for p in asset_dir.rglob("*") if p.name == "__pycache__" or p.name.endswith(("~", ".pyc", ".swp"))]
            assert junk == [], junk


@pytest.mark.slow
def test_cdk_cli_synth_matches_in_process_synth(synth: Synth, tmp_path: Path) -> None:
    """`npx cdk synth GenNStack` (cdk.json context via the CLI) writes the very bytes the tests check."""
    cdk = ROOT / "node_modules" / ".bin" / "cdk"
    if not cdk.exists():
        message = f"{cdk} not found: run `make setup`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "CDK_DISABLE_CLI_TELEMETRY": "true", "CDK_DISABLE_VERSION_CHECK": "true"}
    env["PATH"] = f"{ROOT / 'node_modules' / '.bin'}:{env['PATH']}"
    result = subprocess.run(
        [str(cdk), "synth", "GenNStack", "--quiet", "--output", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("GenNStack.template.json", "GenNStack.assets.json"):
        assert (tmp_path / name).read_bytes() == (synth.outdir / name).read_bytes(), name
