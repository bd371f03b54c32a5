"""The mock server's doomed mode (gennstack/bench/mockserver.py): a warning, then gone at a programmed time.

Each server is its own process (tests/mock_llm.py), so "gone" is the process exiting with its sockets reset,
as a reclaimed spot node's replica would be.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime

import pytest

from gennstack.bench import mockserver


def _address(base_url: str) -> tuple[str, int]:
    host_port = base_url.removeprefix("http://").split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    return host, int(port)


def _stream_raw(base_url: str, max_tokens: int, after_first_chunk: Callable[[], None] | None = None) -> tuple[bytes, str]:
    """POST one streamed chat completion on a raw socket; read until the peer closes or resets.
    ``after_first_chunk`` runs once the first content chunk has arrived (the stream is under way)."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                       "stream": True}).encode()
    sock = socket.create_connection(_address(base_url), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
    data, ending = b"", "closed"
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if after_first_chunk is not None and _content_chunks(data):
                after_first_chunk()
                after_first_chunk = None
    except ConnectionResetError:
        ending = "reset"
    finally:
        sock.close()
    return data, ending


def _content_chunks(data: bytes) -> int:
    return data.count(b'"content":" tok')


def _post(base_url: str, path: str, obj: dict) -> tuple[int, dict]:
    request = urllib.request.Request(base_url.removesuffix("/v1") + path, data=json.dumps(obj).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_stream_running_at_gone_breaks_midway_and_later_requests_cannot_connect(mock_server, tmp_path):
    """Doomed once its one stream is under way (its first chunk arrived): warned at once, gone 0.5 s later,
    while the stream has 500 chunks 20 ms apart (10 s) to go. What is asserted is what the server did, not
    how fast: the stream was cut (no end, some chunks but not all), and the server's own last line counts it."""
    events = tmp_path / "events.jsonl"
    server = mock_server("--ttft", "0", "--itl", "0.02", "--events-file", str(events))
    data, ending = _stream_raw(server.base_url, max_tokens=500,
                               after_first_chunk=lambda: server.doom(warning_in_s=0, gone_after_s=0.5))
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert b"data: [DONE]" not in data and b"finish_reason\":\"length" not in data
    assert not data.endswith(b"0\r\n\r\n")  # the chunked body never ends: the connection was closed under it
    assert 1 <= _content_chunks(data) < 500, _content_chunks(data)  # cut mid-way
    assert server.proc.wait(timeout=30) == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(_address(server.base_url), timeout=5).close()
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["interruption_warning", "replica_gone"]
    assert all(line["source"] == "mock-server" and line["time"].endswith("Z") for line in lines)
    # its final counts: the one stream, cut
    assert {k: lines[1][k] for k in ("chat_requests", "completed_streams", "streams_in_flight")} == {
        "chat_requests": 1, "completed_streams": 0, "streams_in_flight": 1}
    # never gone before its schedule (how much later is the machine's business); times are to the microsecond
    gap = (datetime.fromisoformat(lines[1]["time"].replace("Z", "+00:00"))
           - datetime.fromisoformat(lines[0]["time"].replace("Z", "+00:00"))).total_seconds()
    assert gap >= 0.5 - 0.001, gap


def test_doom_api_schedules_the_warning_counts_requests_after_it_and_exits(mock_server):
    server = mock_server("--ttft", "0", "--itl", "0.001")
    status, answer = _post(server.base_url, "/doom", {"warning_in_s": 0, "gone_after_s": 5.0})
    assert status == 200 and answer["doomed"]["gone_after_s"] == 5.0
    _wait_warned(server)
    data, ending = _stream_raw(server.base_url, max_tokens=3)  # 3 ms of chunks: it completes before gone
    assert b"data: [DONE]" in data and data.endswith(b"0\r\n\r\n")
    stats = server.stats()
    assert stats["doomed"]["warned"] is True and stats["doomed"]["gone"] is False
    assert stats["chat_requests_after_warning"] == 1 == stats["chat_requests"]
    assert stats["streams_in_flight"] == 0  # it ended
    assert server.proc.wait(timeout=10) == 0


@pytest.mark.parametrize("spec, wanted", [({}, "warning_in_s"), ({"warning_in_s": -1}, "must be >= 0"),
                                          ({"warning_in_s": "soon"}, "could not convert"),
                                          ({"warning_in_s": 1, "drain": "yes"}, "drain='yes' must be true or false")])
def test_doom_api_rejects_bad_schedules_and_names_the_fields(mock_server, spec, wanted):
    server = mock_server()
    status, answer = _post(server.base_url, "/doom", spec)
    assert status == 400
    assert "warning_in_s" in answer["error"]["message"] and wanted in answer["error"]["message"]
    assert server.stats()["doomed"] is None


@pytest.mark.parametrize("flags, message", [
    (["--doomed-warning-at", "-1"], "--doomed-warning-at=-1.0: must be a number of seconds >= 0"),
    (["--doomed-warning-at", "1", "--doomed-gone-after", "-2"], "--doomed-gone-after=-2.0: must be a number of seconds >= 0"),
])
def test_bad_doomed_flags_are_refused(flags, message, capsys):
    assert mockserver.main(flags) == 2
    assert message in capsys.readouterr().err


def _wait_warned(server, timeout_s: float = 30.0) -> None:
    """Until the server says it has been warned (its ``/stats``), instead of sleeping its schedule."""
    deadline = time.monotonic() + timeout_s
    while not (server.stats()["doomed"] or {}).get("warned"):
        assert time.monotonic() < deadline, server.stats()
        time.sleep(0.02)


def _health(base_url: str) -> int:
    try:
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/health", timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.parametrize("drain", [True, False])
def test_doomed_drain_fails_health_from_the_warning_on_and_keeps_serving(mock_server, drain):
    server = mock_server("--ttft", "0", "--itl", "0.001")
    assert _health(server.base_url) == 200
    server.doom(warning_in_s=2.0, gone_after_s=30, drain=drain)
    assert _health(server.base_url) == 200  # before the warning (2 s away)
    assert server.stats()["doomed"]["warned"] is False, "the check above came after the warning: not before it"
    _wait_warned(server)
    assert _health(server.base_url) == (503 if drain else 200)
    data, _ = _stream_raw(server.base_url, max_tokens=3)  # a request that still reaches it is served
    assert b"data: [DONE]" in data
    assert server.stats()["chat_requests_after_warning"] == 1


def test_doomed_drain_flag(mock_server):
    server = mock_server("--doomed-warning-at", "0", "--doomed-gone-after", "30", "--doomed-drain")
    _wait_warned(server)
    assert _health(server.base_url) == 503 and server.stats()["doomed"]["drain"] is True


def test_not_doomed_by_default(mock_server):
    server = mock_server("--ttft", "0", "--itl", "0.001")
    assert server.stats()["doomed"] is None
    assert server.proc.poll() is None
