"""Every IAM policy the stack creates stays under IAM's size limits, computed for the worst case.

IAM's limits (IAM User Guide, "IAM and AWS STS quotas", character limits; IAM does not count
white space): a customer managed policy at most 6,144 characters; all inline policies of one role
together at most 10,240; a role's trust policy at most 2,048 (the default quota).

The template is synthesized with the longest ``cluster_name`` config allows (100 characters, also
EKS's limit), and every token is replaced by the longest value it can take: the longest partition
(``aws-us-gov``), a region name of ``MAX_REGION_LENGTH`` characters (config's bound; real region
names are at most 14), a 12-digit account, and for each resource whose ARN a policy names, the
longest name that resource type allows (so CloudFormation's generated names, whatever they are,
cannot be longer).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gennstack.config import MAX_REGION_LENGTH
from tests.support import Synth, synthesize

MANAGED_POLICY_LIMIT = 6_144
INLINE_PER_ROLE_LIMIT = 10_240
TRUST_POLICY_LIMIT = 2_048

LONGEST_CLUSTER_NAME = "c" + "x" * 99
PARTITION = "aws-us-gov"
REGION = "r" * MAX_REGION_LENGTH
ACCOUNT = "123456789012"
URL_SUFFIX = "amazonaws.com.cn"

# The longest physical name of each resource type whose ARN or name a policy can hold, from each
# service's naming rules: IAM role 64, Lambda function 64, SQS queue 80, DynamoDB table 255,
# S3 bucket 63, Secrets Manager secret 512 (plus the "-" and 6 random characters of its ARN).
_LONGEST_NAME = {
    "AWS::IAM::Role": 64,
    "AWS::Lambda::Function": 64,
    "AWS::SQS::Queue": 80,
    "AWS::DynamoDB::GlobalTable": 255,
    "AWS::DynamoDB::Table": 255,
    "AWS::S3::Bucket": 63,
    "AWS::SecretsManager::Secret": 512,
}


def _arn(resource_type: str, attribute: str) -> str:
    prefix = f"arn:{PARTITION}"
    name = "n" * _LONGEST_NAME.get(resource_type, 0)
    arns = {
        ("AWS::IAM::Role", "Arn"): f"{prefix}:iam::{ACCOUNT}:role/{name}",
        ("AWS::Lambda::Function", "Arn"): f"{prefix}:lambda:{REGION}:{ACCOUNT}:function:{name}",
        ("AWS::SQS::Queue", "Arn"): f"{prefix}:sqs:{REGION}:{ACCOUNT}:{name}",
        ("AWS::DynamoDB::GlobalTable", "Arn"): f"{prefix}:dynamodb:{REGION}:{ACCOUNT}:table/{name}",
        ("AWS::DynamoDB::Table", "Arn"): f"{prefix}:dynamodb:{REGION}:{ACCOUNT}:table/{name}",
        ("AWS::S3::Bucket", "Arn"): f"{prefix}:s3:::{name}",
        ("AWS::SecretsManager::Secret", "Ref"): f"{prefix}:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-abcdef",
        ("AWS::KMS::Key", "Arn"): f"{prefix}:kms:{REGION}:{ACCOUNT}:key/{'k' * 36}",
        ("AWS::EKS::Cluster", "Arn"): f"{prefix}:eks:{REGION}:{ACCOUNT}:cluster/{LONGEST_CLUSTER_NAME}",
        # Ref of a cluster is its name (Pod Identity trusts name the cluster's ARN built from it)
        ("AWS::EKS::Cluster", "Ref"): LONGEST_CLUSTER_NAME,
        ("AWS::EC2::VPC", "DefaultSecurityGroup"): "sg-" + "0" * 17,
    }
    if (resource_type, attribute) not in arns:
        raise AssertionError(
            f"a policy names {resource_type}.{attribute}: add its longest value to tests/test_policy_sizes.py"
        )
    return arns[(resource_type, attribute)]


def worst_case(value: Any, resources: dict[str, Any]) -> Any:
    """``value`` with every intrinsic replaced by the longest string it can resolve to."""
    if isinstance(value, list):
        return [worst_case(item, resources) for item in value]
    if not isinstance(value, dict):
        return value
    pseudo = {"AWS::Partition": PARTITION, "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": URL_SUFFIX}
    if "Ref" in value:
        ref = value["Ref"]
        return pseudo[ref] if ref in pseudo else _arn(resources[ref]["Type"], "Ref")
    if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        return re.sub(
            r"\$\{([^}]+)\}",
            lambda m: pseudo.get(m[1]) or _arn(resources[m[1].split(".")[0]]["Type"], (m[1].split(".") + ["Ref"])[1]),
            value["Fn::Sub"],
        )
    if "Fn::GetAtt" in value:
        logical_id, attribute = value["Fn::GetAtt"]
        return _arn(resources[logical_id]["Type"], attribute)
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(str(worst_case(part, resources)) for part in parts)
    unknown = [key for key in value if key.startswith("Fn::")]
    assert not unknown, f"no worst case for {unknown} in {value}"
    return {key: worst_case(item, resources) for key, item in value.items()}


def size(document: Any) -> int:
    """Characters IAM counts: the JSON without white space outside strings."""
    return len(json.dumps(document, separators=(",", ":")))


@pytest.fixture(scope="module")
def longest(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(Path(tmp_path_factory.mktemp("cdk-longest")), {"cluster_name": LONGEST_CLUSTER_NAME, "drills": {"enabled": True}})


def test_every_managed_policy_fits(longest: Synth) -> None:
    resources = longest.template["Resources"]
    sizes = {
        logical_id: size(worst_case(policy["Properties"]["PolicyDocument"], resources))
        for logical_id, policy in longest.resources("AWS::IAM::ManagedPolicy").items()
    }
    print("managed policy sizes (worst case):", json.dumps(sizes, indent=1))
    assert len(sizes) >= 7
    assert {k: v for k, v in sizes.items() if v > MANAGED_POLICY_LIMIT} == {}
    # The split is what makes Karpenter's fit: all six together would not.
    karpenter = sum(v for k, v in sizes.items() if k.startswith("KarpenterController"))
    assert karpenter > MANAGED_POLICY_LIMIT


def test_inline_policies_per_role_fit(longest: Synth) -> None:
    resources = longest.template["Resources"]
    per_role: dict[str, int] = {}
    for policy in longest.resources("AWS::IAM::Policy").values():
        document_size = size(worst_case(policy["Properties"]["PolicyDocument"], resources))
        for role in policy["Properties"].get("Roles", []):
            per_role[role["Ref"]] = per_role.get(role["Ref"], 0) + document_size
    for logical_id, role in longest.resources("AWS::IAM::Role").items():
        for policy in role["Properties"].get("Policies", []):
            per_role[logical_id] = per_role.get(logical_id, 0) + size(worst_case(policy["PolicyDocument"], resources))
    print("inline policy bytes per role (worst case):", json.dumps(per_role, indent=1))
    assert per_role
    assert {k: v for k, v in per_role.items() if v > INLINE_PER_ROLE_LIMIT} == {}


def test_trust_policies_fit(longest: Synth) -> None:
    resources = longest.template["Resources"]
    for logical_id, role in longest.resources("AWS::IAM::Role").items():
        assert size(worst_case(role["Properties"]["AssumeRolePolicyDocument"], resources)) <= TRUST_POLICY_LIMIT, logical_id


def test_the_worst_case_is_worse_than_the_default(synth: Synth, longest: Synth) -> None:
    """The evaluation substitutes something: the long cluster name makes Karpenter's policies longer."""
    def karpenter_size(s: Synth) -> int:
        resources = s.template["Resources"]
        return sum(
            size(worst_case(p["Properties"]["PolicyDocument"], resources))
            for k, p in s.resources("AWS::IAM::ManagedPolicy").items()
            if k.startswith("KarpenterController")
        )

    assert karpenter_size(longest) - karpenter_size(synth) >= 16 * (len(LONGEST_CLUSTER_NAME) - len("gennstack"))


def test_an_unknown_reference_fails_loudly() -> None:
    with pytest.raises(AssertionError, match="AWS::SNS::Topic.TopicArn"):
        worst_case({"Fn::GetAtt": ["Topic", "TopicArn"]}, {"Topic": {"Type": "AWS::SNS::Topic"}})
