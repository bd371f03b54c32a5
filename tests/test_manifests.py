"""Every Kubernetes object the stack applies directly (not through a chart) validates, tokens resolved."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.k8s_schema import validate
from tests.support import Synth

# What a deploy-time token resolves to, shaped as the schema expects.
_TOKEN_VALUES = {"ClusterSecurityGroupId": "sg-0123456789abcdef0", "Arn": "arn:aws:iam::123456789012:role/gennstack-example"}


def _resolve(part: Any) -> str:
    if isinstance(part, str):
        return part
    if "Fn::GetAtt" in part:
        return _TOKEN_VALUES.get(part["Fn::GetAtt"][1], "resolved-at-deploy")
    return "resolved-at-deploy"  # Ref: a name


def applied_objects(synth: Synth) -> list[tuple[str, dict]]:
    objects = []
    for logical_id, resource in synth.template["Resources"].items():
        if resource["Type"] != "Custom::AWSCDK-EKS-KubernetesResource":
            continue
        manifest = resource["Properties"]["Manifest"]
        if isinstance(manifest, dict):
            manifest = "".join(_resolve(part) for part in manifest["Fn::Join"][1])
        objects += [(logical_id, obj) for obj in json.loads(manifest)]
    return objects


@pytest.mark.parametrize("which", ["synth", "synth_variant"])
def test_every_applied_object_validates(which: str, request: pytest.FixtureRequest) -> None:
    objects = applied_objects(request.getfixturevalue(which))
    kinds = {obj["kind"] for _, obj in objects}
    assert {"NodePool", "EC2NodeClass", "ServiceAccount", "Role", "RoleBinding", "Namespace"} <= kinds
    for logical_id, obj in objects:
        try:
            validate(obj)
        except AssertionError as exc:
            raise AssertionError(f"{logical_id}: {exc}") from None
