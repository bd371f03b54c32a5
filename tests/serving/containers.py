"""Running the serving chart's containers as local processes: their rendered env, command and inputs.

Shared by the runtime contract tests (test_pod_identity.py, test_compile_gate.py): a container's
command runs with this interpreter and the chart's files/, its volume paths moved under a temp dir.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

from tests.serving.conftest import CHART

FILES = CHART / "files"

def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped has stopped running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_for(predicate, timeout: float = 10.0) -> bool:
    """Poll ``predicate`` every 50 ms until it is true or ``timeout`` s have passed; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# The end of a fake `vllm` script (python -c): serve vLLM's /health (200; 404 for any other path) on
# the ``port`` the script has read from its flags, until the process is stopped.
SERVE_HEALTH = '''\
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def chart_env(container: dict, root: Path) -> dict[str, str]:
    """The container's literal env, with its volume paths moved under ``root``."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    moved = {k: str(root) + v if v.startswith(("/cache", "/scratch", "/gates")) else v for k, v in env.items()}
    return {**moved, "WORK_DIR": str(root / "work")}


def workload(rendered: dict, prefix: str, container: str) -> dict:
    """The container of workload ``prefix`` (a Deployment's name, or a Job's name less its hash)."""
    matches = [c for (name, cname), c in rendered.items()
               if cname == container and (name == prefix or re.fullmatch(rf"{prefix}-[0-9a-f]{{10}}", name))]
    assert len(matches) == 1, (prefix, container, sorted(rendered))
    return matches[0]


def run(container: dict, env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the container's command (python3 -> this interpreter, /scripts -> the chart's files/)."""
    command = [sys.executable if c == "python3" else c.replace("/scripts/", f"{FILES}/") for c in container["command"]]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def safetensors(name: str, values: bytes) -> bytes:
    header = json.dumps({name: {"dtype": "U8", "shape": [len(values)], "data_offsets": [0, len(values)]}}).encode()
    return struct.pack("<Q", len(header)) + header + values


def put(s3, bucket: str, prefix: str, files: dict[str, bytes], marker: bool = True) -> None:
    for rel, data in files.items():
        s3.put_object(Bucket=bucket, Key=prefix + rel, Body=data)
    if marker:
        s3.put_object(Bucket=bucket, Key=prefix + ".gennstack-complete", Body=b"{}")


def env_with_prefixes(container: dict, root: Path, **prefixes: str) -> dict[str, str]:
    env = chart_env(container, root)
    env.update(prefixes)
    return env


# A model on the fake Hub: what staging copies, and what it must skip.
COMMIT = "3f1c2a9e0b7d4c5a6e8f9a0b1c2d3e4f5a6b7c8d"
HUB_FILES = {
    "config.json": b'{"model_type": "gpt_oss"}',
    "model-00001-of-00001.safetensors": safetensors("w", b"\x01" * 300),
    "original/model.safetensors": b"o" * 100,
    "metal/model.bin": b"m" * 100,
    ".gitattributes": b"*.safetensors filter=lfs",
}
