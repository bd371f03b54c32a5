"""The ``monitoring`` config section: Prometheus' storage and retention, alert thresholds, prices.

kube-prometheus-stack (Prometheus, Alertmanager, Grafana, node-exporter, kube-state-metrics) is
always installed; this section sizes it and sets what the alerts and the cost dashboard compare
against. Every bad value raises :class:`~gennstack.config_base.FieldError` (or a pydantic error
that ``gennstack.config`` turns into one readable message naming the key).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gennstack.config_base import FieldError, StrictModel

__all__ = ["AlertsConfig", "ManagedPrometheusConfig", "MonitoringConfig", "ReceiverConfig"]

_INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
_AMP_WORKSPACE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:aps:[a-z0-9-]+:\d{12}:workspace/ws-[0-9a-f-]{1,64}$")
CAPACITY_TYPES = ("on-demand", "spot", "reserved")
_SNS_TOPIC_ARN_RE = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")
# A Secrets Manager secret name: letters, digits and /_+=.@- (the service's own rule), at most 512.
_SECRET_NAME_RE = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,512}$")
_RECEIVER_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
RECEIVER_TYPES = ("sns", "webhook", "slack", "pagerduty")
SEVERITIES = ("critical", "warning")
# The JSON key each receiver type reads from its Secrets Manager secret.
SECRET_KEYS = {"webhook": "token", "slack": "api_url", "pagerduty": "routing_key"}


class AlertsConfig(StrictModel):
    """Thresholds of GenNStack's PrometheusRule alerts (gennstack.observability.rules)."""

    # Time to first token, 95th percentile at the gateway, per model: above this for 10 minutes alerts.
    ttft_p95_slo_seconds: Annotated[float, Field(gt=0, le=600)] = 2.0
    """Time to first token, 95th percentile at the gateway per model: above this for 10 minutes alerts."""
    # Share of requests that fail (gateway 5xx and AI Gateway errors), per model, over 5 minutes.
    error_rate: Annotated[float, Field(gt=0, lt=1)] = 0.05
    """Share of requests that fail (gateway 5xx and AI Gateway errors) per model over 5 minutes that alerts."""
    # vLLM's KV-cache use (0-1) at or above this for 5 minutes: the server is out of KV cache.
    kv_cache_full: Annotated[float, Field(gt=0, le=1)] = 0.98
    """vLLM's KV-cache use (0-1) at or above this for 5 minutes alerts."""
    # Accelerator pods Pending longer than this alert.
    pending_pod_minutes: Annotated[int, Field(ge=1, le=1440)] = 15
    """Accelerator pods Pending longer than this alert."""


class ManagedPrometheusConfig(StrictModel):
    """Optional remote write of every sample to Amazon Managed Service for Prometheus."""

    enabled: bool = False
    """Remote write to Amazon Managed Service for Prometheus (SigV4, a Pod Identity role that may only write to that
    workspace)."""
    # An existing workspace's ARN; null: the stack creates one.
    workspace_arn: str | None = None
    """An existing workspace's ARN; unset: the stack creates one."""

    @field_validator("workspace_arn")
    @classmethod
    def _arn(cls, value: str | None) -> str | None:
        if value is not None and not _AMP_WORKSPACE_ARN_RE.match(value):
            raise ValueError("must be an Amazon Managed Service for Prometheus workspace ARN "
                             "(arn:aws:aps:<region>:<account>:workspace/ws-...), or null to create one")
        return value

    @model_validator(mode="after")
    def _only_when_enabled(self) -> ManagedPrometheusConfig:
        if self.workspace_arn is not None and not self.enabled:
            raise FieldError("workspace_arn", self.workspace_arn, "null unless enabled is true")
        return self


class ReceiverConfig(StrictModel):
    """Where Alertmanager sends the alerts of the listed severities (gennstack.observability.alertmanager).

    sns: ``topic_arn`` (Alertmanager publishes with SigV4, as a Pod Identity role that may only
    sns:Publish to that topic). webhook, slack, pagerduty: ``secret_name``, a Secrets Manager secret
    (JSON) that External Secrets copies into the cluster; it never appears in cdk.json or
    CloudFormation. Its key: ``token`` (webhook: sent as ``Authorization: Bearer``), ``api_url``
    (slack: the incoming-webhook URL), ``routing_key`` (pagerduty: an Events API v2 integration key).
    """

    name: str
    """The receiver's name in Alertmanager."""
    type: Literal["sns", "webhook", "slack", "pagerduty"]
    """Where alerts go: an SNS topic, a webhook, Slack or PagerDuty."""
    # critical alerts page; warning alerts only go to receivers that list "warning".
    severities: tuple[Literal["critical", "warning"], ...] = ("critical",)
    """Severities it receives: critical alerts page; warning alerts go only to receivers that list warning."""
    topic_arn: str | None = None
    """sns only: the topic Alertmanager publishes to."""
    secret_name: str | None = None
    """webhook, slack, pagerduty: the Secrets Manager secret (name) with the bearer token, webhook URL or routing key."""
    # webhook only: the endpoint Alertmanager POSTs to (the secret is the bearer token).
    url: str | None = None
    """webhook only: the endpoint Alertmanager POSTs to."""
    # slack only: the channel, when the incoming webhook is not bound to one.
    channel: str | None = None
    """slack only: the channel, when the incoming webhook is not bound to one."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _RECEIVER_NAME_RE.match(value):
            raise ValueError("must be 1-40 lowercase letters, digits and '-', starting and ending with a letter or digit")
        return value

    @field_validator("severities")
    @classmethod
    def _severities(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or len(set(value)) != len(value):
            raise ValueError(f"must list each of {list(SEVERITIES)} at most once, and at least one")
        return value

    @field_validator("topic_arn")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        if value is not None and not _SNS_TOPIC_ARN_RE.match(value):
            raise ValueError("must be an SNS topic ARN (arn:aws:sns:<region>:<account>:<topic>)")
        return value

    @field_validator("secret_name")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None and not _SECRET_NAME_RE.match(value):
            raise ValueError("must be a Secrets Manager secret name (letters, digits and /_+=.@-, at most 512)")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+(/\S*)?$", value):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _fields_of_the_type(self) -> ReceiverConfig:
        needed = {"sns": {"topic_arn"}, "webhook": {"secret_name", "url"}, "slack": {"secret_name"},
                  "pagerduty": {"secret_name"}}[self.type]
        allowed = needed | ({"channel"} if self.type == "slack" else set())
        for key in ("topic_arn", "secret_name", "url", "channel"):
            value = getattr(self, key)
            if key in needed and value is None:
                raise FieldError(key, value, f"required for a receiver of type {self.type}")
            if key not in allowed and value is not None:
                raise FieldError(key, value, f"null for a receiver of type {self.type} "
                                             f"(it takes {', '.join(sorted(allowed))})")
        return self


class MonitoringConfig(StrictModel):
    """kube-prometheus-stack's sizing, the alert thresholds and the cost dashboard's prices."""

    # Prometheus' persistent volume (gp3, encrypted) and how long it keeps samples. Prometheus
    # also deletes the oldest blocks once the TSDB reaches 90 % of the volume (retentionSize).
    prometheus_storage_gib: Annotated[int, Field(ge=10, le=16384)] = 100
    """Prometheus' persistent volume (gp3, encrypted); it also deletes the oldest blocks at 90% of it."""
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 15
    """How long Prometheus keeps samples."""
    alertmanager_storage_gib: Annotated[int, Field(ge=1, le=1024)] = 5
    """Alertmanager's persistent volume."""
    grafana_storage_gib: Annotated[int, Field(ge=1, le=1024)] = 10
    """Grafana's persistent volume."""
    # Where Prometheus, Alertmanager, Grafana, kube-state-metrics, the operator and YACE run.
    # on-demand: on-demand nodes of Karpenter's general pool, which grows with their requests.
    # system: the fixed-size system node group (4 x m7i.large by default); synth checks it has room (gennstack/system_capacity.py).
    placement: Literal["system", "on-demand"] = "on-demand"
    """Where the monitoring pods run: on-demand nodes of Karpenter's general pool, or the system node group (synth
    checks it has room)."""
    alerts: AlertsConfig = AlertsConfig()
    managed_prometheus: ManagedPrometheusConfig = ManagedPrometheusConfig()
    # USD per node-hour by instance type and capacity type, for the cost dashboard:
    # {"g6e.2xlarge": {"on-demand": 2.24, "spot": 0.9}}. Nodes of types not listed cost 0 there.
    hourly_prices: dict[str, dict[Literal["on-demand", "spot", "reserved"], Annotated[float, Field(ge=0, le=10000)]]] = Field(
        default_factory=dict)
    """USD per node-hour by instance type and capacity type, for the cost dashboard; types not listed cost 0 there."""
    # Alertmanager's receivers (ReceiverConfig). None: every alert stays in Alertmanager's UI.
    receivers: tuple[ReceiverConfig, ...] = ()
    """Alertmanager's receivers; none: every alert stays in Alertmanager's UI."""

    @field_validator("hourly_prices")
    @classmethod
    def _instance_types(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        bad = sorted(name for name in value if not _INSTANCE_TYPE_RE.match(name))
        if bad:
            raise ValueError(f"keys must be EC2 instance types such as 'g6e.2xlarge'; got {bad}")
        return value

    @field_validator("receivers")
    @classmethod
    def _unique_receivers(cls, value: tuple[ReceiverConfig, ...]) -> tuple[ReceiverConfig, ...]:
        names = [r.name for r in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"receiver names must be unique; repeated: {duplicates}")
        return value

    def retention_size_bytes(self) -> int:
        """Prometheus' retentionSize: 90 % of the volume, leaving room for the WAL and compaction."""
        return self.prometheus_storage_gib * 1024**3 * 9 // 10
