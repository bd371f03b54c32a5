"""The ``GenNStack`` stack: wires the network and model storage (and, later, compute and serving)."""

from __future__ import annotations

from typing import Any

from aws_cdk import Aspects, CfnOutput, Fn, Stack, Tags

from constructs import Construct
from gennstack_infra.components.access_logs import AccessLogBucket
from gennstack_infra.components.cluster import Cluster
from gennstack_infra.components.drills import SpotDrills
from gennstack_infra.components.gateway import Gateway
from gennstack_infra.components.interruption_handler import InterruptionHandler
from gennstack_infra.components.karpenter import Karpenter
from gennstack_infra.components.load_balancer_controller import LoadBalancerController
from gennstack_infra.components.model_storage import ModelStorage
from gennstack_infra.components.monitoring import Monitoring
from gennstack_infra.components.network import Network
from gennstack_infra.components.node_pools import NodePools
from gennstack_infra.components.operators import Operators
from gennstack_infra.components.ordering import KubernetesDeployOrder
from gennstack_infra.components.pod_identity import scope_pod_identity_trust
from gennstack_infra.components.serving import Serving
from gennstack import pod_security
from gennstack.config import GenNStackConfig
from gennstack.observability.names import INTERRUPTION_METRICS_NAMESPACE
from gennstack.summary import CONFIG_METADATA_KEY


class GenNStack(Stack):
    """Everything GenNStack deploys into one account and region.

    Relies on: an environment-agnostic stack only knows two zones (``Fn::GetAZs`` indexes 0
    and 1), so it supplies ``az_count`` zones itself: the names from config when a region is
    set, else ``Fn::Select`` over ``Fn::GetAZs`` (every commercial region has at least three).
    No zone lookup ever runs at synth time.
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: GenNStackConfig, **kwargs: Any) -> None:
        self._zone_names = config.network.availability_zones
        self._az_count = config.network.az_count
        super().__init__(scope, construct_id, **kwargs)
        self.config = config
        # The resolved config, recorded in the template: an audit trail of what was deployed,
        # and what `gennstack summary` reads.
        self.template_options.metadata = {CONFIG_METADATA_KEY: _template_safe(config.model_dump(mode="json"))}
        for key, value in sorted(config.tags.items()):
            Tags.of(self).add(key, value)

        self.access_logs = AccessLogBucket(self, "AccessLogs", expiry_days=config.storage.access_log_expiry_days)
        self.network = Network(
            self,
            "Network",
            config=config.network,
            cluster_name=config.cluster_name,
            flow_log_bucket=self.access_logs.bucket,
        )
        self.model_storage = ModelStorage(
            self, "ModelStorage", config=config.storage, access_log_bucket=self.access_logs.bucket
        )
        self.cluster = Cluster(
            self,
            "Eks",
            config=config.cluster,
            cluster_name=config.cluster_name,
            vpc=self.network.vpc,
            private_subnets=self.network.private_subnets,
        )
        self.karpenter = Karpenter(self, "Karpenter", cluster=self.cluster.cluster, cluster_name=config.cluster_name)
        self.node_pools = NodePools(
            self, "NodePools", cluster=self.cluster.cluster, config=config, node_role_name=self.karpenter.node_role.role_name
        )
        # Created after Karpenter runs and deleted before it: their finalizers need the controller
        # to terminate the nodes and instance profiles, or instances and ENIs outlive the stack.
        self.node_pools.node.add_dependency(self.karpenter.chart, self.karpenter.node_access_entry)
        self.load_balancer_controller = LoadBalancerController(
            self, "LoadBalancerController", cluster=self.cluster.cluster, cluster_name=config.cluster_name,
            vpc_id=self.network.vpc.vpc_id,
        )
        # Pod Security admission: restricted, unless a Neuron generation's hostPath model cache needs privileged.
        neuron = config.generations.inf2.enabled or config.generations.trn2.enabled
        self.operators = Operators(self, "Operators", cluster=self.cluster.cluster, serving_namespace=config.serving.namespace,
                                   serving_namespace_labels=pod_security.namespace_labels(
                                       enforce=pod_security.serving_level(neuron=neuron),
                                       kubernetes_version=config.cluster.kubernetes_version),
                                   multi_node=config.serving.multi_node.enabled)
        self.serving = Serving(self, "Serving", cluster=self.cluster.cluster, config=config, storage=self.model_storage)
        # RayService needs KubeRay's CRDs; pods need the device plugins and the node pools.
        self.serving.chart.node.add_dependency(self.operators, self.node_pools)
        self.interruption_handler = InterruptionHandler(
            self,
            "InterruptionHandler",
            cluster=self.cluster.cluster,
            config=config,
            vpc=self.network.vpc,
            private_subnets=self.network.private_subnets,
            namespace=config.serving.namespace,
            baselines={name: config.serving.model_dump()[name]["warm_spare_replicas"] for name in config.generations.enabled()},
        )
        # Its Role lives in the serving namespace, which the serving chart creates.
        self.interruption_handler.rbac.node.add_dependency(self.serving.chart)
        if config.drills.enabled:
            self.drills = SpotDrills(
                self, "SpotDrills", config=config,
                stop_alarms=[self.interruption_handler.errors_alarm, self.interruption_handler.alarm],
                handler_log_group=self.interruption_handler.log_group,
            )
        self.gateway = Gateway(self, "Gateway", cluster=self.cluster.cluster, config=config, gateway=config.gateway)
        # The NLB comes from the Load Balancer Controller; the routes point at the serving Services.
        self.gateway.node.add_dependency(self.load_balancer_controller, self.serving.chart)

        self.monitoring = Monitoring(
            self, "Monitoring", cluster=self.cluster.cluster, config=config,
            dead_letter_queue=self.interruption_handler.dead_letter_queue,
            metrics_namespace=INTERRUPTION_METRICS_NAMESPACE,
            # Alert receivers' secrets come through the External Secrets controller the gateway installs.
            secrets_reader=self.gateway.external_secrets_service_account.role,
            secrets_controller=self.gateway.charts["external-secrets"],
        )
        # kube-prometheus-stack (and the exporters and objects that follow it) runs on Karpenter's
        # general pool by default: created after the NodePools, deleted before them. The EBS CSI driver
        # the other way round: Karpenter waits for a node's volumes to detach before it terminates it,
        # so the driver must outlive the NodePools.
        self.monitoring.charts["kube-prometheus-stack"].node.add_dependency(self.node_pools)
        self.node_pools.node.add_dependency(self.monitoring.charts["ebs-csi"])

        # Every Kubernetes object waits for the system nodes and the add-ons; every chart for
        # the Load Balancer Controller (see gennstack_infra/components/ordering.py).
        Aspects.of(self).add(
            KubernetesDeployOrder(ready=self.cluster.ready, first_chart=self.load_balancer_controller.chart)
        )

        # Every Pod Identity role: assumable only by its association's service account in this cluster.
        self.pod_identity_trust = scope_pod_identity_trust(self)

        for output_id, value, description in (
            ("ClusterName", self.cluster.cluster.cluster_name, "EKS cluster (aws eks update-kubeconfig --name ...)"),
            ("ModelsBucketName", self.model_storage.models_bucket.bucket_name, "Model weights bucket"),
            ("CompileCacheBucketName", self.model_storage.compile_cache_bucket.bucket_name, "Neuron compile cache"),
            ("HuggingFaceTokenSecretArn", self.serving.hf_token.secret_arn, "Put the Hugging Face token here"),
            ("InterruptionDeadLetterQueueUrl", self.interruption_handler.dead_letter_queue.queue_url, "Failed events"),
            ("GatewayApiKeysSecretArn", self.gateway.api_keys_secret.secret_arn, "Client API keys (JSON {client: key})"),
        ):
            CfnOutput(self, output_id, value=value, description=description)

    @property
    def availability_zones(self) -> list[str]:
        if self._zone_names is not None:
            return list(self._zone_names)
        return [Fn.select(index, Fn.get_azs()) for index in range(self._az_count)]


def _template_safe(value: Any) -> Any:
    """CloudFormation metadata holds no floats (cfn-lint E4002): write them as strings."""
    if isinstance(value, float):
        return str(value)
    if isinstance(value, dict):
        return {key: _template_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_template_safe(item) for item in value]
    return value
