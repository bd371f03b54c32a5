"""The Monitoring construct in the synthesized stack: charts, their order, IAM scope, Pod Identity."""

from __future__ import annotations

import json
from typing import Any

from gennstack import versions
from gennstack.observability import names
from gennstack.observability import values as monitoring_values
from tests.support import VARIANT, Synth, depends_on


def _charts(synth: Synth) -> dict[str, tuple[str, dict[str, Any]]]:
    return {r["Properties"]["Release"]: (logical_id, r["Properties"])
            for logical_id, r in synth.resources("Custom::AWSCDK-EKS-HelmChart").items()}


def _manifest_ids(synth: Synth, prefix: str) -> list[str]:
    return [k for k in synth.resources("Custom::AWSCDK-EKS-KubernetesResource") if k.startswith(prefix)]


def test_charts_pinned_in_their_namespaces(synth: Synth) -> None:
    charts = _charts(synth)
    for chart, namespace in ((versions.KUBE_PROMETHEUS_STACK, names.MONITORING_NAMESPACE),
                             (versions.DCGM_EXPORTER, names.MONITORING_NAMESPACE),
                             (versions.CLOUDWATCH_EXPORTER, names.MONITORING_NAMESPACE),
                             (versions.EBS_CSI_DRIVER, "kube-system")):
        _, properties = charts[chart.name]
        assert (properties["Chart"], properties["Repository"], properties["Version"], properties["Namespace"]) == (
            chart.name, chart.repository, chart.version, namespace)
        assert properties["Wait"] is True


def test_monitoring_objects_come_after_the_operator_and_its_volumes(synth: Synth) -> None:
    template = synth.template
    charts = _charts(synth)
    kps, _ = charts[versions.KUBE_PROMETHEUS_STACK.name]
    assert depends_on(template, kps, charts[versions.EBS_CSI_DRIVER.name][0])
    for dependent in (charts[versions.DCGM_EXPORTER.name][0], charts[versions.CLOUDWATCH_EXPORTER.name][0],
                      *_manifest_ids(synth, "EksClustermanifestScrapeTargets"),
                      *_manifest_ids(synth, "EksClustermanifestAlertRules"),
                      *_manifest_ids(synth, "EksClustermanifestDashboards")):
        assert depends_on(template, dependent, kps), dependent


def test_scrape_targets_rules_and_dashboards_are_applied(synth: Synth) -> None:
    kinds = []
    for prefix in ("EksClustermanifestScrapeTargets", "EksClustermanifestAlertRules", "EksClustermanifestDashboards"):
        (logical_id,) = _manifest_ids(synth, prefix)
        manifest = synth.template["Resources"][logical_id]["Properties"]["Manifest"]
        assert isinstance(manifest, str), f"{logical_id} holds a token"
        kinds += [(o["kind"], o["metadata"]["name"]) for o in json.loads(manifest)]
    assert ("PrometheusRule", "gennstack") in kinds
    assert {("PodMonitor", n) for n in ("gennstack-vllm", "gennstack-ray", "gennstack-gateway", "neuron-monitor")} <= set(kinds)
    assert ("ServiceMonitor", "karpenter") in kinds and ("DaemonSet", "neuron-monitor") in kinds
    assert sum(kind == "ConfigMap" for kind, _ in kinds) == 6


def test_dashboards_of_the_enabled_generations_only(synth: Synth, synth_variant: Synth) -> None:
    """The variant disables trn2 (VARIANT): no gen2-trn2 dashboard; the shared ones stay."""
    def dashboards(s: Synth) -> set[str]:
        (logical_id,) = _manifest_ids(s, "EksClustermanifestDashboards")
        return {o["metadata"]["name"] for o in json.loads(s.template["Resources"][logical_id]["Properties"]["Manifest"])}

    shared = {"gennstack-cost", "gennstack-gateway", "gennstack-spot"}
    assert dashboards(synth) == shared | {"gennstack-gen1-inf2", "gennstack-gen2-trn2", "gennstack-gen3-g6e"}
    assert VARIANT["generations"]["trn2"]["enabled"] is False
    assert dashboards(synth_variant) == shared | {"gennstack-gen1-inf2", "gennstack-gen3-g6e"}


def _associations(synth: Synth) -> dict[tuple[str, str], dict[str, Any]]:
    return {(a["Properties"]["Namespace"], a["Properties"]["ServiceAccount"]): a["Properties"]
            for a in synth.resources("AWS::EKS::PodIdentityAssociation").values()}


def _role_statements(synth: Synth, role_arn: dict[str, Any]) -> list[dict[str, Any]]:
    role_id = role_arn["Fn::GetAtt"][0]
    return [s for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def test_pod_identity_for_the_ebs_driver_and_the_cloudwatch_exporter(synth: Synth) -> None:
    associations = _associations(synth)
    assert ("kube-system", monitoring_values.EBS_CSI_CONTROLLER_SERVICE_ACCOUNT) in associations
    exporter = associations[(names.MONITORING_NAMESPACE, monitoring_values.YACE_SERVICE_ACCOUNT)]
    (statement,) = _role_statements(synth, exporter["RoleArn"])
    # YACE v0.67.0 README.md: the minimum for static jobs (GetMetricStatistics, pkg/job/static.go)
    # and custom-namespace jobs (ListMetrics, GetMetricData); tag:GetResources is for discovery jobs only.
    assert sorted(statement["Action"]) == ["cloudwatch:GetMetricData", "cloudwatch:GetMetricStatistics",
                                           "cloudwatch:ListMetrics"]
    # Remote write is off by default: Prometheus has no role.
    assert (names.MONITORING_NAMESPACE, monitoring_values.PROMETHEUS_SERVICE_ACCOUNT) not in associations
    assert not synth.resources("AWS::APS::Workspace")


def test_remote_write_to_a_workspace_the_stack_creates(synth_variant: Synth) -> None:
    (workspace_id,) = synth_variant.resources("AWS::APS::Workspace")
    association = _associations(synth_variant)[(names.MONITORING_NAMESPACE, monitoring_values.PROMETHEUS_SERVICE_ACCOUNT)]
    (statement,) = _role_statements(synth_variant, association["RoleArn"])
    assert statement["Action"] == "aps:RemoteWrite"
    assert statement["Resource"] == {"Fn::GetAtt": [workspace_id, "Arn"]}
    _, kps = _charts(synth_variant)[versions.KUBE_PROMETHEUS_STACK.name]
    joined = json.dumps(kps["Values"])
    assert "api/v1/remote_write" in joined and "PrometheusEndpoint" in joined and '\\"sigv4\\"' in joined


def test_cloudwatch_namespace_is_the_handlers(synth: Synth) -> None:
    (function,) = [f["Properties"] for k, f in synth.resources("AWS::Lambda::Function").items()
                   if k.startswith("InterruptionHandlerFunction")]
    assert function["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"] == names.INTERRUPTION_METRICS_NAMESPACE


def test_receivers_sns_role_may_only_publish_to_its_topic_and_secrets_come_through_external_secrets(
        synth_variant: Synth) -> None:
    association = _associations(synth_variant)[(names.MONITORING_NAMESPACE, monitoring_values.ALERTMANAGER_SERVICE_ACCOUNT)]
    (statement,) = _role_statements(synth_variant, association["RoleArn"])
    assert statement["Action"] == "sns:Publish"
    assert statement["Resource"] == VARIANT["monitoring"]["receivers"][0]["topic_arn"]
    (logical_id,) = _manifest_ids(synth_variant, "EksClustermanifestAlertReceiverSecrets")
    objects = json.loads(synth_variant.template["Resources"][logical_id]["Properties"]["Manifest"])
    assert [(o["kind"], o["metadata"].get("namespace")) for o in objects] == [
        ("ClusterSecretStore", None), ("ExternalSecret", names.MONITORING_NAMESPACE)]
    readers = [s for p in synth_variant.resources("AWS::IAM::Policy").values()
               for s in p["Properties"]["PolicyDocument"]["Statement"] if s["Action"] == "secretsmanager:GetSecretValue"]
    assert any("gennstack/alerting/pagerduty-??????" in json.dumps(s["Resource"]) for s in readers)
    charts = _charts(synth_variant)
    assert depends_on(synth_variant.template, logical_id, charts[versions.EXTERNAL_SECRETS.name][0])


def _resolved_values(properties: dict[str, Any]) -> dict[str, Any]:
    """A chart's values with each ``Fn::GetAtt`` written as ``<LogicalId.Attribute>`` (the rest is literal)."""
    values = properties["Values"]
    if isinstance(values, dict):
        values = "".join(part if isinstance(part, str) else
                         "<{}.{}>".format(*part["Fn::GetAtt"]) if "Fn::GetAtt" in part else "<{}>".format(part["Ref"])
                         for part in values["Fn::Join"][1])
    return json.loads(values)


def test_pods_roll_when_their_pod_identity_role_arrives(synth: Synth, synth_variant: Synth) -> None:
    """EKS sets a pod's Pod Identity environment when the pod is created (EKS user guide,
    pod-identities.html), and Prometheus Operator v0.93.0 reloads a new remote write or receiver config
    in place: the running pods would never get the credentials. Each role is on its pods
    (``podMetadata.annotations``, which kube-prometheus-stack 88.3.0 templates/alertmanager/alertmanager.yaml
    and templates/prometheus/prometheus.yaml pass to the CRs' spec.podMetadata, and the operator to the
    StatefulSet's pod template: pkg/alertmanager/statefulset.go, pkg/prometheus/promcfg.go
    BuildPodMetadata), so adding one changes the pod template and the StatefulSet rolls them; the chart
    waits for the associations, so the new pods start with them."""
    key = monitoring_values.POD_IDENTITY_ROLE_ANNOTATION
    kps_id, kps = _charts(synth_variant)[versions.KUBE_PROMETHEUS_STACK.name]
    values = _resolved_values(kps)
    associations = _associations(synth_variant)
    for service_account, spec in ((monitoring_values.ALERTMANAGER_SERVICE_ACCOUNT, values["alertmanager"]["alertmanagerSpec"]),
                                  (monitoring_values.PROMETHEUS_SERVICE_ACCOUNT, values["prometheus"]["prometheusSpec"])):
        role_arn = associations[(names.MONITORING_NAMESPACE, service_account)]["RoleArn"]["Fn::GetAtt"]
        assert spec["podMetadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true",
                                                      key: "<{}.{}>".format(*role_arn)}
        (association_id,) = [k for k, a in synth_variant.resources("AWS::EKS::PodIdentityAssociation").items()
                             if a["Properties"]["ServiceAccount"] == service_account]
        assert depends_on(synth_variant.template, kps_id, association_id)
    # No role (the defaults: no SNS receiver, no remote write): no annotation.
    _, default = _charts(synth)[versions.KUBE_PROMETHEUS_STACK.name]
    values = _resolved_values(default)
    assert key not in values["alertmanager"]["alertmanagerSpec"]["podMetadata"]["annotations"]
    assert key not in values["prometheus"]["prometheusSpec"]["podMetadata"]["annotations"]
