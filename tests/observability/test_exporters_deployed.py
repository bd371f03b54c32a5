"""Every series an alert or a dashboard panel reads comes from an exporter the stack deploys, with what
that exporter needs: the synthesized template is read, not the Python that builds it.

For each rule the PrometheusRule applies and each panel of the dashboards' ConfigMaps, every metric
name is mapped to its exporter (gennstack.observability.metrics.SERIES_EXPORTER; a name no exporter
produces fails), and that exporter's needs (metrics.EXPORTERS) are checked in the template:

* scraped: GenNStack's PodMonitor/ServiceMonitor for it is applied, in the monitoring namespace,
  with an endpoint on the exporter's port name and path whose metricRelabelings keep every series
  read (the Ray PodMonitor keeps only those); Prometheus selects every monitor
  (``*SelectorNilUsesHelmValues: false``, no selector); or the chart that runs it is installed with
  its own ServiceMonitor switched on (kube-prometheus-stack 88.3.0 values.yaml:
  ``kubeStateMetrics.enabled`` and ``kube-state-metrics.prometheus.monitor.enabled`` default true);
* running: a generation it serves is enabled (the Neuron monitor, DCGM, vLLM, Ray);
* YACE: its Pod Identity role allows the CloudWatch calls its config's jobs make at v0.67.0
  (static: GetMetricStatistics, pkg/job/static.go; customNamespace: ListMetrics and GetMetricData,
  pkg/job/custom.go; discovery: tag:GetResources, pkg/job/discovery.go; README.md "Authentication"
  lists their union as the minimum), and its config (from the chart's values) makes every aws_*
  name read (BuildMetricName, pkg/promutil/migrate.go);
* kube-state-metrics: every ``label_*`` read from kube_node_labels/kube_pod_labels is in the
  ``--metric-labels-allowlist`` the chart is installed with (v2.19.1 SanitizeLabelName).

That the serving pods carry the ports the vLLM and Ray PodMonitors name is checked against the
rendered serving chart in test_monitoring_manifests.py.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from gennstack.observability import names
from gennstack.observability import values as monitoring_values
from gennstack.observability.metrics import EXPORTERS, SERIES_EXPORTER, Exporter, yace_actions, yace_metric_name
from tests.observability.test_promql import _grafana_to_promql, metric_names
from tests.support import Synth

_LABEL_SERIES = ("kube_node_labels", "kube_pod_labels")


def _flatten(value: Any) -> str:
    """A template string, its Fn::Join tokens (queue names, ARNs) replaced by a placeholder."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(p if isinstance(p, str) else "TOKEN" for p in parts)
    raise AssertionError(f"unexpected template value {value!r}")


def _manifests(template: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [o for k, r in template["Resources"].items()
            if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource" and k.startswith(prefix)
            for o in json.loads(_flatten(r["Properties"]["Manifest"]))]


def _chart_values(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["Properties"]["Release"]: json.loads(_flatten(r["Properties"].get("Values") or "{}"))
            for r in template["Resources"].values() if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"}


def _role_actions(template: dict[str, Any], service_account: str) -> set[str]:
    resources = template["Resources"]
    (role_arn,) = [r["Properties"]["RoleArn"] for r in resources.values()
                   if r["Type"] == "AWS::EKS::PodIdentityAssociation" and r["Properties"]["ServiceAccount"] == service_account]
    role_id = role_arn["Fn::GetAtt"][0]
    actions: set[str] = set()
    for policy in resources.values():
        if policy["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                if statement["Effect"] == "Allow":
                    listed = statement["Action"]
                    actions.update([listed] if isinstance(listed, str) else listed)
    return actions


def deployed_expressions(template: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every rule and panel query the template applies."""
    found = []
    for rule in _manifests(template, "EksClustermanifestAlertRules"):
        for group in rule["spec"]["groups"]:
            found += [(f"rule {group['name']}: {r.get('alert') or r.get('record')}", r["expr"]) for r in group["rules"]]
    for config_map in _manifests(template, "EksClustermanifestDashboards"):
        for file_name, text in config_map["data"].items():
            for panel in json.loads(text)["panels"]:
                found += [(f"{file_name}: {panel['title']} {t['refId']}", _grafana_to_promql(t["expr"])) for t in panel["targets"]]
    return found


def _get(values: dict[str, Any], path: tuple[str, ...], default: bool) -> Any:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return default
        values = values[key]
    return values


def _kept(endpoint: dict[str, Any], series: str) -> bool:
    """Whether the endpoint's metric relabelling keeps ``series`` (Prometheus anchors the regex)."""
    for rule in endpoint.get("metricRelabelings", []):
        if rule.get("sourceLabels") == ["__name__"] and rule.get("action", "replace") in ("keep", "drop"):
            matched = re.fullmatch(rule.get("regex", "(.*)"), series) is not None
            if matched != (rule["action"] == "keep"):
                return False
    return True


def _needs(exporter: Exporter, template: dict[str, Any], generations: list[str], series: set[str]) -> list[str]:
    """What the template lacks for ``exporter`` to produce its series (empty: nothing)."""
    problems = []
    if exporter.generations and not set(exporter.generations) & set(generations):
        problems.append(f"runs only with {'/'.join(exporter.generations)}, none enabled")
    charts = _chart_values(template)
    if exporter.chart:
        if exporter.chart not in charts:
            problems.append(f"chart {exporter.chart} is not installed")
        for path, default in exporter.chart_switches:
            if _get(charts.get(exporter.chart, {}), path, default) is not True:
                problems.append(f"{exporter.chart} values {'.'.join(path)} is not true: its ServiceMonitor is off")
    if exporter.monitor is not None:
        kind, name = exporter.monitor
        objects = [o for o in _manifests(template, "EksClustermanifestScrapeTargets") + _manifests(template, "EksClustermanifestAlertRules")
                   if (o["kind"], o["metadata"]["name"]) == (kind, name)]
        if not objects:
            problems.append(f"no {kind} {name} is applied")
        for obj in objects:
            if obj["metadata"]["namespace"] != names.MONITORING_NAMESPACE:
                problems.append(f"{kind} {name} is in {obj['metadata']['namespace']}, not {names.MONITORING_NAMESPACE}")
            if kind == "PrometheusRule":
                continue
            endpoints = obj["spec"].get("podMetricsEndpoints", obj["spec"].get("endpoints", []))
            scraped = [e for e in endpoints if e.get("port") == exporter.port and e.get("path", "/metrics") == exporter.path]
            if not scraped:
                problems.append(f"{kind} {name} scrapes no {exporter.port}{exporter.path}")
            dropped = sorted(s for s in series if scraped and not any(_kept(e, s) for e in scraped))
            if dropped:
                problems.append(f"{kind} {name} drops {dropped} (metricRelabelings)")
        spec = charts.get("kube-prometheus-stack", {}).get("prometheus", {}).get("prometheusSpec", {})
        selector = {"PodMonitor": "podMonitor", "ServiceMonitor": "serviceMonitor", "PrometheusRule": "rule"}[kind]
        if spec.get(f"{selector}SelectorNilUsesHelmValues") is not False or f"{selector}Selector" in spec:
            problems.append(f"Prometheus does not select every {kind} (only the chart release's)")
    return problems


def _yace_needs(template: dict[str, Any], series: set[str]) -> list[str]:
    config = yaml.safe_load(_chart_values(template)["prometheus-yet-another-cloudwatch-exporter"]["config"])
    problems = []
    missing = yace_actions(config) - _role_actions(template, monitoring_values.YACE_SERVICE_ACCOUNT)
    if missing:
        problems.append(f"YACE's role lacks {sorted(missing)}, which its jobs call")
    exported = {yace_metric_name(job["namespace"], metric["name"], statistic)
                for job in [*config.get("static", []), *config.get("customNamespace", [])]
                for metric in job["metrics"] for statistic in metric["statistics"]}
    unexported = {s for s in series if s.startswith("aws_")} - exported
    if unexported:
        problems.append(f"YACE's config makes none of {sorted(unexported)}")
    return problems


def _ksm_needs(template: dict[str, Any], expressions: list[tuple[str, str]]) -> list[str]:
    allow = _chart_values(template)["kube-prometheus-stack"]["kube-state-metrics"].get("metricLabelsAllowlist", [])
    exposed = {"label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
               for entry in allow for key in entry.split("=", 1)[1].strip("[]").split(",")}
    read = {label for _, expr in expressions if any(s in expr for s in _LABEL_SERIES)
            for label in re.findall(r"\blabel_[a-z0-9_]+", re.sub(r"\blabel_(values|replace)\b", "", expr))}
    return [f"kube-state-metrics is not told to expose {label}" for label in sorted(read - exposed)]


def problems(template: dict[str, Any], generations: list[str]) -> list[str]:
    """Every series read without a deployed exporter, or whose exporter lacks what it needs."""
    expressions = deployed_expressions(template)
    found, used = [], {}
    for where, expr in expressions:
        for series in sorted(metric_names(expr)):
            exporter = SERIES_EXPORTER.get(series)
            if exporter is None:
                found.append(f"{where}: no deployed exporter produces {series} (gennstack/observability/metrics.py)")
            else:
                used.setdefault(exporter, set()).add(series)
    for exporter, series in sorted(used.items()):
        found += [f"{exporter} ({', '.join(sorted(series)[:3])}...): {p}"
                  for p in _needs(EXPORTERS[exporter], template, generations, series)]
    if "yace" in used:
        found += _yace_needs(template, used["yace"])
    if "kube-state-metrics" in used:
        found += _ksm_needs(template, expressions)
    return found


@pytest.mark.parametrize("which", ["synth", "synth_variant"])
def test_every_series_read_has_a_deployed_exporter_with_what_it_needs(which: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(which)
    expressions = deployed_expressions(synth.template)
    assert len(expressions) > 50 and any(w.startswith("rule ") for w, _ in expressions)
    assert problems(synth.template, list(synth.config.generations.enabled())) == []


def test_every_catalogued_exporter_is_one_the_series_name() -> None:
    assert set(SERIES_EXPORTER.values()) == set(EXPORTERS)


def _drop(template: dict[str, Any], prefix: str, kind: str, name: str) -> dict[str, Any]:
    changed = copy.deepcopy(template)
    for key, resource in changed["Resources"].items():
        if key.startswith(prefix):
            objects = [o for o in json.loads(resource["Properties"]["Manifest"]) if (o["kind"], o["metadata"]["name"]) != (kind, name)]
            resource["Properties"]["Manifest"] = json.dumps(objects)
    return changed


def test_what_is_missing_is_named(synth: Synth) -> None:
    """The check fails for each kind of gap: a series no exporter makes, an unscraped exporter, an
    IAM action YACE's jobs need, a label kube-state-metrics does not expose."""
    generations = list(synth.config.generations.enabled())
    template = synth.template

    no_ray = _drop(template, "EksClustermanifestScrapeTargets", "PodMonitor", "gennstack-ray")
    assert any(p.startswith("ray (") and "no PodMonitor gennstack-ray" in p for p in problems(no_ray, generations))

    no_statistics = copy.deepcopy(template)
    for policy in no_statistics["Resources"].values():
        if policy["Type"] == "AWS::IAM::Policy":
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                if isinstance(statement["Action"], list) and "cloudwatch:GetMetricStatistics" in statement["Action"]:
                    statement["Action"].remove("cloudwatch:GetMetricStatistics")
    assert "YACE's role lacks ['cloudwatch:GetMetricStatistics'], which its jobs call" in problems(no_statistics, generations)

    unknown = copy.deepcopy(template)
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "x", "namespace": names.MONITORING_NAMESPACE},
            "spec": {"groups": [{"name": "g", "rules": [
                {"alert": "A", "expr": "vllm:num_requests_swapped > 0"},
                {"alert": "B", "expr": 'count(kube_node_labels{label_topology_kubernetes_io_zone="a"})'}]}]}}
    key = next(k for k in unknown["Resources"] if k.startswith("EksClustermanifestAlertRules"))
    unknown["Resources"][key]["Properties"]["Manifest"] = json.dumps([rule])
    found = problems(unknown, generations)
    assert "rule g: A: no deployed exporter produces vllm:num_requests_swapped (gennstack/observability/metrics.py)" in found
    assert "kube-state-metrics is not told to expose label_topology_kubernetes_io_zone" in found

    narrow = copy.deepcopy(template)
    key = next(k for k in narrow["Resources"] if k.startswith("EksClustermanifestScrapeTargets"))
    objects = json.loads(narrow["Resources"][key]["Properties"]["Manifest"])
    ray = next(o for o in objects if o["metadata"]["name"] == "gennstack-ray")
    ray["spec"]["podMetricsEndpoints"][0]["metricRelabelings"][0]["regex"] = "ray_serve_num_http_requests_total"
    narrow["Resources"][key]["Properties"]["Manifest"] = json.dumps(objects)
    assert any("PodMonitor gennstack-ray drops ['ray_serve_deployment_replica_healthy'" in p for p in problems(narrow, generations))

    no_dcgm = _drop(template, "EksClustermanifestScrapeTargets", "PodMonitor", "none")
    assert any(p.startswith("dcgm-exporter") and "none enabled" in p for p in problems(no_dcgm, ["inf2", "trn2"]))
