"""End to end: a real Prometheus (Debian's `prometheus`) evaluates GenNStack's rules on a local exporter
serving the series the real exporters emit, and a real Alertmanager (Debian's
`prometheus-alertmanager`) with the configuration the stack renders delivers to a local receiver.

What is the test's own, and why (everything else is what the stack deploys):

* A test copy of the rules: the same expressions and labels (gennstack.observability.rules for the
  g6e generation), with every ``for`` set to 1 s and the group evaluated every second, so a
  failure fires in seconds instead of the 1-15 minutes the real rules wait.
* Alertmanager's group_wait and group_interval at 1 s (alertmanager_config(timings=...)), and the
  receivers' secret files under the test's directory instead of /etc/alertmanager/secrets.
* The exporter is prometheus_client's text exposition (the library vLLM writes its metrics with) serving, under ``honor_labels``, the series with the labels they
  carry in Prometheus: kube-state-metrics v2.19.1's kube_pod_status_ready / kube_pod_labels (the
  allow-listed pod labels), vLLM's gauge with the ``generation`` and ``pod`` labels the PodMonitor
  adds, YACE v0.67.0's dead-letter gauge and its own request counter.

Receivers: a webhook (critical only; its bearer token from a secret file) and a Slack receiver
(critical and warning; its URL from a secret file), both pointing at 127.0.0.1. The test asserts
what arrived: the critical alerts on the paging webhook with the token, the warning on Slack's URL
only. It polls with generous deadlines and never asserts on timing.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from gennstack.observability import alertmanager
from gennstack.observability.config import MonitoringConfig
from gennstack.observability.rules import POOLS, rule_groups
from tests.observability import promtool
from tests.observability.alerting import SERVER, binary

NS = "gennstack-serving"
POOL = POOLS["g6e"]
TOKEN = "page-token-from-secrets-manager"
DEADLINE_S = float(__import__("os").environ.get("GENNSTACK_TEST_DEADLINE_S", "180"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Inbox:
    """Every POST the receiver got: (path, Authorization header, JSON body)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posts: list[tuple[str, str, dict[str, Any]]] = []

    def add(self, path: str, auth: str, body: dict[str, Any]) -> None:
        with self.lock:
            self.posts.append((path, auth, body))

    def snapshot(self) -> list[tuple[str, str, dict[str, Any]]]:
        with self.lock:
            return list(self.posts)


def _receiver(inbox: _Inbox) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                payload = json.loads(body)
            except ValueError:
                payload = {"unparsed": body.decode("utf-8", "replace")}
            inbox.add(self.path, self.headers.get("Authorization", ""), payload)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _exporter(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """The registry in Prometheus' text format 0.0.4, whatever the scraper accepts.

    prometheus_client 0.26 answers an OpenMetrics request that does not allow UTF-8 names (Debian's
    Prometheus 2.42 sends none) with ':' escaped to '_' (vllm_kv_cache_usage_perc); the chart's
    Prometheus v3 asks with escaping=allow-utf-8. The text format keeps the names as vLLM writes them.
    """
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _test_rules(config: MonitoringConfig) -> list[dict[str, Any]]:
    """The stack's rule groups with every `for` at 1 s and a 1 s evaluation interval (test copy only)."""
    groups = rule_groups(config, generations=["g6e"], serving_namespace=NS, max_num_seqs={"g6e": 64})
    return [{**g, "interval": "1s", "rules": [{**r, "for": "1s"} if "alert" in r else r for r in g["rules"]]}
            for g in groups]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.terminate()
    for process in started:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{process.args[0]} exited {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} never answered:\n{log.read_text()[-4000:]}")


def _alerts(posts: list[tuple[str, str, dict[str, Any]]], path: str) -> list[dict[str, Any]]:
    return [alert for p, _, body in posts if p == path for alert in body.get("alerts", []) if alert.get("status") == "firing"]


def _names(alerts: list[dict[str, Any]]) -> set[str]:
    return {a["labels"]["alertname"] for a in alerts}


def _slack_alert_names(posts: list[tuple[str, str, dict[str, Any]]]) -> set[str]:
    # Slack's payload carries the rendered title "[FIRING] <alertname>" (alertmanager._integration).
    return {attachment.get("title", "").removeprefix("[FIRING] ") for p, _, body in posts if p == "/chat"
            for attachment in body.get("attachments", []) if attachment.get("title", "").startswith("[FIRING] ")}


def _poll(condition: Any, inbox: _Inbox, what: str, logs: tuple[Path, ...] = (), urls: tuple[str, ...] = ()) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition(inbox.snapshot()):
            return
        time.sleep(0.5)
    got = [(path, body.get("attachments", body.get("alerts"))) for path, _, body in inbox.snapshot()]
    import urllib.request

    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                tails += f"\n--- {url}\n{response.read().decode()[:3000]}"
        except OSError as error:
            tails += f"\n--- {url}: {error}"
    pytest.fail(f"{what} never arrived; the receiver got: {json.dumps(got)[:6000]}\n{tails}")


@pytest.mark.slow
def test_critical_alerts_page_and_a_warning_does_not(tmp_path: Path, processes: list[subprocess.Popen]) -> None:
    prometheus_bin = binary("prometheus", "prometheus")
    alertmanager_bin = binary(SERVER)
    promtool.binary()

    # --- the exporter, healthy at first: one Ready server pod, KV cache half full, YACE querying.
    registry = CollectorRegistry()
    ready = Gauge("kube_pod_status_ready", "", ["namespace", "pod", "uid", "condition"], registry=registry)
    pod_labels = Gauge("kube_pod_labels", "", ["namespace", "pod", "uid", "label_app_kubernetes_io_name",
                                                "label_app_kubernetes_io_component"], registry=registry)
    kv_cache = Gauge("vllm:kv_cache_usage_perc", "", ["model_name", "engine", "generation", "pod"], registry=registry)
    yace_requests = Counter("yace_cloudwatch_requests", "", ["api_name"], registry=registry)
    dead_letters = Gauge("aws_sqs_approximate_number_of_messages_visible_maximum", "",
                         ["name", "dimension_QueueName"], registry=registry)
    pod = f"{POOL}-server-0"
    for condition, value in (("true", 1), ("false", 0), ("unknown", 0)):
        ready.labels(NS, pod, "u1", condition).set(value)
    pod_labels.labels(NS, pod, "u1", POOL, "server").set(1)
    kv_cache.labels("qwen", "0", POOL, pod).set(0.5)
    yace_requests.labels("GetMetricStatistics").inc()
    exporter = _exporter(registry)
    exporter_port = exporter.server_address[1]

    inbox = _Inbox()
    receiver = _receiver(inbox)
    receiver_url = f"http://127.0.0.1:{receiver.server_address[1]}"
    try:
        # --- Alertmanager with the configuration the stack renders for these receivers.
        config = MonitoringConfig.model_validate({"receivers": (
            {"name": "pager", "type": "webhook", "secret_name": "gennstack/alerting/pager", "url": f"{receiver_url}/page"},
            {"name": "chat", "type": "slack", "secret_name": "gennstack/alerting/chat",
             "severities": ("critical", "warning")},
        )})
        secrets = tmp_path / "secrets"
        for receiver_config, content in zip(config.receivers, (TOKEN, f"{receiver_url}/chat"), strict=True):
            path = Path(alertmanager.secret_file(receiver_config, secrets_dir=str(secrets)))
            path.parent.mkdir(parents=True)
            path.write_text(content + "\n", encoding="utf-8")
        rendered = alertmanager.alertmanager_config(
            config, secrets_dir=str(secrets), timings={"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"})
        (tmp_path / "alertmanager.yaml").write_text(yaml.safe_dump(rendered, sort_keys=False), encoding="utf-8")
        am_port = _free_port()
        am_log = tmp_path / "alertmanager.log"
        processes.append(subprocess.Popen(
            [alertmanager_bin, f"--config.file={tmp_path / 'alertmanager.yaml'}", f"--storage.path={tmp_path / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            stdout=am_log.open("w"), stderr=subprocess.STDOUT))
        _wait_ready(f"http://127.0.0.1:{am_port}/-/ready", processes[-1], am_log)

        # --- Prometheus with the test copy of the rules, scraping the exporter every second.
        promtool.write_rules(tmp_path, _test_rules(MonitoringConfig()))
        (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules.yaml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "exporters", "honor_labels": True,
                                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
        }, sort_keys=False), encoding="utf-8")
        prom_port = _free_port()
        prom_log = tmp_path / "prometheus.log"
        processes.append(subprocess.Popen(
            [prometheus_bin, f"--config.file={tmp_path / 'prometheus.yaml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}",
             # Test only: resend firing alerts every second (default 1m), so an alert that fired
             # before Prometheus had discovered Alertmanager is not held back for a minute.
             "--rules.alert.resend-delay=1s"],
            stdout=prom_log.open("w"), stderr=subprocess.STDOUT))
        _wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", processes[-1], prom_log)

        debug = (f"http://127.0.0.1:{prom_port}/api/v1/alerts", f"http://127.0.0.1:{am_port}/api/v2/alerts",
                 f"http://127.0.0.1:{prom_port}/api/v1/query?query=%7B__name__%3D~%22vllm.%2A%7Cyace.%2A%22%7D")
        # --- Drive the failures: the only server pod stops being Ready; its KV cache fills.
        ready.labels(NS, pod, "u1", "true").set(0)
        ready.labels(NS, pod, "u1", "false").set(1)
        kv_cache.labels("qwen", "0", POOL, pod).set(0.99)
        _poll(lambda posts: "GenNStackNoReadyReplica" in _names(_alerts(posts, "/page")), inbox,
              "GenNStackNoReadyReplica on the paging webhook", (am_log, prom_log), debug)
        _poll(lambda posts: "GenNStackKVCacheFull" in _slack_alert_names(posts), inbox,
              "GenNStackKVCacheFull on the Slack receiver", (am_log, prom_log), debug)
        # Then dead letters: the paging pipeline still delivers after the warning went through.
        dead_letters.labels("interruption-dead-letters", "gennstack-dlq").set(3)
        _poll(lambda posts: "GenNStackInterruptionDeadLetters" in _names(_alerts(posts, "/page")), inbox,
              "GenNStackInterruptionDeadLetters on the paging webhook", (am_log, prom_log), debug)

        posts = inbox.snapshot()
        paged = _alerts(posts, "/page")
        assert _names(paged) == {"GenNStackNoReadyReplica", "GenNStackInterruptionDeadLetters"}
        assert {a["labels"]["severity"] for a in paged} == {"critical"}
        assert all(auth == f"Bearer {TOKEN}" for path, auth, _ in posts if path == "/page")
        assert {a["labels"].get("generation") for a in paged if a["labels"]["alertname"] == "GenNStackNoReadyReplica"} == {POOL}
        # The warning reached its receiver and no page: the webhook lists only "critical".
        assert "GenNStackKVCacheFull" not in _names(paged)
        assert {"GenNStackNoReadyReplica", "GenNStackKVCacheFull", "GenNStackInterruptionDeadLetters"} <= \
            _slack_alert_names(inbox.snapshot())
        assert {p for p, _, _ in posts} <= {"/page", "/chat"}
    finally:
        receiver.shutdown()
        exporter.shutdown()
