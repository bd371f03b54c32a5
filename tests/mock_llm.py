"""Local OpenAI-compatible model servers for tests: ``python -m gennstack.bench.mockserver`` processes.

Each server runs in its own process, so its fixed streaming schedule does not share an event loop
(or, on a 2-core machine, a core) with the client under test, and it can be killed mid-load.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gennstack.bench.mockserver import MockProcess, start_process

MockServer = MockProcess


@contextmanager
def mock_servers() -> Iterator[Callable[..., MockServer]]:
    """Yields ``start(*flags, host=..., port=...)``, which starts a server (a free port by default);
    all are stopped on exit."""
    started: list[MockServer] = []

    def start(*flags: str, host: str = "127.0.0.1", port: int = 0) -> MockServer:
        server = start_process(*flags, host=host, port=port)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


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


def stream_chat(base_url: str, model: str, max_tokens: int, *, timeout_s: float = 30) -> tuple[str, int, bool]:
    """One streaming chat completion: ``("ok", content chunks, ended with [DONE])`` or ``("error", repr, False)``."""
    import urllib.request

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True,
                       "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(base_url + "/chat/completions", data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            text = resp.read().decode()
    except Exception as exc:  # noqa: BLE001 - the caller asserts on it
        return ("error", repr(exc), False)
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    content = sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content"))
    return ("ok", content, text.rstrip().endswith("data: [DONE]"))


def wait_arrived(replicas: list[MockServer], count: int, timeout_s: float = 10) -> int:
    """Until ``count`` chat requests have reached ``replicas`` together; returns the first one's share."""
    import time

    deadline = time.monotonic() + timeout_s
    while (seen := [r.stats()["chat_requests"] for r in replicas]) and sum(seen) < count:
        assert time.monotonic() < deadline, f"{seen} of {count} requests arrived"
        time.sleep(0.02)
    return seen[0]
