"""The Gateway construct synthesized in a test stack (the project's network and EKS cluster, the
app's cdk.json feature flags) with cdk-nag's AwsSolutions checks attached: no unacknowledged
finding, pinned charts, least-privilege access to the secrets, no secret in the template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gennstack.config_base import frozen
from tests.support import ROOT, unexpected_validation_findings  # noqa: F401  (ROOT sets JSII_NODE before aws_cdk loads)

pytestmark = pytest.mark.slow

LANGFUSE = "prod/langfuse"
VARIANT = {
    "api_keys_secret_name": "prod/gateway-keys",
    "langfuse": {"enabled": True, "secret_name": LANGFUSE},
    "load_balancer": {"scheme": "internet-facing", "allowed_cidrs": ["203.0.113.0/24"],
                      "certificate_arn": "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"},
}


def synth(outdir: Path, gateway_data: dict, generations: dict | None = None) -> dict:
    from aws_cdk import App, Stack, Validations
    from cdk_nag import AwsSolutionsChecks

    from gennstack_infra.app import cdk_json_context
    from gennstack_infra.components.access_logs import AccessLogBucket
    from gennstack_infra.components.cluster import Cluster
    from gennstack_infra.components.gateway import Gateway
    from gennstack_infra.components.network import Network
    from gennstack.config import load_config
    from gennstack.gateway.config import GatewayConfig

    context = cdk_json_context()
    app = App(context=context, outdir=str(outdir))
    config = load_config({**context["gennstack"], **({"generations": generations} if generations else {})})
    stack = Stack(app, "GatewayTest")
    logs = AccessLogBucket(stack, "AccessLogs", expiry_days=30)
    network = Network(stack, "Network", config=config.network, cluster_name=config.cluster_name, flow_log_bucket=logs.bucket)
    cluster = Cluster(stack, "Eks", config=config.cluster, cluster_name=config.cluster_name, vpc=network.vpc,
                      private_subnets=network.private_subnets)
    Gateway(stack, "Gateway", cluster=cluster.cluster, config=config, gateway=GatewayConfig.model_validate(frozen(gateway_data)))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, write_suppressions_to_cloud_formation=True))
    app.synth()  # raises on any unacknowledged cdk-nag finding
    assert unexpected_validation_findings(outdir, config) == []
    return json.loads((outdir / "GatewayTest.template.json").read_text())


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> dict:
    return synth(tmp_path_factory.mktemp("gateway-default"), {})


@pytest.fixture(scope="module")
def variant(tmp_path_factory) -> dict:
    return synth(tmp_path_factory.mktemp("gateway-variant"), VARIANT, {"inf2": {"enabled": False}})


def _resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def _charts(template: dict) -> dict[str, dict]:
    return {c["Properties"]["Release"]: c["Properties"] for c in _resources(template, "Custom::AWSCDK-EKS-HelmChart").values()}


def _values(chart: dict) -> dict:
    values = chart["Values"]
    if isinstance(values, dict):
        values = "".join(part if isinstance(part, str) else "TOKEN" for part in values["Fn::Join"][1])
    return json.loads(values)


def test_upstream_charts_pinned_together(template) -> None:
    from gennstack import versions

    charts = _charts(template)
    for chart in (versions.ENVOY_GATEWAY, versions.AI_GATEWAY_CRDS, versions.AI_GATEWAY, versions.EXTERNAL_SECRETS):
        assert (charts[chart.name]["Chart"], charts[chart.name]["Repository"], charts[chart.name]["Version"]) == (
            chart.name, chart.repository, chart.version)
    assert versions.ENVOY_GATEWAY.version.startswith("v1.8.") and versions.AI_GATEWAY.version == "v1.1.0"
    project = charts["gennstack-gateway"]
    assert "ChartAssetURL" in project and project["Namespace"] == "gennstack-gateway"


def test_envoy_gateway_values_what_the_ai_gateway_needs(template) -> None:
    values = _values(_charts(template)["gateway-helm"])["config"]["envoyGateway"]
    assert values["extensionApis"]["enableBackend"] is True
    assert values["extensionManager"]["service"]["fqdn"] == {
        "hostname": "ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local", "port": 1063}
    assert values["extensionManager"]["hooks"]["xdsTranslator"]["post"] == ["Translation", "Cluster", "Route"]
    assert values["rateLimit"]["backend"] == {"type": "Redis", "redis": {
        "url": "gennstack-gateway-redis.gennstack-gateway.svc.cluster.local:6379"}}
    assert _values(_charts(template)["ai-gateway-helm"])["controller"]["fullnameOverride"] == "ai-gateway-controller"


def test_project_chart_values_come_from_values_py(template, variant) -> None:
    from gennstack.gateway.config import GatewayConfig, routing_table
    from gennstack.gateway.values import gateway_chart_values

    values = _values(_charts(template)["gennstack-gateway"])
    expected = gateway_chart_values(GatewayConfig(), routing_table(GatewayConfig()), region="TOKEN",
                                    api_keys_secret_name="TOKEN", redis_secret_name="TOKEN", url_suffix="TOKEN", vpc_cidr="TOKEN",
                                    resume_image="TOKEN")
    assert {k: v for k, v in values.items() if k not in ("nodeSelector", "tolerations")} == {
        k: v for k, v in expected.items() if k not in ("nodeSelector", "tolerations")}
    assert values["nodeSelector"] == {"gennstack.io/pool": "system"}
    # the NLB's name in the server certificate follows the deploy region and partition (amazonaws.com.cn in China)
    parts = _charts(template)["gennstack-gateway"]["Values"]["Fn::Join"][1]
    wildcard = next(i for i, part in enumerate(parts) if isinstance(part, str) and part.endswith('"*.elb.'))
    assert parts[wildcard + 1:wildcard + 4] == [{"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"}]
    # an internal NLB without allowed_cidrs admits the VPC's CIDR (never the controller's 0.0.0.0/0)
    cidr = next(i for i, part in enumerate(parts) if isinstance(part, str) and part.endswith('"allowedCidrs":["'))
    assert "Fn::GetAtt" in parts[cidr + 1] and parts[cidr + 1]["Fn::GetAtt"][1] == "CidrBlock"
    # the relay's image is the DockerImageAsset CDK builds from assets/images/resume-relay/Dockerfile
    image = next(i for i, part in enumerate(parts) if isinstance(part, str) and part.endswith('"image":"'))
    assert "container-assets" in json.dumps(parts[image + 1])
    # inf2 disabled in the variant: no llama-3-70b-instruct route or backend
    variant_values = _values(_charts(variant)["gennstack-gateway"])
    assert [b["name"] for b in variant_values["backends"]] == ["llama-4-maverick", "gpt-oss-20b"]
    assert "llama-3-70b-instruct" not in json.dumps(variant_values["routes"])
    assert variant_values["apiKeys"]["remoteSecretName"] == "prod/gateway-keys"
    assert variant_values["langfuse"]["remoteSecretName"] == LANGFUSE


def _secret_policy(template: dict) -> list[dict]:
    statements = []
    for policy in _resources(template, "AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(a.startswith("secretsmanager:") for a in actions):
                statements.append(statement)
    return statements


def _secret_ids(template: dict) -> dict[str, str]:
    """Logical IDs of the generated secrets, by the JSON key they generate."""
    return {s["Properties"]["GenerateSecretString"]["GenerateStringKey"]: k
            for k, s in _resources(template, "AWS::SecretsManager::Secret").items()}


def test_external_secrets_reads_only_the_gateway_secrets(template, variant) -> None:
    (statement,) = _secret_policy(template)
    assert statement["Action"] == "secretsmanager:GetSecretValue"
    ids = _secret_ids(template)
    # the generated secrets' full ARNs: the API keys and the Redis password
    assert statement["Resource"] == [{"Ref": ids["default"]}, {"Ref": ids["password"]}]
    (statement,) = _secret_policy(variant)
    resources = json.dumps(statement["Resource"])
    assert statement["Action"] == "secretsmanager:GetSecretValue"
    assert ":secret:prod/gateway-keys-??????" in resources and f":secret:{LANGFUSE}-??????" in resources
    assert {"Ref": _secret_ids(variant)["password"]} in statement["Resource"]
    assert "*" not in resources
    associations = _resources(template, "AWS::EKS::PodIdentityAssociation")
    assert [(a["Properties"]["Namespace"], a["Properties"]["ServiceAccount"]) for a in associations.values()] == [
        ("external-secrets", "external-secrets")]


def test_generated_api_key_never_in_the_template(template) -> None:
    secrets = _resources(template, "AWS::SecretsManager::Secret")
    secret = secrets[_secret_ids(template)["default"]]
    generate = secret["Properties"]["GenerateSecretString"]
    assert generate["GenerateStringKey"] == "default" and generate["PasswordLength"] == 48
    assert all("SecretString" not in s["Properties"] for s in secrets.values())


def test_redis_password_generated_and_wired(template) -> None:
    """A generated 48-character password of letters and digits (envoyproxy/ratelimit splits REDIS_AUTH
    at ':' into user and password, src/redis/driver_impl.go createDialer at 1e50889b), named to the
    project chart and read by Envoy Gateway's rate-limit service from the synced Secret."""
    from gennstack.gateway.values import REDIS_AUTH_SECRET

    redis_id = _secret_ids(template)["password"]
    generate = _resources(template, "AWS::SecretsManager::Secret")[redis_id]["Properties"]["GenerateSecretString"]
    assert generate["PasswordLength"] == 48 and generate["ExcludePunctuation"] is True
    assert generate.get("IncludeSpace") is False and generate["SecretStringTemplate"] == "{}"
    project = _charts(template)["gennstack-gateway"]
    assert _values(project)["redis"]["remoteSecretName"] == "TOKEN" and redis_id in json.dumps(project["Values"])
    eg = _values(_charts(template)["gateway-helm"])["config"]["envoyGateway"]
    rate_limit = eg["provider"]["kubernetes"]["rateLimitDeployment"]
    assert rate_limit["container"]["env"] == [{"name": "REDIS_AUTH", "valueFrom": {
        "secretKeyRef": {"name": REDIS_AUTH_SECRET, "key": "password"}}}]
    assert rate_limit["pod"]["nodeSelector"] == {"gennstack.io/pool": "system"}


def test_chart_order(template) -> None:
    charts = {k: v for k, v in _resources(template, "Custom::AWSCDK-EKS-HelmChart").items()}
    by_release = {v["Properties"]["Release"]: k for k, v in charts.items()}
    project = charts[by_release["gennstack-gateway"]]
    for upstream in ("gateway-helm", "ai-gateway-helm", "ai-gateway-crds-helm", "external-secrets"):
        assert by_release[upstream] in project["DependsOn"]
    assert by_release["ai-gateway-crds-helm"] in charts[by_release["ai-gateway-helm"]]["DependsOn"]


def test_proxies_namespace_injects_the_nlb_readiness_gate(template) -> None:
    """The Envoy Gateway chart installs into a namespace the stack creates first, labelled for the
    AWS Load Balancer Controller's pod readiness gate (gennstack.gateway.values.POD_READINESS_GATE_LABEL)."""
    from gennstack.gateway.values import ENVOY_GATEWAY_NAMESPACE, envoy_gateway_namespace
    from tests.k8s_schema import validate

    namespace = envoy_gateway_namespace()
    validate(namespace)
    assert namespace["metadata"] == {"name": "envoy-gateway-system",
                                     "labels": {"elbv2.k8s.aws/pod-readiness-gate-inject": "enabled"}}
    manifests = {}
    for key, resource in _resources(template, "Custom::AWSCDK-EKS-KubernetesResource").items():
        manifest = resource["Properties"]["Manifest"]
        for obj in json.loads(manifest) if isinstance(manifest, str) else []:
            if obj["kind"] == "Namespace" and obj["metadata"]["name"] == ENVOY_GATEWAY_NAMESPACE:
                manifests[key] = obj
    assert len(manifests) == 1
    assert next(iter(manifests.values()))["metadata"]["labels"]["elbv2.k8s.aws/pod-readiness-gate-inject"] == "enabled"
    charts = _resources(template, "Custom::AWSCDK-EKS-HelmChart")
    (eg_id,) = [k for k, v in charts.items() if v["Properties"]["Release"] == "gateway-helm"]
    assert next(iter(manifests)) in charts[eg_id]["DependsOn"]
    assert charts[eg_id]["Properties"].get("CreateNamespace") in (None, False)


# external-secrets helm-chart-2.9.0 deploy/charts/external-secrets/values.yaml: the keys
# external_secrets_values() sets (processSecretStore: default true; false adds
# --enable-secret-store-reconciler=false in templates/deployment.yaml).
EXTERNAL_SECRETS_2_9_0_VALUES = {
    "installCRDs": bool, "processSecretStore": bool, "serviceAccount": {"create": bool, "name": str},
    "nodeSelector": dict, "tolerations": list, "webhook": {"nodeSelector": dict, "tolerations": list},
    "certController": {"nodeSelector": dict, "tolerations": list},
}


def _shape(value, shape) -> bool:
    if isinstance(shape, dict):
        return isinstance(value, dict) and set(value) <= set(shape) and all(_shape(v, shape[k]) for k, v in value.items())
    return isinstance(value, shape)


def test_no_namespaced_secret_store_can_borrow_the_controllers_credentials(template, variant) -> None:
    """A SecretStore with no auth would use the External Secrets controller's Pod Identity role
    (v2.9.0 providers/v1/aws/auth/auth.go): the controller reconciles none, so none is ever Ready,
    and with the flood gate on (its default; no extraArgs here) an ExternalSecret refuses a store
    that is not Ready (pkg/controllers/secretstore/client_manager.go). GenNStack's own stores are
    ClusterSecretStores limited to the namespaces they serve."""
    for synthesized in (template, variant):
        values = _values(_charts(synthesized)["external-secrets"])
        assert _shape(values, EXTERNAL_SECRETS_2_9_0_VALUES), values
        assert values["processSecretStore"] is False
        manifests = "".join(_joined(r["Properties"]["Manifest"])
                            for r in _resources(synthesized, "Custom::AWSCDK-EKS-KubernetesResource").values())
        assert '"kind":"SecretStore"' not in manifests.replace(" ", "")


def _joined(value) -> str:
    if isinstance(value, dict):
        return "".join(part if isinstance(part, str) else "TOKEN" for part in value["Fn::Join"][1])
    return value
