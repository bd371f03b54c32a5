"""The gateway's TLS material as the project chart renders it, and the pieces that put it in front of
a real Envoy and a real client on 127.0.0.1: a downstream TLS context for an Envoy bootstrap, and
name resolution of chosen DNS names to the loopback address (the TLS name check is untouched).
"""

from __future__ import annotations

import base64
import copy
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gennstack.gateway.values import CA_CONFIGMAP, CA_KEY_SECRET, TLS_SECRET


@dataclass(frozen=True)
class ChartTls:
    """PEMs from one render of the chart: the server certificate and key Envoy serves (the TLS
    Secret), the CA's certificate and key (the CA Secret), and the CA certificate clients get (the
    ConfigMap), plus the TLS Secret's annotations."""

    cert_pem: str
    key_pem: str
    ca_pem: str
    ca_key_pem: str
    published_ca_pem: str
    annotations: dict[str, str]

    def write(self, directory: Path) -> tuple[Path, Path, Path]:
        """(certfile, keyfile, cafile) under ``directory``; the CA file is the published one."""
        certfile, keyfile, cafile = directory / "tls.crt", directory / "tls.key", directory / "gennstack-ca.pem"
        certfile.write_text(self.cert_pem)
        keyfile.write_text(self.key_pem)
        cafile.write_text(self.published_ca_pem)
        return certfile, keyfile, cafile


def _object(docs: Iterable[dict], kind: str, name: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def chart_tls(docs: Iterable[dict]) -> ChartTls:
    docs = list(docs)
    server = _object(docs, "Secret", TLS_SECRET)
    ca = _object(docs, "Secret", CA_KEY_SECRET)
    published = _object(docs, "ConfigMap", CA_CONFIGMAP)

    def decoded(secret: dict, key: str) -> str:
        return base64.b64decode(secret["data"][key]).decode()

    return ChartTls(
        cert_pem=decoded(server, "tls.crt"), key_pem=decoded(server, "tls.key"), ca_pem=decoded(server, "ca.crt"),
        ca_key_pem=decoded(ca, "tls.key"), published_ca_pem=published["data"]["ca.crt"],
        annotations=dict(server["metadata"].get("annotations") or {}),
    )


def with_downstream_tls(bootstrap: dict[str, Any], certfile: Path, keyfile: Path) -> dict[str, Any]:
    """A copy of ``bootstrap`` whose listeners terminate TLS with ``certfile``/``keyfile`` on every
    filter chain, without a server-name match: the shape Envoy Gateway gives an HTTPS listener
    that has no hostname (any SNI, and none, gets the certificate)."""
    out = copy.deepcopy(bootstrap)
    for listener in out["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            chain.pop("filter_chain_match", None)
            chain["transport_socket"] = {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                    "common_tls_context": {
                        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
                        "alpn_protocols": ["h2", "http/1.1"],
                        "tls_certificates": [{
                            "certificate_chain": {"filename": str(certfile)},
                            "private_key": {"filename": str(keyfile)},
                        }],
                    },
                },
            }
    return out


@contextmanager
def resolve_to_loopback(names: Iterable[str]) -> Iterator[None]:
    """While active, ``socket.getaddrinfo`` answers 127.0.0.1 for ``names`` (as a DNS record pointing
    the NLB's name at the local Envoy would); TLS still sends and checks the name itself."""
    names = {n.lower() for n in names}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, bytes):
            host = host.decode()
        if isinstance(host, str) and host.lower() in names:
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.getaddrinfo = real
