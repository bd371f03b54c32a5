"""Alertmanager's configuration as GenNStack renders it: `amtool check-config` accepts it, `amtool config
routes test` routes each severity where docs/observability.md says, and no secret is in it.

Pinned: Alertmanager v0.25.0 (Debian's amtool) and v0.33.1 (the chart's) both accept
``credentials_file`` (prometheus/common HTTP client), ``api_url_file`` and ``routing_key_file``
(config/notifiers.go SlackConfig.APIURLFile, PagerdutyConfig.RoutingKeyFile at both tags) and
``sns_configs`` with ``sigv4`` (SNSConfig.Sigv4); a webhook's ``url_file`` exists only from
v0.26, so the webhook's secret is its bearer token instead (notify/webhook/config.go at v0.33.1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gennstack.observability import alertmanager, names
from gennstack.observability.config import MonitoringConfig
from gennstack.observability.values import ALERTMANAGER_SERVICE_ACCOUNT, kube_prometheus_stack_values
from tests.observability.alerting import amtool

TOPIC = "arn:aws:sns:eu-west-1:123456789012:gennstack-alerts"
ALL_TYPES = MonitoringConfig.model_validate({"receivers": (
    {"name": "ops-topic", "type": "sns", "topic_arn": TOPIC},
    {"name": "oncall", "type": "pagerduty", "secret_name": "gennstack/alerting/pagerduty"},
    {"name": "chat", "type": "slack", "secret_name": "gennstack/alerting/slack", "channel": "#gennstack",
     "severities": ("critical", "warning")},
    {"name": "hook", "type": "webhook", "secret_name": "gennstack/alerting/hook", "url": "https://hooks.example.com/am",
     "severities": ("warning",)},
)})


def _write(tmp_path: Path, config: MonitoringConfig) -> Path:
    path = tmp_path / "alertmanager.yaml"
    path.write_text(yaml.safe_dump(alertmanager.alertmanager_config(config), sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("config", [MonitoringConfig(), ALL_TYPES], ids=["no-receivers", "every-type"])
def test_amtool_check_config_accepts_the_rendered_configuration(tmp_path: Path, config: MonitoringConfig) -> None:
    _write(tmp_path, config)
    result = amtool("check-config", "alertmanager.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("labels, receiver", [
    (["alertname=GenNStackNoReadyReplica", "severity=critical"], "page"),
    (["alertname=GenNStackKVCacheFull", "severity=warning"], "notify"),
    (["alertname=Watchdog", "severity=none"], "null"),
    (["alertname=InfoInhibitor", "severity=none"], "null"),
    (["alertname=KubeletTooManyPods", "severity=info"], "null"),
    (["alertname=Unlabelled"], "null"),
])
def test_routes_by_severity(tmp_path: Path, labels: list[str], receiver: str) -> None:
    _write(tmp_path, ALL_TYPES)
    result = amtool("config", "routes", "test", "--config.file=alertmanager.yaml", *labels, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_critical_pages_every_critical_receiver_and_warnings_only_theirs() -> None:
    by_name = {r["name"]: r for r in alertmanager.alertmanager_config(ALL_TYPES)["receivers"]}
    page, notify = by_name["page"], by_name["notify"]
    assert [c["topic_arn"] for c in page["sns_configs"]] == [TOPIC]
    assert page["sns_configs"][0]["sigv4"] == {"region": "eu-west-1"}
    assert len(page["pagerduty_configs"]) == 1 and len(page["slack_configs"]) == 1 and "webhook_configs" not in page
    # The PagerDuty and SNS receivers list only "critical": a warning never reaches them.
    assert set(notify) == {"name", "slack_configs", "webhook_configs"}
    assert by_name["null"] == {"name": "null"}


def test_no_secret_in_the_configuration_only_files_the_operator_mounts() -> None:
    rendered = alertmanager.alertmanager_config(ALL_TYPES)
    by_name = {r["name"]: r for r in rendered["receivers"]}
    assert by_name["page"]["pagerduty_configs"][0]["routing_key_file"] == \
        "/etc/alertmanager/secrets/gennstack-alerting-oncall/routing_key"
    assert by_name["page"]["slack_configs"][0]["api_url_file"] == "/etc/alertmanager/secrets/gennstack-alerting-chat/api_url"
    assert by_name["notify"]["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"] == \
        "/etc/alertmanager/secrets/gennstack-alerting-hook/token"
    keys: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            keys.update(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(rendered)
    assert not keys & {"api_url", "routing_key", "service_key", "credentials", "password", "access_key", "secret_key"}
    values = kube_prometheus_stack_values(ALL_TYPES, region="eu-west-1", remote_write=None,
                                          system_node_selector={}, system_tolerations=[])["alertmanager"]
    assert values["config"] == rendered
    assert values["alertmanagerSpec"]["secrets"] == [
        "gennstack-alerting-oncall", "gennstack-alerting-chat", "gennstack-alerting-hook"]
    # kube-prometheus-stack 88.3.0 templates/_helpers.tpl kube-prometheus-stack.alertmanager.serviceAccountName.
    assert ALERTMANAGER_SERVICE_ACCOUNT == f"{names.KPS_FULLNAME}-alertmanager"


def test_external_secrets_copy_each_receivers_key_from_secrets_manager() -> None:
    from tests.k8s_schema import validate

    store = alertmanager.secret_store(region="eu-west-1")
    secrets = alertmanager.external_secrets(ALL_TYPES)
    for obj in (store, *secrets):
        validate(obj)
    assert [(s["metadata"]["name"], s["spec"]["data"][0]["remoteRef"]) for s in secrets] == [
        ("gennstack-alerting-oncall", {"key": "gennstack/alerting/pagerduty", "property": "routing_key"}),
        ("gennstack-alerting-chat", {"key": "gennstack/alerting/slack", "property": "api_url"}),
        ("gennstack-alerting-hook", {"key": "gennstack/alerting/hook", "property": "token"}),
    ]
    assert all(s["spec"]["secretStoreRef"] == {"kind": "ClusterSecretStore", "name": store["metadata"]["name"]} for s in secrets)
    # a ClusterSecretStore for the monitoring namespace only: the controller reconciles no SecretStore
    assert store["kind"] == "ClusterSecretStore"
    assert store["spec"]["conditions"] == [{"namespaces": [names.MONITORING_NAMESPACE]}]
