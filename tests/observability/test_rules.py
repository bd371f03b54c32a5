"""GenNStack's alerts under the real `promtool test rules`: for each alert, series that make it fire
(and when) and series that must not.

The rule file is exactly what the PrometheusRule holds (gennstack.observability.rules) for the
default config, with annotations left out of the comparison only: their text holds $value
templates whose rendering is not the behaviour under test (`promtool check rules` still parses
them, test_rule_file_passes_promtool_check).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gennstack.observability.config import MonitoringConfig
from gennstack.observability.rules import always_serving, rule_groups
from tests.observability import promtool

NS = "gennstack-serving"
GENERATIONS = ["inf2", "trn2", "g6e"]
# The serving config's default max_num_seqs of each generation.
SEQS = {"inf2": 20, "trn2": 16, "g6e": 64}
CONFIG = MonitoringConfig()


def _groups(config: MonitoringConfig = CONFIG) -> list[dict[str, Any]]:
    return rule_groups(config, generations=GENERATIONS, serving_namespace=NS, max_num_seqs=SEQS)


def _without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in groups]


def _promtool_test(tmp_path: Path, tests: list[dict[str, Any]], config: MonitoringConfig = CONFIG) -> None:
    promtool.write_rules(tmp_path, _without_annotations(_groups(config)))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests,
    }, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _ready_pod(pool: str, pod: str, ready: str) -> list[dict[str, str]]:
    return [
        {"series": f'kube_pod_status_ready{{namespace="{NS}", pod="{pod}", condition="true"}}', "values": ready},
        {"series": f'kube_pod_labels{{namespace="{NS}", pod="{pod}", label_app_kubernetes_io_name="{pool}", '
                   'label_app_kubernetes_io_component="server"}', "values": "1x40"},
    ]


def _alerts(name: str, at: str, expected: list[dict[str, str]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels} for labels in expected]}


def test_rule_file_passes_promtool_check(tmp_path: Path) -> None:
    config = MonitoringConfig.model_validate({"hourly_prices": {"g6e.2xlarge": {"on-demand": 2.24, "spot": 0.9}}})
    result = promtool.check_rules(tmp_path, _groups(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_no_ready_replica(tmp_path: Path) -> None:
    """A generation whose pods are not Ready, or that has no pods at all, fires after 10 minutes."""
    series = [
        *_ready_pod("gen2-trn2", "gen2-trn2-a", "0x40"),  # exists, never Ready
        *_ready_pod("gen3-g6e", "gen3-g6e-a", "1x40"),  # Ready
        *_ready_pod("gen1-inf2", "gen1-inf2-worker-a", "1x40"),
        # A warm spare that is Ready does not count as a serving replica.
        {"series": f'kube_pod_status_ready{{namespace="{NS}", pod="gen2-trn2-warm-spare-a", condition="true"}}', "values": "1x40"},
        {"series": f'kube_pod_labels{{namespace="{NS}", pod="gen2-trn2-warm-spare-a", label_app_kubernetes_io_name="gen2-trn2", '
                   'label_app_kubernetes_io_component="warm-spare"}', "values": "1x40"},
    ]
    trn2 = {"severity": "critical", "generation": "gen2-trn2"}
    _promtool_test(tmp_path, [
        {"interval": "1m", "input_series": series, "alert_rule_test": [
            _alerts("GenNStackNoReadyReplica", "5m", []),  # pending, not firing yet
            _alerts("GenNStackNoReadyReplica", "15m", [trn2]),
        ]},
        {"interval": "1m", "input_series": [], "alert_rule_test": [
            _alerts("GenNStackNoReadyReplica", "15m", [
                {"severity": "critical", "generation": pool} for pool in ("gen1-inf2", "gen2-trn2", "gen3-g6e")]),
        ]},
        {"interval": "1m", "input_series": [
            *_ready_pod("gen2-trn2", "gen2-trn2-a", "0 0 0 0 0 1x40"),  # Ready after 5 minutes
            *_ready_pod("gen3-g6e", "gen3-g6e-a", "1x40"),
            *_ready_pod("gen1-inf2", "gen1-inf2-worker-a", "1x40"),
        ], "alert_rule_test": [_alerts("GenNStackNoReadyReplica", "20m", [])]},
    ])


def test_no_ready_replica_is_quiet_while_a_generation_waits_to_be_staged(tmp_path: Path) -> None:
    """The serving chart labels a closed staged gate's pods `gennstack.io/staged: "false"` (servers and
    warm spares; gen1, which has no worker then, on its Ray head), kube-state-metrics exports the label
    (its allowlist in gennstack/observability/values.py) as label_gennstack_io_staged: no page for the
    hours of staging. Once a deploy opens the gate, pods without the label that never get Ready fire."""
    def pod(pool: str, name: str, component: str, ready: str, staged: bool) -> list[dict[str, str]]:
        label = ', label_gennstack_io_staged="false"' if staged else ""
        return [
            {"series": f'kube_pod_status_ready{{namespace="{NS}", pod="{name}", condition="true"}}', "values": ready},
            {"series": f'kube_pod_labels{{namespace="{NS}", pod="{name}", label_app_kubernetes_io_name="{pool}", '
                       f'label_app_kubernetes_io_component="{component}"{label}}}', "values": "1x40"},
        ]
    waiting = [*pod("gen2-trn2", "gen2-trn2-a", "server", "0x40", True),
               *pod("gen1-inf2", "gen1-inf2-head-a", "ray-head", "1x40", True),
               *pod("gen3-g6e", "gen3-g6e-a", "server", "1x40", False)]
    opened = [*pod("gen2-trn2", "gen2-trn2-b", "server", "0x40", False),
              *pod("gen1-inf2", "gen1-inf2-head-b", "ray-head", "1x40", False),
              *pod("gen3-g6e", "gen3-g6e-a", "server", "1x40", False)]
    _promtool_test(tmp_path, [
        {"interval": "1m", "input_series": waiting, "alert_rule_test": [_alerts("GenNStackNoReadyReplica", "30m", [])]},
        {"interval": "1m", "input_series": opened, "alert_rule_test": [_alerts("GenNStackNoReadyReplica", "30m", [
            {"severity": "critical", "generation": pool} for pool in ("gen1-inf2", "gen2-trn2")])]},
    ])


def _histogram(metric: str, labels: str, per_minute: dict[str, int], minutes: int = 40) -> list[dict[str, str]]:
    """Cumulative bucket counters growing by ``per_minute[le]`` each minute."""
    return [{"series": f'{metric}{{{labels}, le="{le}"}}', "values": f"0+{step}x{minutes}"} for le, step in per_minute.items()]


def test_time_to_first_token_over_slo(tmp_path: Path) -> None:
    """p95 above the SLO (2 s by default) fires after 10 minutes; below it, or above for 5 minutes only, does not."""
    assert CONFIG.alerts.ttft_p95_slo_seconds == 2.0
    metric = "gen_ai_server_time_to_first_token_seconds_bucket"
    slow = {"0.5": 0, "1": 0, "2.5": 5, "5": 100, "+Inf": 100}  # p95 between 2.5 s and 5 s
    fast = {"0.5": 90, "1": 100, "2.5": 100, "5": 100, "+Inf": 100}  # p95 under 1 s
    spike = [{"series": f'{metric}{{gen_ai_request_model="m", le="{le}"}}',
              "values": f"0+{slow[le]}x5 {5 * slow[le]}+{fast[le]}x35"} for le in slow]
    _promtool_test(tmp_path, [
        {"interval": "1m", "input_series": _histogram(metric, 'gen_ai_request_model="slow"', slow)
         + _histogram(metric, 'gen_ai_request_model="fast"', fast), "alert_rule_test": [
            _alerts("GenNStackTimeToFirstTokenOverSLO", "8m", []),
            _alerts("GenNStackTimeToFirstTokenOverSLO", "20m", [{"severity": "warning", "gen_ai_request_model": "slow"}]),
        ]},
        {"interval": "1m", "input_series": spike, "alert_rule_test": [
            _alerts("GenNStackTimeToFirstTokenOverSLO", "15m", []),
            _alerts("GenNStackTimeToFirstTokenOverSLO", "30m", []),
        ]},
    ])


def test_time_to_first_token_slo_comes_from_config(tmp_path: Path) -> None:
    config = MonitoringConfig.model_validate({"alerts": {"ttft_p95_slo_seconds": 10.0}})
    metric = "gen_ai_server_time_to_first_token_seconds_bucket"
    slow = {"0.5": 0, "1": 0, "2.5": 5, "5": 100, "+Inf": 100}
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": _histogram(metric, 'gen_ai_request_model="m"', slow),
                               "alert_rule_test": [_alerts("GenNStackTimeToFirstTokenOverSLO", "20m", [])]}], config)


def test_error_rate(tmp_path: Path) -> None:
    """10 failed in 110 requests a minute (9 %) fires after 5 minutes; 2 in 102 (2 %) does not."""
    count = "gen_ai_server_request_duration_seconds_count"
    series = [
        {"series": f'{count}{{gen_ai_request_model="bad"}}', "values": "0+100x30"},
        {"series": f'{count}{{gen_ai_request_model="bad", error_type="_OTHER"}}', "values": "0+10x30"},
        {"series": f'{count}{{gen_ai_request_model="good"}}', "values": "0+100x30"},
        {"series": f'{count}{{gen_ai_request_model="good", error_type="_OTHER"}}', "values": "0+2x30"},
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": [
        _alerts("GenNStackHighErrorRate", "3m", []),
        _alerts("GenNStackHighErrorRate", "15m", [{"severity": "critical", "gen_ai_request_model": "bad"}]),
    ]}])


def test_kv_cache_full(tmp_path: Path) -> None:
    series = [
        {"series": 'vllm:kv_cache_usage_perc{generation="gen3-g6e", pod="full", model_name="m", engine="0"}', "values": "0.99x20"},
        {"series": 'vllm:kv_cache_usage_perc{generation="gen3-g6e", pod="busy", model_name="m", engine="0"}', "values": "0.9x20"},
        {"series": 'vllm:kv_cache_usage_perc{generation="gen3-g6e", pod="blip", model_name="m", engine="0"}',
         "values": "0.99 0.99 0.5x18"},
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": [
        _alerts("GenNStackKVCacheFull", "3m", []),
        _alerts("GenNStackKVCacheFull", "10m", [{"severity": "warning", "generation": "gen3-g6e", "pod": "full"}]),
    ]}])


def test_kv_cache_full_on_neuron_counts_the_contiguous_caches_slots(tmp_path: Path) -> None:
    """gen2-trn2 runs vLLM with prefix caching off: vllm-neuron (vllm-project/vllm-neuron a5ef7c8,
    vllm_neuron/platform.py) sets block_size to max_model_len, and the chart's --num-gpu-blocks-override
    is ceil(8192 / 32) x 16 = 4096 blocks (+1 null block, platform.py), one per running sequence, so
    vLLM 0.13.0's gauge (vllm/v1/core/block_pool.py get_usage, 1 - free / (num_gpu_blocks - 1)) reads
    16 / 4096 with the batch full. What fills NxD Inference's contiguous cache is sequences:
    running / max_num_seqs. A full batch fires; a half-full one, and the gauge itself, do not."""
    def pod(name: str, running: int) -> list[dict[str, str]]:
        return [
            {"series": f'vllm:num_requests_running{{generation="gen2-trn2", pod="{name}", model_name="m", engine="0"}}',
             "values": f"{running}x20"},
            {"series": f'vllm:kv_cache_usage_perc{{generation="gen2-trn2", pod="{name}", model_name="m", engine="0"}}',
             "values": f"{running / 4096}x20"},
        ]
    series = [*pod("full", 16), *pod("half", 8)]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": [
        _alerts("GenNStackKVCacheFull", "3m", []),
        _alerts("GenNStackKVCacheFull", "10m", [{"severity": "warning", "generation": "gen2-trn2", "pod": "full"}]),
    ]}])
    # The slots recorded are the serving config's max_num_seqs of each Neuron generation.
    [batch] = [g for g in _groups() if g["name"] == "gennstack.batch"]
    assert batch["rules"] == [
        {"record": "gennstack:vllm_max_num_seqs", "expr": "vector(20)", "labels": {"generation": "gen1-inf2"}},
        {"record": "gennstack:vllm_max_num_seqs", "expr": "vector(16)", "labels": {"generation": "gen2-trn2"}},
    ]


def test_pending_accelerator_pods(tmp_path: Path) -> None:
    """An accelerator pod Pending past 15 minutes fires; a CPU-only Pending pod, a Running GPU pod and a
    GPU pod held by a scheduling gate (the staged gate: its PodScheduled condition's reason is
    SchedulingGated, exported by kube-state-metrics v2.19.1 as kube_pod_status_reason, 0 or 1 for
    each listed reason) do not."""
    def pod(name: str, pending: str, resource: str, gated: str = "0x40") -> list[dict[str, str]]:
        return [
            {"series": f'kube_pod_status_phase{{namespace="{NS}", pod="{name}", phase="Pending"}}', "values": pending},
            {"series": f'kube_pod_container_resource_requests{{namespace="{NS}", pod="{name}", container="c", '
                       f'resource="{resource}", unit="integer"}}', "values": "1x40"},
            {"series": f'kube_pod_status_reason{{namespace="{NS}", pod="{name}", reason="SchedulingGated"}}',
             "values": gated},
        ]
    series = [*pod("gpu", "1x40", "nvidia_com_gpu"), *pod("neuron", "1x40", "aws_amazon_com_neuron"),
              *pod("cpu", "1x40", "cpu"), *pod("running-gpu", "0x40", "nvidia_com_gpu"),
              *pod("gated-gpu", "1x40", "nvidia_com_gpu", gated="1x40")]
    fired = [{"severity": "warning", "namespace": NS, "pod": name} for name in ("gpu", "neuron")]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": [
        _alerts("GenNStackAcceleratorPodPending", "10m", []),
        _alerts("GenNStackAcceleratorPodPending", "20m", fired),
    ]}])


def test_interruption_dead_letters(tmp_path: Path) -> None:
    metric = 'aws_sqs_approximate_number_of_messages_visible_maximum{dimension_QueueName="dlq"}'
    _promtool_test(tmp_path, [
        {"interval": "1m", "input_series": [{"series": metric, "values": "0 0 1x10"}], "alert_rule_test": [
            _alerts("GenNStackInterruptionDeadLetters", "2m", []),
            _alerts("GenNStackInterruptionDeadLetters", "5m", [{"severity": "critical"}]),
        ]},
        {"interval": "1m", "input_series": [{"series": metric, "values": "0x10"}], "alert_rule_test": [
            _alerts("GenNStackInterruptionDeadLetters", "8m", []),
        ]},
    ])


def test_price_rules_record_each_configured_price(tmp_path: Path) -> None:
    config = MonitoringConfig.model_validate({"hourly_prices": {"g6e.2xlarge": {"on-demand": 2.24, "spot": 0.9}}})
    promtool.write_rules(tmp_path, _without_annotations(_groups(config)))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [],
        "promql_expr_test": [{"expr": "gennstack:node_hourly_price_usd", "eval_time": "5m", "exp_samples": [
            {"labels": 'gennstack:node_hourly_price_usd{label_karpenter_sh_capacity_type="on-demand", '
                       'label_node_kubernetes_io_instance_type="g6e.2xlarge"}', "value": 2.24},
            {"labels": 'gennstack:node_hourly_price_usd{label_karpenter_sh_capacity_type="spot", '
                       'label_node_kubernetes_io_instance_type="g6e.2xlarge"}', "value": 0.9},
        ]}],
    }]}, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("generations", [["trn2"], ["inf2", "g6e"]])
def test_one_no_ready_replica_rule_per_enabled_generation(generations: list[str]) -> None:
    rules = rule_groups(CONFIG, generations=generations, serving_namespace=NS, max_num_seqs=SEQS)[0]["rules"]
    pools = [r["labels"]["generation"] for r in rules if r["alert"] == "GenNStackNoReadyReplica"]
    assert pools == [{"inf2": "gen1-inf2", "trn2": "gen2-trn2", "g6e": "gen3-g6e"}[g] for g in generations]


def test_every_generation_gets_a_no_ready_replica_alert_while_scale_to_zero_is_refused() -> None:
    """min_replicas 0 is refused by the serving config (docs/autoscaling.md), so every enabled
    generation must have a ready replica; a section with a minimum of 0 would get no alert."""
    from types import SimpleNamespace

    from pydantic import ValidationError

    from gennstack.serving.config import ServingConfig

    assert always_serving(ServingConfig(), GENERATIONS) == GENERATIONS
    with pytest.raises(ValidationError, match="min_replicas"):
        ServingConfig.model_validate({"g6e": {"min_replicas": 0}})
    zero = SimpleNamespace(**{g: SimpleNamespace(min_replicas=0 if g == "g6e" else 1) for g in GENERATIONS})
    assert always_serving(zero, GENERATIONS) == [g for g in GENERATIONS if g != "g6e"]


def test_gateway_certificate_expiring(tmp_path: Path) -> None:
    """Under 30 days left for an hour fires; 200 days, or a short dip, does not."""
    metric = 'envoy_server_days_until_first_cert_expiring{namespace="envoy-gateway-system", pod="envoy-a"}'
    _promtool_test(tmp_path, [
        {"interval": "1m", "input_series": [{"series": metric, "values": "29x120"}], "alert_rule_test": [
            _alerts("GenNStackGatewayCertificateExpiring", "30m", []),
            _alerts("GenNStackGatewayCertificateExpiring", "90m", [{"severity": "warning"}]),
        ]},
        {"interval": "1m", "input_series": [{"series": metric, "values": "200x120"}], "alert_rule_test": [
            _alerts("GenNStackGatewayCertificateExpiring", "90m", []),
        ]},
        {"interval": "1m", "input_series": [{"series": metric, "values": "200x30 20x30 200x60"}], "alert_rule_test": [
            _alerts("GenNStackGatewayCertificateExpiring", "90m", []),
        ]},
    ])
