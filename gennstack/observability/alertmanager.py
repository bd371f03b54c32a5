"""Alertmanager's configuration: receivers from ``monitoring.receivers``, routing by severity, inhibition.

kube-prometheus-stack 88.3.0 routes every alert to its ``null`` receiver (values.yaml
``alertmanager.config``); this module replaces that configuration whole (every top-level key is
set, so Helm's merge of maps leaves nothing of the chart's default route or receivers).

Routing: ``severity=critical`` goes to the ``page`` receiver (every configured receiver that lists
"critical"), ``severity=warning`` to ``notify`` (those that list "warning"); anything else
(Watchdog, InfoInhibitor, severity info or none) to ``null``. A warning never reaches a receiver
that lists only "critical": it does not page.

Secrets: the webhook's bearer token, Slack's webhook URL and PagerDuty's routing key are files
Alertmanager reads (``credentials_file``, ``api_url_file``, ``routing_key_file``, accepted by
Alertmanager v0.25.0, Debian's, which the tests run, and v0.33.1, the chart's): External Secrets
writes each receiver's Kubernetes Secret from Secrets Manager and the operator mounts it at
``/etc/alertmanager/secrets/<secret>/`` (Prometheus Operator v0.93.0 Alertmanager CRD,
``spec.secrets``). No secret value is in this configuration.

SNS: ``sns_configs`` with ``sigv4`` and no keys: Alertmanager v0.33.1 (notify/sns/sns.go) loads the
AWS SDK for Go v2 default chain, which reads EKS Pod Identity's container credentials.
"""

from __future__ import annotations

from typing import Any

from gennstack.observability import names
from gennstack.observability.config import SECRET_KEYS, MonitoringConfig, ReceiverConfig

# Prometheus Operator mounts each spec.secrets entry here (Alertmanager CRD, spec.secrets description).
SECRETS_DIR = "/etc/alertmanager/secrets"
NULL, PAGE, NOTIFY = "null", "page", "notify"
ROUTE_BY_SEVERITY = {"critical": PAGE, "warning": NOTIFY}
# Timings of the notification pipeline. group_wait: how long a new group waits for more alerts
# before the first notification; group_interval: before notifying of new alerts in a group that
# already notified; repeat_interval: before repeating a notification that still fires.
TIMINGS = {"group_wait": "30s", "group_interval": "5m", "repeat_interval": "12h"}
PAGE_REPEAT_INTERVAL = "4h"
# One notification per alert name and namespace: every model or generation an alert fires for
# arrives together (GenNStack's alerts aggregate away most labels; kube-prometheus-stack's carry namespace).
GROUP_BY = ["alertname", "namespace"]


def secret_name(receiver: ReceiverConfig) -> str:
    """The Kubernetes Secret (in the monitoring namespace) that holds a receiver's secret."""
    return f"gennstack-alerting-{receiver.name}"


def secret_file(receiver: ReceiverConfig, *, secrets_dir: str = SECRETS_DIR) -> str:
    return f"{secrets_dir}/{secret_name(receiver)}/{SECRET_KEYS[receiver.type]}"


def topic_region(topic_arn: str) -> str:
    return topic_arn.split(":")[3]


def _integration(receiver: ReceiverConfig, *, secrets_dir: str) -> tuple[str, dict[str, Any]]:
    """(the Alertmanager receiver key, its one entry) for a configured receiver."""
    if receiver.type == "sns":
        assert receiver.topic_arn is not None
        return "sns_configs", {
            "topic_arn": receiver.topic_arn,
            "sigv4": {"region": topic_region(receiver.topic_arn)},
            "subject": '[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}',
            "send_resolved": True,
        }
    path = secret_file(receiver, secrets_dir=secrets_dir)
    if receiver.type == "webhook":
        return "webhook_configs", {
            "url": receiver.url,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": path}},
            "send_resolved": True,
        }
    if receiver.type == "slack":
        entry: dict[str, Any] = {"api_url_file": path, "send_resolved": True,
                                 "title": '[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}',
                                 "text": "{{ range .Alerts }}{{ .Annotations.summary }}\n{{ end }}"}
        if receiver.channel:
            entry["channel"] = receiver.channel
        return "slack_configs", entry
    return "pagerduty_configs", {"routing_key_file": path, "send_resolved": True,
                                 "description": "{{ .CommonAnnotations.summary }}"}


def receivers(config: MonitoringConfig, *, secrets_dir: str = SECRETS_DIR) -> list[dict[str, Any]]:
    """null, page and notify; page and notify hold the integrations of the receivers listing their severity."""
    out: list[dict[str, Any]] = [{"name": NULL}]
    for severity, route_receiver in ROUTE_BY_SEVERITY.items():
        entry: dict[str, Any] = {"name": route_receiver}
        for receiver in config.receivers:
            if severity in receiver.severities:
                key, integration = _integration(receiver, secrets_dir=secrets_dir)
                entry.setdefault(key, []).append(integration)
        out.append(entry)
    return out


def inhibit_rules() -> list[dict[str, Any]]:
    """The chart's inhibitions (a critical alert silences its own warning; InfoInhibitor), and GenNStack's.

    A model whose requests fail (GenNStackHighErrorRate, critical) also misses its latency SLO: the
    page says so, the warning adds nothing. The CloudWatch exporter that is not scraped at all
    (GenNStackCloudWatchExporterAbsent) explains its missing request errors too.
    """
    return [
        {"source_matchers": ["severity = critical"], "target_matchers": ["severity =~ warning|info"],
         "equal": ["namespace", "alertname"]},
        {"source_matchers": ["severity = warning"], "target_matchers": ["severity = info"],
         "equal": ["namespace", "alertname"]},
        {"source_matchers": ["alertname = InfoInhibitor"], "target_matchers": ["severity = info"],
         "equal": ["namespace"]},
        {"target_matchers": ["alertname = InfoInhibitor"]},
        {"source_matchers": ["alertname = GenNStackHighErrorRate"],
         "target_matchers": ["alertname = GenNStackTimeToFirstTokenOverSLO"],
         "equal": ["gen_ai_request_model"]},
    ]


def alertmanager_config(config: MonitoringConfig, *, secrets_dir: str = SECRETS_DIR,
                        timings: dict[str, str] | None = None) -> dict[str, Any]:
    """The whole Alertmanager configuration file. ``timings`` overrides TIMINGS (tests only)."""
    timing = {**TIMINGS, **(timings or {})}
    page_repeat = timings.get("repeat_interval", PAGE_REPEAT_INTERVAL) if timings else PAGE_REPEAT_INTERVAL
    return {
        "global": {"resolve_timeout": "5m"},
        "route": {
            "receiver": NULL,
            "group_by": list(GROUP_BY),
            **timing,
            "routes": [
                # The chart's always-firing dead man's switch and the info inhibitor notify no one.
                {"receiver": NULL, "matchers": ['alertname =~ "Watchdog|InfoInhibitor"']},
                {"receiver": PAGE, "matchers": ['severity = "critical"'], "repeat_interval": page_repeat},
                {"receiver": NOTIFY, "matchers": ['severity = "warning"']},
            ],
        },
        "inhibit_rules": inhibit_rules(),
        "receivers": receivers(config, secrets_dir=secrets_dir),
        "templates": ["/etc/alertmanager/config/*.tmpl"],
    }


def secret_receivers(config: MonitoringConfig) -> list[ReceiverConfig]:
    return [r for r in config.receivers if r.type in SECRET_KEYS]


def sns_topics(config: MonitoringConfig) -> list[str]:
    return sorted({r.topic_arn for r in config.receivers if r.type == "sns" and r.topic_arn})


STORE_NAME = "gennstack-alerting"


def secret_store(*, region: str) -> dict[str, Any]:
    """A ClusterSecretStore that serves the monitoring namespace only, authenticating as the External
    Secrets controller (EKS Pod Identity; its role may read only the secrets the stack grants it).

    Not a namespaced SecretStore: the controller reconciles none (``processSecretStore: false``, see
    ``gennstack.gateway.values.external_secrets_values``), so a SecretStore that anyone creates in any
    namespace cannot borrow the controller's credentials."""
    return {
        "apiVersion": "external-secrets.io/v1",
        "kind": "ClusterSecretStore",
        "metadata": {"name": STORE_NAME},
        "spec": {
            "conditions": [{"namespaces": [names.MONITORING_NAMESPACE]}],
            "provider": {"aws": {"service": "SecretsManager", "region": region}},
        },
    }


def external_secrets(config: MonitoringConfig, *, refresh_interval: str = "1h") -> list[dict[str, Any]]:
    """One ExternalSecret per receiver with a secret: its Secrets Manager JSON key into a Kubernetes Secret."""
    out = []
    for receiver in secret_receivers(config):
        key = SECRET_KEYS[receiver.type]
        out.append({
            "apiVersion": "external-secrets.io/v1",
            "kind": "ExternalSecret",
            "metadata": {"name": secret_name(receiver), "namespace": names.MONITORING_NAMESPACE},
            "spec": {
                "refreshInterval": refresh_interval,
                "secretStoreRef": {"kind": "ClusterSecretStore", "name": STORE_NAME},
                "target": {"name": secret_name(receiver), "creationPolicy": "Owner"},
                "data": [{"secretKey": key, "remoteRef": {"key": receiver.secret_name, "property": key}}],
            },
        })
    return out
