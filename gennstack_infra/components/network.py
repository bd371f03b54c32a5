"""The VPC that GenNStack's nodes and pods live in."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Aws, Tags, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_s3 as s3

from constructs import Construct
from gennstack.config import INTERFACE_ENDPOINTS, NetworkConfig

# Subnet group names; the summary and later constructs select subnets by them.
PUBLIC_SUBNETS = "Public"
PRIVATE_SUBNETS = "Private"


class Network(Construct):
    """A VPC across ``az_count`` zones with public and private subnets, NAT, endpoints and flow logs.

    Relies on:
    - the VPC CNI gives every pod a VPC address, so private subnets are large (/18 by default:
      16,379 usable addresses per zone);
    - Karpenter finds subnets by the ``karpenter.sh/discovery: <cluster>`` tag, and the AWS Load
      Balancer Controller by ``kubernetes.io/role/elb`` (public) and ``kubernetes.io/role/internal-elb``
      (private);
    - an S3 gateway endpoint is free and keeps model pulls on AWS's network (no NAT data charge);
      so is the DynamoDB one;
    - spot capacity is per zone, so more zones means fewer simultaneous interruptions.
    Zones come from the stack's ``availability_zones`` (``GenNStack`` supplies ``az_count`` of them).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: NetworkConfig,
        cluster_name: str,
        flow_log_bucket: s3.IBucket,
    ) -> None:
        super().__init__(scope, construct_id)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.vpc_cidr),
            max_azs=config.az_count,
            nat_gateways=config.nat_gateways,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name=PUBLIC_SUBNETS,
                    subnet_type=ec2.SubnetType.PUBLIC,
                    cidr_mask=config.public_subnet_mask,
                    map_public_ip_on_launch=False,
                ),
                ec2.SubnetConfiguration(
                    name=PRIVATE_SUBNETS,
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=config.private_subnet_mask,
                ),
            ],
            restrict_default_security_group=True,
        )
        self.private_subnets = ec2.SubnetSelection(subnet_group_name=PRIVATE_SUBNETS)
        if config.availability_zones is not None:
            # Zone names are hard-coded only when network.availability_zones sets them on purpose
            # (for example to match capacity reservations); the default selects from Fn::GetAZs.
            reason = "zone names pinned on purpose by network.availability_zones"
            Validations.of(self.vpc).acknowledge(Acknowledgment(id="CloudFormation-Validate::W3010", reason=reason))
            for subnet in [*self.vpc.public_subnets, *self.vpc.private_subnets]:
                cfn_subnet = subnet.node.default_child
                assert isinstance(cfn_subnet, ec2.CfnSubnet)
                cfn_subnet.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3010"]}})

        for subnet in self.vpc.public_subnets:
            Tags.of(subnet).add("kubernetes.io/role/elb", "1")
        for subnet in self.vpc.private_subnets:
            Tags.of(subnet).add("kubernetes.io/role/internal-elb", "1")
            Tags.of(subnet).add("karpenter.sh/discovery", cluster_name)

        self.s3_endpoint = self.vpc.add_gateway_endpoint(
            "S3Endpoint", service=ec2.GatewayVpcEndpointAwsService.S3
        )
        for statement in s3_endpoint_policy():
            self.s3_endpoint.add_to_policy(statement)
        # Free as well: the interruption handler's table is reached without NAT.
        self.dynamodb_endpoint = self.vpc.add_gateway_endpoint(
            "DynamoDbEndpoint", service=ec2.GatewayVpcEndpointAwsService.DYNAMODB
        )
        # One security group for every interface endpoint: HTTPS from inside the VPC only. The
        # literal CIDR (not the VPC's CidrBlock attribute) lets cdk-nag evaluate the rule.
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="HTTPS from the VPC to its interface endpoints",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(config.vpc_cidr), ec2.Port.tcp(443), "HTTPS from the VPC"
        )
        # IDs come from the service name, not the list position, so removing one endpoint
        # from config never replaces another.
        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {
            name: self.vpc.add_interface_endpoint(
                _endpoint_id(name),
                service=ec2.InterfaceVpcEndpointAwsService(INTERFACE_ENDPOINTS[name]),
                subnets=self.private_subnets,
                private_dns_enabled=True,
                security_groups=[self.endpoint_security_group],
                open=False,
            )
            for name in config.interface_endpoints
        }

        self.flow_log = self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_s3(flow_log_bucket, "vpc-flow-logs/"),
            traffic_type=ec2.FlowLogTrafficType[config.flow_log_traffic],
        )
        # Parquet with Hive partitions (cheaper, faster Athena queries). Set on the L1
        # resource: CDK's to_s3() options write camelCase keys that CloudFormation's schema
        # rejects (aws/aws-cdk#25432), which cfn-lint reports as E3002/E3003.
        cfn_flow_log = self.flow_log.node.default_child
        assert isinstance(cfn_flow_log, ec2.CfnFlowLog)
        cfn_flow_log.add_property_override(
            "DestinationOptions",
            {"FileFormat": "parquet", "HiveCompatiblePartitions": True, "PerHourPartition": False},
        )


# Buckets of other accounts that nodes and pods read through the S3 gateway endpoint (same-region S3
# traffic takes it), among them: ECR's image layers ("Minimum Amazon S3 bucket permissions for Amazon
# ECR", ECR User Guide: arn:aws:s3:::prod-region-starport-layer-bucket/*), the AL2023 repositories
# (arn:aws:s3:::al2023-repos-region-de612dc2/*), registry.k8s.io's mirror (it redirects layer
# downloads to prod-registry-k8s-io-<region>), SSM agent updates, and whatever a download from
# Hugging Face is redirected to. A list of them would refuse the one nobody listed (a deploy that
# cannot pull an image or stage a model), so reads of any object are allowed and writes only to
# this account's buckets: what the policy stops is a copy out, to a bucket of someone else's.
# One write to AWS-owned buckets is needed: the kubectl provider's Lambdas run in the private subnets
# and answer CloudFormation by a PUT to a presigned URL in cloudformation-custom-resource-response-<region>
# (AWS::CloudFormation::CustomResource docs: custom resources in a VPC "must have access to
# CloudFormation-specific S3 buckets"; otherwise the operation waits out the custom resource's timeout);
# cloudformation-waitcondition-<region> is the other such bucket.
CLOUDFORMATION_RESPONSE_BUCKETS = ("cloudformation-custom-resource-response-*", "cloudformation-waitcondition-*")


def s3_endpoint_policy() -> list[iam.PolicyStatement]:
    """The S3 gateway endpoint's policy: anything on a bucket of this account (the stack's buckets,
    CDK's asset bucket that chart assets come from), ``s3:GetObject`` on any other, and the PUT of a
    custom resource's answer to CloudFormation's response buckets. Nothing in the VPC can write to
    another account's bucket in this region through it but those; IAM still decides who
    may do what in this account's buckets, and traffic to other regions leaves through the NAT."""
    return [
        iam.PolicyStatement(
            sid="ThisAccountsBuckets",
            principals=[iam.AnyPrincipal()],
            actions=["s3:*"],
            resources=["*"],
            conditions={"StringEquals": {"aws:ResourceAccount": Aws.ACCOUNT_ID}},
        ),
        iam.PolicyStatement(
            sid="ReadAnyObject",
            principals=[iam.AnyPrincipal()],
            actions=["s3:GetObject"],
            resources=[f"arn:{Aws.PARTITION}:s3:::*/*"],
        ),
        iam.PolicyStatement(
            sid="CloudFormationResponses",
            principals=[iam.AnyPrincipal()],
            actions=["s3:PutObject"],
            resources=[f"arn:{Aws.PARTITION}:s3:::{bucket}/*" for bucket in CLOUDFORMATION_RESPONSE_BUCKETS],
        ),
    ]


def _endpoint_id(service: str) -> str:
    """``ecr.api`` -> ``EcrApiEndpoint``: a stable construct ID per service."""
    words = service.replace("-", ".").split(".")
    return "".join(word.capitalize() for word in words) + "Endpoint"
