"""The local gateway with the resume relay between its two Envoy halves, on mock replicas (tests only)."""

from __future__ import annotations

import json
import time
import urllib.request

from gennstack.bench.mockserver import MockProcess, start_process
from gennstack.resume.local import MODEL, SLOW, Stack, resume_stack  # noqa: F401 - the tests' imports


def reference(kind: str, body: dict, flags: tuple[str, ...] = ("--ttft", "0", "--itl", "0")) -> dict:
    """The uninterrupted answer of an untouched replica (token mode, as the relay asks), non-streaming."""
    server = start_process(*flags)
    try:
        path = "/chat/completions" if kind == "chat" else "/completions"
        request = urllib.request.Request(server.base_url + path, data=json.dumps(
            {**body, "stream": False, "return_token_ids": True}).encode(), headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.loads(resp.read())
    finally:
        server.stop()


def reference_text(kind: str, body: dict) -> str:
    choice = reference(kind, body)["choices"][0]
    return choice["message"]["content"] if kind == "chat" else choice["text"]


def wait_streaming(replicas: list[MockProcess], timeout_s: float = 10.0) -> MockProcess:
    """The replica with a stream in flight (for a non-streaming client, whose bytes one cannot watch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for replica in replicas:
            try:
                if replica.stats()["streams_in_flight"]:
                    return replica
            except OSError:
                pass
        time.sleep(0.02)
    raise TimeoutError("no replica began a stream")
