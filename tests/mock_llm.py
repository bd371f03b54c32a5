"""Local OpenAI-compatible model servers for tests: ``python -m gennstack.bench.mockserver`` processes.

Each server runs in its own process, so its fixed streaming schedule does not share an event loop
(or, on a 2-core machine, a core) with the client under test, and it can be killed mid-load.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tests.support import ROOT


class MockServer:
    def __init__(self, proc: subprocess.Popen, base_url: str) -> None:
        self.proc = proc
        self.base_url = base_url

    def stats(self) -> dict:
        """The server's own count of requests by outcome."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def kill(self) -> None:
        """Die at once, as a spot-reclaimed node would."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


@contextmanager
def mock_servers() -> Iterator[Callable[..., MockServer]]:
    """Yields ``start(*flags)``, which starts a server on a free port; all are stopped on exit."""
    started: list[subprocess.Popen] = []

    def start(*flags: str) -> MockServer:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(
            [sys.executable, "-m", "gennstack.bench.mockserver", "--port", "0", *flags],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        started.append(proc)
        line = proc.stdout.readline()
        match = re.search(r"(http://\S+/v1)", line)
        assert match, f"mock server did not start: {line!r}"
        return MockServer(proc, match.group(1))

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
