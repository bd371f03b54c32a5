"""examples/multinode-scout.yaml (the README's multi-node overlay) synthesizes clean: cdk-nag through the
app's own validation, cfn-lint with the committed .cfnlintrc.yaml, checkov with the accepted list,
as tests/test_compliance.py checks the default and variant synths; and it installs what it needs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from gennstack import versions
from tests.support import ROOT, Synth, synthesize, unexpected_validation_findings

pytestmark = pytest.mark.slow

OVERLAY = ROOT / "examples" / "multinode-scout.yaml"
CFN_LINT = ROOT / ".venv" / "bin" / "cfn-lint"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


@pytest.fixture(scope="module")
def scout(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("scout"), yaml.safe_load(OVERLAY.read_text()))


def test_cdk_nag_finds_nothing_new(scout: Synth) -> None:
    assert scout.config.serving.multi_node.enabled
    assert unexpected_validation_findings(scout.outdir, scout.config) == []


def test_the_lws_controller_is_installed_pinned_and_the_chart_gets_the_group(scout: Synth) -> None:
    charts = {c["Properties"]["Release"]: c["Properties"] for c in scout.resources("Custom::AWSCDK-EKS-HelmChart").values()}
    lws = charts[versions.LWS.name]
    assert (lws["Chart"], lws["Repository"], lws["Version"], lws["Namespace"]) == (
        "lws", "oci://registry.k8s.io/lws/charts/lws", "0.10.0", "lws-system")
    serving = json.dumps(charts["gennstack-serving"]["Values"])
    assert "multiNode" in serving and "Llama-4-Scout-17B-16E-Instruct" in serving


def test_cfn_lint_reports_nothing(scout: Synth) -> None:
    result = subprocess.run([str(CFN_LINT), "--format", "json", *map(str, sorted(scout.outdir.glob("*.template.json")))],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert json.loads(result.stdout or "[]") == [] and result.returncode == 0, result.stdout[:4000] + result.stderr


def test_checkov_finds_only_accepted_failures(scout: Synth) -> None:
    if not CHECKOV.exists():
        message = f"{CHECKOV} not found: run `make setup`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    files = [arg for path in sorted(scout.outdir.glob("*.template.json")) for arg in ("-f", str(path))]
    result = subprocess.run([str(CHECKOV), *files, "--framework", "cloudformation", "--skip-download", "--quiet", "-o", "json"],
                            capture_output=True, text=True, timeout=600, check=False,
                            env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"})
    assert result.returncode in (0, 1), result.stderr
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    accepted = yaml.safe_load((ROOT / "compliance" / "checkov-accepted.yaml").read_text())
    failed = [(c["check_id"], c["resource"].split(".", 1)[1]) for r in reports for c in r["results"]["failed_checks"]]
    unexplained = [(check, logical) for check, logical in failed
                   if not any(e["check"] == check and logical.startswith(tuple(e["resources"])) for e in accepted)]
    assert unexplained == []


def test_readme_shows_the_overlay_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"```yaml\n{OVERLAY.read_text(encoding='utf-8')}```" in readme
