"""Helm values of the gateway's charts, built from the typed config in one place.

The construct (``gennstack_infra/components/gateway.py``) installs the charts with these values; tests call the
same functions and render the project chart with them, so what is tested is what is deployed.
"""

from __future__ import annotations

from typing import Any

from gennstack import versions
from gennstack.gateway.config import FALLBACK_STATUS, PREFIX_KEY_HEADER, GatewayConfig, RoutingTable
from gennstack.gateway.envoy_common import (AI_GATEWAY_JSON_STATUSES, CLUSTER_RETRY_AFTER_S, DNS_REFRESH_S, MAX_EJECTION_PERCENT,
                                             OVERPROVISIONING_FACTOR, RATE_LIMIT_RESET_HEADER, UNEJECT_ON_PASSING_HEALTH_CHECK,
                                             UPSTREAM_IDLE_TIMEOUT_S, UPSTREAM_MAX_CONNECTION_S,
                                             local_reply_config)
from gennstack.gateway.lua import ACCEPTED_PATHS, prefix_key_script
from gennstack.gateway.names import ENVOY_GATEWAY_NAMESPACE, GATEWAY_RELEASE, backend_host, backend_object_name, rule_name
from gennstack.network_policy import DNS_PEER, PROMETHEUS_POD_LABELS
from gennstack.observability.names import MONITORING_NAMESPACE
from gennstack.resume.config import ModelResume, ResumeConfig
from gennstack.observability.names import CLIENT_ATTRIBUTE

# Release names and namespaces of the upstream charts. The AI Gateway's extension server address
# and the Redis URL below are derived from them, so they are fixed, not configurable.
AI_GATEWAY_NAMESPACE = "envoy-ai-gateway-system"
AI_GATEWAY_CONTROLLER = "ai-gateway-controller"  # the ai-gateway-helm chart's controller.fullnameOverride
EXTERNAL_SECRETS_NAMESPACE = "external-secrets"
EXTERNAL_SECRETS_SERVICE_ACCOUNT = "external-secrets"
CLIENT_HEADER = "x-gennstack-client"
# The Secret (key `password`) External Secrets writes the Redis password to, in the chart's
# namespace (for Redis) and the proxies' (for Envoy Gateway's rate-limit service); mirrors _helpers.tpl.
REDIS_AUTH_SECRET = f"{GATEWAY_RELEASE}-redis-auth"
# New connections may still arrive this long after a proxy starts draining (the NLB deregisters it).
MIN_DRAIN_S = 30
# The labels Envoy Gateway v1.8.3 gives its rate-limit pods
# (internal/infrastructure/kubernetes/ratelimit/resource.go rateLimitLabels), the only Redis clients.
RATE_LIMIT_POD_LABELS = {"app.kubernetes.io/name": "envoy-ratelimit", "app.kubernetes.io/component": "ratelimit",
                         "app.kubernetes.io/managed-by": "envoy-gateway"}
# Envoy Gateway's rate-limit service (envoyproxy/ratelimit), when the rate limit is on.
RATE_LIMIT_REPLICAS = 2
RATE_LIMIT_MIN_AVAILABLE = 1
GATEWAY_LISTENER = "https"  # the Gateway's one listener (templates/gateway.yaml)
# The gateway's own TLS (templates/tls.yaml): object names (mirroring _helpers.tpl) and lifetimes.
TLS_SECRET = f"{GATEWAY_RELEASE}-tls"
CA_KEY_SECRET = f"{GATEWAY_RELEASE}-ca-key"
CA_CONFIGMAP = f"{GATEWAY_RELEASE}-ca"
TLS_CA_VALIDITY_DAYS = 3650
# 825 days: the longest server certificate Apple platforms accept, even from a private CA.
TLS_VALIDITY_DAYS = 825
TLS_RENEW_BEFORE_DAYS = 180
# The proxies' resolver option ndots: a name with at least this many dots is looked up as it is
# first. Every Backend host name (names.backend_host, ``<service>.<namespace>.svc.cluster.local``;
# Service and namespace names are DNS labels, without dots) has 4, so with the ClusterFirst default
# of ndots:5 each of Envoy's refreshes first tried the name under each of the pod's search domains
# (``<proxy namespace>.svc.cluster.local``, ``svc.cluster.local``, ``cluster.local`` and the VPC's,
# e.g. ``ec2.internal``): 4 NXDOMAINs before the real answer (measured with real Envoy's c-ares in
# tests/gateway/test_gateway_dns_ndots_e2e.py). Envoy Gateway v1.8.3's EnvoyProxy has no pod
# dnsConfig field; the chart sets it with envoyDeployment.patch (templates/gateway.yaml).
PROXY_DNS_NDOTS = backend_host("service", "namespace").count(".")

# How often External Secrets re-reads the gateway's secrets, so how long a revoked API key stays
# valid (plus Envoy Gateway's push of the changed Secret). A refresh reads each remote key with
# GetSecretValue ($0.05 per 10,000 calls): at 1 m, 43,200 calls and $0.22 per read per 30 days; the
# gateway has at most five (API keys, the Redis password in two namespaces, Langfuse's two keys):
# $1.08 a month at most, against $0.02 at 1 h.
SECRETS_REFRESH_INTERVAL = "1m"


# Stream resume (docs/gateway.md, "Stream resume"): the relay between the public Gateway and the routing
# Gateway. The routing Gateway's proxies are a ClusterIP Service Envoy Gateway names from the EnvoyProxy
# (envoyService.name; v1.8.3 internal/infrastructure/kubernetes/proxy/resource_provider.go Service, in its own
# namespace), listening on a plain-HTTP port >= 1024, which Envoy Gateway v1.8.3 keeps as
# the container port (internal/gatewayapi/listener.go: only ports below minEphemeralPort 1024 are shifted
# by wellKnownPortShift 10000), so one number serves the Service, the pods and the NetworkPolicies.
ROUTING_GATEWAY = f"{GATEWAY_RELEASE}-routing"
ROUTING_LISTENER = "http"
ROUTING_PORT = 8080
RESUME_RELAY = f"{GATEWAY_RELEASE}-resume"  # the relay's Deployment, Service, ConfigMap (mirrors _helpers.tpl)
RESUME_PORT = 8080
RESUME_METRICS_PORT = 9464
# Relay sizing, from benchmarks/bench_resume_relay.py (benchmarks/results/resume_relay.json; a test holds
# these at or under what it measured): one relay core streams 80,000 tokens/s (measured 80,611 per
# CPU-second, one token per chunk; 107,711 in an earlier run) and costs 5.4 ms of CPU per request of 50
# tokens (measured 5.374; 2.583 earlier), the aiohttp server and client requests included. Two replicas at
# a 250m request reserve 40,000 tokens/s (800 streams at 50 tokens/s) or about 90 new requests/s, and
# burst into the system nodes' idle CPU (no CPU limit). 250m, not more: the system nodes' room with one node
# down (gennstack/system_capacity.py) holds the relay and the routing proxies beside everything else at
# 250m. One process takes requests one after another, so a burst of N simultaneous requests waits up to N
# times the per-request cost (docs/gateway.md).
RESUME_TOKENS_PER_CORE_S = 80_000
RESUME_CPU_MS_PER_REQUEST = 5.4
RESUME_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
# The routing proxies: Envoy only (no TLS, no API-key check, no rate limit) plus the AI Gateway's sidecar.
ROUTING_PROXY_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}


def _duration(seconds: int) -> str:
    return f"{seconds}s"


def redis_url(gateway: GatewayConfig) -> str:
    """Where Envoy Gateway's rate-limit service finds the project chart's Redis."""
    return f"{GATEWAY_RELEASE}-redis.{gateway.namespace}.svc.cluster.local:6379"


def routing_upstream(namespace: str = ENVOY_GATEWAY_NAMESPACE) -> str:
    """The routing Gateway's in-cluster URL, the relay's ``--upstream``."""
    return f"http://{ROUTING_GATEWAY}.{namespace}.svc.cluster.local:{ROUTING_PORT}"


def resume_config(gateway: GatewayConfig, table: RoutingTable) -> ResumeConfig:
    """The relay's ResumeConfig for the enabled models: keyed by the name each server serves (what its
    chunks carry in ``model``), resume on where its generation's is (config.ResumeSettings.on), the
    reason where not; the whole-request deadline is the route's (resilience.request_timeout_s)."""
    r = gateway.resume
    models = {}
    for name, backend in table.backends.items():
        reason = r.reason_off(backend.generation)
        models[name] = ModelResume(resume=reason is None, harmony=name in r.harmony_models, reason_off=reason)
    return ResumeConfig(models=models, max_attempts=r.max_attempts, max_replay_tokens=r.max_replay_tokens,
                        deadline_s=float(gateway.resilience.request_timeout_s),
                        upstream_idle_timeout_s=float(r.upstream_idle_timeout_s))


def resume_config_values(config: ResumeConfig) -> dict[str, Any]:
    """The ResumeConfig as chart values: ``models`` a list of ``{name, ...}`` (helm would merge a map with
    the chart's default models; templates/resume.yaml turns it back into the map), a reason_off of None
    left out (helm drops null values; it is ResumeConfig's default)."""
    data = config.model_dump(mode="json", exclude_none=True)
    data["models"] = [{"name": name, **model} for name, model in data["models"].items()]
    return data


def resume_grace_s(gateway: GatewayConfig) -> int:
    """The relay pod's terminationGracePeriodSeconds: a stopping relay finishes its streams, the longest
    the route allows (request_timeout_s, also the relay's deadline), after the front Envoy stops sending
    it new ones (it leaves the Service once /healthz answers 503: MIN_DRAIN_S covers the endpoint update)."""
    return gateway.resilience.request_timeout_s + MIN_DRAIN_S


def resume_values(gateway: GatewayConfig, table: RoutingTable, image: str) -> dict[str, Any]:
    """The chart's ``resume`` values: the relay (image, replicas, ports, the ResumeConfig JSON) and the
    routing Gateway behind it."""
    r = gateway.resume
    return {
        "enabled": r.enabled,
        "image": image,
        "replicas": r.replicas,
        "port": RESUME_PORT,
        "metricsPort": RESUME_METRICS_PORT,
        "resources": RESUME_RESOURCES,
        "terminationGracePeriodSeconds": resume_grace_s(gateway),
        "config": resume_config_values(resume_config(gateway, table)),
        "routing": {"name": ROUTING_GATEWAY, "listener": ROUTING_LISTENER, "port": ROUTING_PORT, "replicas": r.routing_replicas,
                    "resources": ROUTING_PROXY_RESOURCES},
        "prometheus": {"namespace": MONITORING_NAMESPACE, "podLabels": dict(PROMETHEUS_POD_LABELS)},
        "dns": {"namespace": DNS_PEER["namespace"], "podLabels": dict(DNS_PEER["podLabels"])},
    }


def gateway_name() -> str:
    """Name of the Gateway, the AIGatewayRoute and the HTTPRoute generated from it."""
    return GATEWAY_RELEASE


def drain_timeout_s(gateway: GatewayConfig) -> int:
    """How long a stopping Envoy proxy keeps its streams: the longest request the route allows
    (``request_timeout_s``) plus the time new connections may still arrive while it drains."""
    return gateway.resilience.request_timeout_s + MIN_DRAIN_S


def fallback_statuses(gateway: GatewayConfig, table: RoutingTable) -> dict[str, list[int]]:
    """Per route (model name) with another backend to go to: the extra upstream statuses ``fallback_on``
    asks to retry on, in a fixed order. A route left with one backend (a disabled generation) gets none."""
    out: dict[str, list[int]] = {}
    for route in table.routes:
        reasons = gateway.fallback_on.get(route.model, ())
        if reasons and len(route.backends) > 1:
            out[route.model] = sorted(FALLBACK_STATUS[r] for r in reasons)
    return out


def nlb_dns_wildcard(region: str, url_suffix: str = "amazonaws.com") -> str:
    """The one name that covers every NLB the Load Balancer Controller can make in ``region``:
    NLB DNS names are ``<name>-<id>.elb.<region>.<suffix>`` with ``<name>-<id>`` one label."""
    return f"*.elb.{region}.{url_suffix}"


def in_cluster_dns_wildcard() -> str:
    """The name pods use for the proxies' Service, which Envoy Gateway makes in its own namespace
    (``envoy-<namespace>-<gateway>-<hash>``): the wildcard covers any Service name there."""
    return f"*.{ENVOY_GATEWAY_NAMESPACE}.svc.cluster.local"


def tls_dns_names(gateway: GatewayConfig, *, region: str, url_suffix: str = "amazonaws.com") -> list[str]:
    """Names of the gateway's server certificate: the NLB's wildcard, the proxies' in-cluster
    Service name, then ``gateway.tls.hostnames``."""
    return [nlb_dns_wildcard(region, url_suffix), in_cluster_dns_wildcard(), *gateway.tls.hostnames]


def allowed_cidrs(gateway: GatewayConfig, vpc_cidr: str) -> list[str]:
    """The NLB's client CIDRs (the proxies' Service's loadBalancerSourceRanges): the config's, or for
    an internal NLB without any, the VPC's CIDR. Never empty for an internal NLB: AWS Load Balancer
    Controller v3.5.0 turns empty source ranges into 0.0.0.0/0 (pkg/service/model_build_managed_sg.go,
    buildCIDRsFromSourceRanges), not "the VPC"."""
    lb = gateway.load_balancer
    if lb.allowed_cidrs:
        return list(lb.allowed_cidrs)
    if lb.scheme == "internal":
        if not vpc_cidr:
            raise ValueError("gateway.load_balancer.allowed_cidrs is empty and no VPC CIDR was given: an internal NLB "
                             "would let 0.0.0.0/0 in (pass vpc_cidr, or set allowed_cidrs)")
        return [vpc_cidr]
    return []


def gateway_chart_values(gateway: GatewayConfig, table: RoutingTable, *, region: str,
                         api_keys_secret_name: str, redis_secret_name: str = "", url_suffix: str = "amazonaws.com",
                         vpc_cidr: str = "10.0.0.0/16",  # the CDK ec2.Vpc default; the construct passes its VPC's
                         system_node_selector: dict[str, str] | None = None,
                         system_tolerations: list[dict[str, str]] | None = None,
                         network_policies: bool = True, resume_image: str = "") -> dict[str, Any]:
    """Values of ``assets/charts/gennstack-gateway`` for the routing table of enabled models.

    ``region``, ``api_keys_secret_name``, ``redis_secret_name`` and ``url_suffix`` (the partition's
    DNS suffix) may be CDK tokens; they are names, never secret values. ``redis_secret_name`` is
    required when the rate limit is on. ``vpc_cidr`` (the VPC's CIDR, may be a token) is the internal
    NLB's client range when ``allowed_cidrs`` is empty. ``network_policies``: the namespace's
    default-deny NetworkPolicy (``cluster.network_policies``). ``resume_image``: the relay's image (the
    construct's DockerImageAsset; may be a token), required while ``gateway.resume.enabled``.
    """
    resilience = gateway.resilience
    lb = gateway.load_balancer
    langfuse = gateway.langfuse
    extra_status = fallback_statuses(gateway, table)
    return {
        "gateway": {
            "name": gateway_name(),
            "className": "gennstack",
            "proxyNamespace": ENVOY_GATEWAY_NAMESPACE,
            "replicas": gateway.envoy_replicas,
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
            "drainTimeout": _duration(drain_timeout_s(gateway)),
            "minDrainDuration": _duration(MIN_DRAIN_S),
            "dnsNdots": PROXY_DNS_NDOTS,
            "loadBalancer": {
                "scheme": lb.scheme,
                "certificateArn": lb.certificate_arn or "",
                "allowedCidrs": allowed_cidrs(gateway, vpc_cidr),
            },
            "tls": {
                "dnsNames": tls_dns_names(gateway, region=region, url_suffix=url_suffix),
                "caValidityDays": TLS_CA_VALIDITY_DAYS,
                "validityDays": TLS_VALIDITY_DAYS,
                "renewBeforeDays": TLS_RENEW_BEFORE_DAYS,
            },
        },
        "backends": [
            {
                "name": name,
                "objectName": backend_object_name(name),
                "host": backend_host(backend.service, gateway.serving_namespace),
                "port": backend.port,
            }
            for name, backend in table.backends.items()
        ],
        "routes": [
            {
                "model": route.model,
                "ruleName": rule_name(route.model),
                "backends": [
                    {
                        "name": b.backend,
                        "objectName": backend_object_name(b.backend),
                        "weight": b.weight,
                        "priority": b.priority,
                        "modelNameOverride": b.served_model if b.served_model != route.model else "",
                    }
                    for b in route.backends
                ],
                **({"fallbackOnStatus": extra_status[route.model]} if route.model in extra_status else {}),
                **({"prefixRouting": True} if route.routing == "prefix" else {}),
            }
            for route in table.routes
        ],
        "resilience": {
            "retries": resilience.retries,
            "attemptsPerPriority": resilience.attempts_per_priority,
            "retryOnStatus": list(resilience.retry_on_status),
            "requestTimeout": _duration(resilience.request_timeout_s),
            "streamIdleTimeout": _duration(resilience.stream_idle_timeout_s),
            "dnsRefresh": _duration(DNS_REFRESH_S),
            "maxConnectionDuration": _duration(UPSTREAM_MAX_CONNECTION_S),
            "upstreamIdleTimeout": _duration(UPSTREAM_IDLE_TIMEOUT_S),
            "healthCheck": {
                "path": resilience.health_path,
                "interval": _duration(resilience.health_interval_s),
                "unhealthyThreshold": resilience.unhealthy_threshold,
                "healthyThreshold": resilience.healthy_threshold,
            },
            "outlier": {
                "consecutive5xx": resilience.consecutive_5xx,
                "consecutiveGatewayErrors": resilience.consecutive_gateway_errors,
                "consecutiveLocalOriginFailures": resilience.consecutive_local_origin_failures,
                "baseEjectionTime": _duration(resilience.base_ejection_time_s),
                "maxEjectionPercent": MAX_EJECTION_PERCENT,
            },
        },
        "bufferLimit": f"{gateway.max_request_mib}Mi",
        "rateLimit": {
            "enabled": gateway.rate_limit.enabled,
            "clientHeader": CLIENT_HEADER,
            "tokensPerHour": gateway.rate_limit.tokens_per_hour,
            "requestsPerMinute": gateway.rate_limit.requests_per_minute,
        },
        "secrets": {"region": region, "refreshInterval": SECRETS_REFRESH_INTERVAL},
        "apiKeys": {"remoteSecretName": api_keys_secret_name},
        "langfuse": {
            "enabled": langfuse.enabled,
            "endpoint": langfuse.endpoint,
            "remoteSecretName": langfuse.secret_name or "",
            "sampleRatio": str(langfuse.sample_ratio),
            "recordContent": langfuse.record_content,
        },
        "redis": {
            "image": versions.REDIS_ALPINE_IMAGE,
            "remoteSecretName": redis_secret_name,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        },
        "networkPolicy": {"enabled": network_policies},
        "nodeSelector": dict(system_node_selector or {}),
        "tolerations": list(system_tolerations or []),
        "envoyPatches": envoy_patch_values(),
        "prefixRouting": prefix_routing_values(gateway, table),
        "resume": resume_values(gateway, table, resume_image),
    }


def prefix_routing_values(gateway: GatewayConfig, table: RoutingTable) -> dict[str, Any]:
    """The prefix key's Lua (an EnvoyExtensionPolicy on the Gateway: templates/prefix-routing.yaml) for the
    routes with prefix routing, the header those rules hash on, and the bounded load the EnvoyPatchPolicy
    writes into their Maglev (docs/gateway.md, "Prefix-aware routing")."""
    routing = gateway.routing
    prefix_models = tuple(r.model for r in table.routes if r.routing == "prefix")
    return {"keyHeader": PREFIX_KEY_HEADER, "hashBalanceFactor": routing.hash_balance_factor,
            "lua": prefix_key_script(routing.prefix_bytes, ACCEPTED_PATHS, prefix_models)}


def envoy_patch_values() -> dict[str, Any]:
    """What templates/patches.yaml writes into Envoy's xDS: the same overprovisioning factor and
    local reply config as the local gateway (gennstack/gateway/envoy_common.py)."""
    return {
        "overprovisioningFactor": OVERPROVISIONING_FACTOR,
        "unejectOnPassingHealthCheck": UNEJECT_ON_PASSING_HEALTH_CHECK,
        "listener": GATEWAY_LISTENER,
        "localReplyConfig": local_reply_config(CLUSTER_RETRY_AFTER_S, passthrough=AI_GATEWAY_JSON_STATUSES,
                                               retry_after_from=RATE_LIMIT_RESET_HEADER),
    }


# AWS Load Balancer Controller v3.5.0 (docs/deploy/pod_readiness_gate.md; the chart's mpod.elbv2.k8s.aws
# webhook selects namespaces with this label, failurePolicy Ignore by default): a pod created in such a
# namespace, while a Service selects it, gets a readiness gate that holds it NotReady until the NLB's
# target group reports it healthy. So a rollout of the Envoy proxies (2 replicas, PDB minAvailable 1,
# NLB target type ip) never leaves the NLB without a healthy target. Envoy Gateway v1.8.3 creates the
# proxies' Deployment before their Service (internal/infrastructure/kubernetes/infra.go createOrUpdate),
# so the very first pods may start without the gate; every later one has it.
POD_READINESS_GATE_LABEL = {"elbv2.k8s.aws/pod-readiness-gate-inject": "enabled"}


def envoy_gateway_namespace() -> dict[str, Any]:
    """The proxies' namespace, created before the Envoy Gateway chart, with the readiness-gate label."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ENVOY_GATEWAY_NAMESPACE, "labels": dict(POD_READINESS_GATE_LABEL)}}


def envoy_gateway_values(gateway: GatewayConfig, *, system_node_selector: dict[str, str] | None = None,
                         system_tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Envoy Gateway (gateway-helm) with what the AI Gateway needs: the Backend API, the extension
    manager pointed at the AI Gateway controller, and the global rate limit on Redis."""
    envoy_gateway: dict[str, Any] = {
        "gateway": {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"},
        "provider": {"type": "Kubernetes"},
        "logging": {"level": {"default": "info"}},
        "extensionApis": {"enableEnvoyPatchPolicy": True, "enableBackend": True},
        "extensionManager": {
            "hooks": {"xdsTranslator": {
                "translation": {"listener": {"includeAll": True}, "route": {"includeAll": True},
                                "cluster": {"includeAll": True}, "secret": {"includeAll": True}},
                "post": ["Translation", "Cluster", "Route"],
            }},
            "service": {"fqdn": {
                "hostname": f"{AI_GATEWAY_CONTROLLER}.{AI_GATEWAY_NAMESPACE}.svc.cluster.local",
                "port": 1063,
            }},
        },
    }
    if gateway.rate_limit.enabled:
        envoy_gateway["rateLimit"] = {"backend": {"type": "Redis", "redis": {"url": redis_url(gateway)}}}
        # The rate-limit service (envoyproxy/ratelimit) authenticates to Redis with REDIS_AUTH; Envoy
        # Gateway v1.8.3 adds rateLimitDeployment.container.env to the ones it sets.
        # Two replicas and a PodDisruptionBudget: with one replica, a drained system node or a rollout
        # leaves the proxies without a rate-limit service, and Envoy Gateway's filter fails open
        # (every request let through uncounted). Envoy Gateway v1.8.3 leaves the Deployment's replicas
        # unset (1) and makes no PDB unless rateLimitPDB is given
        # (internal/infrastructure/kubernetes/ratelimit/resource_provider.go Deployment, PodDisruptionBudget).
        envoy_gateway["provider"]["kubernetes"] = {
            "rateLimitDeployment": {
                "replicas": RATE_LIMIT_REPLICAS,
                "container": {"env": [{"name": "REDIS_AUTH", "valueFrom": {
                    "secretKeyRef": {"name": REDIS_AUTH_SECRET, "key": "password"}}}]},
                "pod": {"nodeSelector": dict(system_node_selector or {}), "tolerations": list(system_tolerations or []),
                        # one per system node where there is room (a drained node takes one of them)
                        "topologySpreadConstraints": [{
                            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": dict(RATE_LIMIT_POD_LABELS)}}]},
            },
            "rateLimitPDB": {"minAvailable": RATE_LIMIT_MIN_AVAILABLE},
        }
    return {
        "config": {"envoyGateway": envoy_gateway},
        "deployment": {"replicas": 2, "pod": {"nodeSelector": dict(system_node_selector or {}),
                                              "tolerations": list(system_tolerations or [])}},
        "podDisruptionBudget": {"minAvailable": 1},
    }


def ai_gateway_values(*, system_node_selector: dict[str, str] | None = None,
                      system_tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Envoy AI Gateway (ai-gateway-helm): the controller that is Envoy Gateway's extension server.

    Its GenAI metrics (the ext_proc sidecar's ``:1064/metrics``) carry the client id the API-key
    check forwards, as the ``gennstack.client_id`` attribute (the ``gennstack_client_id`` label)."""
    return {
        "controller": {
            "fullnameOverride": AI_GATEWAY_CONTROLLER,
            "metricsRequestHeaderAttributes": f"{CLIENT_HEADER}:{CLIENT_ATTRIBUTE}",
            "replicaCount": 2,
            "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
            "nodeSelector": dict(system_node_selector or {}),
            "tolerations": list(system_tolerations or []),
        },
        "envoyGateway": {"namespace": ENVOY_GATEWAY_NAMESPACE},
    }


def external_secrets_values(*, system_node_selector: dict[str, str] | None = None,
                            system_tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """External Secrets Operator: its controller's service account gets the Pod Identity role.

    No namespaced SecretStore is ever usable. One with an ``aws`` provider and no ``auth`` gets the
    SDK's default credentials, which are the controller's own (external-secrets v2.9.0
    providers/v1/aws/auth/auth.go ``constructCredsProvider``: no JWT or secretRef auth -> nil, and
    ``New`` loads the default config), so anyone who may create a SecretStore in any namespace could
    read every secret the role may (the gateway's API keys). ``processSecretStore: false`` (chart
    2.9.0 values.yaml; ``--enable-secret-store-reconciler=false`` in templates/deployment.yaml) leaves
    SecretStores without a Ready condition, and the client manager refuses a store that is not Ready
    while the flood gate is on (pkg/controllers/secretstore/client_manager.go ``Get`` ->
    ``assertStoreIsUsable``; ``--enable-flood-gate`` defaults to true in cmd/controller/root.go).
    The aggregated edit/admin ClusterRoles the chart adds grant ``secretstores`` but not
    ``secretstores/status`` (templates/rbac.yaml), so a namespace editor cannot set Ready itself.
    GenNStack's stores are ClusterSecretStores whose ``conditions`` name the namespaces they serve
    (the project's docs/guides/security-best-practices.md, "Configure ClusterSecretStore match
    conditions"). The SecretStore CRD stays installed: the cert controller's ``--crd-names`` still
    lists it unless ClusterSecretStores are off (templates/cert-controller-deployment.yaml)."""
    system = {"nodeSelector": dict(system_node_selector or {}), "tolerations": list(system_tolerations or [])}
    return {
        "installCRDs": True,
        "processSecretStore": False,
        "serviceAccount": {"create": False, "name": EXTERNAL_SECRETS_SERVICE_ACCOUNT},
        **system,
        "webhook": {**system},
        "certController": {**system},
    }
