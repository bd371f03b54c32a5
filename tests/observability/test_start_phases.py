"""Each serving pod's start by phase, from its conditions as kube-state-metrics v2.19.1 exports them, run by the
real `promtool test rules` and read back through each generation's dashboard panel.

kube-state-metrics v2.19.1 internal/store/pod.go: kube_pod_status_scheduled_time, kube_pod_status_initialized_time
and kube_pod_status_ready_time are the PodScheduled / Initialized / Ready conditions' lastTransitionTime (Unix s),
emitted only while the condition is True; kube_pod_created is metadata.creationTimestamp. Labels namespace, pod, uid.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gennstack.observability.config import MonitoringConfig
from gennstack.observability.dashboards import dashboards
from gennstack.observability.rules import START_PHASE_RECORD, rule_groups
from tests.observability import promtool

NS = "gennstack-serving"
CREATED = 1_800_000_000


def _pod(pod: str, pool: str, component: str, *, scheduled: int, initialized: int | None, ready: int | None,
         namespace: str = NS) -> list[dict[str, str]]:
    ident = f'namespace="{namespace}", pod="{pod}", uid="u-{pod}"'
    series = [
        {"series": f"kube_pod_created{{{ident}}}", "values": f"{CREATED}x30"},
        {"series": f"kube_pod_status_scheduled_time{{{ident}}}", "values": f"{CREATED + scheduled}x30"},
        {"series": f'kube_pod_labels{{{ident}, label_app_kubernetes_io_name="{pool}", '
                   f'label_app_kubernetes_io_component="{component}"}}', "values": "1x30"},
    ]
    if initialized is not None:
        series.append({"series": f"kube_pod_status_initialized_time{{{ident}}}", "values": f"{CREATED + initialized}x30"})
    if ready is not None:
        series.append({"series": f"kube_pod_status_ready_time{{{ident}}}", "values": f"{CREATED + ready}x30"})
    return series


def _record(pod: str, pool: str, phase: str, value: int) -> dict:
    return {"labels": f'{START_PHASE_RECORD}{{label_app_kubernetes_io_name="{pool}", namespace="{NS}", '
                      f'phase="{phase}", pod="{pod}", uid="u-{pod}"}}', "value": value}


def _promtool(tmp_path: Path, series: list[dict], tests: list[dict]) -> None:
    groups = [g for g in rule_groups(MonitoringConfig(), generations=["inf2", "trn2", "g6e"], serving_namespace=NS,
                                     max_num_seqs={"inf2": 20, "trn2": 16, "g6e": 64}) if g["name"] == "gennstack.start"]
    assert groups, "no gennstack.start rule group"
    promtool.write_rules(tmp_path, groups)
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, **t} for t in tests],
    }, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_phase_is_seconds_after_the_pod_was_created(tmp_path: Path) -> None:
    """A started g6e server, a trn2 server still syncing its weights, a staging Job's pod (not a server) and a
    server of another namespace: only the servers here are recorded, and a phase not reached yet has no series."""
    series = [
        *_pod("gen3-g6e-a", "gen3-g6e", "server", scheduled=95, initialized=160, ready=290),
        *_pod("gen2-trn2-a", "gen2-trn2", "server", scheduled=240, initialized=None, ready=None),
        *_pod("gen3-g6e-stage-x", "gen3-g6e", "stage", scheduled=5, initialized=9, ready=20),
        *_pod("gen3-g6e-b", "gen3-g6e", "server", scheduled=1, initialized=2, ready=3, namespace="other"),
    ]
    _promtool(tmp_path, series, [{"promql_expr_test": [
        {"expr": START_PHASE_RECORD, "eval_time": "5m", "exp_samples": [
            _record("gen3-g6e-a", "gen3-g6e", "scheduled", 95),
            _record("gen3-g6e-a", "gen3-g6e", "initialized", 160),
            _record("gen3-g6e-a", "gen3-g6e", "ready", 290),
            _record("gen2-trn2-a", "gen2-trn2", "scheduled", 240),
        ]},
    ]}])


@pytest.mark.parametrize(("file", "pool"), [("gennstack-gen1-inf2.json", "gen1-inf2"),
                                            ("gennstack-gen2-trn2.json", "gen2-trn2"),
                                            ("gennstack-gen3-g6e.json", "gen3-g6e")])
def test_every_generation_dashboard_shows_its_pods_start(tmp_path: Path, file: str, pool: str) -> None:
    """The panel's own query, evaluated on the recorded series: one line per pod and phase of this pool only."""
    panel = next(p for p in dashboards()[file]["panels"] if p["title"].startswith("Serving pod start by phase"))
    (target,) = panel["targets"]
    series = [*_pod(f"{pool}-a", pool, "server", scheduled=60, initialized=120, ready=400),
              *_pod("other-a", "gen9-other", "server", scheduled=1, initialized=2, ready=3)]
    _promtool(tmp_path, series, [{"promql_expr_test": [
        {"expr": target["expr"], "eval_time": "5m", "exp_samples": [
            {"labels": f'{{phase="{phase}", pod="{pool}-a"}}', "value": value}
            for phase, value in (("scheduled", 60), ("initialized", 120), ("ready", 400))
        ]},
    ]}])


def test_gen1_panel_says_its_ready_is_the_ray_serve_proxy() -> None:
    """gen1-inf2's worker pods are Ready on the Ray Serve proxy's /-/healthz (templates/inf2-rayservice.yaml
    readinessProbe), not on vLLM's /health: the panel must not read Ready as "model loaded" there."""
    def description(file: str) -> str:
        return next(p["description"] for p in dashboards()[file]["panels"] if p["title"].startswith("Serving pod start"))
    from tests import helm
    from tests.serving.conftest import CHART, REQUIRED, merged, only
    from tests.serving.test_serving_chart import named, serving_pod

    worker = serving_pod(named(helm.render(CHART, merged(REQUIRED, only("inf2")))), "inf2")["containers"][0]
    assert worker["readinessProbe"]["httpGet"]["path"] == "/-/healthz"
    assert "Ray Serve proxy" in description("gennstack-gen1-inf2.json")
    assert "the model loaded" in description("gennstack-gen3-g6e.json")


def test_served_is_the_first_successful_request_the_pods_own_server_counted(tmp_path: Path) -> None:
    """vLLM's vllm:request_success_total (vllm/v1/metrics/loggers.py at v0.29.0 and v0.13.0) as the PodMonitor
    scrapes it (namespace, pod, plus vLLM's finished_reason and engine). Pod a is created at 60 s and finishes
    its first request before the 4-minute evaluation; its server restarts at 6 minutes (the counter back to 0)
    and the phase stays. Pod b is Ready and has served nothing: no phase. Pod c served, then was deleted
    (kube-state-metrics stops listing it): nothing of it is kept."""
    def pod(name: str, created: str) -> list[dict[str, str]]:
        ident = f'namespace="{NS}", pod="{name}", uid="u-{name}"'
        return [{"series": f"kube_pod_created{{{ident}}}", "values": created},
                {"series": f'kube_pod_labels{{{ident}, label_app_kubernetes_io_name="gen3-g6e", '
                           'label_app_kubernetes_io_component="server"}', "values": created.replace("60", "1").replace("30", "1")}]

    def success(name: str, reason: str, values: str) -> dict[str, str]:
        return {"series": f'vllm:request_success_total{{namespace="{NS}", pod="{name}", finished_reason="{reason}", '
                          f'engine="0", model_name="gpt-oss-20b"}}', "values": values}

    series = [
        *pod("gen3-g6e-a", "60x15"), *pod("gen3-g6e-b", "30x15"), *pod("gen3-g6e-c", "30x3"),
        success("gen3-g6e-a", "stop", "0 0 0 0 2 5 0 1 1 1 1 1 1 1 1 1"),
        success("gen3-g6e-a", "length", "0x15"),
        success("gen3-g6e-b", "stop", "0x15"),
        success("gen3-g6e-c", "stop", "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"),
    ]
    served = {"labels": f'{START_PHASE_RECORD}{{label_app_kubernetes_io_name="gen3-g6e", namespace="{NS}", '
                        'phase="served", pod="gen3-g6e-a", uid="u-gen3-g6e-a"}', "value": 240 - 60}
    _promtool(tmp_path, series, [{"promql_expr_test": [
        {"expr": f'{START_PHASE_RECORD}{{phase="served", pod=~"gen3-g6e-[ab]"}}', "eval_time": "3m", "exp_samples": []},
        {"expr": f'{START_PHASE_RECORD}{{phase="served", pod=~"gen3-g6e-[ab]"}}', "eval_time": "5m", "exp_samples": [served]},
        {"expr": f'{START_PHASE_RECORD}{{phase="served", pod="gen3-g6e-c"}}', "eval_time": "3m", "exp_samples": [
            {"labels": served["labels"].replace("gen3-g6e-a", "gen3-g6e-c"), "value": 60 - 30}]},
        # After the restart, and with c gone: a's phase as it was, nothing of c (its record lasts while
        # kube-state-metrics listed it in the last 10 minutes: gone by 14 minutes).
        {"expr": f'{START_PHASE_RECORD}{{phase="served"}}', "eval_time": "12m", "exp_samples": [served]},
        {"expr": 'gennstack:serving_pod_first_served_time{pod="gen3-g6e-c"}', "eval_time": "14m", "exp_samples": []},
    ]}])


def test_served_survives_a_gap_in_kube_state_metrics_and_is_not_inherited_by_a_pod_of_the_same_name(tmp_path: Path) -> None:
    """From the upstream review (prometheus v3.13.2 rules/group.go, scrape/scrape.go: a rule that returns
    nothing writes stale markers, a failed scrape marks its target's series stale). Pod d is created at 60 s
    and serves before 4 minutes; kube-state-metrics misses it for two minutes (6 and 7): its phase is still
    180 s afterwards. Pod e (a StatefulSet's name: uid u1) serves at 4 minutes and is deleted at 5; a new
    e (uid u2) is created at 480 s and serves nothing: it has no served phase, not u1's."""
    def listed(name: str, uid: str, values: str) -> list[dict[str, str]]:
        ident = f'namespace="{NS}", pod="{name}", uid="{uid}"'
        labels = " ".join("1" if v not in ("_", "stale") else v for v in values.split())
        return [{"series": f"kube_pod_created{{{ident}}}", "values": values},
                {"series": f'kube_pod_labels{{{ident}, label_app_kubernetes_io_name="gen3-g6e", '
                           'label_app_kubernetes_io_component="server"}', "values": labels}]

    def success(name: str, values: str) -> dict[str, str]:
        return {"series": f'vllm:request_success_total{{namespace="{NS}", pod="{name}", finished_reason="stop", '
                          f'engine="0", model_name="gpt-oss-20b"}}', "values": values}

    gap = " ".join(["60"] * 6 + ["stale", "_"] + ["60"] * 8)
    series = [
        *listed("gen3-g6e-d", "u-d", gap),
        success("gen3-g6e-d", "0 0 0 0 1 1 1 1 1 1 1 1 1 1 1 1"),
        *listed("gen3-g6e-e", "u1", " ".join(["60"] * 6)),
        *listed("gen3-g6e-e", "u2", " ".join(["_"] * 8 + ["480"] * 8)),
        success("gen3-g6e-e", " ".join(["0"] * 4 + ["1", "1"])),
    ]
    d = {"labels": f'{START_PHASE_RECORD}{{label_app_kubernetes_io_name="gen3-g6e", namespace="{NS}", '
                   'phase="served", pod="gen3-g6e-d", uid="u-d"}', "value": 240 - 60}
    _promtool(tmp_path, series, [{"promql_expr_test": [
        {"expr": f'{START_PHASE_RECORD}{{phase="served", pod="gen3-g6e-d"}}', "eval_time": "5m", "exp_samples": [d]},
        {"expr": f'{START_PHASE_RECORD}{{phase="served", pod="gen3-g6e-d"}}', "eval_time": "13m", "exp_samples": [d]},
        {"expr": f'{START_PHASE_RECORD}{{phase="served", pod="gen3-g6e-e", uid="u2"}}', "eval_time": "12m", "exp_samples": []},
        {"expr": 'gennstack:serving_pod_first_served_time{pod="gen3-g6e-e"}', "eval_time": "12m", "exp_samples": []},
    ]}])
