"""Fixtures for the benchmark tests: a programmed mock server in its own process, a parser."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


class MockServerProcess:
    def __init__(self, proc: subprocess.Popen, base_url: str) -> None:
        self.proc = proc
        self.base_url = base_url

    def stats(self) -> dict:
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/stats", timeout=10) as resp:
            return json.loads(resp.read())


@pytest.fixture
def mock_server() -> Iterator[Callable[..., MockServerProcess]]:
    """Start ``python -m gennstack.bench.mockserver`` with the given flags, on a free port.

    A separate process, so the server's scheduling does not share the client's event loop
    (on a 2-core machine they get one core each).
    """
    started: list[subprocess.Popen] = []

    def start(*flags: str) -> MockServerProcess:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen([sys.executable, "-m", "gennstack.bench.mockserver", "--port", "0", *flags],
                                stdout=subprocess.PIPE, text=True, env=env)
        started.append(proc)
        line = proc.stdout.readline()
        match = re.search(r"(http://\S+/v1)", line)
        assert match, f"mock server did not start: {line!r}"
        return MockServerProcess(proc, match.group(1))

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def bench_parser() -> argparse.ArgumentParser:
    """A ``gennstack`` parser holding only the bench subcommand."""
    from gennstack.bench import cli

    parser = argparse.ArgumentParser(prog="gennstack")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser
