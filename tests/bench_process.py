"""``gennstack bench`` as a real subprocess beside a local mock replica: the drill end-to-end tests'
shared way to start it, wait until it is sending, and never leave it running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import ROOT


@contextmanager
def bench_process(base_url: str, *, model: str, events: Path, out: Path, concurrency: int, duration: int,
                  max_tokens: int, ramp_up: float = 0.0) -> Iterator[subprocess.Popen[str]]:
    """The bench streaming to ``base_url`` with the drill's events file (``--events``); killed on exit if still running."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bench = subprocess.Popen(
        [sys.executable, "-m", "gennstack.cli", "bench", "--base-url", base_url, "--model", model,
         "--concurrency", str(concurrency), "--duration", str(duration), "--warmup-seconds", "1", "--ramp-up", f"{ramp_up:g}",
         "--max-tokens", str(max_tokens), "--prompt-tokens", "16", "--events", str(events),
         "--output-dir", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        yield bench
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()


def wait_until_sending(replica: Any, bench: subprocess.Popen[str], *, timeout_s: float = 30) -> None:
    """Until ``replica`` (a tests.mock_llm.MockServer) has seen the bench's first chat request."""
    deadline = time.monotonic() + timeout_s
    while replica.stats()["chat_requests"] == 0:
        assert time.monotonic() < deadline and bench.poll() is None, "the bench never reached the replica"
        time.sleep(0.05)
