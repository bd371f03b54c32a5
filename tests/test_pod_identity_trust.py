"""Pod Identity roles: each may be assumed only by its association's service account, namespace and cluster.

The EKS User Guide's trust for a Pod Identity role restricted to one ServiceAccount and Namespace
(awsdocs/amazon-eks-user-guide latest/ug/manage-access/aws-access/pod-id-role.adoc, "Setting
Conditions"): ``StringEquals`` on ``aws:RequestTag/kubernetes-namespace`` and
``aws:RequestTag/kubernetes-service-account`` for ``sts:AssumeRole`` and ``sts:TagSession``; the same
page lists ``eks-cluster-arn`` among the request tags Pod Identity sends, which binds the cluster.
"""

from __future__ import annotations

import json

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

from gennstack_infra.components.pod_identity import scope_pod_identity_trust
from tests.support import Synth


def _roles_of_associations(synth: Synth) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    for association in synth.resources("AWS::EKS::PodIdentityAssociation").values():
        props = association["Properties"]
        out.setdefault(props["RoleArn"]["Fn::GetAtt"][0], set()).add((props["Namespace"], props["ServiceAccount"]))
    return out


def test_every_pod_identity_role_trusts_only_its_associations(any_synth_pair: tuple[Synth, Synth]) -> None:
    for synth in any_synth_pair:
        associations = _roles_of_associations(synth)
        (cluster_id,) = synth.resources("AWS::EKS::Cluster")
        pod_roles = {
            k: r for k, r in synth.resources("AWS::IAM::Role").items()
            if "pods.eks.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])
        }
        assert set(pod_roles) == set(associations), "every Pod Identity role has an association, and only those trust EKS"
        for role_id, role in pod_roles.items():
            pairs = set()
            for statement in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]:
                assert statement["Effect"] == "Allow"
                assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
                assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
                assert set(statement["Condition"]) == {"StringEquals"}, role_id
                tags = statement["Condition"]["StringEquals"]
                assert set(tags) == {
                    "aws:RequestTag/eks-cluster-arn",
                    "aws:RequestTag/kubernetes-namespace",
                    "aws:RequestTag/kubernetes-service-account",
                }
                arn = json.dumps(tags["aws:RequestTag/eks-cluster-arn"])
                assert ':eks:' in arn and ':cluster/' in arn and json.dumps({"Ref": cluster_id}) in arn, arn
                pairs.add((tags["aws:RequestTag/kubernetes-namespace"], tags["aws:RequestTag/kubernetes-service-account"]))
            assert pairs == associations[role_id], role_id


def _bare_stack() -> tuple[Stack, eks.CfnPodIdentityAssociation]:
    stack = Stack(App(), "Test")
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"))
    association = eks.CfnPodIdentityAssociation(
        stack, "Association", cluster_name="c", namespace="ns", service_account="sa", role_arn=role.role_arn)
    return stack, association


def test_two_associations_of_one_role_get_one_statement_each() -> None:
    stack, first = _bare_stack()
    eks.CfnPodIdentityAssociation(stack, "Second", cluster_name="c", namespace="other", service_account="sa2",
                                  role_arn=first.role_arn)
    (statements,) = scope_pod_identity_trust(stack).values()
    assert [(s["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-namespace"],
             s["Condition"]["StringEquals"]["aws:RequestTag/kubernetes-service-account"]) for s in statements] == [
        ("ns", "sa"), ("other", "sa2")]


def test_a_role_from_outside_the_stack_fails_synth() -> None:
    stack, _ = _bare_stack()
    eks.CfnPodIdentityAssociation(stack, "Imported", cluster_name="c", namespace="ns", service_account="x",
                                  role_arn="arn:aws:iam::123456789012:role/elsewhere")
    with pytest.raises(ValueError, match="Test/Imported names role 'arn:aws:iam::123456789012:role/elsewhere'"):
        scope_pod_identity_trust(stack)


def test_a_role_that_trusts_another_principal_too_fails_synth() -> None:
    stack = Stack(App(), "Test")
    role = iam.Role(stack, "Role", assumed_by=iam.CompositePrincipal(
        iam.ServicePrincipal("pods.eks.amazonaws.com"), iam.ServicePrincipal("ec2.amazonaws.com")))
    eks.CfnPodIdentityAssociation(stack, "Association", cluster_name="c", namespace="ns", service_account="sa",
                                  role_arn=role.role_arn)
    with pytest.raises(ValueError, match=r"trusts \['ec2.amazonaws.com', 'pods.eks.amazonaws.com'\]"):
        scope_pod_identity_trust(stack)
