"""Self-managed Karpenter: controller IAM (through Pod Identity), node role, interruption queue, chart."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Aws, Duration, Validations
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam

from constructs import Construct
from gennstack_infra.components.cluster import pinned_chart
from gennstack_infra.components.karpenter_interruption import KarpenterInterruptionQueue
from gennstack import versions
from gennstack.controller_values import KARPENTER_NAMESPACE as NAMESPACE
from gennstack.controller_values import KARPENTER_SERVICE_ACCOUNT as SERVICE_ACCOUNT
from gennstack.controller_values import karpenter_values


NODE_ROLE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",
)


def _arn(service: str, resource: str, *, region: bool = True, account: str = "*") -> str:
    return f"arn:{Aws.PARTITION}:{service}:{Aws.REGION if region else ''}:{account}:{resource}"


def controller_policies(*, cluster_name: str, node_role_arn: str, queue_arn: str) -> dict[str, list[iam.PolicyStatement]]:
    """Karpenter's controller permissions, split into managed policies as its v1.14 CloudFormation does.

    Upstream (aws/karpenter-provider-aws ``website/content/en/v1.14/getting-started/
    getting-started-with-karpenter/cloudformation.yaml``) defines six managed policies:
    NodeLifecycle, IAMIntegration, EKSIntegration, Interruption, ZonalShift and ResourceDiscovery.
    One policy holding all of them is ~6,000 characters against IAM's 6,144-character limit for a
    managed policy, and the cluster name appears in it 16 times, so it breaks with a long cluster
    name or region; split, each stays far below (tests/test_policy_sizes.py computes the worst case).

    Every mutating EC2/IAM action is scoped by the ``kubernetes.io/cluster/<name>: owned`` and
    ``karpenter.sh/nodepool`` tags Karpenter puts on what it creates; the read actions are
    limited to this region. The ``*`` resources left are the ones EC2/IAM/Pricing describe and
    list APIs require.
    """
    owned = f"kubernetes.io/cluster/{cluster_name}"
    region = Aws.REGION
    ec2_created = [
        _arn("ec2", f"{kind}/*")
        for kind in ("fleet", "instance", "volume", "network-interface", "launch-template", "spot-instances-request")
    ]
    instance_profiles = f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:instance-profile/*"
    cluster_arn = f"arn:{Aws.PARTITION}:eks:{region}:{Aws.ACCOUNT_ID}:cluster/{cluster_name}"
    statement = iam.PolicyStatement
    node_lifecycle = [
        statement(
            sid="AllowScopedEC2InstanceAccessActions",
            actions=["ec2:RunInstances", "ec2:CreateFleet"],
            resources=[
                f"arn:{Aws.PARTITION}:ec2:{region}::image/*",
                f"arn:{Aws.PARTITION}:ec2:{region}::snapshot/*",
                _arn("ec2", "security-group/*"),
                _arn("ec2", "subnet/*"),
                _arn("ec2", "capacity-reservation/*"),
                _arn("ec2", "placement-group/*"),
            ],
        ),
        statement(
            sid="AllowScopedEC2LaunchTemplateAccessActions",
            actions=["ec2:RunInstances", "ec2:CreateFleet"],
            resources=[_arn("ec2", "launch-template/*")],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        ),
        statement(
            sid="AllowScopedEC2InstanceActionsWithTags",
            actions=["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
            resources=ec2_created,
            conditions={
                "StringEquals": {f"aws:RequestTag/{owned}": "owned", "aws:RequestTag/eks:eks-cluster-name": cluster_name},
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        ),
        statement(
            sid="AllowScopedResourceCreationTagging",
            actions=["ec2:CreateTags"],
            resources=ec2_created,
            conditions={
                "StringEquals": {
                    f"aws:RequestTag/{owned}": "owned",
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                    "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                },
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        ),
        statement(
            sid="AllowScopedResourceTagging",
            actions=["ec2:CreateTags"],
            resources=[_arn("ec2", "instance/*")],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                "ForAllValues:StringEquals": {"aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]},
            },
        ),
        statement(
            sid="AllowScopedDeletion",
            actions=["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
            resources=[_arn("ec2", "instance/*"), _arn("ec2", "launch-template/*")],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        ),
    ]
    iam_integration = [
        statement(
            sid="AllowPassingInstanceRole",
            actions=["iam:PassRole"],
            resources=[node_role_arn],
            conditions={"StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}},
        ),
        statement(
            sid="AllowScopedInstanceProfileCreationActions",
            actions=["iam:CreateInstanceProfile"],
            resources=[instance_profiles],
            conditions={
                "StringEquals": {
                    f"aws:RequestTag/{owned}": "owned",
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                    "aws:RequestTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        ),
        statement(
            sid="AllowScopedInstanceProfileTagActions",
            actions=["iam:TagInstanceProfile"],
            resources=[instance_profiles],
            conditions={
                "StringEquals": {
                    f"aws:ResourceTag/{owned}": "owned",
                    "aws:ResourceTag/topology.kubernetes.io/region": region,
                    f"aws:RequestTag/{owned}": "owned",
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                    "aws:RequestTag/topology.kubernetes.io/region": region,
                },
                "StringLike": {
                    "aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                    "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*",
                },
            },
        ),
        statement(
            sid="AllowScopedInstanceProfileActions",
            actions=["iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile"],
            resources=[instance_profiles],
            conditions={
                "StringEquals": {f"aws:ResourceTag/{owned}": "owned", "aws:ResourceTag/topology.kubernetes.io/region": region},
                "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        ),
    ]
    eks_integration = [
        statement(sid="AllowAPIServerEndpointDiscovery", actions=["eks:DescribeCluster"], resources=[cluster_arn]),
    ]
    interruption = [
        statement(
            sid="AllowInterruptionQueueActions",
            actions=["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
            resources=[queue_arn],
        ),
    ]
    zonal_shift = [
        statement(
            sid="AllowZonalShiftStatusReadOnly",
            actions=["arc-zonal-shift:GetManagedResource"],
            resources=["*"],
            conditions={"StringEquals": {"arc-zonal-shift:ResourceIdentifier": cluster_arn}},
        ),
    ]
    resource_discovery = [
        statement(
            sid="AllowRegionalReadActions",
            actions=[
                "ec2:DescribeCapacityReservations",
                "ec2:DescribeImages",
                "ec2:DescribeInstances",
                "ec2:DescribeInstanceStatus",
                "ec2:DescribeInstanceTypeOfferings",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeLaunchTemplates",
                "ec2:DescribePlacementGroups",
                "ec2:DescribeSecurityGroups",
                "ec2:DescribeSpotPriceHistory",
                "ec2:DescribeSubnets",
            ],
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": region}},
        ),
        statement(
            sid="AllowSSMReadActions",
            actions=["ssm:GetParameter"],
            resources=[f"arn:{Aws.PARTITION}:ssm:{region}::parameter/aws/service/*"],
        ),
        statement(sid="AllowPricingReadActions", actions=["pricing:GetProducts"], resources=["*"]),
        statement(sid="AllowUnscopedInstanceProfileListAction", actions=["iam:ListInstanceProfiles"], resources=["*"]),
        statement(sid="AllowInstanceProfileReadActions", actions=["iam:GetInstanceProfile"], resources=[instance_profiles]),
    ]
    return {
        "NodeLifecycle": node_lifecycle,
        "IAMIntegration": iam_integration,
        "EKSIntegration": eks_integration,
        "Interruption": interruption,
        "ZonalShift": zonal_shift,
        "ResourceDiscovery": resource_discovery,
    }


class Karpenter(Construct):
    """Karpenter's controller on the system nodes, with its node role and interruption queue.

    Relies on: Karpenter v1 creates instance profiles for the node role itself; the EKS Pod
    Identity agent add-on must run for the controller's service account to get its role; the
    chart ships its CRDs in ``crds/``, which Helm installs on first install only (upgrade CRDs with
    the ``karpenter-crd`` chart, see README).
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, cluster_name: str) -> None:
        super().__init__(scope, construct_id)
        self.node_role = iam.Role(
            self,
            "NodeRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(p) for p in NODE_ROLE_MANAGED_POLICIES],
            description=f"Nodes that Karpenter launches for {cluster_name}",
        )
        # Nodes join through an EC2_LINUX access entry (no aws-auth ConfigMap).
        self.node_access_entry = eks.CfnAccessEntry(
            self, "NodeAccessEntry", cluster_name=cluster.cluster_name, principal_arn=self.node_role.role_arn, type="EC2_LINUX"
        )
        self.interruption = KarpenterInterruptionQueue(self, "Interruption")

        self.service_account = eks.ServiceAccount(
            self,
            "ServiceAccount",
            cluster=cluster,
            name=SERVICE_ACCOUNT,
            namespace=NAMESPACE,
            identity_type=eks.IdentityType.POD_IDENTITY,
        )
        policies = controller_policies(
            cluster_name=cluster_name, node_role_arn=self.node_role.role_arn, queue_arn=self.interruption.queue.queue_arn
        )
        self.controller_policies = {
            name: iam.ManagedPolicy(self, f"Controller{name}Policy", statements=statements)
            for name, statements in policies.items()
        }
        for policy in self.controller_policies.values():
            self.service_account.role.add_managed_policy(policy)

        # CRDs from their own chart, installed first, so upgrades update them (Helm never
        # upgrades a chart's crds/ folder).
        self.crd_chart = pinned_chart(
            self, "CrdChart", cluster=cluster, chart=versions.KARPENTER_CRD, namespace=NAMESPACE
        )
        self.chart = pinned_chart(
            self,
            "Chart",
            cluster=cluster,
            chart=versions.KARPENTER,
            namespace=NAMESPACE,
            values=karpenter_values(
                cluster_name=cluster_name, queue_name=self.interruption.queue.queue_name, region=Aws.REGION
            ),
            # NodePools install after the controller serves (two replicas on the system nodes).
            wait=True,
            timeout=Duration.minutes(10),
        )
        self.chart.node.add_dependency(self.service_account, self.crd_chart)
        self._acknowledge()

    def _acknowledge(self) -> None:
        Validations.of(self.node_role).acknowledge(
            *[
                Acknowledgment(
                    id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]",
                    reason="Karpenter's documented node role policy set (worker, CNI, ECR pull-only, SSM); "
                    "the role is assumable only by EC2 and used only by Karpenter-launched nodes.",
                )
                for policy in NODE_ROLE_MANAGED_POLICIES
            ]
        )
        wildcard_reason = (
            "Karpenter's own v1.14 policy: the resource is a type wildcard ({}), and every mutating "
            "action on it is conditioned on the kubernetes.io/cluster/<name>=owned and karpenter.sh/nodepool tags."
        )
        unscoped = Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="Karpenter's own v1.14 policy: EC2 Describe*, pricing:GetProducts and "
            "iam:ListInstanceProfiles support no resource-level scoping (Describe* is limited to this "
            "region by aws:RequestedRegion), and arc-zonal-shift:GetManagedResource is conditioned on this cluster.",
        )
        ec2 = "Resource::arn:<AWS::Partition>:ec2:<AWS::Region>"
        instance_profiles = "Resource::arn:<AWS::Partition>:iam::<AWS::AccountId>:instance-profile/*"
        wildcards = {
            "NodeLifecycle": [
                f"{ec2}::image/*",
                f"{ec2}::snapshot/*",
                *[
                    f"{ec2}:*:{kind}/*"
                    for kind in (
                        "security-group", "subnet", "capacity-reservation", "placement-group", "fleet", "instance",
                        "volume", "network-interface", "launch-template", "spot-instances-request",
                    )
                ],
            ],
            "IAMIntegration": [instance_profiles],
            "ResourceDiscovery": [instance_profiles, "Resource::arn:<AWS::Partition>:ssm:<AWS::Region>::parameter/aws/service/*"],
        }
        for name, policy in self.controller_policies.items():
            acknowledgments = [
                Acknowledgment(id=f"AwsSolutions-IAM5[{w}]", reason=wildcard_reason.format(w.split("::", 1)[1]))
                for w in wildcards.get(name, [])
            ]
            if name in ("ZonalShift", "ResourceDiscovery"):
                acknowledgments.append(unscoped)
            if acknowledgments:
                Validations.of(policy).acknowledge(*acknowledgments)
