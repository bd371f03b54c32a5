"""The cost dashboard's arithmetic, run by Prometheus' engine (`promtool test rules`): node-hours and
USD by instance and capacity type from kube_node_labels and the configured prices.

The queries are the dashboard's own (gennstack.observability.dashboards), with Grafana's
``$__range`` set to 1h; the prices are the recording rules GenNStack installs. A subquery
``[1h:1m]`` evaluated at t holds the 1-minute steps in [t-1h, t] in Prometheus 2.x (Debian's
promtool) and in (t-1h, t] from Prometheus 3.0 on (the cluster's v3.13: range selectors became
left-open), so the expected node-minutes count the steps the running promtool's engine includes.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gennstack.observability.config import MonitoringConfig
from gennstack.observability.dashboards import cost_dashboard
from gennstack.observability.rules import rule_groups
from tests.observability import promtool

CONFIG = MonitoringConfig.model_validate({"hourly_prices": {"g6e.2xlarge": {"on-demand": 2.24, "spot": 0.9}}})
NODE = "kube_node_labels{{node=\"{node}\", label_node_kubernetes_io_instance_type=\"{it}\", label_karpenter_sh_capacity_type=\"{ct}\"}}"
SPOT = {"label_node_kubernetes_io_instance_type": "g6e.2xlarge", "label_karpenter_sh_capacity_type": "spot"}
ON_DEMAND = {"label_node_kubernetes_io_instance_type": "g6e.2xlarge", "label_karpenter_sh_capacity_type": "on-demand"}


def _query(title: str) -> str:
    panel = next(p for p in cost_dashboard()["panels"] if p["title"] == title)
    return panel["targets"][0]["expr"].replace("$__range", "1h")


def _samples(values: list[tuple[dict[str, str], float]]) -> list[dict]:
    return [{"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "value": value}
            for labels, value in values]


def _steps(end: int) -> range:
    """The subquery's steps (minutes) at ``end`` for the promtool under test."""
    version = re.search(r"version (\d+)\.", promtool.run("--version", cwd=Path.cwd()).stdout)
    assert version, "promtool --version printed no version"
    return range(end - 60 if int(version.group(1)) < 3 else end - 59, end + 1)


def test_cost_dashboard_arithmetic(tmp_path: Path) -> None:
    groups = [g for g in rule_groups(CONFIG, generations=["g6e"], serving_namespace="s", max_num_seqs={"g6e": 64}) if g["name"] == "gennstack.prices"]
    promtool.write_rules(tmp_path, groups)
    series = [
        # A spot node for the whole two hours; an on-demand one for the last 30 minutes; a system
        # node (no Karpenter capacity-type label) that the cost panels leave out.
        {"series": NODE.format(node="a", it="g6e.2xlarge", ct="spot"), "values": "1x120"},
        {"series": NODE.format(node="b", it="g6e.2xlarge", ct="on-demand"), "values": "_x89 1x30"},
        {"series": 'kube_node_labels{node="sys", label_node_kubernetes_io_instance_type="m7i.large"}', "values": "1x120"},
    ]
    # Node a is up at every step of the subquery; b from minute 89 on (its last sample, at 119,
    # still answers at 120 within the 5-minute lookback).
    steps = _steps(120)
    a_hours, b_hours = len(steps) / 60, len([m for m in steps if m >= 89]) / 60
    tests = [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": _query("Nodes by instance and capacity type"), "eval_time": "120m",
         "exp_samples": _samples([(SPOT, 1), (ON_DEMAND, 1)])},
        {"expr": _query("Node-hours in the time range"), "eval_time": "120m",
         "exp_samples": _samples([(SPOT, a_hours), (ON_DEMAND, b_hours)])},
        {"expr": _query("USD per hour"), "eval_time": "120m",
         "exp_samples": _samples([(SPOT, 0.9), (ON_DEMAND, 2.24)])},
        {"expr": _query("USD in the time range"), "eval_time": "120m",
         "exp_samples": _samples([(SPOT, 0.9 * a_hours), (ON_DEMAND, 2.24 * b_hours)])},
    ]}]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_trn2_kv_cache_panel_reads_slots_in_use(tmp_path: Path) -> None:
    """The gen2-trn2 dashboard's KV panel, by Prometheus' engine: sequences running over max_num_seqs
    (the recorded gennstack:vllm_max_num_seqs), not vLLM's block gauge, which prefix caching off on
    Neuron pins near 0 (gennstack.observability.rules.CONTIGUOUS_KV)."""
    from gennstack.observability.dashboards import vllm_dashboard

    panel = next(p for p in vllm_dashboard("trn2", "gen2-trn2", [])["panels"] if p["title"].startswith("KV-cache"))
    assert panel["title"] == "KV-cache slots in use"
    groups = [g for g in rule_groups(CONFIG, generations=["trn2"], serving_namespace="s", max_num_seqs={"trn2": 16})
              if g["name"] == "gennstack.batch"]
    promtool.write_rules(tmp_path, groups)
    running = 'vllm:num_requests_running{{generation="gen2-trn2", pod="{pod}"}}'
    series = [{"series": running.format(pod="a"), "values": "12x10"}, {"series": running.format(pod="b"), "values": "16x10"}]
    tests = [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": panel["targets"][0]["expr"], "eval_time": "5m", "exp_samples": [
            {"labels": '{pod="a"}', "value": 0.75}, {"labels": '{pod="b"}', "value": 1}]},
    ]}]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_panels_show_only_their_pools_nodes(tmp_path: Path) -> None:
    """gen3-g6e's servers and the multi-node groups run on the same g6e NodePools: the GPU panels keep
    the nodes their own serving pods run on (kube_pod_info's node, as the DCGM exporter's Hostname:
    NODE_NAME from spec.nodeName, NVIDIA/dcgm-exporter 4.5.3-4.8.2 internal/pkg/hostname/hostname.go).
    A warm spare's node (component warm-spare) is no server's either."""
    from gennstack.observability.dashboards import dashboards, multi_node_dashboards

    def queries(dashboard: dict) -> dict[str, str]:
        return {p["title"]: p["targets"][0]["expr"] for p in dashboard["panels"] if p["title"].startswith("GPU")}

    gen3 = queries(dashboards()["gennstack-gen3-g6e.json"])
    groups = queries(multi_node_dashboards()["gennstack-gen3-g6e-multinode.json"])
    pods = {"n1": ("srv", "gen3-g6e", "server"), "n2": ("grp", "gen3-g6e-multinode", "server"),
            "n3": ("spare", "gen3-g6e", "warm-spare")}
    series = []
    for node, (pod, name, component) in pods.items():
        series += [
            {"series": f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{node}", gpu="0"}}', "values": "50x10"},
            {"series": f'DCGM_FI_DEV_FB_USED{{Hostname="{node}", gpu="0"}}', "values": "30x10"},
            {"series": f'DCGM_FI_DEV_FB_FREE{{Hostname="{node}", gpu="0"}}', "values": "10x10"},
            {"series": f'kube_pod_info{{namespace="s", pod="{pod}", node="{node}"}}', "values": "1x10"},
            {"series": f'kube_pod_labels{{namespace="s", pod="{pod}", label_app_kubernetes_io_name="{name}", '
                       f'label_app_kubernetes_io_component="{component}"}}', "values": "1x10"},
        ]
    tests = [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": gen3["GPU utilisation"], "eval_time": "5m", "exp_samples": [{"labels": '{Hostname="n1"}', "value": 50}]},
        {"expr": gen3["GPU memory used"], "eval_time": "5m", "exp_samples": [{"labels": '{Hostname="n1"}', "value": 0.75}]},
        {"expr": groups["GPU utilisation"], "eval_time": "5m", "exp_samples": [{"labels": '{Hostname="n2"}', "value": 50}]},
        {"expr": groups["GPU memory used"], "eval_time": "5m", "exp_samples": [{"labels": '{Hostname="n2"}', "value": 0.75}]},
    ]}]
    promtool.write_rules(tmp_path, [])
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
