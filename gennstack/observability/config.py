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

__all__ = ["AlertsConfig", "ManagedPrometheusConfig", "MonitoringConfig"]

_INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
_AMP_WORKSPACE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:aps:[a-z0-9-]+:\d{12}:workspace/ws-[0-9a-f-]{1,64}$")
CAPACITY_TYPES = ("on-demand", "spot")


class AlertsConfig(StrictModel):
    """Thresholds of GenNStack's PrometheusRule alerts (gennstack.observability.rules)."""

    # Time to first token, 95th percentile at the gateway, per model: above this for 10 minutes alerts.
    ttft_p95_slo_seconds: Annotated[float, Field(gt=0, le=600)] = 2.0
    # Share of requests that fail (gateway 5xx and AI Gateway errors), per model, over 5 minutes.
    error_rate: Annotated[float, Field(gt=0, lt=1)] = 0.05
    # vLLM's KV-cache use (0-1) at or above this for 5 minutes: the server is out of KV cache.
    kv_cache_full: Annotated[float, Field(gt=0, le=1)] = 0.98
    # Accelerator pods Pending longer than this alert.
    pending_pod_minutes: Annotated[int, Field(ge=1, le=1440)] = 15


class ManagedPrometheusConfig(StrictModel):
    """Optional remote write of every sample to Amazon Managed Service for Prometheus."""

    enabled: bool = False
    # An existing workspace's ARN; null: the stack creates one.
    workspace_arn: str | None = None

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


class MonitoringConfig(StrictModel):
    """kube-prometheus-stack's sizing, the alert thresholds and the cost dashboard's prices."""

    # Prometheus' persistent volume (gp3, encrypted) and how long it keeps samples. Prometheus
    # also deletes the oldest blocks once the TSDB reaches 90 % of the volume (retentionSize).
    prometheus_storage_gib: Annotated[int, Field(ge=10, le=16384)] = 100
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 15
    alertmanager_storage_gib: Annotated[int, Field(ge=1, le=1024)] = 5
    grafana_storage_gib: Annotated[int, Field(ge=1, le=1024)] = 10
    # Where Prometheus, Alertmanager, Grafana, kube-state-metrics, the operator and YACE run.
    # on-demand: on-demand nodes of Karpenter's general pool, which grows with their requests.
    # system: the fixed-size system node group (4 x m7i.large by default); synth checks it has room (gennstack/system_capacity.py).
    placement: Literal["system", "on-demand"] = "on-demand"
    alerts: AlertsConfig = AlertsConfig()
    managed_prometheus: ManagedPrometheusConfig = ManagedPrometheusConfig()
    # USD per node-hour by instance type and capacity type, for the cost dashboard:
    # {"g6e.2xlarge": {"on-demand": 2.24, "spot": 0.9}}. Nodes of types not listed cost 0 there.
    hourly_prices: dict[str, dict[Literal["on-demand", "spot"], Annotated[float, Field(ge=0, le=10000)]]] = Field(
        default_factory=dict)

    @field_validator("hourly_prices")
    @classmethod
    def _instance_types(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        bad = sorted(name for name in value if not _INSTANCE_TYPE_RE.match(name))
        if bad:
            raise ValueError(f"keys must be EC2 instance types such as 'g6e.2xlarge'; got {bad}")
        return value

    def retention_size_bytes(self) -> int:
        """Prometheus' retentionSize: 90 % of the volume, leaving room for the WAL and compaction."""
        return self.prometheus_storage_gib * 1024**3 * 9 // 10
