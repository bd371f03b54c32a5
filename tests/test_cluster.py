"""EKS, Karpenter and the operators: the properties cdk-nag cannot see on aws_eks_v2, asserted here."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from gennstack_infra.components.karpenter_interruption import INTERRUPTION_PATTERNS
from gennstack.controller_values import operator_values
from gennstack import versions
from tests.support import ROOT, Synth, depends_on


def _one(synth: Synth, resource_type: str) -> dict:
    (resource,) = synth.resources(resource_type).values()
    return resource["Properties"]


def test_auto_mode_is_off_and_no_default_capacity(synth: Synth) -> None:
    cluster = _one(synth, "AWS::EKS::Cluster")
    assert cluster["ComputeConfig"] == {"Enabled": False}
    assert cluster["KubernetesNetworkConfig"]["ElasticLoadBalancing"] == {"Enabled": False}
    assert cluster["StorageConfig"] == {"BlockStorage": {"Enabled": False}}
    (nodegroup,) = synth.resources("AWS::EKS::Nodegroup").values()  # only the system node group
    assert nodegroup["Properties"]["Labels"] == {"gennstack.io/pool": "system"}


def test_kubernetes_version_and_matching_kubectl_layer(synth: Synth) -> None:
    cluster = _one(synth, "AWS::EKS::Cluster")
    assert cluster["Version"] == "1.36"
    from gennstack_infra.components.cluster import KUBECTL_LAYERS

    pins = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    for minor, release in versions.KUBERNETES.items():
        # kubectl supports one minor of skew: the layer's minor must be the cluster's.
        assert KUBECTL_LAYERS[release.kubectl_layer].__name__ == f"KubectlV{minor.replace('1.', '')}Layer"
        assert release.kubectl_layer.endswith(f"-v{minor.replace('1.', '')}")
        assert f"\n{release.kubectl_layer}==" in pins  # the package is pinned


def test_access_entries_only_and_no_creator_admin(synth: Synth) -> None:
    cluster = _one(synth, "AWS::EKS::Cluster")
    assert cluster["AccessConfig"]["AuthenticationMode"] == "API"
    assert cluster["AccessConfig"]["BootstrapClusterCreatorAdminPermissions"] is False


def test_control_plane_logging_and_secrets_encryption(synth: Synth) -> None:
    cluster = _one(synth, "AWS::EKS::Cluster")
    enabled = {t["Type"] for t in cluster["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert enabled == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    (encryption,) = cluster["EncryptionConfig"]
    assert encryption["Resources"] == ["secrets"]
    key_id = encryption["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    assert synth.template["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True


def test_control_plane_log_group_has_retention_and_encryption(synth: Synth) -> None:
    groups = {
        k: g for k, g in synth.resources("AWS::Logs::LogGroup").items()
        if g["Properties"].get("LogGroupName") == "/aws/eks/gennstack/cluster"
    }
    ((log_group_id, group),) = groups.items()
    assert group["Properties"]["RetentionInDays"] == 90
    key_id = group["Properties"]["KmsKeyId"]["Fn::GetAtt"][0]
    cluster_key = _one(synth, "AWS::EKS::Cluster")["EncryptionConfig"][0]["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    assert key_id == cluster_key
    cluster_id = next(iter(synth.resources("AWS::EKS::Cluster")))
    assert log_group_id in synth.template["Resources"][cluster_id]["DependsOn"]


def test_endpoint_private_by_default(synth: Synth) -> None:
    vpc_config = _one(synth, "AWS::EKS::Cluster")["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config["EndpointPublicAccess"] is False


def test_public_endpoint_only_from_allow_list(synth_variant: Synth) -> None:
    vpc_config = _one(synth_variant, "AWS::EKS::Cluster")["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is True
    assert vpc_config["PublicAccessCidrs"] == ["203.0.113.0/24"]
    assert vpc_config["EndpointPrivateAccess"] is True


def test_admin_roles_get_cluster_admin_access_entries(synth_variant: Synth) -> None:
    entries = [
        e["Properties"] for e in synth_variant.resources("AWS::EKS::AccessEntry").values()
        if e["Properties"]["PrincipalArn"] == "arn:aws:iam::123456789012:role/platform-admins"
    ]
    (entry,) = entries
    (policy,) = entry["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSClusterAdminPolicy" in json.dumps(policy["PolicyArn"])


def test_control_plane_in_private_subnets(synth: Synth) -> None:
    subnets = {s["Ref"] for s in _one(synth, "AWS::EKS::Cluster")["ResourcesVpcConfig"]["SubnetIds"]}
    assert subnets and all("Private" in s for s in subnets)


def test_managed_addons_are_pinned(synth: Synth) -> None:
    addons = {a["Properties"]["AddonName"]: a["Properties"] for a in synth.resources("AWS::EKS::Addon").values()}
    release = versions.KUBERNETES["1.36"]
    assert {name: a["AddonVersion"] for name, a in addons.items()} == {
        **release.addons, "eks-pod-identity-agent": release.pod_identity_agent
    }
    for name in release.addons:
        assert addons[name]["ResolveConflicts"] == "OVERWRITE"


def test_system_nodes_on_demand_tainted_al2023(synth: Synth) -> None:
    nodegroup = _one(synth, "AWS::EKS::Nodegroup")
    assert nodegroup["CapacityType"] == "ON_DEMAND"
    assert nodegroup["AmiType"] == "AL2023_x86_64_STANDARD"
    assert nodegroup["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": "CriticalAddonsOnly", "Value": "true"}]
    # 4: the system pods fit with one node down (gennstack/system_capacity.py, tests/test_system_capacity.py).
    assert nodegroup["ScalingConfig"] == {"DesiredSize": 4, "MaxSize": 4, "MinSize": 4}


# --- Karpenter -----------------------------------------------------------------------------


def _karpenter(synth: Synth, resource_type: str) -> dict[str, dict]:
    return {k: v for k, v in synth.resources(resource_type).items() if k.startswith("KarpenterInterruption")}


def test_interruption_queue_encrypted_and_tls_only(synth: Synth) -> None:
    (queue,) = [q["Properties"] for q in _karpenter(synth, "AWS::SQS::Queue").values()]
    assert queue["SqsManagedSseEnabled"] is True
    assert queue["MessageRetentionPeriod"] == 300
    (policy,) = _karpenter(synth, "AWS::SQS::QueuePolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    deny = next(s for s in statements if s["Effect"] == "Deny")
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    # every Allow is one interruption rule's grant (aws-events-targets SqsQueue), bound to that rule's ARN
    rules = set(_karpenter(synth, "AWS::Events::Rule"))
    allows = [s for s in statements if s["Effect"] == "Allow"]
    assert allows and all(s["Principal"] == {"Service": "events.amazonaws.com"} for s in allows)
    assert {s["Condition"]["ArnEquals"]["aws:SourceArn"]["Fn::GetAtt"][0] for s in allows} == rules


def test_every_interruption_rule_targets_the_queue(synth: Synth) -> None:
    rules = _karpenter(synth, "AWS::Events::Rule")
    patterns = [r["Properties"]["EventPattern"] for r in rules.values()]
    canonical = lambda p: json.dumps(p, sort_keys=True)  # noqa: E731
    assert sorted(map(canonical, patterns)) == sorted(map(canonical, INTERRUPTION_PATTERNS.values()))
    queue_id = next(iter(_karpenter(synth, "AWS::SQS::Queue")))
    for rule in rules.values():
        (target,) = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [queue_id, "Arn"]}


def _managed_policy(synth: Synth, prefix: str) -> list[dict]:
    (policy,) = [r for k, r in synth.resources("AWS::IAM::ManagedPolicy").items() if k.startswith(prefix)]
    return policy["Properties"]["PolicyDocument"]["Statement"]


KARPENTER_SIDS = [
    "AllowScopedEC2InstanceAccessActions", "AllowScopedEC2LaunchTemplateAccessActions",
    "AllowScopedEC2InstanceActionsWithTags", "AllowScopedResourceCreationTagging", "AllowScopedResourceTagging",
    "AllowScopedDeletion", "AllowPassingInstanceRole", "AllowScopedInstanceProfileCreationActions",
    "AllowScopedInstanceProfileTagActions", "AllowScopedInstanceProfileActions", "AllowAPIServerEndpointDiscovery",
    "AllowInterruptionQueueActions", "AllowZonalShiftStatusReadOnly", "AllowRegionalReadActions",
    "AllowSSMReadActions", "AllowPricingReadActions", "AllowUnscopedInstanceProfileListAction",
    "AllowInstanceProfileReadActions",
]


# Upstream's split (aws/karpenter-provider-aws v1.14 getting-started cloudformation.yaml): six
# managed policies, by name, with the statements each holds.
KARPENTER_POLICIES = {
    "NodeLifecycle": KARPENTER_SIDS[:6],
    "IAMIntegration": KARPENTER_SIDS[6:10],
    "EKSIntegration": ["AllowAPIServerEndpointDiscovery"],
    "Interruption": ["AllowInterruptionQueueActions"],
    "ZonalShift": ["AllowZonalShiftStatusReadOnly"],
    "ResourceDiscovery": KARPENTER_SIDS[13:],
}


def test_karpenter_controller_policies_split_as_upstream(synth: Synth) -> None:
    for name, sids in KARPENTER_POLICIES.items():
        assert [s["Sid"] for s in _managed_policy(synth, f"KarpenterController{name}Policy")] == sids
    (association,) = [
        a["Properties"] for a in synth.resources("AWS::EKS::PodIdentityAssociation").values()
        if a["Properties"]["ServiceAccount"] == "karpenter"
    ]
    role = synth.template["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    attached = {ref["Ref"] for ref in role["ManagedPolicyArns"]}
    assert attached == {k for k in synth.resources("AWS::IAM::ManagedPolicy") if k.startswith("KarpenterController")}
    assert len(attached) == 6


def test_karpenter_controller_policy_is_upstreams(synth: Synth) -> None:
    statements = [
        s for name in KARPENTER_POLICIES for s in _managed_policy(synth, f"KarpenterController{name}Policy")
    ]
    assert [s["Sid"] for s in statements] == KARPENTER_SIDS
    by_sid = {s["Sid"]: s for s in statements}
    # Mutations are scoped to this cluster's tags.
    for sid in ("AllowScopedEC2LaunchTemplateAccessActions", "AllowScopedDeletion", "AllowScopedResourceTagging"):
        assert by_sid[sid]["Condition"]["StringEquals"]["aws:ResourceTag/kubernetes.io/cluster/gennstack"] == "owned"
    assert by_sid["AllowPassingInstanceRole"]["Resource"]["Fn::GetAtt"][0].startswith("KarpenterNodeRole")
    # The only unscoped resources are the ones AWS offers no resource-level permission for.
    unscoped = {s["Sid"] for s in statements if s["Resource"] == "*"}
    assert unscoped == {
        "AllowZonalShiftStatusReadOnly", "AllowRegionalReadActions", "AllowPricingReadActions",
        "AllowUnscopedInstanceProfileListAction",
    }
    assert by_sid["AllowRegionalReadActions"]["Condition"] == {"StringEquals": {"aws:RequestedRegion": {"Ref": "AWS::Region"}}}


def test_karpenter_role_through_pod_identity(synth: Synth) -> None:
    associations = {
        a["Properties"]["ServiceAccount"]: a["Properties"] for a in synth.resources("AWS::EKS::PodIdentityAssociation").values()
    }
    assert associations["karpenter"]["Namespace"] == "kube-system"
    role_id = associations["karpenter"]["RoleArn"]["Fn::GetAtt"][0]
    trust = synth.template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert {s["Principal"]["Service"] for s in trust} == {"pods.eks.amazonaws.com"}
    assert associations["aws-load-balancer-controller"]["Namespace"] == "kube-system"


def test_karpenter_node_role_and_access_entry(synth: Synth) -> None:
    roles = {k: r["Properties"] for k, r in synth.resources("AWS::IAM::Role").items() if k.startswith("KarpenterNodeRole")}
    (node_role,) = roles.values()
    policies = sorted(json.dumps(p) for p in node_role["ManagedPolicyArns"])
    assert len(policies) == 4
    for name in ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryPullOnly", "AmazonSSMManagedInstanceCore"):
        assert any(name in p for p in policies), name
    entries = [e["Properties"] for e in synth.resources("AWS::EKS::AccessEntry").values() if e["Properties"].get("Type") == "EC2_LINUX"]
    (entry,) = entries
    assert entry["PrincipalArn"] == {"Fn::GetAtt": [next(iter(roles)), "Arn"]}
    assert "AccessPolicies" not in entry


def _charts(synth: Synth) -> dict[str, dict]:
    """Upstream charts by release (the repo's own chart assets have no repository)."""
    return {
        c["Properties"]["Release"]: c["Properties"]
        for c in synth.resources("Custom::AWSCDK-EKS-HelmChart").values()
        if "Repository" in c["Properties"]
    }


def test_charts_pinned_from_the_versions_module(synth: Synth) -> None:
    charts = _charts(synth)
    assert {(c["Chart"], c["Repository"], c["Version"]) for c in charts.values()} == {
        (c.name, c.repository, c.version) for c in versions.CHARTS
    }


def _values(chart: dict) -> dict:
    values = chart["Values"]
    if isinstance(values, dict):  # Fn::Join: tokens (queue name, region, VPC id) sit inside JSON strings
        values = "".join(part if isinstance(part, str) else "TOKEN" for part in values["Fn::Join"][1])
    return json.loads(values)


def test_karpenter_chart_values(synth: Synth) -> None:
    charts = _charts(synth)
    values = _values(charts["karpenter"])
    assert values["settings"]["clusterName"] == "gennstack"
    assert values["settings"]["interruptionQueue"] == "TOKEN"
    assert "KarpenterInterruptionQueue" in json.dumps(charts["karpenter"]["Values"])
    assert values["replicas"] == 2 and values["podDisruptionBudget"]["maxUnavailable"] == 1
    assert values["serviceAccount"] == {"create": False, "name": "karpenter"}
    assert values["nodeSelector"] == {"gennstack.io/pool": "system"}


def test_karpenter_crds_install_before_controller_and_node_pools(synth: Synth) -> None:
    resources = synth.template["Resources"]
    crd_chart = next(k for k in resources if k.startswith("KarpenterCrdChart"))
    controller = next(k for k in resources if k.startswith("KarpenterChart"))
    assert crd_chart in resources[controller]["DependsOn"]
    node_pools = [k for k, r in resources.items() if k.startswith("NodePools") and r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"]
    assert node_pools and all(depends_on(synth.template, k, crd_chart) for k in node_pools)


# ray-project/kuberay v1.7.0, helm-chart/kuberay-operator/values.yaml: the keys kuberay_values() sets
# (nodeSelector, tolerations and resources of the operator's Deployment; singleNamespaceInstall, default
# false; watchNamespace, unset by default) and the one it relies on at its default (crNamespacedRbacEnable:
# true, "effective when rbacEnable and singleNamespaceInstall are both set to true").
KUBERAY_1_7_0_KEYS = {"nodeSelector", "tolerations", "resources", "singleNamespaceInstall", "watchNamespace"}


def test_kuberay_watches_only_the_serving_namespace_which_exists_before_it(synth: Synth) -> None:
    """KubeRay v1.7.0's chart writes its operator ClusterRole (create/get/list/delete on Secrets, Pods and
    Services of every namespace) only without singleNamespaceInstall (templates/role.yaml); with it, a Role
    of the same rules in each watchNamespace (templates/multiple_namespaces_role.yaml) and the operator
    runs with ``--watch-namespace`` (templates/deployment.yaml). Rendered once with helm 4.2.3 against the
    chart at tag v1.7.0 (not fetched in tests): no ClusterRole or ClusterRoleBinding for the operator, a
    Role and RoleBinding in gennstack-serving for its ServiceAccount in kuberay-system, the leader-election
    Role in kuberay-system. The Role needs its namespace at install: the ServingNamespace manifest comes
    first, and the serving chart (whose helm install would otherwise create it) after the operator."""
    values = _values(_charts(synth)["kuberay-operator"])
    assert set(values) == KUBERAY_1_7_0_KEYS
    assert values["singleNamespaceInstall"] is True and values["watchNamespace"] == ["gennstack-serving"]
    resources = synth.template["Resources"]
    (namespace,) = [k for k in resources if k.startswith("EksClustermanifestServingNamespace")]
    (manifest,) = json.loads(resources[namespace]["Properties"]["Manifest"])  # CDK adds its prune label
    assert (manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"]) == ("v1", "Namespace", "gennstack-serving")
    kuberay = next(k for k, r in resources.items() if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"
                   and r["Properties"]["Release"] == "kuberay-operator")
    serving = next(k for k, r in resources.items() if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"
                   and r["Properties"]["Release"] == "gennstack-serving")
    assert depends_on(synth.template, kuberay, namespace)
    assert depends_on(synth.template, serving, kuberay)
    assert resources[serving]["Properties"]["Namespace"] == "gennstack-serving"


@pytest.mark.parametrize("chart", ["kuberay-operator", "metrics-server", "aws-load-balancer-controller", "keda"])
def test_controllers_run_on_system_nodes(synth: Synth, chart: str) -> None:
    values = _values(_charts(synth)[chart])
    assert values["nodeSelector"] == {"gennstack.io/pool": "system"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]


def test_device_plugins_tolerate_accelerator_taints() -> None:
    values = operator_values(serving_namespace="gennstack-serving")
    assert values["nvidia-device-plugin"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "nvidia" in json.dumps(values["nvidia-device-plugin"]["affinity"])
    assert values["neuron-helm-chart"]["devicePlugin"]["tolerations"][0]["key"] == "aws.amazon.com/neuron"
    # Off: every Neuron pod takes all devices of its node, so allocation is always contiguous.
    assert values["neuron-helm-chart"]["scheduler"] == {"enabled": False}


def test_node_pool_manifests_in_template(synth: Synth) -> None:
    manifests = []
    for key, resource in synth.template["Resources"].items():
        if key.startswith("NodePools") and resource["Type"] == "Custom::AWSCDK-EKS-KubernetesResource":
            manifest = resource["Properties"]["Manifest"]
            text = manifest if isinstance(manifest, str) else json.dumps(manifest)
            manifests.append(text)
    joined = " ".join(manifests)
    for name in ("gen1-inf2", "gen2-trn2", "gen3-g6e", "general"):
        assert name in joined
    assert versions.AL2023_AMI_ALIAS in joined and versions.NEURON_AMI_ALIAS in joined


def test_iam_wildcards_only_where_acknowledged(synth: Synth) -> None:
    """No IAM statement grants `*` resources outside the policies whose wildcards cdk-nag acknowledges."""
    allowed_prefixes = (
        "KarpenterControllerResourceDiscoveryPolicy",  # EC2 Describe*, pricing, instance-profile list
        "KarpenterControllerZonalShiftPolicy",  # conditioned on this cluster's ARN
        "LoadBalancerControllerPolicy",  # ELB/EC2 describe and create
        "CustomVpcRestrictDefaultSG",  # CDK-owned
        "InterruptionHandlerFunctionServiceRoleDefaultPolicy",  # ec2:DescribeInstances, X-Ray
        "MonitoringCloudWatchExporterRoleDefaultPolicy",  # cloudwatch:GetMetricData/ListMetrics (read-only)
    )
    for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        for logical_id, policy in synth.resources(kind).items():
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                if statement.get("Resource") == "*":
                    assert logical_id.startswith(allowed_prefixes), (logical_id, statement)
    Template.from_json(synth.template)  # the template parses as CloudFormation


def test_system_nodes_use_a_launch_template_with_imdsv2_hop_limit_1(any_synth_pair) -> None:
    """Without a launch template a managed node group gets IMDS hop limit 2: pods could take the node role."""
    for synth in any_synth_pair:
        (group,) = synth.resources("AWS::EKS::Nodegroup").values()
        template_id = group["Properties"]["LaunchTemplate"]["Id"]["Ref"]
        assert group["Properties"]["LaunchTemplate"]["Version"] == {"Fn::GetAtt": [template_id, "LatestVersionNumber"]}
        assert "DiskSize" not in group["Properties"]  # EKS rejects it beside a launch template
        data = synth.template["Resources"][template_id]["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1, "HttpTokens": "required"}
        assert data["BlockDeviceMappings"] == [
            {"DeviceName": "/dev/xvda", "Ebs": {"DeleteOnTermination": True, "Encrypted": True, "VolumeSize": 20, "VolumeType": "gp3"}}
        ]
        # EKS merges its AMI and bootstrap into the template: it must name neither.
        assert "ImageId" not in data and "UserData" not in data


def test_controllers_are_told_their_region(synth: Synth) -> None:
    """With IMDS out of pods' reach (hop limit 1), a controller that asks IMDS for its region cannot start."""
    charts = _charts(synth)
    karpenter = json.dumps(charts["karpenter"]["Values"])
    assert '\\"env\\":[{\\"name\\":\\"AWS_REGION\\",\\"value\\":\\"' in karpenter and "AWS::Region" in karpenter
    controller = json.dumps(charts["aws-load-balancer-controller"]["Values"])
    assert '\\"region\\":\\"' in controller and '\\"vpcId\\":\\"' in controller


def test_vpc_cni_enforces_network_policies(synth: Synth) -> None:
    """Without the VPC CNI's network policy agent every NetworkPolicy is accepted and ignored."""
    addons = {a["Properties"]["AddonName"]: a["Properties"] for a in synth.resources("AWS::EKS::Addon").values()}
    assert json.loads(addons["vpc-cni"]["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}
    assert all("ConfigurationValues" not in a for name, a in addons.items() if name != "vpc-cni")
