"""The monitoring charts' values: only keys the pinned charts read, and what config says.

VERIFIED lists every key path the values set, each read in the pinned chart (values.yaml, or the
template that reads a commented-out key) and, for what the charts pass through to Prometheus
Operator's custom resources (prometheusSpec, alertmanagerSpec), in the Prometheus and Alertmanager
CRDs of kube-prometheus-stack 88.3.0 (charts/crds/crds/crd-prometheuses.yaml, crd-alertmanagers.yaml;
storage, retentionSize, remoteWrite[].sigv4.region were validated there when the keys were chosen):

* kube-prometheus-stack 88.3.0 (prometheus-community/helm-charts, tag kube-prometheus-stack-88.3.0,
  54199b5b): charts/kube-prometheus-stack/values.yaml; templates/prometheus/prometheus.yaml
  (storageSpec -> spec.storage, resources, remoteWrite), templates/alertmanager/alertmanager.yaml (storage);
* its grafana subchart 12.10.4 (grafana-community/helm-charts, tag grafana-12.10.4):
  charts/grafana/values.yaml; persistence.storageClassName is read in templates/pvc.yaml, fullnameOverride
  in templates/_helpers.tpl (grafana.fullname: the Service and the admin Secret, key admin-password);
* its kube-state-metrics subchart 8.2.0: charts/kube-state-metrics/values.yaml (metricLabelsAllowlist,
  joined into --metric-labels-allowlist in templates/deployment.yaml);
* dcgm-exporter 4.8.2 (NVIDIA/dcgm-exporter, tag 4.5.3-4.8.2, 691c9276): deployment/values.yaml;
  affinity is passed whole in templates/daemonset.yaml;
* aws-ebs-csi-driver 2.64.0 (kubernetes-sigs/aws-ebs-csi-driver, tag helm-chart-aws-ebs-csi-driver-2.64.0,
  9767d852): charts/aws-ebs-csi-driver/values.yaml (storageClasses entries: name, volumeBindingMode,
  reclaimPolicy, allowVolumeExpansion, parameters);
* prometheus-yet-another-cloudwatch-exporter 0.47.0: values.yaml; serviceMonitor.labels and
  .interval are read in templates/servicemonitor.yaml; config is the exporter's config file
  (docs/configuration.md at YACE v0.67.0: static and customNamespace jobs).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gennstack.observability import names
from gennstack.observability import values as v
from gennstack.observability.config import MonitoringConfig

SYSTEM = {"system_node_selector": {"gennstack.io/pool": "system"},
          "system_tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"}]}
# Objects the charts pass through whole (Kubernetes or CRD types): their inner keys are not chart keys.
OPAQUE = {"nodeSelector", "tolerations", "affinity", "resources", "volumeClaimTemplate", "remoteWrite",
          "storageClasses", "additionalLabels", "labels", "metricLabelsAllowlist",
          # alertmanager.config is Alertmanager's own file (amtool checks it: test_alertmanager.py);
          # podMetadata.annotations is an EmbeddedObjectMetadata map (crd-alertmanagers.yaml, crd-prometheuses.yaml).
          "config", "annotations"}

VERIFIED = {
    "kube-prometheus-stack": {
        "fullnameOverride",
        "kubeEtcd.enabled", "kubeScheduler.enabled", "kubeControllerManager.enabled",
        "defaultRules.rules.etcd", "defaultRules.rules.kubeControllerManager",
        "defaultRules.rules.kubeSchedulerAlerting", "defaultRules.rules.kubeSchedulerRecording",
        "alertmanager.alertmanagerSpec.nodeSelector", "alertmanager.alertmanagerSpec.tolerations",
        "alertmanager.alertmanagerSpec.storage.volumeClaimTemplate",
        "alertmanager.alertmanagerSpec.persistentVolumeClaimRetentionPolicy.whenDeleted",
        "alertmanager.alertmanagerSpec.persistentVolumeClaimRetentionPolicy.whenScaled",
        # values.yaml alertmanager.config (rendered whole into the Alertmanager's config Secret),
        # alertmanagerSpec.secrets and .podMetadata (passed to spec.secrets / spec.podMetadata).
        "alertmanager.config", "alertmanager.alertmanagerSpec.secrets",
        "alertmanager.alertmanagerSpec.podMetadata.annotations", "prometheus.prometheusSpec.podMetadata.annotations",
        "grafana.nodeSelector", "grafana.tolerations", "grafana.fullnameOverride",
        "grafana.persistence.enabled", "grafana.persistence.type", "grafana.persistence.storageClassName",
        "grafana.persistence.accessModes", "grafana.persistence.size", "grafana.deploymentStrategy.type",
        "grafana.sidecar.dashboards.enabled", "grafana.sidecar.dashboards.label", "grafana.sidecar.dashboards.labelValue",
        "grafana.sidecar.dashboards.searchNamespace", "grafana.sidecar.dashboards.folderAnnotation",
        "grafana.sidecar.dashboards.provider.foldersFromFilesStructure",
        "kube-state-metrics.nodeSelector", "kube-state-metrics.tolerations", "kube-state-metrics.metricLabelsAllowlist",
        "prometheusOperator.nodeSelector", "prometheusOperator.tolerations",
        "prometheusOperator.admissionWebhooks.patch.nodeSelector", "prometheusOperator.admissionWebhooks.patch.tolerations",
        "prometheus.prometheusSpec.nodeSelector", "prometheus.prometheusSpec.tolerations",
        "prometheus.prometheusSpec.retention", "prometheus.prometheusSpec.retentionSize",
        "prometheus.prometheusSpec.storageSpec.volumeClaimTemplate", "prometheus.prometheusSpec.resources",
        "prometheus.prometheusSpec.persistentVolumeClaimRetentionPolicy.whenDeleted",
        "prometheus.prometheusSpec.persistentVolumeClaimRetentionPolicy.whenScaled",
        "prometheus.prometheusSpec.serviceMonitorSelectorNilUsesHelmValues",
        "prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues",
        "prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues", "prometheus.prometheusSpec.remoteWrite",
    },
    "dcgm-exporter": {"affinity", "tolerations", "serviceMonitor.enabled", "serviceMonitor.additionalLabels"},
    "aws-ebs-csi-driver": {"controller.nodeSelector", "controller.tolerations", "controller.serviceAccount.create",
                           "controller.serviceAccount.name", "storageClasses"},
    "cloudwatch-exporter": {"nodeSelector", "tolerations", "serviceAccount.create", "serviceAccount.name",
                            "serviceMonitor.enabled", "serviceMonitor.labels", "serviceMonitor.interval", "config",
                            # templates/deployment.yaml: each extraArgs entry becomes --<key>=<value>.
                            "extraArgs.scraping-interval"},
}


def _paths(values: dict[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and key not in OPAQUE:
            out |= _paths(value, path)
        else:
            out.add(path)
    return out


REMOTE = MonitoringConfig.model_validate({"managed_prometheus": {"enabled": True}})


def _kps(config: MonitoringConfig = REMOTE, remote_write: str | None = "https://example/api/v1/remote_write") -> dict[str, Any]:
    return v.kube_prometheus_stack_values(config, region="us-east-1", remote_write=remote_write, **SYSTEM)


@pytest.mark.parametrize("chart, values", [
    ("kube-prometheus-stack", _kps()),
    ("dcgm-exporter", v.dcgm_exporter_values()),
    ("aws-ebs-csi-driver", v.ebs_csi_driver_values(**SYSTEM)),
    ("cloudwatch-exporter", v.cloudwatch_exporter_values(MonitoringConfig(), exporter_config={}, **SYSTEM)),
])
def test_values_use_only_verified_keys(chart: str, values: dict[str, Any]) -> None:
    assert _paths(values) <= VERIFIED[chart], sorted(_paths(values) - VERIFIED[chart])


def test_fullname_matches_the_names_other_parts_use() -> None:
    assert _kps()["fullnameOverride"] == names.KPS_FULLNAME
    assert names.PROMETHEUS_URL == "http://gennstack-monitoring-prometheus.monitoring.svc.cluster.local:9090"
    assert v.PROMETHEUS_SERVICE_ACCOUNT == "gennstack-monitoring-prometheus"
    # docs/observability.md's port-forward commands name these.
    assert _kps()["grafana"]["fullnameOverride"] == "gennstack-monitoring-grafana"


def test_storage_and_retention_follow_config() -> None:
    config = MonitoringConfig(prometheus_storage_gib=200, retention_days=30, alertmanager_storage_gib=2, grafana_storage_gib=3)
    values = _kps(config, None)
    spec = values["prometheus"]["prometheusSpec"]
    assert spec["retention"] == "30d"
    assert spec["retentionSize"] == f"{200 * 1024**3 * 9 // 10}B"
    claims = [spec["storageSpec"]["volumeClaimTemplate"]["spec"],
              values["alertmanager"]["alertmanagerSpec"]["storage"]["volumeClaimTemplate"]["spec"]]
    assert [c["resources"]["requests"]["storage"] for c in claims] == ["200Gi", "2Gi"]
    assert {c["storageClassName"] for c in claims} == {v.STORAGE_CLASS} == {values["grafana"]["persistence"]["storageClassName"]}
    assert values["grafana"]["persistence"]["size"] == "3Gi"
    assert values["grafana"]["deploymentStrategy"] == {"type": "Recreate"}  # its one ReadWriteOnce volume
    assert "remoteWrite" not in spec
    (storage_class,) = v.ebs_csi_driver_values(**SYSTEM)["storageClasses"]
    assert storage_class["name"] == v.STORAGE_CLASS
    assert storage_class["parameters"] == {"type": "gp3", "encrypted": "true"}


def test_prometheus_selects_every_monitor_and_rule_in_the_cluster() -> None:
    spec = _kps()["prometheus"]["prometheusSpec"]
    for kind in ("serviceMonitor", "podMonitor", "rule"):
        assert spec[f"{kind}SelectorNilUsesHelmValues"] is False
        assert f"{kind}Selector" not in spec  # empty selector: all, in every namespace


@pytest.mark.parametrize("placement, node_selector", [
    ("system", {"gennstack.io/pool": "system"}),
    ("on-demand", {"gennstack.io/pool": "general", "karpenter.sh/capacity-type": "on-demand"}),
])
def test_placement(placement: str, node_selector: dict[str, str]) -> None:
    values = _kps(MonitoringConfig(placement=placement), None)
    for where in (values["prometheus"]["prometheusSpec"], values["alertmanager"]["alertmanagerSpec"], values["grafana"],
                  values["kube-state-metrics"], values["prometheusOperator"]):
        assert where["nodeSelector"] == node_selector


def test_remote_write_signs_with_sigv4_in_the_region() -> None:
    assert _kps()["prometheus"]["prometheusSpec"]["remoteWrite"] == [
        {"url": "https://example/api/v1/remote_write", "sigv4": {"region": "us-east-1"}}]
    assert v.remote_write_url("arn:aws:aps:eu-west-1:123456789012:workspace/ws-0a1b2c3d-4e5f") == (
        "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-0a1b2c3d-4e5f/api/v1/remote_write")


def test_dashboard_sidecar_label_is_the_manifests() -> None:
    dashboards = _kps()["grafana"]["sidecar"]["dashboards"]
    assert {dashboards["label"]: dashboards["labelValue"]} == v.DASHBOARD_LABEL
    assert dashboards["folderAnnotation"] == v.DASHBOARD_FOLDER_ANNOTATION


def test_kube_state_metrics_exposes_the_labels_the_queries_join_on() -> None:
    """kube-state-metrics v2.19.1 names them label_<key with every non [a-zA-Z0-9_] as _>
    (internal/store/utils.go SanitizeLabelName); the rules and dashboards use these names."""
    allow = _kps()["kube-state-metrics"]["metricLabelsAllowlist"]
    assert allow == v.KSM_LABELS_ALLOWLIST
    assert "karpenter.sh/capacity-type" in allow[0] and "node.kubernetes.io/instance-type" in allow[0]
    assert "gennstack.io/generation" in allow[0] and "app.kubernetes.io/component" in allow[1]


def test_cloudwatch_exporter_config() -> None:
    config = v.cloudwatch_exporter_config(region="eu-west-1", dead_letter_queue_name="dlq", metrics_namespace="GenNStack")
    assert config["static"][0]["dimensions"] == [{"name": "QueueName", "value": "dlq"}]
    assert config["customNamespace"][0]["namespace"] == "GenNStack"
    values = v.cloudwatch_exporter_values(MonitoringConfig(), exporter_config=config, **SYSTEM)
    assert yaml.safe_load(values["config"]) == config
    assert values["serviceMonitor"]["labels"] == names.MONITORING_LABEL
    assert values["serviceAccount"]["name"] == v.YACE_SERVICE_ACCOUNT


def test_yace_delay_is_set_where_yace_reads_it() -> None:
    """YACE v0.67.0 (prometheus-community/yet-another-cloudwatch-exporter tag v0.67.0,
    pkg/config/scrapeconf.go ``validateMetric``): "Delay at the metric level has been ignored for an
    incredibly long time ... This logs a warning for now" (``if m.Delay != 0 { logger.Warn(...) }``),
    then ``mDelay`` comes only from ``discovery.Delay``, the job's ``JobLevelMetricFields`` (inline in
    ``Job`` and ``CustomNamespace``; ``Static`` has none and passes nil). The window then ends
    ``delay`` seconds back (pkg/clients/cloudwatch/input.go, pkg/job/getmetricdata/iterator.go)."""
    config = v.cloudwatch_exporter_config(region="eu-west-1", dead_letter_queue_name="dlq", metrics_namespace="GenNStack")
    jobs = [*config["static"], *config["customNamespace"]]
    assert [(job["name"], metric["name"]) for job in jobs for metric in job["metrics"] if "delay" in metric] == []
    [handler] = config["customNamespace"]
    assert handler["delay"] == v.YACE_DELAY_SECONDS == 120
    # Static jobs have no job-level fields in v0.67.0: a delay there would be an unknown key.
    assert "delay" not in config["static"][0]


def test_dcgm_exporter_runs_on_nvidia_nodes_only() -> None:
    values = v.dcgm_exporter_values()
    term = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]}]
    assert values["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_control_plane_monitors_eks_hides_are_off() -> None:
    values = _kps()
    assert [values[c]["enabled"] for c in ("kubeEtcd", "kubeScheduler", "kubeControllerManager")] == [False] * 3
    assert set(values["defaultRules"]["rules"].values()) == {False}


def test_volume_claims_are_deleted_with_the_statefulsets() -> None:
    """kube-prometheus-stack 88.3.0 passes prometheusSpec/alertmanagerSpec.persistentVolumeClaimRetentionPolicy
    to the Prometheus and Alertmanager resources (templates/prometheus/prometheus.yaml line 308,
    templates/alertmanager/alertmanager.yaml line 119; its default {} keeps the claims); the operator
    sets it on the StatefulSets, whose controller then deletes the claims when the StatefulSet goes
    (Kubernetes StatefulSetPersistentVolumeClaimRetentionPolicy, GA in 1.32)."""
    values = v.kube_prometheus_stack_values(MonitoringConfig(), region="us-east-1", remote_write=None, **SYSTEM)
    policy = {"whenDeleted": "Delete", "whenScaled": "Retain"}
    assert values["prometheus"]["prometheusSpec"]["persistentVolumeClaimRetentionPolicy"] == policy
    assert values["alertmanager"]["alertmanagerSpec"]["persistentVolumeClaimRetentionPolicy"] == policy
