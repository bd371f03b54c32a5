"""EKS Pod Identity roles that only their own service account, in their own cluster, can assume.

A role's trust in ``pods.eks.amazonaws.com`` alone lets any Pod Identity association in the account
use it: anyone who may create an association (or a pod under another associated service account,
once an association names this role) gets its permissions. EKS Pod Identity tags the session it
assumes the role with ``eks-cluster-arn``, ``eks-cluster-name``, ``kubernetes-namespace``,
``kubernetes-service-account``, ``kubernetes-pod-name`` and ``kubernetes-pod-uid``, and the EKS User
Guide restricts a role to one service account and namespace with ``aws:RequestTag/...`` conditions
on ``sts:AssumeRole`` and ``sts:TagSession`` (awsdocs/amazon-eks-user-guide
latest/ug/manage-access/aws-access/pod-id-role.adoc, "Setting Conditions"). GenNStack adds the
cluster's ARN, so a same-named namespace and service account in another cluster is refused too.
Tags are on by default (an association's ``disableSessionTags`` is false unless set; GenNStack
never sets it): without them every assume would be refused.

Every role an association of the stack names gets this trust, whoever created the association
(CDK's ``ServiceAccount`` or GenNStack's own), so one added later cannot be forgotten.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

PRINCIPAL = "pods.eks.amazonaws.com"
# The same CloudFormation resource from both modules (aws-eks-v2's ServiceAccount, GenNStack's own).
_ASSOCIATIONS = (eks.CfnPodIdentityAssociation, eks_l1.CfnPodIdentityAssociation)


def pod_identity_trust_statement(*, cluster_arn: Any, namespace: Any, service_account: Any) -> dict[str, Any]:
    """One trust statement: EKS Pod Identity, for this service account of this namespace of this cluster."""
    return {
        "Effect": "Allow",
        "Principal": {"Service": PRINCIPAL},
        "Action": ["sts:AssumeRole", "sts:TagSession"],
        "Condition": {
            "StringEquals": {
                "aws:RequestTag/eks-cluster-arn": cluster_arn,
                "aws:RequestTag/kubernetes-namespace": namespace,
                "aws:RequestTag/kubernetes-service-account": service_account,
            }
        },
    }


def scope_pod_identity_trust(stack: Stack) -> dict[str, list[dict[str, Any]]]:
    """Replace the trust policy of every role a ``CfnPodIdentityAssociation`` in ``stack`` names with
    one statement per association (:func:`pod_identity_trust_statement`). Returns the statements by
    role logical ID. Call it once, after every construct of the stack exists.

    Fails synth when an association names a role that is not a role of this stack trusted by
    ``pods.eks.amazonaws.com`` only (nothing to scope, or a trust that serves someone else too).
    """
    roles = {stack.resolve(r.logical_id): r for r in stack.node.find_all() if isinstance(r, iam.CfnRole)}
    statements: dict[str, list[dict[str, Any]]] = {}
    for association in (a for a in stack.node.find_all() if isinstance(a, _ASSOCIATIONS)):
        role_arn = stack.resolve(association.role_arn)
        logical_id = role_arn.get("Fn::GetAtt", [None])[0] if isinstance(role_arn, dict) else None
        if logical_id not in roles:
            raise ValueError(
                f"Pod Identity association {association.node.path} names role {role_arn!r}, not a role of this "
                "stack: its trust cannot be limited to the association's service account"
            )
        trusted = _principals(stack.resolve(roles[logical_id].assume_role_policy_document))
        if trusted != {PRINCIPAL}:
            raise ValueError(
                f"role {roles[logical_id].node.path} of Pod Identity association {association.node.path} trusts "
                f"{sorted(trusted)}: a Pod Identity role may trust {PRINCIPAL} only"
            )
        statements.setdefault(logical_id, []).append(pod_identity_trust_statement(
            cluster_arn=stack.format_arn(service="eks", resource="cluster", resource_name=association.cluster_name),
            namespace=association.namespace,
            service_account=association.service_account,
        ))
    for logical_id, role_statements in statements.items():
        roles[logical_id].add_property_override(
            "AssumeRolePolicyDocument", {"Version": "2012-10-17", "Statement": role_statements}
        )
    return statements


def _principals(document: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for statement in document.get("Statement", []):
        services = statement.get("Principal", {}).get("Service", [])
        out.update([services] if isinstance(services, str) else services)
        out.update(k for k in statement.get("Principal", {}) if k != "Service")
    return out
