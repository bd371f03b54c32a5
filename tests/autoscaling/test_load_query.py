"""The PromQL the ScaledObjects send to Prometheus, evaluated by the real Prometheus engine.

`promtool test rules` (Debian's `prometheus` package) evaluates each ScaledObject's query, taken from
the rendered chart, over series shaped like vLLM's gauges as Prometheus stores them: vLLM's labels
(model_name, engine: vllm/v1/metrics/loggers.py at v0.29.0 and v0.13.0) plus the target labels the
Prometheus Operator adds (namespace, pod, ...). It must add running and waiting requests over the
generation's own pods only, drop a removed pod's series, and return nothing (not 0) when no server
reports, which KEDA (ignoreNullValues "false") turns into an error and then its fallback.
Skips locally without promtool; fails under CI=true. Debian 12's promtool is Prometheus 2.42; the
query uses only sum() and + of two label-less results, whose semantics Prometheus 3 keeps.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tests import helm
from tests.serving.conftest import CHART, NAMESPACE, cdk_values

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool not found: install Debian's `prometheus` package")
        pytest.skip("promtool not found (Debian package `prometheus`)")
    return path


@pytest.fixture(scope="module")
def queries() -> dict[str, str]:
    objects = helm.render(CHART, cdk_values(), namespace=NAMESPACE)
    return {o["metadata"]["name"]: o["spec"]["triggers"][0]["metadata"]["query"] for o in objects if o["kind"] == "ScaledObject"}


def _series(metric: str, model: str, pod: str, values: str, namespace: str = NAMESPACE) -> dict[str, str]:
    labels = (f'namespace="{namespace}",pod="{pod}",container="vllm",job="{namespace}/vllm",'
              f'model_name="{model}",engine="0"')
    return {"series": f"{metric}{{{labels}}}", "values": values}


def _run(promtool: str, tmp_path, series: list[dict], cases: list[dict]) -> subprocess.CompletedProcess:
    test = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "30s", "input_series": series, "promql_expr_test": cases}]}
    path = tmp_path / "query_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)


def test_query_sums_running_and_waiting_over_the_generations_pods(promtool, queries, tmp_path) -> None:
    query = queries["gen3-g6e"]
    series = [
        _series("vllm:num_requests_running", "gpt-oss-20b", "gen3-g6e-7d9f-a", "40x20"),
        _series("vllm:num_requests_waiting", "gpt-oss-20b", "gen3-g6e-7d9f-a", "12x20"),
        # A second replica, removed after two minutes: its series go stale and leave the sum.
        _series("vllm:num_requests_running", "gpt-oss-20b", "gen3-g6e-7d9f-b", "30x3 stale"),
        _series("vllm:num_requests_waiting", "gpt-oss-20b", "gen3-g6e-7d9f-b", "0x3 stale"),
        # Another generation, and the same model name in another namespace: not this generation's load.
        _series("vllm:num_requests_running", "llama-4-maverick", "gen2-trn2-5c6b-a", "16x20"),
        _series("vllm:num_requests_waiting", "gpt-oss-20b", "other-a", "99x20", namespace="other"),
    ]
    cases = [
        {"expr": query, "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 82}]},
        {"expr": query, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 52}]},
        {"expr": queries["gen2-trn2"], "eval_time": "1m", "exp_samples": []},  # trn2 reports no waiting gauge here
    ]
    result = _run(promtool, tmp_path, series, cases)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_server_means_no_sample_not_zero(promtool, queries, tmp_path) -> None:
    series = [_series("vllm:num_requests_running", "llama-4-maverick", "gen2-trn2-5c6b-a", "3x20"),
              _series("vllm:num_requests_waiting", "llama-4-maverick", "gen2-trn2-5c6b-a", "1x20")]
    cases = [{"expr": queries["gen3-g6e"], "eval_time": "1m", "exp_samples": []},
             {"expr": queries["gen2-trn2"], "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 4}]}]
    result = _run(promtool, tmp_path, series, cases)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails(promtool, queries, tmp_path) -> None:
    """The harness can fail: promtool reports a mismatch."""
    series = [_series("vllm:num_requests_running", "gpt-oss-20b", "gen3-g6e-7d9f-a", "5x20"),
              _series("vllm:num_requests_waiting", "gpt-oss-20b", "gen3-g6e-7d9f-a", "0x20")]
    cases = [{"expr": queries["gen3-g6e"], "eval_time": "1m", "exp_samples": [{"labels": "{}", "value": 6}]}]
    result = _run(promtool, tmp_path, series, cases)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr
