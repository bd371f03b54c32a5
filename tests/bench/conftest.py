"""Fixtures for the benchmark tests: a programmed mock server in its own process, a parser."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.mock_llm import MockServer, mock_servers

REPO_ROOT = Path(__file__).resolve().parents[2]


MockServerProcess = MockServer


@pytest.fixture
def mock_server() -> Iterator[Callable[..., MockServer]]:
    """Start ``python -m gennstack.bench.mockserver`` with the given flags, on a free port (tests/mock_llm.py)."""
    with mock_servers() as start:
        yield start


@pytest.fixture
def bench_parser() -> argparse.ArgumentParser:
    """A ``gennstack`` parser holding only the bench subcommand."""
    from gennstack.bench import cli

    parser = argparse.ArgumentParser(prog="gennstack")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser
