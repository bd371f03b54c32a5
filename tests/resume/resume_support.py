"""The local gateway with the resume relay between its two Envoy halves, on mock replicas (tests only)."""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from gennstack.bench.mockserver import MockProcess, start_process
from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.demo import free_ports
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap
from gennstack.resume.local import RelayProcess, local_resume_config

MODEL = "llama-3-70b-instruct"
SLOW = ("--ttft", "0.02", "--itl", "0.02")


@dataclass
class Stack:
    replicas: list[MockProcess]
    relay: RelayProcess | None
    gateway: LocalGateway

    @property
    def base_url(self) -> str:
        return self.gateway.base_url

    def replica_at(self, host_port: str) -> MockProcess:
        return next(r for r in self.replicas if f"{r.host}:{r.port}" == host_port)


@contextmanager
def resume_stack(replicas: int = 2, *, flags: tuple[str, ...] = SLOW, resume: bool = True, resume_data: dict | None = None,
                 api_keys: tuple[tuple[str, str], ...] = (), rate_limit: int = 0, gateway_overrides: dict | None = None
                 ) -> Iterator[Stack]:
    """``replicas`` mock servers of MODEL behind the local gateway; with ``resume``, the relay between
    the front listener and the routing listener (gateway local's topology)."""
    servers: list[MockProcess] = []
    relay = None
    gateway = None
    try:
        servers = [start_process(*flags) for _ in range(replicas)]
        config = GatewayConfig.model_validate(frozen(gateway_overrides or {}))
        table = routing_table(config)
        endpoints = {MODEL: [s.base_url for s in servers]}
        first = free_ports(3)
        relay_port, routing_port, metrics_port = first, first + 1, first + 2
        extra = {}
        if resume:
            relay = RelayProcess.start(local_resume_config([MODEL], resume_data), port=relay_port,
                                       upstream=f"http://127.0.0.1:{routing_port}", metrics_port=metrics_port)
            extra = {"resume_relay_port": relay_port, "routing_port": routing_port}
        bootstrap = envoy_bootstrap(table, endpoints, config, LocalSettings(
            listen_port=0, admin_port=0, api_keys=api_keys, rate_limit_requests=rate_limit, rate_limit_interval_s=60.0, **extra))
        gateway = LocalGateway.start(bootstrap)
        gateway.wait_healthy()
        yield Stack(servers, relay, gateway)
    finally:
        if gateway is not None:
            gateway.stop()
        if relay is not None:
            relay.kill()
        for server in servers:
            server.stop()


def reference(kind: str, body: dict, flags: tuple[str, ...] = ("--ttft", "0", "--itl", "0")) -> dict:
    """The uninterrupted answer of an untouched replica (token mode, as the relay asks), non-streaming."""
    server = start_process(*flags)
    try:
        path = "/chat/completions" if kind == "chat" else "/completions"
        request = urllib.request.Request(server.base_url + path, data=json.dumps(
            {**body, "stream": False, "return_token_ids": True}).encode(), headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.loads(resp.read())
    finally:
        server.stop()


def reference_text(kind: str, body: dict) -> str:
    choice = reference(kind, body)["choices"][0]
    return choice["message"]["content"] if kind == "chat" else choice["text"]


def wait_streaming(replicas: list[MockProcess], timeout_s: float = 10.0) -> MockProcess:
    """The replica with a stream in flight (for a non-streaming client, whose bytes one cannot watch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for replica in replicas:
            try:
                if replica.stats()["streams_in_flight"]:
                    return replica
            except OSError:
                pass
        time.sleep(0.02)
    raise TimeoutError("no replica began a stream")
