"""Upstream connections have a bounded life, so a draining gen1 pod's Serve proxy stops getting requests.

gen1-inf2's backend is one ClusterIP Service (KubeRay's gen1-inf2-serve-svc) in front of every
worker's Serve proxy (proxy_location EveryNode). A draining pod's proxy answers /-/healthz 503 (Ray
2.60.0 python/ray/serve/_private/proxy.py _get_health_or_routes_reponse), so its readiness probe
takes it out of the Service, but Envoy's pooled keep-alive connections to the ClusterIP stay on it
(kube-proxy picks the endpoint per connection), and Ray counts the proxy drained only with no
ongoing requests after at least PROXY_MIN_DRAINING_PERIOD_S (proxy.py is_drained,
serve/_private/constants.py): with steady traffic the node never drained and the pod's SIGKILL cut
every stream through it. With max_connection_duration (BackendTrafficPolicy
timeout.http.maxConnectionDuration -> the cluster's common_http_protocol_options, Envoy Gateway
v1.8.3 internal/xds/translator/cluster.go; the same field in the local gateway) Envoy stops
sending on a connection once it is that old and closes it after its streams end (Envoy counts
upstream_cx_max_duration_reached), so new requests open new connections, which go to ready pods.

Asserted: what Envoy's admin /stats and the mock server's /stats report, and the rendered values;
the stream's length only has to exceed the lifetime (no wall-clock assertion).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig
from gennstack.gateway.envoy_common import UPSTREAM_MAX_CONNECTION_S
from gennstack.gateway.values import gateway_chart_values
from tests.gateway.conftest import start_local_gateway

pytestmark = [pytest.mark.slow]

MODEL = "llama-3-70b-instruct"
ITL_S = 0.05
# A stream that outlives one connection lifetime by half.
TOKENS = int(UPSTREAM_MAX_CONNECTION_S * 1.5 / ITL_S)


def _stream(base_url: str) -> tuple[int, bytes]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "write"}], "max_tokens": TOKENS, "stream": True}
    request = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return resp.status, resp.read()


def test_a_connection_past_its_lifetime_finishes_its_stream_and_the_next_request_opens_a_new_one(mock_backends) -> None:
    server = mock_backends("--ttft", "0.05", "--itl", str(ITL_S))
    gateway = GatewayConfig.model_validate(frozen({
        "models": {MODEL: {"generation": "inf2", "service": "gen1-inf2-serve-svc"}}, "aliases": {}, "fallbacks": {},
        "resilience": {"health_interval_s": 1}}))
    with start_local_gateway(gateway, {MODEL: [server.base_url]}, rate_limit_requests=0) as gw:
        status, body = _stream(gw.base_url)
        after = _stream(gw.base_url)
        stats = {k.removeprefix("cluster.route-0."): v for k, v in gw.stats("cluster.route-0.").items()}
        served = server.stats()
    # The long stream was not cut: every chunk and the end marker came, and the server finished it.
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]"), body[-300:]
    assert after[0] == 200
    assert served["completed_streams"] == 2 and served["streams_in_flight"] == 0
    assert served["tokens_sent"] >= 2 * TOKENS
    assert served["chat_requests"] == 2  # nothing retried
    # Envoy retired the connection that outlived its lifetime, and the next request took a new one.
    assert stats["upstream_cx_max_duration_reached"] >= 1, stats
    assert stats["upstream_cx_total"] >= 2, stats
    assert stats.get("upstream_rq_retry", 0) == 0


def test_the_cluster_sets_the_same_lifetime_and_it_fits_the_drain_budget() -> None:
    """The gateway chart's BackendTrafficPolicy gets the lifetime, and a draining gen1 pod leaves
    every Envoy connection within its drain: readiness (the worker's /-/healthz probe, period x
    failures) + the lifetime + Ray Serve's minimum proxy draining period, inside the drain deadline
    (the serving chart's graceful_shutdown_timeout_s, which files/ray_drain.py gives Ray)."""
    import yaml

    from gennstack.config import load_config
    from gennstack.gateway.config import routing_table
    from tests import helm
    from tests.serving.conftest import CHART as SERVING_CHART, NAMESPACE, cdk_values
    from tests.support import ROOT

    gateway = load_config({}).gateway
    from tests.gateway.conftest import RELAY_IMAGE

    values = gateway_chart_values(gateway, routing_table(gateway), region="eu-west-1", api_keys_secret_name="keys",
                                  redis_secret_name="redis", resume_image=RELAY_IMAGE)
    assert values["resilience"]["maxConnectionDuration"] == f"{UPSTREAM_MAX_CONNECTION_S}s"
    policies = [o for o in helm.render(ROOT / "assets" / "charts" / "gennstack-gateway", values, namespace="gennstack-gateway")
                if o["kind"] == "BackendTrafficPolicy" and "retry" in o["spec"]]
    assert policies and all(p["spec"]["timeout"]["http"]["maxConnectionDuration"] == f"{UPSTREAM_MAX_CONNECTION_S}s"
                            for p in policies)

    from ray.serve._private.constants import PROXY_MIN_DRAINING_PERIOD_S

    service = next(o for o in helm.render(SERVING_CHART, cdk_values(), namespace=NAMESPACE) if o["kind"] == "RayService")
    deadline = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"][0]["deployments"][0]["graceful_shutdown_timeout_s"]
    worker = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    readiness = worker["readinessProbe"]
    assert readiness["httpGet"]["path"] == "/-/healthz"
    leaves_service_s = readiness["periodSeconds"] * readiness["failureThreshold"]
    assert leaves_service_s + UPSTREAM_MAX_CONNECTION_S + PROXY_MIN_DRAINING_PERIOD_S < deadline
