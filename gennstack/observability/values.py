"""Helm values of the monitoring charts, built from the ``monitoring`` config section.

One function per chart, each callable on its own so tests can check the values without synthesizing
the stack. The chart keys used here were read from the pinned charts' values.yaml and templates
(tests/observability/test_values.py lists them with their upstream files).
"""

from __future__ import annotations

from typing import Any

import yaml

from gennstack.observability import alertmanager, names
from gennstack.observability.config import MonitoringConfig

# The StorageClass the EBS CSI driver chart creates and every monitoring volume claims.
STORAGE_CLASS = "gennstack-gp3"
# The StatefulSets' volume claims go with them (helm uninstall on cdk destroy): without this the
# chart's default ({}) keeps them, and 100 + 5 GiB of gp3 stay billed after the cluster is gone.
# Scaling down keeps them. The operator passes it to the StatefulSet (Prometheus Operator v0.93.0
# persistentVolumeClaimRetentionPolicy; kube-prometheus-stack 88.3.0 values.yaml lines 1004 and 4223).
PVC_RETENTION = {"whenDeleted": "Delete", "whenScaled": "Retain"}
EBS_CSI_NAMESPACE = "kube-system"
EBS_CSI_CONTROLLER_SERVICE_ACCOUNT = "ebs-csi-controller-sa"
YACE_SERVICE_ACCOUNT = "gennstack-cloudwatch-exporter"
# The IAM actions YACE v0.67.0 needs for static and custom-namespace jobs (README.md lists
# tag:GetResources too, for discovery jobs, which GenNStack does not run).
YACE_ACTIONS = ("cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics", "cloudwatch:ListMetrics")
# kube-prometheus-stack names Prometheus' ServiceAccount "<fullname>-prometheus"
# (templates/_helpers.tpl, kube-prometheus-stack.prometheus.serviceAccountName).
PROMETHEUS_SERVICE_ACCOUNT = f"{names.KPS_FULLNAME}-prometheus"
# ... and Alertmanager's "<fullname>-alertmanager" (kube-prometheus-stack.alertmanager.serviceAccountName):
# the SNS receiver's Pod Identity role is associated with it.
ALERTMANAGER_SERVICE_ACCOUNT = f"{names.KPS_FULLNAME}-alertmanager"
# Karpenter v1.14.1 never voluntarily disrupts (consolidates, drifts) a node running a pod with this
# annotation (karpenter.sh/do-not-disrupt, the core's v1.DoNotDisruptAnnotationKey): Prometheus and
# Alertmanager stay put instead of moving whenever the general pool consolidates (each move is a
# gap in the metrics KEDA scales on, and restarts every alert's `for` timer).
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}
# The Pod Identity role of Prometheus (remote write) or Alertmanager (SNS), on their pods. EKS sets
# a pod's credential environment (AWS_CONTAINER_CREDENTIALS_FULL_URI, AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE)
# when the pod is created, if its ServiceAccount has an association then (EKS user guide,
# pod-identities.html: "If a pod uses a service account that has an association, Amazon EKS sets
# environment variables in the containers of the pod"); Prometheus Operator v0.93.0 applies a changed
# remote write or Alertmanager configuration in place, without a new pod. The annotation makes the
# association's appearance (or a new role) a pod template change: Prometheus Operator copies
# spec.podMetadata.annotations into the StatefulSet's pod template (pkg/alertmanager/statefulset.go
# makeStatefulSetSpec, pkg/prometheus/promcfg.go BuildPodMetadata), whose RollingUpdate strategy
# (pkg/operator/statefulset.go) replaces the pods, and they start with the credentials.
POD_IDENTITY_ROLE_ANNOTATION = "gennstack.io/pod-identity-role"
# YACE fetches every CloudWatch metric once per refresh (--scraping-interval, 300 s by default,
# cmd/yace/main.go at v0.67.0) and exports only the newest datapoint of each query
# (pkg/clients/cloudwatch/client.go toMetricDataResult, pkg/promutil/migrate.go). The handler's
# metrics are therefore asked for in one bucket as long as the refresh (period = length = refresh):
# each exported Sum counts every event of its 5 minutes, once. DELAY: the query window ends this
# long before each refresh, so CloudWatch has ingested the handler's last datapoints of it. It is a
# job-level field: YACE v0.67.0 ignores a metric's own `delay` and only logs a warning
# (pkg/config/scrapeconf.go validateMetric: "Metric is configured with delay that has been being
# ignored"; `mDelay` is taken from the job's JobLevelMetricFields only), and a static job has no
# job-level fields (type Static), so its metrics never have a delay.
YACE_REFRESH_SECONDS = 300
YACE_DELAY_SECONDS = 120
# Grafana's Service and admin Secret (grafana chart templates/_helpers.tpl grafana.fullname).
GRAFANA_FULLNAME = f"{names.KPS_FULLNAME}-grafana"
# Grafana's dashboard sidecar picks up ConfigMaps with this label (kube-prometheus-stack values.yaml,
# grafana.sidecar.dashboards.label / labelValue).
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
DASHBOARD_FOLDER_ANNOTATION = "grafana_folder"
# Node and pod labels kube-state-metrics exposes as kube_node_labels / kube_pod_labels
# (--metric-labels-allowlist); the dashboards and alerts join on them.
KSM_LABELS_ALLOWLIST = [
    "nodes=[karpenter.sh/capacity-type,karpenter.sh/nodepool,node.kubernetes.io/instance-type,gennstack.io/generation]",
    # gennstack.io/staged: "false" marks the pods of a generation whose staged gate is closed.
    "pods=[app.kubernetes.io/name,app.kubernetes.io/component,gennstack.io/staged]",
]
NVIDIA_GPU_TAINT = "nvidia.com/gpu"


def placement(config: MonitoringConfig, *, system_node_selector: dict[str, str],
              system_tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    """nodeSelector and tolerations of the monitoring pods: the system nodes or on-demand general nodes."""
    if config.placement == "system":
        return {"nodeSelector": dict(system_node_selector), "tolerations": list(system_tolerations)}
    return {"nodeSelector": {"gennstack.io/pool": "general", "karpenter.sh/capacity-type": "on-demand"}, "tolerations": []}


def _claim(size_gib: int) -> dict[str, Any]:
    return {"spec": {
        "storageClassName": STORAGE_CLASS,
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{size_gib}Gi"}},
    }}


def remote_write_url(workspace_arn: str) -> str:
    """The remote-write endpoint of an Amazon Managed Service for Prometheus workspace, from its ARN."""
    parts = workspace_arn.split(":")
    region, workspace_id = parts[3], parts[5].split("/", 1)[1]
    return f"https://aps-workspaces.{region}.amazonaws.com/workspaces/{workspace_id}/api/v1/remote_write"


def pod_annotations(role_arn: str | None) -> dict[str, str]:
    """The Prometheus or Alertmanager pods' annotations: do-not-disrupt, and the Pod Identity role
    (``POD_IDENTITY_ROLE_ANNOTATION``) when they have one, so pods started before it roll."""
    return {**DO_NOT_DISRUPT, **({POD_IDENTITY_ROLE_ANNOTATION: role_arn} if role_arn is not None else {})}


def kube_prometheus_stack_values(config: MonitoringConfig, *, region: str, remote_write: str | None,
                                 system_node_selector: dict[str, str],
                                 system_tolerations: list[dict[str, Any]],
                                 prometheus_role_arn: str | None = None,
                                 alertmanager_role_arn: str | None = None) -> dict[str, Any]:
    """Values of kube-prometheus-stack: where it runs, its volumes and retention, what it selects.

    ``remote_write``: the Amazon Managed Service for Prometheus endpoint, or None. Prometheus signs
    with SigV4 using the credentials EKS Pod Identity gives its ServiceAccount.
    ``prometheus_role_arn`` / ``alertmanager_role_arn``: the Pod Identity role of each (remote write,
    SNS receivers), or None; on the pods as ``POD_IDENTITY_ROLE_ANNOTATION``.
    """
    where = placement(config, system_node_selector=system_node_selector, system_tolerations=system_tolerations)
    prometheus_spec: dict[str, Any] = {
        **where,
        "podMetadata": {"annotations": pod_annotations(prometheus_role_arn)},
        "retention": f"{config.retention_days}d",
        "retentionSize": f"{config.retention_size_bytes()}B",
        "storageSpec": {"volumeClaimTemplate": _claim(config.prometheus_storage_gib)},
        "persistentVolumeClaimRetentionPolicy": PVC_RETENTION,
        # Every ServiceMonitor, PodMonitor and PrometheusRule in the cluster, not only the chart's
        # own (release label): GenNStack's, Karpenter's and the DCGM exporter's.
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "podMonitorSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
    }
    if remote_write is not None:
        prometheus_spec["remoteWrite"] = [{"url": remote_write, "sigv4": {"region": region}}]
    return {
        "fullnameOverride": names.KPS_FULLNAME,
        # EKS runs etcd, the scheduler and the controller manager out of the cluster's reach: their
        # monitors would only ever be down, and their alerts fire forever.
        **{component: {"enabled": False} for component in ("kubeEtcd", "kubeScheduler", "kubeControllerManager")},
        "defaultRules": {"rules": {rule: False for rule in (
            "etcd", "kubeControllerManager", "kubeSchedulerAlerting", "kubeSchedulerRecording")}},
        "alertmanager": {
            # The whole configuration (gennstack.observability.alertmanager): receivers from
            # monitoring.receivers, routed by severity.
            "config": alertmanager.alertmanager_config(config),
            "alertmanagerSpec": {
                **where,
                "podMetadata": {"annotations": pod_annotations(alertmanager_role_arn)},
                "storage": {"volumeClaimTemplate": _claim(config.alertmanager_storage_gib)},
                "persistentVolumeClaimRetentionPolicy": PVC_RETENTION,
                # Each receiver's Secret (External Secrets), mounted at /etc/alertmanager/secrets/<name>/.
                "secrets": [alertmanager.secret_name(r) for r in alertmanager.secret_receivers(config)],
            },
        },
        "grafana": {
            **where,
            # The subchart names itself after the release otherwise ("kube-prometheus-stack-grafana").
            "fullnameOverride": GRAFANA_FULLNAME,
            "persistence": {"enabled": True, "type": "pvc", "storageClassName": STORAGE_CLASS,
                            "accessModes": ["ReadWriteOnce"], "size": f"{config.grafana_storage_gib}Gi"},
            # One ReadWriteOnce volume: a rolling update's new pod could not attach it on another node.
            "deploymentStrategy": {"type": "Recreate"},
            # The dashboard sidecar loads every labelled ConfigMap into the folder its annotation names.
            "sidecar": {"dashboards": {
                "enabled": True, **_sidecar_label(), "searchNamespace": "ALL",
                "folderAnnotation": DASHBOARD_FOLDER_ANNOTATION,
                "provider": {"foldersFromFilesStructure": True},
            }},
        },
        "kube-state-metrics": {**where, "metricLabelsAllowlist": KSM_LABELS_ALLOWLIST},
        "prometheusOperator": {
            **where,
            "admissionWebhooks": {"patch": where},
        },
        "prometheus": {"prometheusSpec": prometheus_spec},
    }


def _sidecar_label() -> dict[str, str]:
    (label, value), = DASHBOARD_LABEL.items()
    return {"label": label, "labelValue": value}


def dcgm_exporter_values() -> dict[str, Any]:
    """The DCGM exporter on every NVIDIA node (Karpenter's GPU-maker label), scraped by its chart's ServiceMonitor."""
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]}]},
        ]}}},
        "tolerations": [{"key": NVIDIA_GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "serviceMonitor": {"enabled": True, "additionalLabels": dict(names.MONITORING_LABEL)},
    }


def ebs_csi_driver_values(*, system_node_selector: dict[str, str], system_tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    """The EBS CSI driver: controller on the system nodes, and the encrypted gp3 StorageClass the volumes use."""
    return {
        "controller": {
            "nodeSelector": dict(system_node_selector),
            "tolerations": list(system_tolerations),
            "serviceAccount": {"create": True, "name": EBS_CSI_CONTROLLER_SERVICE_ACCOUNT},
        },
        "storageClasses": [{
            "name": STORAGE_CLASS,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
            "allowVolumeExpansion": True,
            "parameters": {"type": "gp3", "encrypted": "true"},
        }],
    }


def cloudwatch_exporter_config(*, region: str, dead_letter_queue_name: str, metrics_namespace: str) -> dict[str, Any]:
    """YACE's config: the interruption handler's dead-letter queue depth and its own metrics.

    The handler publishes Interruptions, DuplicateSignals, PrewarmLatency, HandlerLatency,
    WarmSpareReplicas, Errors and, for drain routing, DrainedPods, RestoredPods, KeptPods and
    DrainLatency, for the scale-down order ServingReplicas (by capacity type), and for return to spot
    SpotMoves (by outcome and cause) in
    ``metrics_namespace`` (lambdas/interruption_handler/handler.py).
    """
    # The dead-letter depth is a gauge: the newest minute's maximum is what the alert wants.
    depth_window = {"period": 60, "length": 300}
    period = {"period": YACE_REFRESH_SECONDS, "length": YACE_REFRESH_SECONDS}
    return {
        "apiVersion": "v1alpha1",
        "sts-region": region,
        "static": [{
            "name": "interruption-dead-letters",
            "namespace": "AWS/SQS",
            "regions": [region],
            "dimensions": [{"name": "QueueName", "value": dead_letter_queue_name}],
            "metrics": [{"name": "ApproximateNumberOfMessagesVisible", "statistics": ["Maximum"], **depth_window}],
        }],
        "customNamespace": [{
            "name": "interruption-handler",
            "namespace": metrics_namespace,
            "regions": [region],
            # On the job: YACE reads `delay` from here only (YACE_DELAY_SECONDS).
            "delay": YACE_DELAY_SECONDS,
            "metrics": [
                {"name": "Interruptions", "statistics": ["Sum"], "nilToZero": True, **period},
                {"name": "DuplicateSignals", "statistics": ["Sum"], "nilToZero": True, **period},
                {"name": "Errors", "statistics": ["Sum"], "nilToZero": True, **period},
                {"name": "PrewarmLatency", "statistics": ["Average", "Maximum"], **period},
                {"name": "WarmSpareReplicas", "statistics": ["Maximum"], **period},
                {"name": "DrainedPods", "statistics": ["Sum"], "nilToZero": True, **period},
                {"name": "RestoredPods", "statistics": ["Sum"], "nilToZero": True, **period},
                # published every reconcile (each minute) while a generation's last replicas are kept
                {"name": "KeptPods", "statistics": ["Maximum"], "nilToZero": True, **period},
                {"name": "DrainLatency", "statistics": ["Maximum"], **period},
                # a gauge published every reconcile: serving replicas by their node's capacity type
                {"name": "ServingReplicas", "statistics": ["Maximum"], **period},
                # return to spot: one per move started, completed, cancelled (by cause) or restored
                {"name": "SpotMoves", "statistics": ["Sum"], "nilToZero": True, **period},
            ],
        }],
    }


def cloudwatch_exporter_values(config: MonitoringConfig, *, exporter_config: dict[str, Any],
                               system_node_selector: dict[str, str],
                               system_tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    """YACE with its config, on the monitoring nodes; credentials from EKS Pod Identity (no keys)."""
    where = placement(config, system_node_selector=system_node_selector, system_tolerations=system_tolerations)
    return {
        **where,
        "serviceAccount": {"create": True, "name": YACE_SERVICE_ACCOUNT},
        "serviceMonitor": {"enabled": True, "labels": dict(names.MONITORING_LABEL), "interval": "60s"},
        # The refresh the handler's query windows are as long as (cloudwatch_exporter_config).
        "extraArgs": {"scraping-interval": YACE_REFRESH_SECONDS},
        "config": yaml.safe_dump(exporter_config, sort_keys=False),
    }
