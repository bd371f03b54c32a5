"""Every PromQL expression of the dashboards and the alert rules parses (promtool's parser, Prometheus'
own) and reads only metric names that the pinned exporters emit (gennstack.observability.metrics).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gennstack.observability.config import MonitoringConfig
from gennstack.observability.dashboards import dashboards, multi_node_dashboards
from gennstack.observability.metrics import METRICS, RECORDED, yace_metric_name
from gennstack.observability.rules import rule_groups
from gennstack.observability.values import cloudwatch_exporter_config
from tests.observability import promtool

# Grafana substitutes these before a query reaches Prometheus; the values only need to parse.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "6h", "$model": ".*"}
CONFIG = MonitoringConfig.model_validate({"hourly_prices": {"g6e.2xlarge": {"on-demand": 2.24, "spot": 0.9}}})

_KEYWORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "rate", "irate", "increase", "histogram_quantile", "sum_over_time", "count_over_time", "vector", "label_replace",
    "absent", "inf", "nan",
}


def _grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def dashboard_expressions() -> list[tuple[str, str]]:
    # With the multi-node model's dashboard (applied only while serving.multi_node is on).
    every = {**dashboards(), **multi_node_dashboards()}
    return [(f"{name}: {panel['title']} {target['refId']}", _grafana_to_promql(target["expr"]))
            for name, dashboard in every.items() for panel in dashboard["panels"] for target in panel["targets"]]


def rule_expressions() -> list[tuple[str, str]]:
    # With the multi-node groups' rule (serving.multi_node on).
    groups = rule_groups(CONFIG, generations=["inf2", "trn2", "g6e"], serving_namespace="gennstack-serving",
                         max_num_seqs={"inf2": 20, "trn2": 16, "g6e": 64},
                         multi_node_pool="gen3-g6e-multinode")
    return [(f"{g['name']}: {r.get('alert') or r.get('record')}", r["expr"]) for g in groups for r in g["rules"]]


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside {...}, "..." and by/on (...) lists,
    not followed by "(" (functions) and not keywords or durations."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        name = match.group(0)
        rest = text[match.end():].lstrip()
        if name.lower() in _KEYWORDS or rest.startswith("("):
            continue
        names.add(name)
    return names


def test_metric_name_extraction() -> None:
    assert metric_names('sum by (le, pod) (rate(vllm:x_bucket{a="b", c=~"d|e"}[5m])) / on (pod) group_left () y') == {
        "vllm:x_bucket", "y"}
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(z[5m:1m]))) > 2') == {"z"}


def test_every_expression_parses(tmp_path: Path) -> None:
    expressions = dashboard_expressions() + rule_expressions()
    groups = [{"name": "parse", "rules": [{"record": f"parse:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(expressions)]}]
    result = promtool.check_rules(tmp_path, groups)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in result.stdout


@pytest.mark.parametrize("where, expr", dashboard_expressions() + rule_expressions())
def test_expression_reads_only_known_metrics(where: str, expr: str) -> None:
    unknown = metric_names(expr) - set(METRICS) - RECORDED
    assert not unknown, f"{where} reads {sorted(unknown)}: list each in gennstack/observability/metrics.py with its upstream source"


def test_every_listed_metric_is_used() -> None:
    """The catalogue holds no stale entries: each name is read by a dashboard or a rule."""
    used = set().union(*(metric_names(expr) for _, expr in dashboard_expressions() + rule_expressions()))
    assert set(METRICS) - used == set()


def test_yace_names_match_the_exporter_config() -> None:
    """The aws_* names in the catalogue are exactly what YACE's BuildMetricName makes of GenNStack's exporter config."""
    config = cloudwatch_exporter_config(region="us-east-1", dead_letter_queue_name="q", metrics_namespace="GenNStack")
    exported = {
        yace_metric_name(job["namespace"], metric["name"], statistic)
        for job in [*config["static"], *config["customNamespace"]] for metric in job["metrics"] for statistic in metric["statistics"]
    }
    assert {name for name in METRICS if name.startswith("aws_")} <= exported


@pytest.mark.parametrize("namespace, metric, statistic, expected", [
    # Cases of pkg/promutil/migrate_test.go (TestBuildMetricName) at YACE v0.67.0.
    ("AWS/ElastiCache", "CPUUtilization", "Average", "aws_elasticache_cpuutilization_average"),
    ("/aws/sagemaker/TrainingJobs", "CPUUtilization", "Average", "aws_sagemaker_trainingjobs_cpuutilization_average"),
    ("Glue", "glue.driver.aggregate.bytesRead", "Average", "aws_glue_driver_aggregate_bytes_read_average"),
    ("Glue", "aggregate.glue.jobs.bytesRead", "Average", "aws_glue_aggregate_glue_jobs_bytes_read_average"),
    # GenNStack's own, by the same function:
    ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "Maximum", "aws_sqs_approximate_number_of_messages_visible_maximum"),
    ("GenNStack", "WarmSpareReplicas", "Maximum", "aws_gennstack_warm_spare_replicas_maximum"),
])
def test_yace_metric_name(namespace: str, metric: str, statistic: str, expected: str) -> None:
    assert yace_metric_name(namespace, metric, statistic) == expected
