"""Helm values of the gateway's charts, built from the typed config in one place.

The construct (``constructs/gateway.py``) installs the charts with these values; tests call the
same functions and render the project chart with them, so what is tested is what is deployed.
"""

from __future__ import annotations

import re
from typing import Any

from gennstack.gateway.config import GatewayConfig, RoutingTable

# Release names and namespaces of the upstream charts. The AI Gateway's extension server address
# and the Redis URL below are derived from them, so they are fixed, not configurable.
ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"
AI_GATEWAY_NAMESPACE = "envoy-ai-gateway-system"
AI_GATEWAY_CONTROLLER = "ai-gateway-controller"  # the ai-gateway-helm chart's controller.fullnameOverride
EXTERNAL_SECRETS_NAMESPACE = "external-secrets"
EXTERNAL_SECRETS_SERVICE_ACCOUNT = "external-secrets"
GATEWAY_RELEASE = "gennstack-gateway"  # the project chart's release; its fullname is the same
CLIENT_HEADER = "x-gennstack-client"
# The gateway's own TLS (templates/tls.yaml): object names (mirroring _helpers.tpl) and lifetimes.
TLS_SECRET = f"{GATEWAY_RELEASE}-tls"
CA_KEY_SECRET = f"{GATEWAY_RELEASE}-ca-key"
CA_CONFIGMAP = f"{GATEWAY_RELEASE}-ca"
TLS_CA_VALIDITY_DAYS = 3650
# 825 days: the longest server certificate Apple platforms accept, even from a private CA.
TLS_VALIDITY_DAYS = 825
TLS_RENEW_BEFORE_DAYS = 180


def _duration(seconds: int) -> str:
    return f"{seconds}s"


def redis_url(gateway: GatewayConfig) -> str:
    """Where Envoy Gateway's rate-limit service finds the project chart's Redis."""
    return f"{GATEWAY_RELEASE}-redis.{gateway.namespace}.svc.cluster.local:6379"


def gateway_name() -> str:
    """Name of the Gateway, the AIGatewayRoute and the HTTPRoute generated from it."""
    return GATEWAY_RELEASE


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


def backend_object_name(backend: str) -> str:
    """Name the chart gives a backend's Backend and AIServiceBackend (mirrors _helpers.tpl)."""
    return f"{GATEWAY_RELEASE}-{re.sub(r'[._:/]', '-', backend.lower())}"[:63].rstrip("-")


def gateway_chart_values(gateway: GatewayConfig, table: RoutingTable, *, region: str,
                         api_keys_secret_name: str, url_suffix: str = "amazonaws.com",
                         system_node_selector: dict[str, str] | None = None,
                         system_tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Values of ``assets/charts/gennstack-gateway`` for the routing table of enabled models.

    ``region``, ``api_keys_secret_name`` and ``url_suffix`` (the partition's DNS suffix) may be CDK
    tokens; they are names, never secret values.
    """
    resilience = gateway.resilience
    lb = gateway.load_balancer
    langfuse = gateway.langfuse
    return {
        "gateway": {
            "name": gateway_name(),
            "className": "gennstack",
            "proxyNamespace": ENVOY_GATEWAY_NAMESPACE,
            "replicas": gateway.envoy_replicas,
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
            "loadBalancer": {
                "scheme": lb.scheme,
                "certificateArn": lb.certificate_arn or "",
                "allowedCidrs": list(lb.allowed_cidrs),
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
                "host": f"{backend.service}.{gateway.serving_namespace}.svc.cluster.local",
                "port": backend.port,
            }
            for name, backend in table.backends.items()
        ],
        "routes": [
            {
                "model": route.model,
                "backends": [
                    {
                        "name": b.backend,
                        "weight": b.weight,
                        "priority": b.priority,
                        "modelNameOverride": b.served_model if b.served_model != route.model else "",
                    }
                    for b in route.backends
                ],
            }
            for route in table.routes
        ],
        "resilience": {
            "retries": resilience.retries,
            "attemptsPerPriority": resilience.attempts_per_priority,
            "retryOnStatus": list(resilience.retry_on_status),
            "requestTimeout": _duration(resilience.request_timeout_s),
            "streamIdleTimeout": _duration(resilience.stream_idle_timeout_s),
            "healthCheck": {
                "path": resilience.health_path,
                "interval": _duration(resilience.health_interval_s),
                "unhealthyThreshold": resilience.unhealthy_threshold,
                "healthyThreshold": resilience.healthy_threshold,
            },
            "outlier": {
                "consecutive5xx": resilience.consecutive_5xx,
                "consecutiveGatewayErrors": resilience.consecutive_gateway_errors,
                "baseEjectionTime": _duration(resilience.base_ejection_time_s),
            },
        },
        "bufferLimit": f"{gateway.max_request_mib}Mi",
        "rateLimit": {
            "enabled": gateway.rate_limit.enabled,
            "clientHeader": CLIENT_HEADER,
            "tokensPerHour": gateway.rate_limit.tokens_per_hour,
            "requestsPerMinute": gateway.rate_limit.requests_per_minute,
        },
        "secrets": {"region": region, "refreshInterval": "1h"},
        "apiKeys": {"remoteSecretName": api_keys_secret_name},
        "langfuse": {
            "enabled": langfuse.enabled,
            "endpoint": langfuse.endpoint,
            "remoteSecretName": langfuse.secret_name or "",
            "sampleRatio": str(langfuse.sample_ratio),
        },
        "redis": {
            "image": "docker.io/library/redis:7.4.2-alpine",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        },
        "nodeSelector": dict(system_node_selector or {}),
        "tolerations": list(system_tolerations or []),
    }


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
    return {
        "config": {"envoyGateway": envoy_gateway},
        "deployment": {"replicas": 2, "pod": {"nodeSelector": dict(system_node_selector or {}),
                                              "tolerations": list(system_tolerations or [])}},
        "podDisruptionBudget": {"minAvailable": 1},
    }


def ai_gateway_values(*, system_node_selector: dict[str, str] | None = None,
                      system_tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Envoy AI Gateway (ai-gateway-helm): the controller that is Envoy Gateway's extension server."""
    return {
        "controller": {
            "fullnameOverride": AI_GATEWAY_CONTROLLER,
            "replicaCount": 2,
            "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
            "nodeSelector": dict(system_node_selector or {}),
            "tolerations": list(system_tolerations or []),
        },
        "envoyGateway": {"namespace": ENVOY_GATEWAY_NAMESPACE},
    }


def external_secrets_values(*, system_node_selector: dict[str, str] | None = None,
                            system_tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """External Secrets Operator: its controller's service account gets the Pod Identity role."""
    system = {"nodeSelector": dict(system_node_selector or {}), "tolerations": list(system_tolerations or [])}
    return {
        "installCRDs": True,
        "serviceAccount": {"create": False, "name": EXTERNAL_SECRETS_SERVICE_ACCOUNT},
        **system,
        "webhook": {**system},
        "certController": {**system},
    }
