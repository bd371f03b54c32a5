"""The model servers: the project's serving chart, its Pod Identity roles and the Hugging Face token secret."""

from __future__ import annotations


from aws_cdk import Acknowledgment, Aws, RemovalPolicy, Validations
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_secretsmanager as secretsmanager

from constructs import Construct
from gennstack_infra.components.cluster import acknowledge_chart_asset_read
from gennstack_infra.paths import ASSETS
from gennstack_infra.components.model_storage import ModelStorage
from gennstack.config import GenNStackConfig
from gennstack.serving.values import compile_cache_prefixes, model_prefixes, serving_values

CHART_DIR = ASSETS / "charts" / "gennstack-serving"
INF2_IMAGE_DIR = ASSETS / "images" / "inf2-ray-serve"
MULTI_NODE_IMAGE_DIR = ASSETS / "images" / "g6e-vllm-ray"
SERVING_SERVICE_ACCOUNT = "gennstack-serving"
STAGING_SERVICE_ACCOUNT = "gennstack-staging"
# A name prefix: the chart names one account per Neuron generation, `gennstack-compile-inf2`, `-trn2`.
COMPILE_SERVICE_ACCOUNT = "gennstack-compile"


class Serving(Construct):
    """Installs ``assets/charts/gennstack-serving`` with values from ``serving_values``.

    Serving pods get a role that can only read the models and compile-cache buckets; the stage Jobs
    get one that can also upload (never delete) weights and read the Hugging Face token; each Neuron
    generation's compile Jobs, whose pods run the model's code, one that reads that generation's model
    and reads and uploads only its compile-cache prefix (docs/security.md). All through EKS Pod
    Identity, bound to the chart's service accounts. The token itself never appears in the
    template or the chart's values: the stack creates the secret with a random placeholder, you put
    the token in once (README), and the staging Job reads it at run time.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        config: GenNStackConfig,
        storage: ModelStorage,
    ) -> None:
        super().__init__(scope, construct_id)
        namespace = config.serving.namespace
        self.hf_token = secretsmanager.Secret(
            self,
            "HuggingFaceToken",
            description="Hugging Face access token for GenNStack's staging Jobs (put the real token in; see README)",
            removal_policy=RemovalPolicy.RETAIN,
        )
        Validations.of(self.hf_token).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SMG4",
                reason="A Hugging Face access token cannot be rotated by AWS: it is issued in the Hugging Face "
                "account and replaced there; only the staging Jobs' role can read it.",
            )
        )
        self.serving_role = self._pod_role("ServingRole", "Model servers: read model weights and compiled artifacts")
        self.staging_role = self._pod_role("StagingRole", "Staging Jobs: upload model weights and compiled artifacts")
        storage.grant_serving_read(self.serving_role)
        storage.grant_staging_write(self.staging_role)
        self.hf_token.grant_read(self.staging_role)
        self.compile_roles = self._compile_roles(config, storage)
        self.associations = [
            eks.CfnPodIdentityAssociation(
                self,
                f"{role_id}Association",
                cluster_name=cluster.cluster_name,
                namespace=namespace,
                service_account=service_account,
                role_arn=role.role_arn,
            )
            for role_id, role, service_account in (
                ("Serving", self.serving_role, SERVING_SERVICE_ACCOUNT),
                ("Staging", self.staging_role, STAGING_SERVICE_ACCOUNT),
                *((f"Compile{name.capitalize()}", role, f"{COMPILE_SERVICE_ACCOUNT}-{name}")
                  for name, role in self.compile_roles.items()),
            )
        ]
        values = serving_values(
            config,
            config.serving,
            models_bucket=storage.models_bucket.bucket_name,
            compile_cache_bucket=storage.compile_cache_bucket.bucket_name,
            region=Aws.REGION,
            hf_token_secret=self.hf_token.secret_arn,
            serving_service_account=SERVING_SERVICE_ACCOUNT,
            staging_service_account=STAGING_SERVICE_ACCOUNT,
            compile_service_account=COMPILE_SERVICE_ACCOUNT,
        )
        # KubeRay needs Ray Serve in every gen1-inf2 pod; the Neuron vLLM DLC's own Ray cannot take it.
        # CDK builds the DLC plus Ray Serve in its own environment at deploy time (Docker on the
        # deploying machine) unless config names an image.
        self.inf2_image: ecr_assets.DockerImageAsset | None = None
        if config.generations.inf2.enabled and config.serving.inf2.image is None:
            self.inf2_image = ecr_assets.DockerImageAsset(
                self, "Inf2RayServeImage", directory=str(INF2_IMAGE_DIR), platform=ecr_assets.Platform.LINUX_AMD64
            )
            values["inf2"]["image"] = self.inf2_image.image_uri
        # The multi-node groups run Ray (head on the leader, vLLM's Ray executor); vllm/vllm-openai has
        # none (vLLM PR #36170 dropped it from requirements/cuda.txt). CDK builds the chart's vLLM image plus Ray unless config names an image.
        self.multi_node_image: ecr_assets.DockerImageAsset | None = None
        if config.serving.multi_node.enabled and config.serving.multi_node.image is None:
            self.multi_node_image = ecr_assets.DockerImageAsset(
                self, "MultiNodeRayImage", directory=str(MULTI_NODE_IMAGE_DIR), platform=ecr_assets.Platform.LINUX_AMD64
            )
            values["multiNode"]["image"] = self.multi_node_image.image_uri
        self.chart = eks.HelmChart(
            self,
            "Chart",
            cluster=cluster,
            chart_asset=s3_assets.Asset(self, "ChartAsset", path=str(CHART_DIR), exclude=["**/__pycache__", "**/*.pyc", ".*~"]),
            namespace=namespace,
            release="gennstack-serving",
            values=values,
        )
        for association in self.associations:
            self.chart.node.add_dependency(association)
        self._acknowledge(cluster, config)

    def _compile_roles(self, config: GenNStackConfig, storage: ModelStorage) -> dict[str, iam.Role]:
        """One role per enabled Neuron generation for its compile Jobs: its model's weights (read) and its
        compile-cache prefix (read, upload), the keys gennstack.serving.values gives the chart too."""
        models = model_prefixes(config)
        roles: dict[str, iam.Role] = {}
        for name, prefix in compile_cache_prefixes(config, config.serving).items():
            role = self._pod_role(f"Compile{name.capitalize()}Role",
                                  f"{name} compile Jobs: read its model, upload its compiled artifacts only")
            storage.grant_compile_write(role, model_prefix=models[name], compile_prefix=prefix)
            roles[name] = role
        return roles

    def _pod_role(self, construct_id: str, description: str) -> iam.Role:
        role = iam.Role(
            self, construct_id, assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"), description=description
        )
        # EKS Pod Identity assumes the role with session tags.
        role.assume_role_policy.add_statements(
            iam.PolicyStatement(actions=["sts:TagSession"], principals=[iam.ServicePrincipal("pods.eks.amazonaws.com")])
        )
        return role

    def _acknowledge(self, cluster: eks.Cluster, config: GenNStackConfig) -> None:
        acknowledge_chart_asset_read(cluster)
        reason = (
            "CDK's bucket grants: object-level wildcards under the model buckets only (the serving role reads, "
            "the staging role reads and uploads weights, each compile role reads its model and reads and uploads "
            "its own compile-cache prefix; none deletes), and KMS actions on the buckets' one key."
        )
        models, cache = "<ModelStorageModelsBucket2AA7EB86.Arn>", "<ModelStorageCompileCacheBucket619E16CC.Arn>"
        read = ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*")
        write = ("Action::kms:GenerateDataKey*", "Action::kms:ReEncrypt*", "Action::s3:Abort*")
        findings: list[tuple[iam.Role, tuple[str, ...]]] = [
            (self.serving_role, (*read, f"Resource::{models}/*", f"Resource::{cache}/*")),
            (self.staging_role, (*read, *write, f"Resource::{models}/*")),
        ]
        compiled, weights = compile_cache_prefixes(config, config.serving), model_prefixes(config)
        for name, role in self.compile_roles.items():
            findings.append((role, (*read, *write, f"Resource::{models}/{weights[name]}*",
                                    f"Resource::{cache}/{compiled[name]}*")))
        for role, ids in findings:
            Validations.of(role.node.find_child("DefaultPolicy")).acknowledge(
                *[Acknowledgment(id=f"AwsSolutions-IAM5[{finding}]", reason=reason) for finding in ids]
            )
