"""The EKS control plane, its managed add-ons, and the on-demand node group for system pods."""

from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, Annotations, Aws, CfnResource, RemovalPolicy, Stack, Token, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk.lambda_layer_kubectl_v36 import KubectlV36Layer

from constructs import Construct
from gennstack import versions
from gennstack.instances import SYSTEM_ROOT_VOLUME_GIB
from gennstack.config import ClusterConfig
from gennstack.deploy_warnings import NO_ADMIN
from gennstack.system_nodes import SYSTEM_LABEL, SYSTEM_TAINT_KEY


# The kubectl/helm Lambda layer of each Kubernetes minor, by the PyPI package versions.KUBERNETES names.
KUBECTL_LAYERS = {"aws-cdk.lambda-layer-kubectl-v36": KubectlV36Layer}

# The CloudWatch Logs retention periods config may name, by days.
_RETENTION = {
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    731: logs.RetentionDays.TWO_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}

# Managed add-on configuration values, by add-on. The VPC CNI enforces Kubernetes NetworkPolicy
# (the serving and gateway Redis instances rely on theirs) only with its network policy agent on:
# the EKS User Guide's "Configure your cluster for Kubernetes network policies" sets exactly
# {"enableNetworkPolicy": "true"} (a string) on the vpc-cni add-on (v1.14.0 and later).
ADDON_CONFIGURATION: dict[str, dict[str, str]] = {"vpc-cni": {"enableNetworkPolicy": "true"}}

_LOG_TYPES = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


class Cluster(Construct):
    """An EKS cluster in the VPC's private subnets, without Auto Mode, with access entries only.

    Relies on:
    - ``aws_eks_v2`` defaults to EKS Auto Mode; GenNStack runs its own Karpenter (full NodePool
      control, spot first, no per-instance Auto Mode fee), so Auto Mode is off
      (``DefaultCapacityType.NODEGROUP`` with no default capacity);
    - authentication mode ``API``: access entries only, no ``aws-auth`` ConfigMap;
    - with a private endpoint, CDK's kubectl handler runs inside the VPC's private subnets;
    - cdk-nag's EKS rules (public endpoint, control-plane logs) only recognise the older
      ``aws_eks`` cluster, so ``tests/test_cluster.py`` asserts those properties itself.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ClusterConfig,
        cluster_name: str,
        vpc: ec2.IVpc,
        private_subnets: ec2.SubnetSelection,
    ) -> None:
        super().__init__(scope, construct_id)
        version = versions.KUBERNETES[config.kubernetes_version]
        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"EKS secrets envelope encryption and control-plane logs ({cluster_name})",
            enable_key_rotation=True,
        )
        # EKS writes control-plane logs to this group; created here so it has a retention period
        # and encryption (EKS would create it without either). It goes with the stack.
        log_group_name = f"/aws/eks/{cluster_name}/cluster"
        self.secrets_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowControlPlaneLogs",
                principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                resources=["*"],
                conditions={
                    "ArnEquals": {
                        "kms:EncryptionContext:aws:logs:arn": (
                            f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:{log_group_name}"
                        )
                    }
                },
            )
        )
        self.log_group = logs.LogGroup(
            self,
            "ControlPlaneLogs",
            log_group_name=log_group_name,
            retention=_RETENTION[config.control_plane_log_retention_days],
            encryption_key=self.secrets_key,
            removal_policy=RemovalPolicy.DESTROY,
        )
        endpoint = (
            eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*config.public_endpoint_cidrs)
            if config.public_endpoint_cidrs
            else eks.EndpointAccess.PRIVATE
        )
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            version=eks.KubernetesVersion.of(version.kubernetes),
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            vpc=vpc,
            vpc_subnets=[private_subnets],
            endpoint_access=endpoint,
            cluster_logging=_LOG_TYPES,
            secrets_encryption_key=self.secrets_key,
            bootstrap_cluster_creator_admin_permissions=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=KUBECTL_LAYERS[version.kubectl_layer](self, "KubectlLayer")),
            output_config_command=False,
        )
        self.cluster.node.add_dependency(self.log_group)

        # Managed add-ons, pinned; they take over the self-managed defaults EKS bootstraps
        # (OVERWRITE), so an add-on update never fights leftover configuration.
        self.addons = {
            name: eks.Addon(
                self, _addon_id(name), cluster=self.cluster, addon_name=name, addon_version=addon_version,
                preserve_on_delete=False, configuration_values=ADDON_CONFIGURATION.get(name),
            )
            for name, addon_version in version.addons.items()
        }
        for addon in self.addons.values():
            _cfn(addon).add_property_override("ResolveConflicts", "OVERWRITE")
        # The Pod Identity agent: aws_eks_v2 creates it on first use by a POD_IDENTITY service
        # account; created here so every controller's role works, and pinned.
        _cfn(self.cluster.eks_pod_identity_agent).add_property_override("AddonVersion", version.pod_identity_agent)

        self.system_launch_template = system_node_launch_template(self, "SystemNodesLaunchTemplate")
        self.system_nodes = self.cluster.add_nodegroup_capacity(
            "SystemNodes",
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.system_launch_template.launch_template_id,
                version=self.system_launch_template.latest_version_number,
            ),
            instance_types=[ec2.InstanceType(t) for t in config.system_node_instance_types],
            min_size=config.system_nodes_min,
            desired_size=config.system_nodes_min,
            max_size=config.system_nodes_max,
            capacity_type=eks.CapacityType.ON_DEMAND,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            subnets=private_subnets,
            labels=SYSTEM_LABEL,
            taints=[
                eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=SYSTEM_TAINT_KEY, value="true"),
            ],
        )

        self.ready = self._order_node_group_and_addons()

        if not config.admin_role_arns:
            # Printed by `cdk synth` and `cdk deploy`; `gennstack summary` repeats it, preflight fails on it.
            Annotations.of(self).add_warning_v2("gennstack:no-cluster-admin", NO_ADMIN)
        for index, role_arn in enumerate(config.admin_role_arns):
            self.cluster.grant_access(
                f"Admin{index}",
                role_arn,
                [eks.AccessPolicy.from_access_policy_name("AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER)],
            )
        self._acknowledge()

    def _order_node_group_and_addons(self) -> list[Construct]:
        """Node group after the node-level add-ons, CoreDNS after the nodes; returns what Kubernetes objects wait for.

        The VPC CNI, kube-proxy and the Pod Identity agent are DaemonSets, ACTIVE with no node,
        so nodes start with the pinned builds. CoreDNS is a Deployment: without nodes its pods
        stay Pending and the add-on never becomes ACTIVE, so it waits for the node group.
        aws-cdk-lib 2.275's kubectl barrier waits only for the cluster and its admin access entry
        (``aws-eks-v2/lib/cluster.js``, ``_kubectlReadyBarrier``), so the stack makes every
        Kubernetes object wait for what this returns (``gennstack_infra/components/ordering.py``).
        """
        node_level = [self.addons[name] for name in ("vpc-cni", "kube-proxy")]
        self.system_nodes.node.add_dependency(*node_level, self.cluster.eks_pod_identity_agent)
        self.addons["coredns"].node.add_dependency(self.system_nodes)
        return [self.system_nodes, *self.addons.values(), self.cluster.eks_pod_identity_agent]

    def _acknowledge(self) -> None:
        # CDK's kubectl provider (the Lambda that runs kubectl/helm for manifests and charts):
        # CDK owns its code, runtime and roles. Each acknowledgment sits on the resource it covers.
        provider = self.cluster.node.find_child("KubectlProvider")
        handler = provider.node.find_child("Handler")
        on_event = provider.node.find_child("Provider").node.find_child("framework-onEvent")
        managed = (
            "service-role/AWSLambdaBasicExecutionRole",
            "service-role/AWSLambdaVPCAccessExecutionRole",
            "AmazonEC2ContainerRegistryReadOnly",
        )
        managed_reason = (
            "CDK-owned kubectl provider (aws_eks_v2): AWS managed policies for Lambda logging, VPC ENIs "
            "and ECR pulls of charts, maintained by AWS; the role is assumable only by Lambda."
        )
        ecr_public = (
            'AwsSolutions-IAM4[Policy::{"Fn::If":["EksClusterKubectlProviderHandlerHasEcrPublicC426D1A5",'
            '{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},'
            '{"Ref":"AWS::NoValue"}]}]'
        )
        Validations.of(handler.node.find_child("ServiceRole")).acknowledge(
            *[
                Acknowledgment(id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{p}]", reason=managed_reason)
                for p in managed
            ],
            Acknowledgment(
                id=ecr_public,
                reason="CDK-owned kubectl provider: read-only pulls of OCI charts from ECR Public "
                "(Karpenter, Neuron), only in the aws partition.",
            ),
        )
        Validations.of(on_event.node.find_child("ServiceRole")).acknowledge(
            *[
                Acknowledgment(id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{p}]", reason=managed_reason)
                for p in managed[:2]
            ],
            Acknowledgment(
                id="AwsSolutions-IAM5[Resource::<EksClusterKubectlProviderHandlerDA75FB7A.Arn>:*]",
                reason="CDK's custom-resource provider framework may invoke any version of its own kubectl "
                "handler function; the wildcard covers only that function's version qualifiers.",
            ),
        )
        Validations.of(handler).acknowledge(
            Acknowledgment(
                id="AwsSolutions-L1",
                reason="CDK-owned kubectl provider: aws-cdk-lib pins the runtime its handler is tested "
                "with; it moves forward with the pinned aws-cdk-lib version.",
            )
        )
        Validations.of(self.system_nodes.role).acknowledge(
            *[
                Acknowledgment(
                    id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]",
                    reason="EKS requires this AWS managed policy on node roles (it tracks new EKS/ECR/CNI "
                    "API needs); the role is assumable only by EC2 in this node group.",
                )
                for policy in ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly")
            ]
        )
        Validations.of(self.cluster.role).acknowledge(
            Acknowledgment(
                id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKSClusterPolicy]",
                reason="The EKS control plane's service role must carry AmazonEKSClusterPolicy; it is "
                "assumable only by eks.amazonaws.com.",
            )
        )


def system_node_launch_template(scope: Construct, construct_id: str) -> ec2.LaunchTemplate:
    """The system node group's launch template: IMDSv2 only, hop limit 1, an encrypted gp3 root volume.

    Without a launch template EKS managed node groups get IMDS with a hop limit of 2, so any pod
    on a system node could take the node role's credentials. With hop limit 1 only host-network
    pods (the VPC CNI, kube-proxy, the Pod Identity agent) reach IMDS; controllers get their
    roles from Pod Identity and are told their region and VPC in their chart values. EKS merges
    the node group's AMI and bootstrap user data into this template (no image ID here), and it
    must not name a disk size of its own (``diskSize`` conflicts with a launch template).
    """
    return ec2.LaunchTemplate(
        scope,
        construct_id,
        require_imdsv2=True,
        http_put_response_hop_limit=1,
        http_endpoint=True,
        block_devices=[
            ec2.BlockDevice(
                device_name="/dev/xvda",
                volume=ec2.BlockDeviceVolume.ebs(
                    SYSTEM_ROOT_VOLUME_GIB, volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True, delete_on_termination=True
                ),
            )
        ],
    )


def _addon_id(addon: str) -> str:
    """``kube-proxy`` -> ``KubeProxyAddon``: a stable construct ID per add-on."""
    return "".join(part.capitalize() for part in addon.split("-")) + "Addon"


def _cfn(addon: eks.IAddon) -> CfnResource:
    resource = addon.node.default_child
    assert isinstance(resource, CfnResource)
    return resource


def acknowledge_chart_asset_read(cluster: eks.Cluster) -> None:
    """cdk-nag findings on CDK's grant to its kubectl handler to read chart assets (once per cluster).

    Installing a chart from an asset (``HelmChart(chart_asset=...)``) makes CDK grant the kubectl
    handler read access to the CDK bootstrap asset bucket; every construct that does so calls this.
    """
    if cluster.node.try_find_child("ChartAssetReadAcknowledged") is not None:
        return
    Construct(cluster, "ChartAssetReadAcknowledged")
    stack = Stack.of(cluster)
    policy = (
        cluster.node.find_child("KubectlProvider").node.find_child("Handler").node.find_child("ServiceRole")
        .node.find_child("DefaultPolicy")
    )
    bucket = (
        f"arn:{_nag(stack.partition, 'Partition')}:s3:::cdk-hnb659fds-assets-"
        f"{_nag(stack.account, 'AccountId')}-{_nag(stack.region, 'Region')}/*"
    )
    Validations.of(policy).acknowledge(
        *[
            Acknowledgment(
                id=f"AwsSolutions-IAM5[{finding}]",
                reason="CDK's grant to its own kubectl handler: read (Get/List) the project's Helm chart assets "
                "from the CDK bootstrap asset bucket of this account and region.",
            )
            for finding in ("Action::s3:GetBucket*", "Action::s3:GetObject*", "Action::s3:List*", f"Resource::{bucket}")
        ]
    )


def _nag(value: str, pseudo: str) -> str:
    """How cdk-nag spells a stack attribute in a finding: the literal, or ``<AWS::Pseudo>`` when unresolved."""
    return f"<AWS::{pseudo}>" if Token.is_unresolved(value) else value


def pinned_chart(
    scope: Construct,
    construct_id: str,
    *,
    cluster: eks.ICluster,
    chart: versions.Chart,
    namespace: str,
    **options: Any,
) -> eks.HelmChart:
    """An upstream chart at the version ``gennstack.versions`` pins, released under the chart's name."""
    return eks.HelmChart(
        scope,
        construct_id,
        cluster=cluster,
        chart=chart.name,
        repository=chart.repository,
        version=chart.version,
        namespace=namespace,
        release=chart.name,
        **options,
    )
