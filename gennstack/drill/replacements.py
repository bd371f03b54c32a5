"""When an AWS drill's replacement pods became Ready and served, from the cluster's own start phases.

Each serving pod records its start in the cluster's Prometheus (gennstack/observability/rules.py):
``gennstack:serving_pod_start_phase_seconds{phase="ready"|"served"}``, seconds after the pod was
created (``served``: its first successful request, by its own vLLM's ``vllm:request_success_total``).
``gennstack drill --prometheus-url URL`` (a port-forward to the stack's Prometheus) reads them for the
generation's server pods created after the drill started, the interrupted replicas' replacements
(and any other pod the generation started meanwhile, which the drill cannot tell apart), and adds
them as events ``replacement_ready`` and ``replacement_served`` at the time each phase happened
(created + seconds), with ``source: "prometheus"``.

Prometheus' HTTP API: ``GET /api/v1/query?query=...`` answers ``{"status": "success", "data":
{"resultType": "vector", "result": [{"metric": {...}, "value": [<unix>, "<number>"]}]}}``
(prometheus/prometheus docs/querying/api.md).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gennstack.observability.rules import SERVED_PHASE, START_PHASE_RECORD

SOURCE = "prometheus"
PHASES = {"ready": "replacement_ready", SERVED_PHASE: "replacement_served"}

Fetch = Callable[[str], dict[str, Any]]


class PrometheusError(Exception):
    """Prometheus could not be asked, or answered with an error; the message says which."""


@dataclass(frozen=True)
class Phase:
    """One replacement pod's phase: its creation (Unix s) and the phase's seconds after it."""

    pod: str
    phase: str
    created_unix: float
    seconds: float

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.created_unix + self.seconds, tz=timezone.utc)


def http_fetch(base_url: str, timeout_s: float = 10.0) -> Fetch:
    """A ``Fetch`` that asks ``base_url``'s ``/api/v1/query``."""
    def fetch(query: str) -> dict[str, Any]:
        url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except OSError as exc:  # URLError, HTTPError, timeouts
            raise PrometheusError(f"{base_url}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise PrometheusError(f"{base_url}: not a Prometheus API answer ({exc})") from exc
    return fetch


def _vector(fetch: Fetch, query: str) -> list[dict[str, Any]]:
    answer = fetch(query)
    if answer.get("status") != "success" or answer.get("data", {}).get("resultType") != "vector":
        raise PrometheusError(f"query {query!r}: {answer.get('errorType', 'unexpected answer')}: {answer.get('error', answer)}")
    return answer["data"]["result"]


def queries(*, namespace: str, pool: str, since_unix: float) -> tuple[str, str]:
    """The two queries: the pool's server pods created after ``since_unix`` (value: created, Unix s),
    and their ready and served phases (value: seconds after created)."""
    servers = (f'kube_pod_labels{{namespace="{namespace}", label_app_kubernetes_io_name="{pool}", '
               'label_app_kubernetes_io_component="server"}')
    created = f'kube_pod_created{{namespace="{namespace}"}} > {since_unix:.3f} and on (namespace, pod) {servers}'
    phases = (f'{START_PHASE_RECORD}{{namespace="{namespace}", label_app_kubernetes_io_name="{pool}", '
              f'phase=~"{"|".join(PHASES)}"}}')
    return created, phases


def replacement_phases(fetch: Fetch, *, namespace: str, pool: str, since_unix: float) -> tuple[list[str], list[Phase]]:
    """The pool's server pods created after ``since_unix`` (sorted), and each one's ready and served phases so far."""
    created_query, phases_query = queries(namespace=namespace, pool=pool, since_unix=since_unix)
    created = {s["metric"]["pod"]: float(s["value"][1]) for s in _vector(fetch, created_query)}
    phases = [Phase(pod=s["metric"]["pod"], phase=s["metric"]["phase"], created_unix=created[s["metric"]["pod"]],
                    seconds=float(s["value"][1]))
              for s in _vector(fetch, phases_query) if s["metric"].get("pod") in created]
    return sorted(created), sorted(phases, key=lambda p: (p.created_unix + p.seconds, p.pod, p.phase))


def all_served(pods: list[str], phases: list[Phase], *, served: bool = True) -> bool:
    """At least one replacement, and every one has served (``served`` False: is Ready, for a generation that
    records no served phase)."""
    done = {p.pod for p in phases if p.phase == (SERVED_PHASE if served else "ready")}
    return bool(pods) and set(pods) <= done
