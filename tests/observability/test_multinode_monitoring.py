"""Monitoring of the multi-node model (serving.multi_node, issue 25): its leaders' vLLM /metrics are
scraped, its workers are not, and the no-ready-replica alert counts a group once.

Upstream facts relied on:

* LWS v0.10.0 (kubernetes-sigs/lws, pkg/webhooks/pod_webhook.go Default): the pod webhook labels every
  group pod ``leaderworkerset.sigs.k8s.io/worker-index``, "0" on the leader, its index on a worker
  (api/leaderworkerset/v1/leaderworkerset_types.go WorkerIndexLabelKey); the chart's templates do not
  set it, so the test adds it as the webhook does.
* prometheus-operator PodMonitor: ``selector`` is a label selector over pods; a
  ``podMetricsEndpoints[].port`` names a container port, and a pod without a port of that name gives
  no target.
* kube-state-metrics v2.19.1 (docs/metrics/workload/pod-metrics.md): ``kube_pod_container_status_ready``
  "Describes whether the containers readiness check succeeded", labels namespace, pod, uid, container.
  The group's leader container is ``vllm`` (readiness: vLLM's /health, up only with every pipeline
  stage); the worker's is ``ray-worker`` with no probe (Ready as soon as it runs).
"""

from __future__ import annotations

from pathlib import Path

from gennstack.observability import manifests
from gennstack.observability.config import MonitoringConfig
from gennstack.observability.rules import rule_groups
from tests import helm
from tests.k8s_schema import validate
from tests.observability import promtool
from tests.observability.test_rules import NS, _alerts, _without_annotations
from tests.serving.conftest import CHART, REQUIRED, merged

POOL = "gen3-g6e-multinode"
GENERATIONS = ["inf2", "trn2", "g6e"]
SEQS = {"inf2": 20, "trn2": 16, "g6e": 64}
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _group_pods() -> dict[str, dict]:
    """The leader's and a worker's pod as LWS creates them from the rendered templates (its webhook's label added)."""
    objects = helm.render(CHART, merged(REQUIRED, {"multiNode": {"enabled": True, "staged": True}}), namespace=NS)
    [lws] = [o for o in objects if o["kind"] == "LeaderWorkerSet" and o["metadata"]["name"] == POOL]
    template = lws["spec"]["leaderWorkerTemplate"]
    pods = {}
    for role, index in (("leaderTemplate", "0"), ("workerTemplate", "1")):
        pod = template[role]
        pods[role] = {"labels": {**pod["metadata"]["labels"], WORKER_INDEX: index},
                      "ports": {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])},
                      "containers": [c["name"] for c in pod["spec"]["containers"]]}
    return pods


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels", "matchExpressions"}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_the_leaders_are_scraped_the_workers_are_not() -> None:
    monitors = manifests.pod_monitors(generations=GENERATIONS, serving_namespace=NS, multi_node_pool=POOL)
    for monitor in monitors:
        validate(monitor)
    by_name = {m["metadata"]["name"]: m for m in monitors}
    pods = _group_pods()
    leader, worker = pods["leaderTemplate"], pods["workerTemplate"]
    multi = by_name["gennstack-vllm-multinode"]["spec"]
    assert _selects(multi["selector"], leader["labels"]) and not _selects(multi["selector"], worker["labels"])
    [endpoint] = multi["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert "http" in leader["ports"] and "http" not in worker["ports"]  # the worker serves no HTTP at all
    assert (leader["containers"], worker["containers"]) == (["vllm"], ["ray-worker"])
    # Its series carry generation=gen3-g6e-multinode (the pod's name label), apart from gen3-g6e's dashboards.
    assert endpoint["relabelings"][0] == {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                                          "targetLabel": "generation"}
    # gen3-g6e's own PodMonitor selects none of the group's pods.
    vllm = by_name["gennstack-vllm"]["spec"]
    assert not _selects(vllm["selector"], leader["labels"]) and not _selects(vllm["selector"], worker["labels"])
    # Off: exactly the monitors as before.
    assert manifests.pod_monitors(generations=GENERATIONS, serving_namespace=NS) == [
        m for m in monitors if m["metadata"]["name"] != "gennstack-vllm-multinode"]


def _group(name: str, leader_ready: str, worker_ready: str = "1x40", staged: bool = False) -> list[dict[str, str]]:
    """One group's two pods as kube-state-metrics exports them."""
    label = ', label_gennstack_io_staged="false"' if staged else ""
    series = []
    for pod, container, ready in ((f"{name}-0", "vllm", leader_ready), (f"{name}-0-1", "ray-worker", worker_ready)):
        series += [
            {"series": f'kube_pod_container_status_ready{{namespace="{NS}", pod="{pod}", container="{container}"}}', "values": ready},
            {"series": f'kube_pod_status_ready{{namespace="{NS}", pod="{pod}", condition="true"}}', "values": ready},
            {"series": f'kube_pod_labels{{namespace="{NS}", pod="{pod}", label_app_kubernetes_io_name="{POOL}", '
                       f'label_app_kubernetes_io_component="server"{label}}}', "values": "1x40"},
        ]
    return series


def _generations_ready() -> list[dict[str, str]]:
    out = []
    for pool in ("gen1-inf2", "gen2-trn2", "gen3-g6e"):
        out += [{"series": f'kube_pod_status_ready{{namespace="{NS}", pod="{pool}-a", condition="true"}}', "values": "1x40"},
                {"series": f'kube_pod_labels{{namespace="{NS}", pod="{pool}-a", label_app_kubernetes_io_name="{pool}", '
                           'label_app_kubernetes_io_component="server"}', "values": "1x40"}]
    return out


def test_no_ready_replica_counts_a_group_once_by_its_leader(tmp_path: Path) -> None:
    """A group whose worker is Ready but whose leader is not serves nothing: it fires. A Ready leader is
    a serving group. No pod at all fires too; a group waiting for staging (its gate closed) does not."""
    groups = rule_groups(MonitoringConfig(), generations=GENERATIONS, serving_namespace=NS, multi_node_pool=POOL,
                         max_num_seqs=SEQS)
    alerts = [r for r in groups[0]["rules"] if r["alert"] == "GenNStackNoReadyReplica"]
    assert [r["labels"]["generation"] for r in alerts] == ["gen1-inf2", "gen2-trn2", "gen3-g6e", POOL]
    promtool.write_rules(tmp_path, _without_annotations(groups))
    import yaml

    fires = [_alerts("GenNStackNoReadyReplica", "20m", [{"severity": "critical", "generation": POOL}])]
    quiet = [_alerts("GenNStackNoReadyReplica", "20m", [])]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": [*_generations_ready(), *_group("g-a", "0x40")], "alert_rule_test": fires},
        {"interval": "1m", "input_series": _generations_ready(), "alert_rule_test": fires},
        {"interval": "1m", "input_series": [*_generations_ready(), *_group("g-a", "0x40"), *_group("g-b", "0 0 0 1x40")],
         "alert_rule_test": quiet},
        {"interval": "1m", "input_series": [*_generations_ready(), *_group("g-a", "0x40", "0x40", staged=True)],
         "alert_rule_test": quiet},
    ]}, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # Off: the rules as before (one per generation).
    default = rule_groups(MonitoringConfig(), generations=GENERATIONS, serving_namespace=NS, max_num_seqs=SEQS)
    assert [r["labels"]["generation"] for r in default[0]["rules"] if r["alert"] == "GenNStackNoReadyReplica"] == [
        "gen1-inf2", "gen2-trn2", "gen3-g6e"]


def test_the_rule_file_with_the_group_rule_passes_promtool_check(tmp_path: Path) -> None:
    result = promtool.check_rules(tmp_path, rule_groups(MonitoringConfig(), generations=GENERATIONS, serving_namespace=NS,
                                                       multi_node_pool=POOL, max_num_seqs=SEQS))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_the_groups_dashboard_is_the_builders_counts_groups_and_is_applied_only_when_on(tmp_path: Path) -> None:
    """assets/dashboards/multinode/ holds it (not assets/dashboards/, whose files every config applies):
    the builder's output, valid as the other dashboards (test_dashboards.py's checks), its queries parse
    (promtool) and read only known series; its ConfigMap comes only with the multi-node pool."""
    import json

    from gennstack.observability import dashboards as builder
    from gennstack.observability.metrics import METRICS, RECORDED
    from tests.observability.test_dashboards import test_dashboard_json_model
    from tests.observability.test_promql import _grafana_to_promql, metric_names

    expected = builder.multi_node_dashboards()
    files = sorted(builder.MULTI_NODE_DIR.glob("*.json"))
    assert [p.name for p in files] == sorted(expected)
    for path in files:
        assert path.read_text(encoding="utf-8") == builder.render(expected[path.name]), (
            f"{path.name} is stale: run .venv/bin/python -m gennstack.observability.dashboards")
        test_dashboard_json_model(path)
    dashboard = expected[f"gennstack-{POOL}.json"]
    assert dashboard["title"] == f"GenNStack / {POOL}"
    [replicas] = [p for p in dashboard["panels"] if p["title"] == "Replicas (groups)"]
    assert 'kube_pod_container_status_ready{container="vllm"}' in replicas["targets"][0]["expr"]
    assert f'label_app_kubernetes_io_name="{POOL}"' in replicas["targets"][0]["expr"]
    # Every vLLM panel reads the leaders' series (generation=<pool>), none gen3-g6e's.
    exprs = [_grafana_to_promql(t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    assert not [e for e in exprs if 'generation="gen3-g6e"' in e]
    assert all(metric_names(e) <= set(METRICS) | RECORDED for e in exprs)
    result = promtool.check_rules(tmp_path, [{"name": "parse", "rules": [
        {"record": f"parse:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}])
    assert result.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in result.stdout, result.stdout + result.stderr
    default = manifests.dashboard_config_maps()
    on = manifests.dashboard_config_maps(multi_node_pool=POOL)
    assert on[:-1] == default and on[-1]["metadata"]["name"] == f"gennstack-{POOL}"
    assert json.loads(on[-1]["data"][f"gennstack-{POOL}.json"])["uid"] == f"gennstack-{POOL}"
