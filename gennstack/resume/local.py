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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gennstack.resume.config import ModelResume, ResumeConfig


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


def metric(values: dict[str, float], name: str, **labels: str) -> float:
    """One metric's value from :meth:`RelayProcess.metrics` (0 when absent)."""
    if labels:
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    else:
        key = name
    return values.get(key, 0.0)


def dumps(config: ResumeConfig) -> str:
    return json.dumps(json.loads(config.to_json()), sort_keys=True)
