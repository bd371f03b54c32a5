"""A threaded HTTPS server on 127.0.0.1 for the fakes of HTTPS APIs (the Kubernetes API server)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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
