"""The gateway's typed config section and the routing table built from it.

``GatewayConfig`` is one section of the GenNStack config (the lead wires it into
``GenNStackConfig``); :func:`routing_table` turns it, plus the set of enabled generations, into
the one :class:`RoutingTable` that both the cluster chart (``gennstack.gateway.values``) and the
local Envoy (``gennstack.gateway.local``) are built from, so the two cannot disagree on which
model name goes where.

Vocabulary (the Envoy AI Gateway's):

* a **model** is a name clients send in the request body's ``"model"`` and the name the server
  behind it serves (vLLM ``--served-model-name``);
* a **backend** is one model server (a Kubernetes Service in the serving namespace);
* a **route** matches one model name (the ``x-ai-eg-model`` header the AI Gateway derives from
  the body) and sends it to one or more backends with a ``weight`` (traffic split among backends of
  the same priority) and a ``priority`` (0 serves; 1, 2, ... take over only when every backend of
  the lower numbers is failing). An **alias** (``gennstack-default``) is a route whose backends
  serve other model names: the gateway rewrites the body's ``model`` to the backend's own name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from gennstack.config_base import GENERATION_NAMES, FieldError, StrictModel
from gennstack.gateway.names import backend_object_name, collisions, rule_name
from gennstack.gateway.resume_support import SERVER_SUPPORT

__all__ = [
    "AliasTarget",
    "NLB_IDLE_TIMEOUT_S",
    "STREAM_IDLE_MAX_S",
    "FALLBACK_STATUS",
    "GatewayConfig",
    "LangfuseConfig",
    "LoadBalancerConfig",
    "ModelBackend",
    "RateLimitConfig",
    "ResumeSettings",
    "ResilienceConfig",
    "Route",
    "RouteBackend",
    "RoutingConfig",
    "RoutingTable",
    "TlsConfig",
    "default_models",
    "routing_table",
]

# The AI Gateway allows 15 rules per AIGatewayRoute; GenNStack renders one route with one rule per
# model name, so at most 15 model names and aliases together.
MAX_ROUTES = 15
_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ACM_ARN_RE = re.compile(r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]{36}$")
_SECRET_NAME_RE = re.compile(r"^[A-Za-z0-9/_+=.@-]{1,512}$")


def _secret_name(value: str) -> str:
    if not _SECRET_NAME_RE.match(value):
        raise ValueError("must be a Secrets Manager secret name (letters, digits, /_+=.@-)")
    return value


SecretName = Annotated[str, AfterValidator(_secret_name)]
_DURATION_LIMITS = (1, 3600)
# The NLB's idle timeout: "The connection idle timeout for TLS listeners is 350 seconds and can't be
# modified" (AWS, Elastic Load Balancing, Network Load Balancers, "Update the TCP idle timeout for your
# Network Load Balancer listener"; a TCP listener's defaults to 350 s). GenNStack's NLB listener is TLS
# with an ACM certificate and TCP without, so 350 s holds for both. No byte in either direction for that
# long and the NLB closes the connection; while an attempt sends nothing (a non-streaming answer being
# generated) the client's connection sends nothing either, so one attempt's silence stays below it.
NLB_IDLE_TIMEOUT_S = 350
STREAM_IDLE_MAX_S = NLB_IDLE_TIMEOUT_S - 10
MIN_LOCAL_ORIGIN_FAILURES = 2

Generation = Literal["inf2", "trn2", "g6e"]


class ModelBackend(StrictModel):
    """A model name and the server that serves it (one Service in ``serving_namespace``)."""

    generation: Generation
    """The generation (inf2, trn2, g6e) whose model server serves this model."""
    service: str
    """The serving Service in serving_namespace the gateway sends this model's requests to."""
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    """That Service's port."""

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        if not _DNS_LABEL_RE.match(value):
            raise ValueError("must be a Kubernetes Service name (lowercase letters, digits, '-', at most 63)")
        return value


class AliasTarget(StrictModel):
    """One backend of an alias: a model name from ``models``, its share and its failover order."""

    model: str
    """A model name of gateway.models this alias sends to."""
    # Share of the alias's traffic among the targets of the same priority (relative, like Envoy's).
    weight: Annotated[int, Field(ge=0, le=1000)] = 1
    """Share of the alias's traffic among the targets of the same priority (relative, like Envoy's weights)."""
    # 0 serves; a higher number takes over only when every target of the lower numbers fails.
    priority: Annotated[int, Field(ge=0, le=7)] = 0
    """0 serves; a higher number takes over only when every target of the lower numbers fails."""


class ResilienceConfig(StrictModel):
    """Failover, health checks and timeouts (Envoy Gateway ``BackendTrafficPolicy`` and the route)."""

    # Retries after the first attempt (each may go to another backend: connect failures,
    # resets and the status codes below).
    retries: Annotated[int, Field(ge=0, le=10)] = 3
    """Retries after the first attempt, each possibly on another backend (connect failures, resets, retry_on_status)."""
    # Attempts at one priority before the next priority is tried (Envoy's previous_priorities):
    # 2 keeps the first retry at the same priority, on another server (previous_hosts).
    attempts_per_priority: Annotated[int, Field(ge=1, le=10)] = 2
    """Attempts at one priority before the next priority is tried (Envoy's previous_priorities)."""
    retry_on_status: tuple[int, ...] = (502, 503, 504)
    """Backend HTTP statuses that are retried."""
    # No byte from a server for this long: the attempt is stuck. Envoy resets it (the AI Gateway makes
    # the rule's streamIdleTimeout Envoy's per-try idle timeout) and counts a failure against the server;
    # before the first byte that is a retry on another server, after it the client sees the stream end
    # early. A non-streaming answer sends no byte until it is done (vLLM), so this must outlast the
    # longest non-streaming answer: 300 s is 6,000 tokens at 20 tokens/s. It is also the bound on how
    # long a request waits on a server that hangs (one that dies is retried at once).
    # At most STREAM_IDLE_MAX_S: while an attempt is silent the client's connection is silent too, and
    # the NLB closes a connection idle for 350 s (NLB_IDLE_TIMEOUT_S).
    stream_idle_timeout_s: Annotated[int, Field(ge=1)] = 300
    """No byte from a server for this long: the attempt is reset and counted as the server's failure; it must outlast
    the longest non-streaming answer and stay under the NLB's 350 s idle timeout."""
    # Whole request, streaming included (long generations take minutes); also bounds each attempt,
    # since Envoy's per-try timeout covers the whole response and must not cut a long stream.
    request_timeout_s: Annotated[int, Field(ge=1, le=86400)] = 900
    """Timeout of a whole request, streaming included (also each attempt's)."""
    health_path: str = "/health"
    """Path of the active health check on every model server."""
    health_interval_s: Annotated[int, Field(ge=1, le=300)] = 5
    """Seconds between active health checks."""
    unhealthy_threshold: Annotated[int, Field(ge=1, le=10)] = 2
    """Failed health checks in a row that take a server out."""
    healthy_threshold: Annotated[int, Field(ge=1, le=10)] = 1
    """Passed health checks in a row that bring it back."""
    # Passive health checking (outlier ejection).
    consecutive_5xx: Annotated[int, Field(ge=1, le=100)] = 5
    """5xx answers in a row that eject a server (passive health checking)."""
    consecutive_gateway_errors: Annotated[int, Field(ge=1, le=100)] = 3
    """502/503/504 answers in a row that eject a server."""
    # Resets, connect failures and silent attempts in a row (Envoy's local-origin failures) that eject a
    # server: at least 2, so that one request written onto a connection the server was closing (a
    # keep-alive race) never ejects a healthy server.
    consecutive_local_origin_failures: Annotated[int, Field(ge=1, le=100)] = 3
    """Resets, connect failures and silent attempts in a row that eject a server."""
    # How long every ejection lasts, the first and each repeat alike (Envoy's max_ejection_time is set
    # to it, so its backoff never makes a repeat longer). It is also the longest a model's last
    # healthy server can be out: Envoy's ejection cap counts unhealthy servers too (docs/gateway.md,
    # "What counts against a server").
    base_ejection_time_s: Annotated[int, Field(ge=1, le=3600)] = 10
    """How long every ejection lasts, the first and each repeat alike."""

    @field_validator("retry_on_status")
    @classmethod
    def _statuses(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [code for code in value if not 500 <= code <= 599]
        if bad:
            raise ValueError(f"{bad} are not 5xx status codes; retrying a 4xx repeats a client error")
        return value

    @field_validator("health_path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", value):
            raise ValueError("must be an absolute URL path such as '/health'")
        return value

    @field_validator("consecutive_local_origin_failures")
    @classmethod
    def _local_origin(cls, value: int) -> int:
        if value < MIN_LOCAL_ORIGIN_FAILURES:
            raise ValueError(f"{value}: at least {MIN_LOCAL_ORIGIN_FAILURES}; one reset (a request written onto a "
                             "keep-alive connection the server was closing) would eject a healthy server")
        return value

    @model_validator(mode="after")
    def _timeouts(self) -> ResilienceConfig:
        if self.stream_idle_timeout_s > STREAM_IDLE_MAX_S:
            raise FieldError("stream_idle_timeout_s", self.stream_idle_timeout_s,
                             f"at most {STREAM_IDLE_MAX_S}: the NLB closes a connection idle for {NLB_IDLE_TIMEOUT_S} s "
                             "(fixed for a TLS listener), and the client's connection is silent while an attempt is")
        if self.stream_idle_timeout_s > self.request_timeout_s:
            raise FieldError("stream_idle_timeout_s", self.stream_idle_timeout_s, f"at most request_timeout_s ({self.request_timeout_s})")
        return self


class RateLimitConfig(StrictModel):
    """Per-client limits. In the cluster: Envoy Gateway's global rate limit on Redis, keyed by the
    client id the API-key check forwards; tokens are counted by the AI Gateway (``llmRequestCosts``)."""

    enabled: bool = True
    """Per-client rate limits (one budget across every model and alias, on the gateway's Redis)."""
    # Total (input + output) tokens per client per hour; 0: no token limit.
    tokens_per_hour: Annotated[int, Field(ge=0, le=10**12)] = 2_000_000
    """Total (input + output) tokens per client per hour; 0: no token limit."""
    # Requests per client per minute; 0: no request limit.
    requests_per_minute: Annotated[int, Field(ge=0, le=10**7)] = 600
    """Requests per client per minute; 0: no request limit."""


# What a backend's answer means, for `fallback_on`, and the upstream status it arrives as: vLLM
# answers a prompt longer than the model's context with 400 (the status of every other request
# error too: Envoy's retry policy cannot read the body), an overloaded server with 429.
FALLBACK_STATUS: dict[str, int] = {"rate_limited": 429, "context_length": 400}
FallbackReason = Literal["rate_limited", "context_length"]


class LoadBalancerConfig(StrictModel):
    """The NLB in front of the Envoy proxies (AWS Load Balancer Controller).

    TLS is always on (``TlsConfig``): without ``certificate_arn`` the NLB passes TCP through on 443
    to Envoy, which terminates TLS with the certificate the chart generates; with it the NLB
    terminates TLS with the ACM certificate and opens a new TLS connection to Envoy.
    """

    # internal: reachable from the VPC (and peered networks) only.
    scheme: Literal["internal", "internet-facing"] = "internal"
    """internal: reachable from the VPC (and peered networks) only; internet-facing needs allowed_cidrs."""
    # ACM certificate (for a name clients already trust): the NLB terminates TLS on 443 with it and
    # re-encrypts to Envoy. Optional, internet-facing included: without it clients trust the gateway's CA.
    certificate_arn: str | None = None
    """An ACM certificate ARN: TLS ends at the NLB with it, re-encrypted to Envoy; unset: TLS passes through to Envoy,
    which serves the gateway's own certificate."""
    # Client CIDRs allowed through the NLB's security group; empty: the VPC's CIDR for internal
    # (the stack writes it: the AWS Load Balancer Controller v3.5.0 itself would open 0.0.0.0/0,
    # pkg/service/model_build_managed_sg.go buildCIDRsFromSourceRanges, so anything routed into the
    # VPC, peering, transit gateway, VPN, would reach 443); internet-facing must set it.
    allowed_cidrs: tuple[str, ...] = ()
    """Client CIDRs let through the NLB's security group; empty (internal only): the VPC's CIDR."""

    @field_validator("certificate_arn")
    @classmethod
    def _arn(cls, value: str | None) -> str | None:
        if value is not None and not _ACM_ARN_RE.match(value):
            raise ValueError("must be an ACM certificate ARN (arn:aws:acm:REGION:ACCOUNT:certificate/UUID)")
        return value

    @field_validator("allowed_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        import ipaddress

        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a CIDR block ({exc})") from None
        return value

    @model_validator(mode="after")
    def _public_needs_cidrs(self) -> LoadBalancerConfig:
        if self.scheme == "internet-facing" and not self.allowed_cidrs:
            raise FieldError("allowed_cidrs", [], "the client CIDRs to let in when scheme is internet-facing")
        return self


# A certificate carries at most this many names of the user's own (the NLB's wildcard comes on top).
MAX_TLS_HOSTNAMES = 20
_DNS_NAME_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _hostname_problem(name: str) -> str | None:
    """Why ``name`` cannot be a DNS name in the server certificate, or None when it can."""
    import ipaddress

    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        return "is an IP address; the certificate names DNS names only (use a DNS name that resolves to the NLB)"
    if name.endswith("."):
        return "ends with '.'; write the name without the trailing dot"
    if len(name) > 253:
        return f"is {len(name)} characters; a DNS name has at most 253"
    labels = name.split(".")
    if len(labels) < 2:
        return "has one label; give a fully qualified name such as llm.example.com"
    if labels[0] == "*":
        if len(labels) < 3:
            return "is a wildcard over a top-level domain; a wildcard needs at least two labels after '*.'"
        labels = labels[1:]
    for label in labels:
        if not _DNS_NAME_LABEL_RE.match(label):
            return (f"has label {label!r}; each label is 1-63 of a-z, 0-9 and '-', not starting or ending with '-' "
                    "(a wildcard only as the whole first label: '*.example.com')")
    return None


class TlsConfig(StrictModel):
    """HTTPS on 443, always. The project chart generates a CA and a server certificate at install
    (kept across upgrades) whose names are the NLB's (``*.elb.<region>.amazonaws.com``) plus these."""

    # Extra DNS names in the server certificate, e.g. a Route 53 alias of the NLB (llm.example.com)
    # or a wildcard ('*.llm.example.com'); matched case-insensitively, stored lowercase.
    hostnames: tuple[str, ...] = ()
    """Up to 20 more DNS names in the gateway's own certificate (a Route 53 alias of the NLB; *. wildcards); it always
    holds the NLB's and the in-cluster names."""

    @field_validator("hostnames", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        if isinstance(value, (list, tuple)):
            return tuple(v.lower() if isinstance(v, str) else v for v in value)
        return value

    @field_validator("hostnames")
    @classmethod
    def _hostnames(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            problem = _hostname_problem(name)
            if problem:
                raise ValueError(f"{name!r} {problem}")
        duplicates = sorted({n for n in value if value.count(n) > 1})
        if duplicates:
            raise ValueError(f"{duplicates} appear more than once")
        if len(value) > MAX_TLS_HOSTNAMES:
            raise ValueError(f"{len(value)} names; at most {MAX_TLS_HOSTNAMES}")
        return value


class LangfuseConfig(StrictModel):
    """Traces to Langfuse over OTLP/HTTP from the AI Gateway's external processor. Off by default."""

    enabled: bool = False
    """Send per-request traces to Langfuse over OTLP."""
    # Langfuse's OTLP endpoint (cloud EU shown; US: https://us.cloud.langfuse.com/api/public/otel,
    # self-hosted: https://<host>/api/public/otel).
    endpoint: str = "https://cloud.langfuse.com/api/public/otel"
    """Langfuse's OTLP endpoint (cloud EU by default; US: https://us.cloud.langfuse.com/api/public/otel, self-hosted:
    https://<host>/api/public/otel)."""
    # Secrets Manager secret (name) holding JSON {"public_key": "pk-lf-...", "secret_key": "sk-lf-..."}.
    secret_name: SecretName | None = None
    """Secrets Manager secret (name) holding JSON {"public_key": "pk-lf-...", "secret_key": "sk-lf-..."}."""
    # Fraction of requests traced.
    sample_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    """Fraction of requests traced."""
    # Record prompts and completions in the traces. Off: the AI Gateway redacts them
    # (OpenInference OPENINFERENCE_HIDE_INPUTS/OUTPUTS); traces keep model, tokens and latency.
    record_content: bool = False
    """Record prompts and completions in the traces; off: they are redacted, traces keep model, tokens and latency."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not re.fullmatch(r"https://[A-Za-z0-9.-]+(:\d+)?(/[A-Za-z0-9._~/-]*)?", value):
            raise ValueError("must be an https:// URL such as https://cloud.langfuse.com/api/public/otel")
        return value

    @model_validator(mode="after")
    def _needs_secret(self) -> LangfuseConfig:
        if self.enabled and self.secret_name is None:
            raise FieldError("secret_name", None, "the Secrets Manager secret with the Langfuse keys when enabled")
        return self


RoutingMode = Literal["prefix", "least_request"]
# The header the gateway's Lua filter writes the request's prefix key into (never the client's copy),
# and the one a client may send to name its conversation (it then replaces the prompt prefix as the key).
PREFIX_KEY_HEADER = "x-gennstack-prefix-key"
SESSION_HEADER = "x-gennstack-session"
# Generations whose servers can take prefix routing. gen1 (inf2) is Ray Serve behind one KubeRay
# Service: the gateway sees one host, the Serve proxy, which picks the replica itself, so hashing
# in Envoy would pick a proxy, never a replica's cache.
PREFIX_ROUTABLE = ("trn2", "g6e")


class RoutingConfig(StrictModel):
    """How a model's requests are spread over its servers (docs/gateway.md, "Prefix-aware routing").

    ``prefix``: Envoy's Maglev consistent hash with bounded load on a key the gateway computes from
    the prompt's leading messages, so a conversation's turns and requests with one long system
    prompt go to the server that already holds that prefix in its KV cache, unless that server has
    more than ``hash_balance_factor`` % of the mean in-flight requests. ``least_request``: Envoy
    Gateway's default, blind to the cache."""

    # Per generation. Default: prefix for gen3 (vLLM with its prefix cache on, 2-6 replicas);
    # least_request for gen2 (vLLM on Neuron runs with prefix caching off: nothing to route to) and
    # gen1 (one Ray Serve Service: see PREFIX_ROUTABLE).
    generations: dict[Generation, RoutingMode] = Field(
        default_factory=lambda: {"inf2": "least_request", "trn2": "least_request", "g6e": "prefix"})
    """Per generation, how the gateway picks a server: prefix (consistent hash on the prompt's leading messages, with
    bounded load) or least_request."""
    # Bytes of the prompt's text (the leading messages up to and including the first user message,
    # as decoded strings) that make the key: requests that agree on these bytes share a server.
    # 1024 bytes are ~250 tokens: a longer shared system prompt puts all its users on one server;
    # with a shorter one, each conversation is keyed by its first user message too.
    prefix_bytes: Annotated[int, Field(ge=16, le=65536)] = 1024
    """Bytes of the prompt's leading messages (up to the first user message) that make the prefix key."""
    # Envoy's consistent_hashing_lb_config.hash_balance_factor: a server with more in-flight requests
    # than this % of the mean (plus the rounding envoy_common.bounded_load_slots computes) is skipped
    # for the next one in the key's probe order. 100-1000; Envoy Gateway v1.8.3 has no field for it,
    # the chart patches it in.
    hash_balance_factor: Annotated[int, Field(ge=100, le=1000)] = 125
    """Bounded load: a server with more in-flight requests than this % of the mean is skipped for the key's next one
    (Envoy's hash_balance_factor)."""

    @field_validator("generations")
    @classmethod
    def _routable(cls, value: dict[str, str]) -> dict[str, str]:
        for generation, mode in value.items():
            if mode == "prefix" and generation not in PREFIX_ROUTABLE:
                raise ValueError(f"{generation}: prefix routing needs a server per host; {generation} (gen1) is Ray Serve "
                                 f"behind one Service, so Envoy would only pick its proxy (allowed: {list(PREFIX_ROUTABLE)})")
        return value

    def mode(self, generation: str) -> RoutingMode:
        return self.generations.get(generation, "least_request")


def _default_resume_generations() -> dict[str, bool]:
    return {generation: entry.supported for generation, entry in SERVER_SUPPORT.items()}


class ResumeSettings(StrictModel):
    """Token-exact stream resume (docs/gateway.md, "Stream resume"): the relay between the public
    Gateway and the routing Gateway continues a stream whose server died, from the next token, on
    another server of the same model. Per generation, on by default where its server supports it
    (gennstack.gateway.resume_support); the relay's bounds."""

    enabled: bool = True
    """The relay and the second, cluster-internal Gateway. False: one Gateway, as before (no resume)."""
    generations: dict[Generation, bool] = Field(default_factory=_default_resume_generations)
    """Per generation: resume its models' streams. A generation whose server lacks what a resumed stream needs
    cannot be turned on (resume_support names what is missing)."""
    harmony_models: tuple[str, ...] = ("gpt-oss-20b",)
    """Served model names whose output is Harmony (GPT-OSS: reasoning and final channels, tool calls); names not in
    models are ignored unless set here explicitly, then they must be in models."""
    replicas: Annotated[int, Field(ge=2, le=20)] = 2
    """Relay replicas, on the system (on-demand) nodes; at least 2 with a PodDisruptionBudget of 1."""
    routing_replicas: Annotated[int, Field(ge=2, le=20)] = 2
    """The routing Gateway's proxies (behind the relays), on the system nodes with a PodDisruptionBudget of 1."""
    max_attempts: Annotated[int, Field(ge=0, le=100)] = 3
    """Upstream attempts per client request after the first (each break spends one)."""
    max_replay_tokens: Annotated[int, Field(ge=1, le=10_000_000)] = 32768
    """The longest replay: prompt IDs plus generated IDs a continuation may send."""
    upstream_idle_timeout_s: Annotated[int, Field(ge=1, le=3600)] = 30
    """An upstream stream silent this long between chunks counts as broken (before its first chunk only the relay's
    deadline bounds it); below resilience.stream_idle_timeout_s, which would reset it later anyway."""

    @field_validator("generations")
    @classmethod
    def _supported(cls, value: dict[str, bool]) -> dict[str, bool]:
        for generation, on in value.items():
            entry = SERVER_SUPPORT[generation]
            if on and not entry.supported:
                raise ValueError(f"{generation}: its server ({entry.server}) cannot resume a stream: {entry.reason}")
        return value

    def on(self, generation: str) -> bool:
        """Whether ``generation``'s streams are resumed (the relay on and the generation on)."""
        return self.enabled and self.generations.get(generation, SERVER_SUPPORT[generation].supported)

    def reason_off(self, generation: str) -> str | None:
        """Why ``generation``'s streams are not resumed, or None where they are."""
        entry = SERVER_SUPPORT[generation]
        if not entry.supported:
            return f"{entry.server}: {entry.reason}"
        if not self.enabled:
            return "gateway.resume.enabled is false"
        if not self.on(generation):
            return f"gateway.resume.generations.{generation} is false"
        return None


_DEFAULT_MODELS = {
    "llama-3-70b-instruct": ModelBackend(generation="inf2", service="gen1-inf2-serve-svc"),
    "llama-4-maverick": ModelBackend(generation="trn2", service="gen2-trn2"),
    "gpt-oss-20b": ModelBackend(generation="g6e", service="gen3-g6e"),
}
_DEFAULT_ALIASES = {
    "gennstack-default": (
        AliasTarget(model="gpt-oss-20b", weight=80),
        AliasTarget(model="llama-4-maverick", weight=20),
        AliasTarget(model="llama-3-70b-instruct", priority=1),
    ),
}


def default_models() -> dict[str, ModelBackend]:
    """``gateway.models`` when the config names none."""
    return dict(_DEFAULT_MODELS)


class GatewayConfig(StrictModel):
    """The one OpenAI-compatible front door: which model names go where, and how it protects them."""

    # Namespace of the project chart (Gateway, routes, policies, Redis).
    namespace: str = "gennstack-gateway"
    """Namespace of the gateway chart (Gateway, routes, policies, Redis)."""
    # Namespace of the model servers' Services (the serving chart's).
    serving_namespace: str = "gennstack-serving"
    """Namespace of the model servers' Services (the serving chart's)."""
    models: dict[str, ModelBackend] = Field(default_factory=default_models)
    """The model names clients can ask for, each mapped to the serving Service that serves it."""
    aliases: dict[str, tuple[AliasTarget, ...]] = Field(default_factory=lambda: dict(_DEFAULT_ALIASES))
    """Model names that split or fail over across models by weight and priority (gennstack-default: 80/20 with a
    fallback)."""
    # Per model: other model names that take over, in order, when it fails (priority 1, 2, ...).
    fallbacks: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Per model: other model names that take over, in order, when it fails (priority 1, 2, ...)."""
    # Per model or alias: backend answers that also move the request to the next backend, beyond
    # connect failures, resets and retry_on_status: rate_limited (429), context_length (400).
    fallback_on: dict[str, tuple[FallbackReason, ...]] = Field(default_factory=dict)
    """Per model or alias: backend answers that also move the request on: rate_limited (429), context_length (400)."""
    resilience: ResilienceConfig = ResilienceConfig()
    rate_limit: RateLimitConfig = RateLimitConfig()
    # Largest request body (long prompts); Envoy Gateway's default of 32 KiB is far too small. 8 MiB holds
    # a 1M-token prompt of English text (about 4 MiB) with room for JSON; every proxy buffers up to this much
    # per request before any rate limit applies, so a larger limit is memory and parsing one API key can spend.
    max_request_mib: Annotated[int, Field(ge=1, le=512)] = 8
    """Largest request body in MiB; every proxy buffers up to this much per request."""
    load_balancer: LoadBalancerConfig = LoadBalancerConfig()
    # HTTPS on 443 with the chart's own CA (docs/gateway.md "Calling it").
    tls: TlsConfig = TlsConfig()
    # Secrets Manager secret (name) with the client API keys as JSON {"client-id": "key", ...}.
    # Unset: the stack creates one with a generated key for client "default".
    api_keys_secret_name: SecretName | None = None
    """Secrets Manager secret (name) with the client API keys as JSON {"client-id": "key"}; unset: the stack creates
    one with a generated key for client default."""
    langfuse: LangfuseConfig = LangfuseConfig()
    # Prefix-aware routing per generation (docs/gateway.md, "Prefix-aware routing").
    routing: RoutingConfig = RoutingConfig()
    envoy_replicas: Annotated[int, Field(ge=1, le=20)] = 2
    """Envoy proxy replicas (on the system nodes, 510m CPU each in the fit check)."""
    resume: ResumeSettings = ResumeSettings()
    """Stream resume behind the public Gateway: the relay, which generations it resumes, its bounds (docs/gateway.md, "Stream resume")."""

    @field_validator("namespace", "serving_namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL_RE.match(value):
            raise ValueError("must be a Kubernetes namespace name (lowercase letters, digits, '-')")
        return value

    @field_validator("models")
    @classmethod
    def _models(cls, value: dict[str, ModelBackend]) -> dict[str, ModelBackend]:
        if not value:
            raise ValueError("must name at least one model")
        for name in value:
            if not _MODEL_NAME_RE.match(name):
                raise ValueError(f"model name {name!r} must be 1-128 of letters, digits and ._:/-")
        return value

    @model_validator(mode="after")
    def _references(self) -> GatewayConfig:
        for alias, targets in self.aliases.items():
            if not _MODEL_NAME_RE.match(alias):
                raise FieldError(f"aliases.{alias}", alias, "1-128 of letters, digits and ._:/-")
            if alias in self.models:
                raise FieldError(f"aliases.{alias}", alias, "a name that is not also in models")
            if not targets:
                raise FieldError(f"aliases.{alias}", [], "at least one target")
            seen = [t.model for t in targets]
            for target in targets:
                if target.model not in self.models:
                    raise FieldError(f"aliases.{alias}", target.model, f"a model from models: {sorted(self.models)}")
            if len(set(seen)) != len(seen):
                raise FieldError(f"aliases.{alias}", seen, "each model at most once")
            if not any(t.weight > 0 for t in targets if t.priority == min(x.priority for x in targets)):
                raise FieldError(f"aliases.{alias}", [t.model_dump() for t in targets],
                                 "a target with weight > 0 at the lowest priority")
        for model, others in self.fallbacks.items():
            if model not in self.models:
                raise FieldError(f"fallbacks.{model}", model, f"a model from models: {sorted(self.models)}")
            for other in others:
                if other not in self.models or other == model:
                    raise FieldError(f"fallbacks.{model}", other, "another model from models")
            if len(set(others)) != len(others):
                raise FieldError(f"fallbacks.{model}", list(others), "each model at most once")
        for name, reasons in self.fallback_on.items():
            if name in self.models:
                if not self.fallbacks.get(name):
                    raise FieldError(f"fallback_on.{name}", list(reasons),
                                     f"a model with fallbacks (fallbacks.{name}) to fall back to")
            elif name in self.aliases:
                if len(self.aliases[name]) < 2:
                    raise FieldError(f"fallback_on.{name}", list(reasons), "an alias with at least two targets")
            else:
                raise FieldError(f"fallback_on.{name}", name,
                                 f"a model or alias: {sorted(self.models) + sorted(self.aliases)}")
            if not reasons or len(set(reasons)) != len(reasons):
                raise FieldError(f"fallback_on.{name}", list(reasons),
                                 f"one or more of {sorted(FALLBACK_STATUS)}, each at most once")
        self._unique_kubernetes_names()
        for name in self.resume.harmony_models if "harmony_models" in self.resume.model_fields_set else ():
            if name not in self.models:
                raise FieldError("resume.harmony_models", name, f"a model from models: {sorted(self.models)}")
        if self.resume.enabled and self.resume.upstream_idle_timeout_s >= self.resilience.stream_idle_timeout_s:
            raise FieldError("resume.upstream_idle_timeout_s", self.resume.upstream_idle_timeout_s,
                             f"less than resilience.stream_idle_timeout_s ({self.resilience.stream_idle_timeout_s}): "
                             "the relay must see a silent stream before Envoy resets it")
        if len(self.models) + len(self.aliases) > MAX_ROUTES:
            raise FieldError("aliases", len(self.models) + len(self.aliases),
                             f"at most {MAX_ROUTES} model names and aliases together (AI Gateway rules per route)")
        return self


    def _unique_kubernetes_names(self) -> None:
        """Two names that sanitize and truncate to one Kubernetes name would be rejected by the API
        server (rule names) or overwrite each other (Backends): refuse them here, naming both."""
        for key, names, to_name, what in (
            ("models", list(self.models), backend_object_name, "Backend/AIServiceBackend"),
            ("aliases", [*self.models, *self.aliases], rule_name, "AIGatewayRoute rule"),
        ):
            for k8s_name, sources in collisions(names, to_name).items():
                raise FieldError(key, sources, f"names that give distinct Kubernetes names; these all give the {what} "
                                 f"name {k8s_name!r} (lowercased, '._:/' -> '-', cut at 63 characters)")


# ---- the routing table ------------------------------------------------------------------


@dataclass(frozen=True)
class RouteBackend:
    """One backend of a route: which server, its split weight, its failover priority, and the model
    name that server serves (written into the request body when it differs from the route's)."""

    backend: str  # the serving model's name, also the AIServiceBackend/Backend name suffix
    weight: int
    priority: int
    served_model: str


@dataclass(frozen=True)
class Route:
    model: str
    backends: tuple[RouteBackend, ...]
    # "prefix" when its one priority-0 backend's generation routes by prefix (route_routing; a split
    # across models, such as the 80/20 alias, keeps least request).
    routing: RoutingMode = "least_request"


@dataclass(frozen=True)
class RoutingTable:
    """Routes in a fixed order (models first, as configured, then aliases) and the backends they use."""

    routes: tuple[Route, ...]
    backends: dict[str, ModelBackend]

    def route(self, model: str) -> Route:
        return next(r for r in self.routes if r.model == model)


def _compact(targets: list[tuple[str, int, int]]) -> tuple[RouteBackend, ...]:
    """Renumber priorities 0, 1, 2... (a disabled generation can leave a gap or an empty 0)."""
    levels = sorted({p for _, _, p in targets})
    rank = {p: i for i, p in enumerate(levels)}
    return tuple(RouteBackend(backend=m, weight=w, priority=rank[p], served_model=m) for m, w, p in targets)


def routing_table(gateway: GatewayConfig, enabled_generations: set[str] | frozenset[str] = frozenset(GENERATION_NAMES)) -> RoutingTable:
    """The routes for the models of enabled generations only.

    A model whose generation is disabled loses its route and disappears from aliases and
    fallbacks; an alias left with no target is dropped; priorities are renumbered from 0.
    """
    unknown = set(enabled_generations) - set(GENERATION_NAMES)
    if unknown:
        raise ValueError(f"unknown generation(s) {sorted(unknown)}; allowed: {list(GENERATION_NAMES)}")
    live = {name: b for name, b in gateway.models.items() if b.generation in enabled_generations}
    routes: list[Route] = []
    for model in live:
        chain = [(model, 1, 0)] + [(other, 1, i + 1) for i, other in enumerate(gateway.fallbacks.get(model, ())) if other in live]
        backends = _compact(chain)
        routes.append(Route(model=model, backends=backends, routing=route_routing(gateway, backends)))
    for alias, targets in gateway.aliases.items():
        if kept := alias_backends([(t.model, t.weight, t.priority) for t in targets], set(live)):
            routes.append(Route(model=alias, backends=kept, routing=route_routing(gateway, kept)))
    return RoutingTable(routes=tuple(routes), backends=live)


def route_routing(gateway: GatewayConfig, backends: tuple[RouteBackend, ...]) -> RoutingMode:
    """A route hashes on the prefix key when it serves from one model at priority 0 and that
    model's generation routes by prefix. A route that splits priority 0 across models (an alias)
    keeps least request: Envoy Gateway v1.8.3 builds its ConsistentHash as Maglev without
    locality_weighted_lb_config (internal/xds/translator/cluster.go), and Envoy's Maglev then
    ignores locality weights (thread_aware_lb_impl.cc normalizeWeights), which would lose the split.
    Fallback priorities (1, 2, ...) are hashed too: Maglev keeps one table per priority."""
    first = [b for b in backends if b.priority == 0]
    if len(first) != 1:
        return "least_request"
    return gateway.routing.mode(gateway.models[first[0].backend].generation)


def alias_backends(targets: list[tuple[str, int, int]], live: set[str]) -> tuple[RouteBackend, ...]:
    """An alias's (model, weight, priority) targets as routed: only models in ``live`` (those of enabled
    generations), none of weight 0 (a priority level whose weights are all 0 would serve nothing),
    priorities renumbered from 0. Empty: the alias is dropped. ``gennstack summary`` prints these."""
    return _compact([target for target in targets if target[0] in live and target[1] > 0])
