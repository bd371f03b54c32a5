"""The ``monitoring`` config section: defaults, and bad values named by key, value and what is allowed."""

from __future__ import annotations

import pytest

from gennstack.config import ConfigError, load_config
from gennstack.observability.config import MonitoringConfig


def test_defaults() -> None:
    config = load_config({}, None).monitoring
    assert config == MonitoringConfig()
    assert (config.prometheus_storage_gib, config.retention_days, config.placement) == (100, 15, "on-demand")
    assert config.alerts.ttft_p95_slo_seconds == 2.0 and config.alerts.error_rate == 0.05
    assert config.managed_prometheus.enabled is False and config.hourly_prices == {}


def test_whole_numbers_are_accepted_for_thresholds_and_prices() -> None:
    config = load_config({"monitoring": {"alerts": {"ttft_p95_slo_seconds": 3},
                                         "hourly_prices": {"g6e.2xlarge": {"spot": 1}}}}, None).monitoring
    assert config.alerts.ttft_p95_slo_seconds == 3 and config.hourly_prices["g6e.2xlarge"]["spot"] == 1


@pytest.mark.parametrize("monitoring, message", [
    ({"retention_days": 0}, "monitoring.retention_days: got 0"),
    ({"prometheus_storage_gib": 5}, "monitoring.prometheus_storage_gib: got 5"),
    ({"placement": "spot"}, "monitoring.placement: got 'spot'; Input should be 'system' or 'on-demand'"),
    ({"alerts": {"error_rate": 1.5}}, "monitoring.alerts.error_rate: got 1.5"),
    ({"alerts": {"ttft_p95_slo_seconds": 0}}, "monitoring.alerts.ttft_p95_slo_seconds: got 0"),
    ({"alerts": {"kv_cache_full": 1.2}}, "monitoring.alerts.kv_cache_full: got 1.2"),
    ({"alerts": {"pending_pod_minutes": 0}}, "monitoring.alerts.pending_pod_minutes: got 0"),
    ({"managed_prometheus": {"enabled": True, "workspace_arn": "arn:x"}},
     "monitoring.managed_prometheus.workspace_arn: got 'arn:x'; must be an Amazon Managed Service for Prometheus workspace ARN"),
    ({"managed_prometheus": {"workspace_arn": "arn:aws:aps:us-east-1:123456789012:workspace/ws-abc"}},
     "monitoring.managed_prometheus.workspace_arn: got 'arn:aws:aps:us-east-1:123456789012:workspace/ws-abc'; "
     "allowed: null unless enabled is true"),
    ({"hourly_prices": {"G6E": {"spot": 1.0}}}, "monitoring.hourly_prices: got {'G6E': {'spot': 1.0}}; keys must be EC2 instance types"),
    ({"hourly_prices": {"g6e.2xlarge": {"capacity-block": 1.0}}}, "Input should be 'on-demand', 'spot' or 'reserved'"),
    ({"receivers": [{"name": "ops", "type": "sns"}]},
     "monitoring.receivers.0.topic_arn: got None; allowed: required for a receiver of type sns"),
    ({"receivers": [{"name": "ops", "type": "sns", "topic_arn": "arn:aws:sns:us-east-1:123456789012:t", "secret_name": "x"}]},
     "monitoring.receivers.0.secret_name: got 'x'; allowed: null for a receiver of type sns (it takes topic_arn)"),
    ({"receivers": [{"name": "ops", "type": "sns", "topic_arn": "arn:aws:sqs:us-east-1:123456789012:t"}]},
     "monitoring.receivers.0.topic_arn: got 'arn:aws:sqs:us-east-1:123456789012:t'; must be an SNS topic ARN"),
    ({"receivers": [{"name": "chat", "type": "slack"}]},
     "monitoring.receivers.0.secret_name: got None; allowed: required for a receiver of type slack"),
    ({"receivers": [{"name": "hook", "type": "webhook", "secret_name": "s", "url": "ftp://x"}]},
     "monitoring.receivers.0.url: got 'ftp://x'; must be an http:// or https:// URL"),
    ({"receivers": [{"name": "Ops", "type": "pagerduty", "secret_name": "s"}]},
     "monitoring.receivers.0.name: got 'Ops'; must be 1-40 lowercase letters"),
    ({"receivers": [{"name": "pd", "type": "pagerduty", "secret_name": "s", "severities": []}]},
     "monitoring.receivers.0.severities: got []; must list each of"),
    ({"receivers": [{"name": "pd", "type": "pagerduty", "secret_name": "s", "severities": ["info"]}]},
     "Input should be 'critical' or 'warning'"),
    ({"receivers": [{"name": "pd", "type": "pagerduty", "secret_name": "s"}, {"name": "pd", "type": "slack", "secret_name": "t"}]},
     "receiver names must be unique; repeated: ['pd']"),
    ({"hourly_prices": {"g6e.2xlarge": {"spot": -1.0}}}, "monitoring.hourly_prices.g6e.2xlarge.spot: got -1.0"),
    ({"grafana": {}}, "monitoring.grafana: unknown key (value {}); allowed keys here:"),
])
def test_bad_values_are_named(monitoring: dict, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config({"monitoring": monitoring}, None)
    assert message in str(excinfo.value)


def test_retention_size_leaves_a_tenth_of_the_volume_free() -> None:
    for gib in (10, 100, 16384):  # the smallest, the default and the largest volume config allows
        size = MonitoringConfig(prometheus_storage_gib=gib).retention_size_bytes()
        assert size == gib * 1024**3 * 9 // 10
        assert gib * 1024**3 - size >= gib * 1024**3 // 10
