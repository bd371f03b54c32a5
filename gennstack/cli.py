"""The ``gennstack`` command. Each tool is a subcommand registered in ``_SUBCOMMANDS``.

A subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed namespace, returning an exit code) as a default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gennstack import __version__

# module path of each subcommand, imported lazily so one tool's dependencies never
# slow down or break another.
_SUBCOMMANDS: dict[str, str] = {
    "summary": "gennstack.summary",
    "diagram": "gennstack.diagram",
    "bench": "gennstack.bench.cli",
    "gateway": "gennstack.gateway.cli",
    "preflight": "gennstack.preflight.cli",
    "cost": "gennstack.cost.cli",
    "drill": "gennstack.drill.cli",
    "config": "gennstack.config_reference",
    "resume": "gennstack.resume.cli",
    "simulate": "gennstack.simulate.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gennstack",
        description="GenNStack tools: deployment summary, preflight checks, benchmarks and more.",
    )
    parser.add_argument("--version", action="version", version=f"gennstack {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_path in _SUBCOMMANDS.values():
        importlib.import_module(module_path).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
