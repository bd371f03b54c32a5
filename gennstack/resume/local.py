"""The resume relay on this machine: its own process beside the local gateway's Envoy.

Its own process (``gennstack resume serve``), not a thread of the CLI: the same program as the cluster's
relay Deployment, with its own event loop (the CLI's waiting never delays a chunk), and killable on its own
(a relay that dies breaks its streams: the drill and docs/gateway.md say so).
"""

from __future__ import annotations

import collections
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gennstack.bench.mockserver import MockProcess, start_process
from gennstack.config_base import frozen
from gennstack.resume.config import ModelResume, ResumeConfig

MODEL = "llama-3-70b-instruct"
SLOW = ("--ttft", "0.02", "--itl", "0.02")


def local_resume_config(served_models: Iterable[str], data: dict | None = None) -> ResumeConfig:
    """The local gateway's relay config: every served model resumed (harmony off), under the
    ``resume:`` section of ``gateway local --file`` (a ResumeConfig; its models override these)."""
    data = dict(data or {})
    models = {name: ModelResume().model_dump() for name in served_models}
    models.update(data.pop("models", None) or {})
    return ResumeConfig.from_data({**data, "models": models}, source="resume")


@dataclass
class RelayProcess:
    proc: subprocess.Popen
    base_url: str
    workdir: Path
    metrics_url: str | None = None
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))

    @classmethod
    def start(cls, config: ResumeConfig, *, port: int, upstream: str, metrics_port: int | None = None,
              ready_timeout_s: float = 30.0) -> RelayProcess:
        workdir = Path(tempfile.mkdtemp(prefix="gennstack-resume-"))
        config_path = workdir / "resume.json"
        config_path.write_text(config.to_json(), encoding="utf-8")
        command = [sys.executable, "-m", "gennstack.cli", "resume", "serve", "--listen", f"127.0.0.1:{port}",
                   "--upstream", upstream, "--config", str(config_path)]
        if metrics_port is not None:
            command += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        relay = cls(proc, f"http://127.0.0.1:{port}", workdir,
                    f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port is not None else None)
        threading.Thread(target=relay._read, daemon=True).start()
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                time.sleep(0.2)
                raise RuntimeError(f"the resume relay exited with {proc.returncode}: {' '.join(relay.output)}")
            try:
                with urllib.request.urlopen(relay.base_url + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return relay
            except OSError:
                time.sleep(0.1)
        relay.kill()
        raise TimeoutError(f"the resume relay did not answer /healthz in {ready_timeout_s}s: {' '.join(relay.output)}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip("\n"))

    def metrics(self) -> dict[str, float]:
        """Its metrics, ``name{labels}`` -> value (needs a metrics port)."""
        assert self.metrics_url is not None
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            text = resp.read().decode()
        values = {}
        for line in text.splitlines():
            match = re.match(r"^(gennstack_resume_\w+(?:\{[^}]*\})?) (\S+)$", line)
            if match and not match.group(1).split("{")[0].endswith("_created"):
                values[match.group(1)] = float(match.group(2))
        return values

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM: it finishes its streams and exits; its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> RelayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Stack:
    """Mock replicas of MODEL behind the local gateway, the relay between its halves (none with resume off)."""

    replicas: list[MockProcess]
    relay: RelayProcess | None
    gateway: Any

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
    from gennstack.gateway.config import GatewayConfig, routing_table
    from gennstack.gateway.ports import free_ports
    from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap

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


def metric(values: dict[str, float], name: str, **labels: str) -> float:
    """One metric's value from :meth:`RelayProcess.metrics` (0 when absent)."""
    if labels:
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    else:
        key = name
    return values.get(key, 0.0)


def dumps(config: ResumeConfig) -> str:
    return json.dumps(json.loads(config.to_json()), sort_keys=True)
