"""The dashboards in assets/dashboards/: current with their builder, and well-formed Grafana dashboard
JSON models that load as provisioned dashboards.

The fields checked are those of Grafana's dashboard JSON model (Grafana 13.1.3, the version
kube-prometheus-stack 88.3.0's grafana chart 12.10.4 runs; docs/sources/dashboards/build-dashboards/
view-dashboard-json-model in grafana/grafana): a dashboard has a title, a uid (at most 40
characters), a schemaVersion, time, templating.list and panels; a panel an integer id unique in its
dashboard, a type, a gridPos on the 24-column grid and targets whose refIds are unique in the panel.
No schema validator for the JSON model is installable here (@grafana/schema ships TypeScript types,
not a validator), so these rules are checked one by one.
"""

from __future__ import annotations

import json

import pytest

from gennstack.observability import dashboards as builder
from gennstack.observability.manifests import dashboard_config_maps
from gennstack.observability.values import DASHBOARD_LABEL

FILES = sorted(builder.DASHBOARD_DIR.glob("*.json"))
PANEL_TYPES = {"timeseries", "table", "stat", "gauge", "bargauge"}
UNITS = {"s", "ms", "none", "percent", "percentunit", "reqps", "bytes", "currencyUSD"}


def test_files_match_the_builder() -> None:
    expected = builder.dashboards()
    assert sorted(p.name for p in FILES) == sorted(expected)
    for path in FILES:
        assert path.read_text(encoding="utf-8") == builder.render(expected[path.name]), (
            f"{path.name} is stale: run .venv/bin/python -m gennstack.observability.dashboards")


def test_one_dashboard_per_generation_plus_gateway_spot_cost() -> None:
    titles = {json.loads(p.read_text())["title"] for p in FILES}
    assert titles == {f"GenNStack / {n}" for n in ("gen1-inf2", "gen2-trn2", "gen3-g6e", "gateway", "spot", "cost")}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dashboard_json_model(path) -> None:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    for key in ("uid", "title", "schemaVersion", "time", "templating", "panels", "annotations"):
        assert key in dashboard, f"{path.name}: no {key}"
    assert isinstance(dashboard["uid"], str) and 0 < len(dashboard["uid"]) <= 40
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] == builder.SCHEMA_VERSION
    assert isinstance(dashboard["templating"]["list"], list)
    assert set(dashboard["time"]) == {"from", "to"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells = set()
    for panel in dashboard["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert panel["title"]
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"} and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{path.name}: panel {panel['title']!r} overlaps another"
                cells.add((x, y))
        assert panel["fieldConfig"]["defaults"]["unit"] in UNITS
        assert panel["datasource"] == builder.DATASOURCE
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids))
        for target in panel["targets"]:
            assert target["datasource"] == builder.DATASOURCE and target["expr"].strip()
    used = {v for p in dashboard["panels"] for t in p["targets"] for v in ("$model",) if v in t["expr"]}
    assert used <= {f"${v['name']}" for v in dashboard["templating"]["list"]}


def test_uids_are_unique() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in FILES]
    assert len(uids) == len(set(uids))


def test_datasource_is_the_one_kube_prometheus_stack_provisions() -> None:
    """kube-prometheus-stack 88.3.0 values.yaml: grafana.sidecar.datasources.uid: prometheus (type prometheus)."""
    assert builder.DATASOURCE == {"type": "prometheus", "uid": "prometheus"}


def test_config_maps_carry_every_dashboard_for_the_sidecar() -> None:
    maps = dashboard_config_maps()
    assert [m["metadata"]["name"] for m in maps] == [p.stem for p in FILES]
    for config_map, path in zip(maps, FILES, strict=True):
        assert DASHBOARD_LABEL.items() <= config_map["metadata"]["labels"].items()
        assert json.loads(config_map["data"][path.name]) == json.loads(path.read_text())
        # A ConfigMap holds at most 1 MiB (Kubernetes' limit on an object's data).
        assert len(config_map["data"][path.name].encode()) < 1024 * 1024


def test_a_disabled_generation_gets_no_dashboard() -> None:
    """Only the enabled generations' dashboards, beside the shared ones; a name that is no generation is refused."""
    names = [m["metadata"]["name"] for m in dashboard_config_maps(generations=["g6e"])]
    assert names == ["gennstack-cost", "gennstack-gateway", "gennstack-gen3-g6e", "gennstack-spot"]
    assert [m["metadata"]["name"] for m in dashboard_config_maps(generations=[])] == ["gennstack-cost", "gennstack-gateway", "gennstack-spot"]
    with pytest.raises(ValueError, match=r"unknown generations \['gen3'\]"):
        dashboard_config_maps(generations=["gen3"])


def test_gen1_model_variable_starts_on_gen1s_model() -> None:
    """The gateway's series carry every generation's models; gen1's dashboard opens on its own."""
    from gennstack.config import load_config
    from gennstack.observability.dashboards import gen1_dashboard

    (variable,) = gen1_dashboard()["templating"]["list"]
    model = load_config({}).serving.inf2.served_model_name
    assert variable["current"]["value"] == [model] and variable["current"]["value"] != ["$__all"]


def test_no_prefix_cache_ratio_where_prefix_caching_is_off() -> None:
    """The chart runs the Neuron generations with --no-enable-prefix-caching (the serving chart's
    vllmArgs): gen2's dashboard has no 0/0 hit ratio; g6e (vLLM's default, caching on) keeps it."""
    from gennstack.observability.dashboards import dashboards
    from tests import helm
    from tests.serving.conftest import CHART, NAMESPACE, cdk_values

    import json

    # The server's arguments reach it through the pod (command, env or a mounted script's config).
    args = {o["metadata"]["name"]: json.dumps(o) for o in helm.render(CHART, cdk_values(), namespace=NAMESPACE)
            if o["kind"] == "Deployment"}
    assert "--no-enable-prefix-caching" in args["gen2-trn2"] and "--no-enable-prefix-caching" not in args["gen3-g6e"]
    for name, has_ratio in (("gennstack-gen2-trn2.json", False), ("gennstack-gen3-g6e.json", True)):
        exprs = [t["expr"] for p in dashboards()[name]["panels"] for t in p["targets"]]
        assert any("vllm:prefix_cache_queries_total" in e for e in exprs) is has_ratio, name
        assert any("vllm:num_preemptions_total" in e for e in exprs), name
