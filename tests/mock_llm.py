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

    @property
    def port(self) -> int:
        return int(self.base_url.removesuffix("/v1").rsplit(":", 1)[1])

    def doom(self, warning_in_s: float, gone_after_s: float, *, drain: bool = False) -> dict:
        """Doomed mode through the server's API: a warning ``warning_in_s`` from now, gone ``gone_after_s`` later;
        ``drain``: ``/health`` fails from the warning on (gennstack/bench/mockserver.py)."""
        body = json.dumps({"warning_in_s": warning_in_s, "gone_after_s": gone_after_s, "drain": drain}).encode()
        request = urllib.request.Request(self.base_url.removesuffix("/v1") + "/doom", data=body, method="POST",
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
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


class RecordingServer:
    """An in-process OpenAI-compatible chat server on 127.0.0.1 that keeps the headers and the body
    of every POST it gets (``seen``) and answers each with one non-streaming completion of
    ``completion_tokens`` tokens (whatever the request asked); ``GET`` (the health check) is 200.
    Use as a context manager; ``base_url`` ends in ``/v1``."""

    def __init__(self, completion_tokens: int = 1) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen: list[tuple[dict[str, str], bytes]] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _json(self, status: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._json(200, {"status": "ok"})

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers["content-length"]))
                seen.append(({k.lower(): v for k, v in self.headers.items()}, raw))
                model = json.loads(raw).get("model", "")
                self._json(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": completion_tokens,
                                           "total_tokens": 1 + completion_tokens}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
