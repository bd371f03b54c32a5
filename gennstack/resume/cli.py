"""``gennstack resume serve``: the resume relay, between the gateway's front Envoy and its routing Envoy.

It relays ``/v1/chat/completions`` and ``/v1/completions`` to ``--upstream`` (the routing Envoy: model
routing, alias, failover, prefix keys), asking each upstream stream for its token IDs; when a stream breaks
mid-answer it continues it from the next token through the routing Envoy and the client sees one stream.
Any other path passes through unchanged. ``GET /healthz``: 200 while accepting, 503 after SIGTERM (then it
finishes its in-flight streams and exits). Metrics in Prometheus text on ``--metrics-listen`` at /metrics.

Exit codes: 0 stopped cleanly; 2 bad arguments or config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlsplit

from gennstack.config_base import ConfigError


def host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as (host, port); argparse shows the message on a bad one."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port 1-65535, got {value!r}")
    return host, int(port)


def upstream_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL such as http://127.0.0.1:10000, got {value!r}")
    return value.rstrip("/")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("resume", help="the stream-resume relay between the gateway's two Envoy halves",
                                   description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="resume_command", metavar="SUBCOMMAND", required=True)
    serve = commands.add_parser("serve", help="run the relay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--listen", type=host_port, required=True, metavar="HOST:PORT", help="where clients (the front Envoy) connect")
    serve.add_argument("--upstream", type=upstream_url, required=True, metavar="URL",
                       help="the routing Envoy, e.g. http://127.0.0.1:10000")
    serve.add_argument("--config", type=Path, required=True, metavar="FILE.json", help="the ResumeConfig (gennstack/resume/config.py)")
    serve.add_argument("--metrics-listen", type=host_port, default=None, metavar="HOST:PORT",
                       help="serve Prometheus metrics at /metrics here (default: none)")
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from gennstack.resume.config import ResumeConfig

    try:
        config = ResumeConfig.load(args.config)
    except ConfigError as exc:
        print(f"gennstack resume serve: {exc}", file=sys.stderr)
        return 2
    from gennstack.resume.relay import serve_forever

    return serve_forever(config, listen=args.listen, upstream=args.upstream, metrics_listen=args.metrics_listen)
