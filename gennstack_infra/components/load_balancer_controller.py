"""The AWS Load Balancer Controller (the gateway's NLB comes from it), with its role through Pod Identity."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Aws, Duration, Validations
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

from constructs import Construct
from gennstack_infra.components.cluster import pinned_chart
from gennstack import versions
from gennstack.controller_values import LBC_NAMESPACE as NAMESPACE
from gennstack.controller_values import LBC_SERVICE_ACCOUNT as SERVICE_ACCOUNT
from gennstack.controller_values import load_balancer_controller_values

_CLUSTER_TAG = "elbv2.k8s.aws/cluster"


def controller_policy_statements() -> list[iam.PolicyStatement]:
    """The controller's permissions as its v3.5.0 ``docs/install/iam_policy.json`` defines them.

    Mutating actions are scoped by the ``elbv2.k8s.aws/cluster`` tag the controller puts on what it
    creates; ELB and EC2 describe and create calls have no resource-level scoping.
    """
    partition = Aws.PARTITION
    elb = f"arn:{partition}:elasticloadbalancing:*:*"
    balancers = [f"{elb}:targetgroup/*/*", f"{elb}:loadbalancer/net/*/*", f"{elb}:loadbalancer/app/*/*"]
    security_groups = f"arn:{partition}:ec2:*:*:security-group/*"
    request_tagged = {"Null": {f"aws:RequestTag/{_CLUSTER_TAG}": "false"}}
    resource_tagged = {"Null": {f"aws:ResourceTag/{_CLUSTER_TAG}": "false"}}
    tag_change_on_owned = {"Null": {f"aws:RequestTag/{_CLUSTER_TAG}": "true", f"aws:ResourceTag/{_CLUSTER_TAG}": "false"}}
    statement = iam.PolicyStatement
    return [
        statement(
            actions=["iam:CreateServiceLinkedRole"],
            resources=["*"],
            conditions={"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}},
        ),
        statement(
            actions=[
                *(f"ec2:{a}" for a in (
                    "DescribeAccountAttributes", "DescribeAddresses", "DescribeAvailabilityZones",
                    "DescribeInternetGateways", "DescribeVpcs", "DescribeVpcPeeringConnections", "DescribeSubnets",
                    "DescribeSecurityGroups", "DescribeInstances", "DescribeNetworkInterfaces", "DescribeTags",
                    "GetCoipPoolUsage", "DescribeCoipPools", "GetSecurityGroupsForVpc", "DescribeIpamPools",
                    "DescribeRouteTables",
                )),
                *(f"elasticloadbalancing:{a}" for a in (
                    "DescribeLoadBalancers", "DescribeLoadBalancerAttributes", "DescribeListeners",
                    "DescribeListenerCertificates", "DescribeSSLPolicies", "DescribeRules", "DescribeTargetGroups",
                    "DescribeTargetGroupAttributes", "DescribeTargetHealth", "DescribeTags", "DescribeTrustStores",
                    "DescribeListenerAttributes", "DescribeCapacityReservation",
                )),
            ],
            resources=["*"],
        ),
        statement(
            actions=[
                "cognito-idp:DescribeUserPoolClient", "acm:ListCertificates", "acm:DescribeCertificate",
                "iam:ListServerCertificates", "iam:GetServerCertificate", "waf-regional:GetWebACL",
                "waf-regional:GetWebACLForResource", "waf-regional:AssociateWebACL", "waf-regional:DisassociateWebACL",
                "wafv2:GetWebACL", "wafv2:GetWebACLForResource", "wafv2:AssociateWebACL", "wafv2:DisassociateWebACL",
                "shield:GetSubscriptionState", "shield:DescribeProtection", "shield:CreateProtection",
                "shield:DeleteProtection",
            ],
            resources=["*"],
        ),
        statement(actions=["ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress"], resources=["*"]),
        statement(actions=["ec2:CreateSecurityGroup"], resources=["*"]),
        statement(
            actions=["ec2:CreateTags"],
            resources=[security_groups],
            conditions={"StringEquals": {"ec2:CreateAction": "CreateSecurityGroup"}, **request_tagged},
        ),
        statement(actions=["ec2:CreateTags", "ec2:DeleteTags"], resources=[security_groups], conditions=tag_change_on_owned),
        statement(
            actions=["ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress", "ec2:DeleteSecurityGroup"],
            resources=["*"],
            conditions=resource_tagged,
        ),
        statement(
            actions=["elasticloadbalancing:CreateLoadBalancer", "elasticloadbalancing:CreateTargetGroup"],
            resources=["*"],
            conditions=request_tagged,
        ),
        statement(
            actions=[
                "elasticloadbalancing:CreateListener", "elasticloadbalancing:DeleteListener",
                "elasticloadbalancing:CreateRule", "elasticloadbalancing:DeleteRule",
            ],
            resources=["*"],
        ),
        statement(
            actions=["elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags"],
            resources=balancers,
            conditions=tag_change_on_owned,
        ),
        statement(
            actions=["elasticloadbalancing:AddTags", "elasticloadbalancing:RemoveTags"],
            resources=[
                f"{elb}:listener/net/*/*/*", f"{elb}:listener/app/*/*/*",
                f"{elb}:listener-rule/net/*/*/*", f"{elb}:listener-rule/app/*/*/*",
            ],
        ),
        statement(
            actions=[
                f"elasticloadbalancing:{a}" for a in (
                    "ModifyLoadBalancerAttributes", "SetIpAddressType", "SetSecurityGroups", "SetSubnets",
                    "DeleteLoadBalancer", "ModifyTargetGroup", "ModifyTargetGroupAttributes", "DeleteTargetGroup",
                    "ModifyListenerAttributes", "ModifyCapacityReservation", "ModifyIpPools",
                )
            ],
            resources=["*"],
            conditions=resource_tagged,
        ),
        statement(
            actions=["elasticloadbalancing:AddTags"],
            resources=balancers,
            conditions={
                "StringEquals": {"elasticloadbalancing:CreateAction": ["CreateTargetGroup", "CreateLoadBalancer"]},
                **request_tagged,
            },
        ),
        statement(
            actions=["elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"],
            resources=[f"{elb}:targetgroup/*/*"],
        ),
        statement(
            actions=[
                "elasticloadbalancing:SetWebAcl", "elasticloadbalancing:ModifyListener",
                "elasticloadbalancing:AddListenerCertificates", "elasticloadbalancing:RemoveListenerCertificates",
                "elasticloadbalancing:ModifyRule", "elasticloadbalancing:SetRulePriorities",
            ],
            resources=["*"],
        ),
    ]


class LoadBalancerController(Construct):
    """AWS Load Balancer Controller, two replicas on the system nodes, role through Pod Identity."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, cluster_name: str, vpc_id: str) -> None:
        super().__init__(scope, construct_id)
        self.service_account = eks.ServiceAccount(
            self, "ServiceAccount", cluster=cluster, name=SERVICE_ACCOUNT, namespace=NAMESPACE,
            identity_type=eks.IdentityType.POD_IDENTITY,
        )
        self.policy = iam.ManagedPolicy(self, "Policy", statements=controller_policy_statements())
        self.service_account.role.add_managed_policy(self.policy)
        self.chart = pinned_chart(
            self,
            "Chart",
            cluster=cluster,
            chart=versions.AWS_LOAD_BALANCER_CONTROLLER,
            namespace=NAMESPACE,
            values=load_balancer_controller_values(cluster_name=cluster_name, region=Aws.REGION, vpc_id=vpc_id),
            # Every other chart installs after this one: wait until its pods serve (two replicas on
            # the system nodes: an image pull and a leader election, about a minute).
            wait=True,
            timeout=Duration.minutes(10),
        )
        self.chart.node.add_dependency(self.service_account)
        reason = (
            "The AWS Load Balancer Controller's own v3.5.0 policy: ELB/EC2 describe and create calls support no "
            "resource scoping; mutations of existing load balancers, target groups and security groups are "
            "conditioned on the elbv2.k8s.aws/cluster tag the controller sets."
        )
        wildcards = [
            "Resource::*",
            "Resource::arn:<AWS::Partition>:ec2:*:*:security-group/*",
            "Resource::arn:<AWS::Partition>:elasticloadbalancing:*:*:targetgroup/*/*",
            "Resource::arn:<AWS::Partition>:elasticloadbalancing:*:*:loadbalancer/net/*/*",
            "Resource::arn:<AWS::Partition>:elasticloadbalancing:*:*:loadbalancer/app/*/*",
            "Resource::arn:<AWS::Partition>:elasticloadbalancing:*:*:listener/net/*/*/*",
            "Resource::arn:<AWS::Partition>:elasticloadbalancing:*:*:listener/app/*/*/*",
            "Resource::arn:<AWS::Partition>:elasticloadbalancing:*:*:listener-rule/net/*/*/*",
            "Resource::arn:<AWS::Partition>:elasticloadbalancing:*:*:listener-rule/app/*/*/*",
        ]
        Validations.of(self.policy).acknowledge(
            *[Acknowledgment(id=f"AwsSolutions-IAM5[{w}]", reason=reason) for w in wildcards]
        )
