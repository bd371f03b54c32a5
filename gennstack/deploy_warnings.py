"""What a config can synthesize but a user should not deploy without knowing: one list, three readers.

The synth (``gennstack_infra/components/cluster.py`` adds each as a CDK warning, which ``cdk synth`` and
``cdk deploy`` print), ``gennstack summary`` (from the config recorded in the template) and
``gennstack preflight`` (which fails on a missing admin) say the same thing in the same words.
Works on the JSON form of the config (``GenNStackConfig.model_dump(mode="json")``), which is what
the template records.
"""

from __future__ import annotations

import re
from typing import Any

_COMMIT = re.compile(r"^[0-9a-f]{40}$")

FIND_YOUR_ROLE = (
    "find your role: `aws sts get-caller-identity` shows arn:aws:sts::ACCOUNT:assumed-role/ROLE/SESSION; "
    "`aws iam get-role --role-name ROLE --query Role.Arn` prints the ARN to list, path included "
    "(IAM Identity Center: arn:aws:iam::ACCOUNT:role/aws-reserved/sso.amazonaws.com/REGION/AWSReservedSSO_...; "
    "EKS access entries take the path, unlike aws-auth)"
)

NO_ADMIN = (
    "cluster.admin_role_arns is empty: nobody but CDK's kubectl role could use the cluster "
    "(authentication by access entries only, no cluster-creator admin). Add your role's ARN to "
    "cluster.admin_role_arns before deploying; " + FIND_YOUR_ROLE
)

ZONES_BY_GETAZS = (
    "network.availability_zones is unset: the VPC takes the first network.az_count zones Fn::GetAZs lists, "
    "which may include a zone EKS cannot use (us-east-1's use1-az3) or one without inf2, trn2 or g6e. "
    "Run `gennstack preflight` for a zone set where every enabled generation runs, and set region and "
    "network.availability_zones"
)


def unpinned_revision(generation: str, revision: str) -> str:
    return (
        f"generations.{generation}.model_revision is {revision!r}, not a commit: the staging Job records the commit "
        "it copied and fails when the branch or tag later moves; pin the 40-character commit it logs"
    )


def config_warnings(config: dict[str, Any]) -> list[str]:
    """The warnings for a config in its JSON form, most important first."""
    found = []
    if not config.get("cluster", {}).get("admin_role_arns"):
        found.append(NO_ADMIN)
    if config.get("network", {}).get("availability_zones") is None:
        found.append(ZONES_BY_GETAZS)
    for name, generation in config.get("generations", {}).items():
        revision = generation.get("model_revision", "main")
        if generation.get("enabled") and not _COMMIT.match(revision):
            found.append(unpinned_revision(name, revision))
    return found
