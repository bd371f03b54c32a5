"""The checks GenNStack promises: cdk-nag, cfn-lint and checkov, over what `cdk synth` writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from aws_cdk import aws_s3 as s3

from gennstack.deploy_warnings import NO_ADMIN
from tests.support import ROOT, Synth, unexpected_validation_findings

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
CFN_LINT = ROOT / ".venv" / "bin" / "cfn-lint"


def _templates(*synths: Synth) -> list[Path]:
    return sorted(path for synth in synths for path in synth.outdir.glob("*.template.json"))


# --- cdk-nag -------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["synth", "synth_variant"])
def test_no_unacknowledged_validation_findings(which: str, request: pytest.FixtureRequest) -> None:
    """Synth succeeded (a finding would have raised), and the report holds no violation of any level.

    The one exception is GenNStack's own warning about a config nobody could reach the cluster
    with (gennstack/deploy_warnings.py), which the default config is meant to print.
    """
    synth: Synth = request.getfixturevalue(which)
    assert unexpected_validation_findings(synth.outdir, synth.config) == []
    report_file = synth.outdir / "validation-report.json"
    reports = json.loads(report_file.read_text())["pluginReports"] if report_file.exists() else []
    warned = [v["description"] for p in reports for v in p["violations"]]
    assert warned == ([] if synth.config.cluster.admin_role_arns else [NO_ADMIN])


def test_nag_fails_synth_on_a_finding(tmp_path: Path) -> None:
    """The check can fail: an unencrypted, non-TLS bucket without access logs stops the synth."""
    from gennstack_infra.app import build_app

    app, stack, _ = build_app(outdir=str(tmp_path))
    s3.Bucket(stack, "CarelessBucket")
    with pytest.raises(RuntimeError, match="ValidationFailed") as excinfo:
        app.synth()
    message = str(excinfo.value)
    assert "AwsSolutions-S1" in message and "AwsSolutions-S10" in message
    assert "CarelessBucket" in message


def _acknowledgments(template: dict) -> list[dict[str, str]]:
    found = []
    for logical_id, resource in sorted(template["Resources"].items()):
        for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
            found.append({"resource": logical_id, "id": rule["id"], "reason": rule["reason"]})
    return found


def test_every_acknowledgment_has_a_reason(synth: Synth, synth_variant: Synth) -> None:
    for synthesized in (synth, synth_variant):
        acknowledgments = _acknowledgments(synthesized.template)
        assert acknowledgments, "cdk-nag acknowledgments are no longer written to the template"
        for ack in acknowledgments:
            assert len(ack["reason"]) >= 40, f"{ack} needs a reason that names the compensating control"


def test_acknowledgment_list(synth: Synth, snapshot) -> None:
    """The full list, grouped by finding and reason, so a reviewer sees every change to it in the snapshot diff."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for ack in _acknowledgments(synth.template):
        grouped.setdefault((ack["id"], ack["reason"]), []).append(ack["resource"])
    listing = [{"id": i, "reason": r, "resources": sorted(res)} for (i, r), res in sorted(grouped.items())]
    print("\n".join(f"{a['id']} on {', '.join(a['resources'])}: {a['reason']}" for a in listing))
    assert listing == snapshot


# --- cfn-lint ------------------------------------------------------------------------------


def test_cfn_lint_reports_nothing(synth: Synth, synth_variant: Synth) -> None:
    """cfn-lint with the committed .cfnlintrc.yaml (run from the repo root so it is picked up)."""
    result = subprocess.run(
        [str(CFN_LINT), "--format", "json", *map(str, _templates(synth, synth_variant))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    matches = json.loads(result.stdout or "[]")
    assert matches == [], json.dumps(matches, indent=1)[:4000]
    assert result.returncode == 0, result.stderr


def test_cfn_lint_config_ignores_only_what_it_explains() -> None:
    config = yaml.safe_load((ROOT / ".cfnlintrc.yaml").read_text())
    assert config["ignore_checks"] == ["W3005"]


# --- checkov -------------------------------------------------------------------------------


def _accepted() -> list[dict]:
    entries = yaml.safe_load((ROOT / "compliance" / "checkov-accepted.yaml").read_text())
    for entry in entries:
        assert set(entry) == {"check", "resources", "reason"}, entry
        assert len(entry["reason"]) >= 40, f"{entry['check']} needs a real reason"
    return entries


@pytest.fixture(scope="module")
def checkov_failures(synth: Synth, synth_variant: Synth) -> list[tuple[str, str]]:
    if not CHECKOV.exists():
        message = f"{CHECKOV} not found: run `make setup` (checkov lives in its own virtual environment)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    files = [arg for path in _templates(synth, synth_variant) for arg in ("-f", str(path))]
    result = subprocess.run(
        [str(CHECKOV), *files, "--framework", "cloudformation", "--skip-download", "--quiet", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    assert result.returncode in (0, 1), result.stderr  # 1: failures found
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert sum(r["summary"]["parsing_errors"] for r in reports) == 0
    assert sum(r["summary"]["passed"] for r in reports) > 50, "checkov ran no real checks"
    return sorted(
        (check["check_id"], check["resource"].split(".", 1)[1]) for r in reports for check in r["results"]["failed_checks"]
    )


def test_checkov_failures_are_all_accepted_with_reasons(checkov_failures: list[tuple[str, str]]) -> None:
    accepted = _accepted()
    unexplained = [
        (check_id, logical_id)
        for check_id, logical_id in checkov_failures
        if not any(e["check"] == check_id and logical_id.startswith(tuple(e["resources"])) for e in accepted)
    ]
    assert unexplained == [], "fix these, or accept them in compliance/checkov-accepted.yaml with a reason"


def test_checkov_accepted_list_has_no_stale_entries(checkov_failures: list[tuple[str, str]]) -> None:
    for entry in _accepted():
        for prefix in entry["resources"]:
            assert any(
                check_id == entry["check"] and logical_id.startswith(prefix) for check_id, logical_id in checkov_failures
            ), f"{entry['check']} on {prefix} no longer fails: remove it from compliance/checkov-accepted.yaml"


def test_checkov_is_installed_apart_from_the_app() -> None:
    """checkov pins old boto3/packaging; in the app's environment pip would walk them back."""
    assert shutil.which("checkov", path=str(ROOT / ".venv" / "bin")) is None
