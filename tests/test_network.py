"""What matters about the VPC: zones, subnets, NAT, endpoints, flow logs and discovery tags."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from gennstack.summary import endpoint_service_name
from tests.support import Synth


def _tags(resource: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource["Properties"].get("Tags", [])}


def _subnets(synth: Synth, kind: str) -> list[dict]:
    return [s for s in synth.resources("AWS::EC2::Subnet").values() if _tags(s)["aws-cdk:subnet-type"] == kind]


def test_three_zones_by_default_from_get_azs(synth: Synth) -> None:
    public, private = _subnets(synth, "Public"), _subnets(synth, "Private")
    assert len(public) == len(private) == 3
    zones = [s["Properties"]["AvailabilityZone"] for s in private]
    assert zones == [{"Fn::Select": [i, {"Fn::GetAZs": ""}]} for i in range(3)]


def test_zone_names_from_config_when_region_is_set(synth_variant: Synth) -> None:
    zones = sorted(s["Properties"]["AvailabilityZone"] for s in _subnets(synth_variant, "Private"))
    assert zones == ["eu-west-1a", "eu-west-1b"]


def test_subnets_sized_for_pod_density(synth: Synth) -> None:
    assert {s["Properties"]["CidrBlock"].split("/")[1] for s in _subnets(synth, "Private")} == {"18"}
    assert {s["Properties"]["CidrBlock"].split("/")[1] for s in _subnets(synth, "Public")} == {"24"}
    for subnet in _subnets(synth, "Public"):
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False


def test_one_nat_by_default_and_one_per_zone_when_configured(synth: Synth, synth_variant: Synth) -> None:
    assert len(synth.resources("AWS::EC2::NatGateway")) == 1
    assert len(synth_variant.resources("AWS::EC2::NatGateway")) == 2


def test_discovery_and_load_balancer_tags(synth: Synth) -> None:
    for subnet in _subnets(synth, "Private"):
        tags = _tags(subnet)
        assert tags["karpenter.sh/discovery"] == "gennstack"
        assert tags["kubernetes.io/role/internal-elb"] == "1"
        assert "kubernetes.io/role/elb" not in tags
    for subnet in _subnets(synth, "Public"):
        tags = _tags(subnet)
        assert tags["kubernetes.io/role/elb"] == "1"
        assert "karpenter.sh/discovery" not in tags


def _endpoint_services(synth: Synth) -> dict[str, dict]:
    return {endpoint_service_name(e): e for e in synth.resources("AWS::EC2::VPCEndpoint").values()}


def test_s3_gateway_endpoint_on_private_route_tables(synth: Synth) -> None:
    s3 = _endpoint_services(synth)["s3"]
    assert s3["Properties"]["VpcEndpointType"] == "Gateway"
    private_tables = {
        k for k, v in synth.resources("AWS::EC2::RouteTable").items() if "Private" in v["Properties"]["Tags"][0]["Value"]
    }
    assert {ref["Ref"] for ref in s3["Properties"]["RouteTableIds"]} >= private_tables


def test_interface_endpoints_default_set_private_and_https_only(synth: Synth) -> None:
    endpoints = _endpoint_services(synth)
    assert set(endpoints) == {"s3", "dynamodb", "ecr.api", "ecr.dkr", "sts", "sqs", "ec2", "logs"}
    private_subnets = {k for k, v in synth.resources("AWS::EC2::Subnet").items() if _tags(v)["aws-cdk:subnet-type"] == "Private"}
    for name, endpoint in endpoints.items():
        if name in ("s3", "dynamodb"):
            assert endpoint["Properties"]["VpcEndpointType"] == "Gateway"
            continue
        assert endpoint["Properties"]["PrivateDnsEnabled"] is True
        assert {ref["Ref"] for ref in endpoint["Properties"]["SubnetIds"]} == private_subnets
    Template.from_json(synth.template).has_resource_properties(
        "AWS::EC2::SecurityGroup",
        {
            "GroupDescription": "HTTPS from the VPC to its interface endpoints",
            "SecurityGroupIngress": [Match.object_like({"CidrIp": "10.0.0.0/16", "FromPort": 443, "ToPort": 443})],
        },
    )


def test_interface_endpoints_follow_config(synth_variant: Synth) -> None:
    assert set(_endpoint_services(synth_variant)) == {"s3", "dynamodb", "ecr.api", "ecr.dkr", "sts", "eks-auth", "ssm"}


def test_endpoint_ids_do_not_depend_on_list_position(synth: Synth, synth_variant: Synth) -> None:
    """Removing an endpoint from config must not replace the others."""
    default_ids = {k for k, v in synth.resources("AWS::EC2::VPCEndpoint").items()}
    variant_ids = {k for k, v in synth_variant.resources("AWS::EC2::VPCEndpoint").items()}
    assert {"NetworkVpcEcrApiEndpoint", "NetworkVpcStsEndpoint"} <= {i[:-8] for i in default_ids & variant_ids}


def test_flow_logs_to_s3_as_parquet(synth: Synth, synth_variant: Synth) -> None:
    Template.from_json(synth.template).has_resource_properties(
        "AWS::EC2::FlowLog",
        {
            "ResourceType": "VPC",
            "TrafficType": "ALL",
            "LogDestinationType": "s3",
            # PascalCase keys: CloudFormation's schema (CDK's own writes camelCase, aws/aws-cdk#25432).
            "DestinationOptions": {"FileFormat": "parquet", "HiveCompatiblePartitions": True, "PerHourPartition": False},
        },
    )
    (variant,) = synth_variant.resources("AWS::EC2::FlowLog").values()
    assert variant["Properties"]["TrafficType"] == "REJECT"


def test_default_security_group_is_restricted(synth: Synth) -> None:
    assert len(synth.resources("Custom::VpcRestrictDefaultSG")) == 1


def test_s3_endpoint_writes_only_to_this_accounts_buckets(any_synth_pair: tuple[Synth, Synth]) -> None:
    """Without a policy a gateway endpoint allows everything on every bucket of every account in the region.

    Reads stay open: nodes read other accounts' buckets through it (ECR User Guide "Minimum Amazon S3
    bucket permissions for Amazon ECR": arn:aws:s3:::prod-region-starport-layer-bucket/*; AL2023's
    al2023-repos-region-de612dc2; registry.k8s.io's prod-registry-k8s-io-<region>)."""
    for synth in any_synth_pair:
        (endpoint,) = [e["Properties"] for e in synth.resources("AWS::EC2::VPCEndpoint").values()
                       if e["Properties"].get("VpcEndpointType") == "Gateway" and "s3" in str(e["Properties"]["ServiceName"])]
        own, read, answers = endpoint["PolicyDocument"]["Statement"]
        assert own == {"Sid": "ThisAccountsBuckets", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "s3:*",
                       "Resource": "*", "Condition": {"StringEquals": {"aws:ResourceAccount": {"Ref": "AWS::AccountId"}}}}
        assert read == {"Sid": "ReadAnyObject", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "s3:GetObject",
                        "Resource": {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::*/*"]]}}
        # The kubectl provider's Lambdas sit in the private subnets (their S3 traffic takes the endpoint)
        # and answer CloudFormation with a PUT to a presigned URL in an AWS-owned bucket; denied, every
        # HelmChart and manifest would wait out its custom resource timeout.
        handlers = [f["Properties"] for k, f in synth.resources("AWS::Lambda::Function").items()
                    if k.startswith("EksClusterKubectlProvider")]
        assert handlers and all("VpcConfig" in h for h in handlers)
        assert answers == {"Sid": "CloudFormationResponses", "Effect": "Allow", "Principal": {"AWS": "*"},
                           "Action": "s3:PutObject", "Resource": [
                               {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":s3:::{bucket}/*"]]}
                               for bucket in ("cloudformation-custom-resource-response-*", "cloudformation-waitcondition-*")]}
