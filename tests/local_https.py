"""A threaded HTTPS server on 127.0.0.1 for the fakes of HTTPS APIs (the Kubernetes API server),
with the request record and the reading and answering every such fake does."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    """One request a fake received, and the status it answered."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0


def read_request(h: BaseHTTPRequestHandler) -> Seen:
    """The request's method, path, lower-cased headers and body (parsed when it is JSON)."""
    # As Go's net/http (the API server) does: without it every response waits ~40 ms for the
    # client's delayed ACK between the header and body writes.
    h.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    length = int(h.headers.get("Content-Length") or 0)
    raw = h.rfile.read(length) if length else b""
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw
    return Seen(h.command, h.path, {k.lower(): v for k, v in h.headers.items()}, body)


def send(h: BaseHTTPRequestHandler, seen: Seen, status: int, body: bytes, content_type: str = "application/json") -> None:
    """Answer ``status`` with ``body`` and record the status on ``seen``; a client that gave up is ignored."""
    seen.status = status
    try:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    except OSError:
        pass


class LocalHttpsServer:
    """Serves TLS with ``certfile``/``keyfile`` on a free loopback port; every request goes to ``serve``.

    HTTP/1.1 keep-alive, a 5 s socket timeout, no request logging, and connection errors (a client
    that rejects the certificate, or hangs up on a hung request) are ignored.
    """

    def __init__(
        self, serve: Callable[[BaseHTTPRequestHandler], None], *, certfile: str, keyfile: str,
        methods: Iterable[str] = ("GET", "PATCH", "POST", "PUT"),
    ) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certfile, keyfile)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def finish_request(self, request: socket.socket, client_address: Any) -> None:
                request.settimeout(5)
                super().finish_request(context.wrap_socket(request, server_side=True), client_address)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        handler_methods: dict[str, Any] = {
            "protocol_version": "HTTP/1.1",
            "log_message": lambda self, *args: None,
            **{f"do_{method}": (lambda self: serve(self)) for method in methods},
        }
        handler = type("Handler", (BaseHTTPRequestHandler,), handler_methods)
        self._server = Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
