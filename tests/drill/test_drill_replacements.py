"""``gennstack drill --prometheus-url``: the replacement pods' Ready and first served request, from the start
phases the cluster records (gennstack/observability/rules.py), as drill events (gennstack/drill/replacements.py).

The queries run in the real promtool against the series the rules write; the HTTP client against a local
server speaking Prometheus' /api/v1/query answer format (prometheus/prometheus docs/querying/api.md)."""

from __future__ import annotations

import io
import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from gennstack.drill.cli import replacement_markers
from gennstack.drill.events import EventLog
from gennstack.drill.replacements import PrometheusError, http_fetch, queries, replacement_phases
from gennstack.observability.rules import START_PHASE_RECORD
from tests.observability import promtool

NS, POOL = "gennstack-serving", "gen3-g6e"
SINCE = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
T0 = SINCE.timestamp()


def _vector(*samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": m, "value": [T0 + 900, repr(float(v))]} for m, v in samples]}}


class Script:
    """A Prometheus that answers each poll from a list of (created, phases) answers, the last one repeated."""

    def __init__(self, *polls: tuple[dict[str, float], dict[tuple[str, str], float]]) -> None:
        self.polls, self.asked = list(polls), []

    def __call__(self, query: str) -> dict[str, Any]:
        self.asked.append(query)
        created, phases = self.polls[min((len(self.asked) - 1) // 2, len(self.polls) - 1)]
        if query.startswith("kube_pod_created"):
            return _vector(*(({"namespace": NS, "pod": pod, "uid": f"u-{pod}"}, t) for pod, t in created.items()))
        return _vector(*(({"namespace": NS, "pod": pod, "phase": phase, "label_app_kubernetes_io_name": POOL}, s)
                         for (pod, phase), s in phases.items()))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def _follow(tmp_path: Path, fetch: Any, wait_seconds: float = 900.0, *, served: bool = True) -> tuple[list[dict], list[str], str]:
    out, warnings, clock = io.StringIO(), [], Clock()
    log = EventLog(tmp_path / "drill-events.jsonl", out, now=lambda: SINCE)
    replacement_markers(fetch, namespace=NS, pool=POOL, since=SINCE, log=log, warn=warnings.append, sleep=clock.sleep,
                        monotonic=clock.monotonic, wait_seconds=wait_seconds, served=served)
    path = tmp_path / "drill-events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines], warnings, out.getvalue()


def test_each_replacement_gets_its_ready_and_served_at_the_time_they_happened(tmp_path: Path) -> None:
    """Two replacements created after the drill started; the first poll has one Ready, the next both Ready and
    one served, the third everything: the drill stops asking there and adds each phase at created + seconds."""
    a, b = T0 + 130, T0 + 140
    script = Script(({"gen3-g6e-a": a}, {("gen3-g6e-a", "ready"): 95}),
                    ({"gen3-g6e-a": a, "gen3-g6e-b": b}, {("gen3-g6e-a", "ready"): 95, ("gen3-g6e-a", "served"): 150,
                                                          ("gen3-g6e-b", "ready"): 80}),
                    ({"gen3-g6e-a": a, "gen3-g6e-b": b}, {("gen3-g6e-a", "ready"): 95, ("gen3-g6e-a", "served"): 150,
                                                          ("gen3-g6e-b", "ready"): 80, ("gen3-g6e-b", "served"): 81}))
    events, warnings, out = _follow(tmp_path, script)
    assert warnings == [] and len(script.asked) == 6
    assert [(e["time"], e["event"], e["pod"], e["seconds_after_created"], e["source"]) for e in events] == [
        ("2026-11-30T12:03:40Z", "replacement_ready", "gen3-g6e-b", 80.0, "prometheus"),
        ("2026-11-30T12:03:41Z", "replacement_served", "gen3-g6e-b", 81.0, "prometheus"),
        ("2026-11-30T12:03:45Z", "replacement_ready", "gen3-g6e-a", 95.0, "prometheus"),
        ("2026-11-30T12:04:40Z", "replacement_served", "gen3-g6e-a", 150.0, "prometheus"),
    ]
    assert "replacements: 2 gen3-g6e pod(s) created since the drill started, 2 served" in out


def test_a_replacement_that_never_serves_is_named_after_the_wait(tmp_path: Path) -> None:
    script = Script(({"gen3-g6e-a": T0 + 130}, {("gen3-g6e-a", "ready"): 95}))
    events, warnings, out = _follow(tmp_path, script, wait_seconds=60)
    assert [e["event"] for e in events] == ["replacement_ready"]
    assert len(script.asked) == 2 * 5  # at 0, 15, 30, 45 and 60 s: the next would be past the wait
    assert "1 served" not in out and "not served (yet): gen3-g6e-a" in out


def test_a_generation_without_a_served_phase_stops_at_ready(tmp_path: Path) -> None:
    """gen1-inf2 records no served phase (its vLLM is not scraped: the upstream review): the drill stops asking
    once every replacement is Ready instead of waiting out the 900 s for a phase that never comes."""
    script = Script(({"gen3-g6e-a": T0 + 130}, {("gen3-g6e-a", "ready"): 95}))
    events, warnings, out = _follow(tmp_path, script, served=False)
    assert [e["event"] for e in events] == ["replacement_ready"] and len(script.asked) == 2
    assert "1 Ready (no served phase: its vLLM is not scraped)" in out and "not served" not in out


def test_an_unreachable_prometheus_warns_and_never_fails_the_drill(tmp_path: Path) -> None:
    events, warnings, _ = _follow(tmp_path, http_fetch("http://127.0.0.1:9", timeout_s=2))
    assert events == [] and len(warnings) == 1 and warnings[0].startswith("replacement markers incomplete: http://127.0.0.1:9: ")


def test_the_http_client_sends_the_queries_and_reads_the_answers() -> None:
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)["query"][0]
            asked.append(query)
            body = Script(({"gen3-g6e-a": T0 + 10}, {("gen3-g6e-a", "served"): 42}))(query if "created" in query else "x")
            if parts.path != "/api/v1/query":
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        pods, phases = replacement_phases(http_fetch(f"http://127.0.0.1:{server.server_port}/"), namespace=NS, pool=POOL,
                                          since_unix=T0)
    finally:
        server.shutdown()
    assert pods == ["gen3-g6e-a"] and [(p.pod, p.phase, p.seconds, p.at.timestamp()) for p in phases] == [
        ("gen3-g6e-a", "served", 42.0, T0 + 52)]
    assert asked == list(queries(namespace=NS, pool=POOL, since_unix=T0))
    with pytest.raises(PrometheusError, match="bad_data: parse error"):
        replacement_phases(lambda q: {"status": "error", "errorType": "bad_data", "error": "parse error"},
                           namespace=NS, pool=POOL, since_unix=T0)


def test_the_queries_select_the_pools_servers_created_after_the_drill_started(tmp_path: Path) -> None:
    """In the real promtool, on the series the rules write and kube-state-metrics exports: a replacement
    created after the start (kept), a pod of the pool from before it, another pool's, and a stage Job's pod."""
    since = 600  # promtool's clock starts at 0
    created_q, phases_q = queries(namespace=NS, pool=POOL, since_unix=since)

    def pod(name: str, pool: str, component: str, created: int) -> list[dict[str, str]]:
        ident = f'namespace="{NS}", pod="{name}", uid="u-{name}"'
        return [{"series": f"kube_pod_created{{{ident}}}", "values": f"{created}x20"},
                {"series": f'kube_pod_labels{{{ident}, label_app_kubernetes_io_name="{pool}", '
                           f'label_app_kubernetes_io_component="{component}"}}', "values": "1x20"},
                {"series": f'{START_PHASE_RECORD}{{{ident}, label_app_kubernetes_io_name="{pool}", phase="served"}}',
                 "values": "90x20"}]

    series = [*pod("gen3-g6e-new", POOL, "server", 700), *pod("gen3-g6e-old", POOL, "server", 100),
              *pod("gen2-trn2-new", "gen2-trn2", "server", 700), *pod("gen3-g6e-stage-x", POOL, "staging", 700)]
    promtool.write_rules(tmp_path, [{"name": "none", "rules": [{"record": "unused", "expr": "vector(1)"}]}])
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": created_q, "eval_time": "15m", "exp_samples": [
                {"labels": f'kube_pod_created{{namespace="{NS}", pod="gen3-g6e-new", uid="u-gen3-g6e-new"}}', "value": 700}]},
            {"expr": phases_q, "eval_time": "15m", "exp_samples": [
                {"labels": f'{START_PHASE_RECORD}{{namespace="{NS}", pod="{name}", uid="u-{name}", '
                           f'label_app_kubernetes_io_name="{POOL}", phase="served"}}', "value": 90}
                for name in ("gen3-g6e-new", "gen3-g6e-old", "gen3-g6e-stage-x")]},
        ]}]}, sort_keys=False), encoding="utf-8")
    result = promtool.run("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
