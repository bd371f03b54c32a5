"""Metrics, dashboards and alerts: kube-prometheus-stack and what it scrapes."""

from __future__ import annotations

from aws_cdk import Acknowledgment, ArnFormat, Duration, Stack, Validations
from aws_cdk import aws_aps as aps
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs

from constructs import Construct
from gennstack_infra.components.cluster import pinned_chart
from gennstack.system_nodes import SYSTEM_NODE_SELECTOR, SYSTEM_TOLERATIONS
from gennstack import network_policy, versions
from gennstack.config import GenNStackConfig
from gennstack.observability import alertmanager, manifests, names, rules
from gennstack.observability import values as monitoring_values
from gennstack.serving.multinode_gateway import multi_node_pool as multi_node_pool_of


class Monitoring(Construct):
    """kube-prometheus-stack (Prometheus, Alertmanager, Grafana, node-exporter, kube-state-metrics)
    with GenNStack's scrape targets, dashboards and alerts; the EBS CSI driver for its volumes; the
    DCGM exporter on GPU nodes, AWS's neuron-monitor on Neuron nodes and YACE for the interruption
    handler's CloudWatch metrics; optionally remote write to Amazon Managed Service for Prometheus.

    Relies on: the EKS Pod Identity agent add-on (the EBS CSI controller, YACE and, with remote
    write, Prometheus get their AWS credentials from it; Prometheus signs remote writes with SigV4
    from the default credential chain); Prometheus Operator's CRDs come with the
    kube-prometheus-stack chart, so every ServiceMonitor, PodMonitor and PrometheusRule is applied
    after it; the objects each scrape target relies on are listed in gennstack/observability/manifests.py;
    the DCGM exporter requests no GPU and sees the node's GPUs through the EKS NVIDIA AMI's default
    NVIDIA container runtime; YACE and Prometheus find Pod Identity credentials through the AWS SDK
    for Go v2's default chain (container credentials).
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, config: GenNStackConfig,
                 dead_letter_queue: sqs.IQueue, metrics_namespace: str,
                 secrets_reader: iam.IRole | None = None, secrets_controller: Construct | None = None) -> None:
        """``secrets_reader``: the External Secrets controller's role (the gateway installs it), granted
        read access to the receivers' Secrets Manager secrets; ``secrets_controller``: its chart, which
        the receivers' SecretStore and ExternalSecrets wait for (its CRDs). Both are needed only when
        a webhook, Slack or PagerDuty receiver is configured."""
        super().__init__(scope, construct_id)
        monitoring = config.monitoring
        generations = list(config.generations.enabled())
        system = {"system_node_selector": SYSTEM_NODE_SELECTOR, "system_tolerations": SYSTEM_TOLERATIONS}
        region = cluster.stack.region
        self.charts: dict[str, eks.HelmChart] = {}
        self.associations: list[eks.CfnPodIdentityAssociation] = []

        ebs_role = self._pod_role(cluster, "EbsCsi", monitoring_values.EBS_CSI_NAMESPACE,
                                  monitoring_values.EBS_CSI_CONTROLLER_SERVICE_ACCOUNT,
                                  "EBS CSI driver controller: create, attach and delete the monitoring volumes")
        ebs_role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name("service-role/AmazonEBSCSIDriverPolicy"))
        Validations.of(ebs_role).acknowledge(Acknowledgment(
            id="AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy]",
            reason="AWS's policy for the EBS CSI driver: its volume and snapshot actions are conditioned on the "
                   "driver's own tags; the role is assumable only by the driver's controller through Pod Identity.",
        ))
        self.charts["ebs-csi"] = self._chart(cluster, "EbsCsiDriver", versions.EBS_CSI_DRIVER,
                                             monitoring_values.EBS_CSI_NAMESPACE,
                                             monitoring_values.ebs_csi_driver_values(**system))

        self.workspace_arn, remote_write, prometheus_role = self._managed_prometheus(cluster, config)
        sns_role = self._sns_role(cluster, monitoring)
        # Each role on its pods (values.POD_IDENTITY_ROLE_ANNOTATION): added to a running stack, it rolls
        # them, so they start with the Pod Identity credentials.
        self.charts["kube-prometheus-stack"] = self._chart(
            cluster, "KubePrometheusStack", versions.KUBE_PROMETHEUS_STACK, names.MONITORING_NAMESPACE,
            monitoring_values.kube_prometheus_stack_values(
                monitoring, region=region, remote_write=remote_write, **system,
                prometheus_role_arn=prometheus_role.role_arn if prometheus_role else None,
                alertmanager_role_arn=sns_role.role_arn if sns_role else None))
        self.charts["kube-prometheus-stack"].node.add_dependency(self.charts["ebs-csi"])
        kps = self.charts["kube-prometheus-stack"]

        if "g6e" in generations:
            self.charts["dcgm-exporter"] = self._chart(cluster, "DcgmExporter", versions.DCGM_EXPORTER,
                                                       names.MONITORING_NAMESPACE, monitoring_values.dcgm_exporter_values())
        exporter_role = self._pod_role(cluster, "CloudWatchExporter", names.MONITORING_NAMESPACE,
                                       monitoring_values.YACE_SERVICE_ACCOUNT,
                                       "YACE: read the interruption handler's CloudWatch metrics")
        # YACE v0.67.0's minimum for static and custom-namespace jobs (README.md, "Authentication"):
        # the dead-letter depth is a static job, fetched with GetMetricStatistics (pkg/job/static.go);
        # the handler's namespace is listed with ListMetrics and fetched with GetMetricData. No
        # discovery job runs, so tag:GetResources is not needed.
        exporter_role.add_to_principal_policy(iam.PolicyStatement(
            actions=list(monitoring_values.YACE_ACTIONS), resources=["*"]))
        Validations.of(exporter_role.node.find_child("DefaultPolicy")).acknowledge(Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="CloudWatch's GetMetricData, GetMetricStatistics and ListMetrics support no resource-level "
                   "permissions; the role is read-only and assumable only by the exporter's ServiceAccount "
                   "through Pod Identity.",
        ))
        exporter_config = monitoring_values.cloudwatch_exporter_config(
            region=region, dead_letter_queue_name=dead_letter_queue.queue_name, metrics_namespace=metrics_namespace)
        self.charts["cloudwatch-exporter"] = self._chart(
            cluster, "CloudWatchExporter", versions.CLOUDWATCH_EXPORTER, names.MONITORING_NAMESPACE,
            monitoring_values.cloudwatch_exporter_values(monitoring, exporter_config=exporter_config, **system))
        for chart_id in ("dcgm-exporter", "cloudwatch-exporter"):
            if chart_id in self.charts:
                self.charts[chart_id].node.add_dependency(kps)
        # Pods start with their AWS credentials in place.
        for chart in self.charts.values():
            chart.node.add_dependency(*self.associations)

        serving_namespace = config.serving.namespace
        # serving.multi_node's groups: their leaders scraped, one no-ready-replica rule counting groups.
        multi_node_pool = multi_node_pool_of(config.serving.multi_node) if config.serving.multi_node.enabled else None
        self.scrape_targets = cluster.add_manifest(
            "ScrapeTargets",
            *manifests.pod_monitors(generations=generations, serving_namespace=serving_namespace,
                                    multi_node_pool=multi_node_pool,
                                    resume_namespace=config.gateway.namespace if config.gateway.resume.enabled else None),
            manifests.karpenter_service_monitor(),
            *manifests.neuron_monitor(generations=generations),
        )
        self.rules = cluster.add_manifest("AlertRules", rules.prometheus_rule(
            monitoring, generations=rules.always_serving(config.serving, generations), serving_namespace=serving_namespace,
            multi_node_pool=multi_node_pool, max_num_seqs=rules.batch_sizes(config.serving, generations)))
        self.dashboards = cluster.add_manifest("Dashboards", *manifests.dashboard_config_maps(
            generations=generations, multi_node_pool=multi_node_pool))
        manifests_after_kps = [self.scrape_targets, self.rules, self.dashboards]
        if config.cluster.network_policies:
            # Ingress to the monitoring namespace: from itself, KEDA (to Prometheus) and the API server (webhook).
            self.network_policies = cluster.add_manifest("NetworkPolicies", *network_policy.monitoring_policies(
                vpc_cidr=config.network.vpc_cidr, labels=names.MONITORING_LABEL))
            manifests_after_kps.append(self.network_policies)
        for manifest in manifests_after_kps:
            manifest.node.add_dependency(kps)
        self._receivers(cluster, monitoring, region=region, kps=kps, secrets_reader=secrets_reader,
                        secrets_controller=secrets_controller)

    def _receivers(self, cluster: eks.Cluster, monitoring, *, region: str, kps: eks.HelmChart,
                   secrets_reader: iam.IRole | None, secrets_controller: Construct | None) -> None:
        """Alertmanager's way out: SNS through a Pod Identity role (``_sns_role``, associated before the
        chart installs), the other receivers' secrets through External Secrets."""
        with_secrets = alertmanager.secret_receivers(monitoring)
        self.receiver_secrets: eks.KubernetesManifest | None = None
        if not with_secrets:
            return
        if secrets_reader is None or secrets_controller is None:
            raise ValueError("monitoring.receivers: webhook, slack and pagerduty receivers need External Secrets "
                             "(the gateway installs it); pass secrets_reader and secrets_controller")
        stack = Stack.of(self)
        secrets_reader.add_to_principal_policy(iam.PolicyStatement(
            actions=["secretsmanager:GetSecretValue"],
            # Secrets Manager appends six random characters to a secret's name in its ARN.
            resources=[stack.format_arn(service="secretsmanager", resource="secret",
                                        resource_name=f"{r.secret_name}-??????",
                                        arn_format=ArnFormat.COLON_RESOURCE_NAME) for r in with_secrets],
        ))
        self.receiver_secrets = cluster.add_manifest(
            "AlertReceiverSecrets", alertmanager.secret_store(region=region), *alertmanager.external_secrets(monitoring))
        self.receiver_secrets.node.add_dependency(kps, secrets_controller)

    def _sns_role(self, cluster: eks.Cluster, monitoring) -> iam.Role | None:
        """Alertmanager's Pod Identity role for the SNS receivers' topics, or None without SNS receivers.
        Every chart of this construct waits for the associations (``__init__``)."""
        topics = alertmanager.sns_topics(monitoring)
        if not topics:
            return None
        role = self._pod_role(cluster, "AlertmanagerSns", names.MONITORING_NAMESPACE,
                              monitoring_values.ALERTMANAGER_SERVICE_ACCOUNT,
                              "Alertmanager: publish alerts to the configured SNS topics")
        role.add_to_principal_policy(iam.PolicyStatement(actions=["sns:Publish"], resources=topics))
        return role

    def _managed_prometheus(self, cluster: eks.Cluster,
                            config: GenNStackConfig) -> tuple[str | None, str | None, iam.Role | None]:
        """The workspace's ARN, remote-write URL and Prometheus' role (all None when remote write is off)."""
        managed = config.monitoring.managed_prometheus
        if not managed.enabled:
            return None, None, None
        if managed.workspace_arn is None:
            workspace = aps.CfnWorkspace(self, "Workspace", alias=f"{config.cluster_name}-metrics")
            arn, url = workspace.attr_arn, f"{workspace.attr_prometheus_endpoint}api/v1/remote_write"
        else:
            arn, url = managed.workspace_arn, monitoring_values.remote_write_url(managed.workspace_arn)
        role = self._pod_role(cluster, "PrometheusRemoteWrite", names.MONITORING_NAMESPACE,
                              monitoring_values.PROMETHEUS_SERVICE_ACCOUNT,
                              "Prometheus: remote write to the Amazon Managed Service for Prometheus workspace")
        role.add_to_principal_policy(iam.PolicyStatement(actions=["aps:RemoteWrite"], resources=[arn]))
        return arn, url, role

    def _pod_role(self, cluster: eks.Cluster, construct_id: str, namespace: str, service_account: str,
                  description: str) -> iam.Role:
        principal = iam.ServicePrincipal("pods.eks.amazonaws.com")
        role = iam.Role(self, f"{construct_id}Role", assumed_by=principal, description=description)
        # EKS Pod Identity assumes the role with session tags.
        role.assume_role_policy.add_statements(iam.PolicyStatement(actions=["sts:TagSession"], principals=[principal]))
        self.associations.append(eks.CfnPodIdentityAssociation(
            self, f"{construct_id}Association", cluster_name=cluster.cluster_name, namespace=namespace,
            service_account=service_account, role_arn=role.role_arn))
        return role

    def _chart(self, cluster: eks.Cluster, construct_id: str, chart: versions.Chart, namespace: str,
               values: dict) -> eks.HelmChart:
        return pinned_chart(self, construct_id, cluster=cluster, chart=chart, namespace=namespace, values=values,
                            create_namespace=True, wait=True, timeout=Duration.minutes(10))
