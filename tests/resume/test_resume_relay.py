"""The resume relay in process (gennstack/resume/relay.py) against the mock server (its token mode): refusals,
the byte-level field stripping, several breaks in one answer, silence, bounds; and the relay process's SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from aiohttp import web

from gennstack.bench.mockserver import (
    MARK,
    Fault,
    MockServer,
    MockSettings,
    chat_reference_text,
    greedy_answer,
    start_process,
    token_text,
    tokenize,
)
from gennstack.gateway.demo import free_ports
from gennstack.resume.config import ResumeConfig
from gennstack.resume.local import RelayProcess, metric
from gennstack.resume.relay import Relay, Stream, refusal, strip_ids

MESSAGES = [{"role": "user", "content": "hello there relay"}]


@pytest.mark.parametrize(("kind", "extra", "reason"), [
    ("chat", {}, None),
    ("chat", {"temperature": 0.7, "seed": 3, "top_p": 0.9, "max_completion_tokens": 9}, None),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {}}}, "structured_output"),
    ("chat", {"response_format": {"type": "text"}}, None),
    ("chat", {"structured_outputs": {"regex": "a+"}}, "structured_output"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("chat", {"tool_choice": "required"}, "tools"),
    ("chat", {"n": 2}, "n"),
    ("chat", {"logprobs": True}, "logprobs"),
    ("chat", {"presence_penalty": 0.5}, "penalties"),
    ("chat", {"stop": ["\n\n"]}, "stop_strings"),
    ("chat", {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "continuous_usage"),
    ("chat", {"include_reasoning": False}, "reasoning_hidden"),
    ("chat", {"use_beam_search": True}, "beam_search"),
    ("completion", {"prompt": "x"}, None),
    ("completion", {"prompt": [1, 2, 3]}, None),
    ("completion", {"prompt": ["a", "b"]}, "batch_prompt"),
    ("completion", {"prompt": "x", "echo": True}, "echo"),
    ("completion", {"prompt": "x", "best_of": 3}, "best_of"),
    ("completion", {"prompt": "x", "suffix": "y"}, "suffix"),
])
def test_refusal_reasons(kind: str, extra: dict, reason: str | None) -> None:
    body = {"model": "m", **({"messages": MESSAGES} if kind == "chat" else {}), **extra}
    assert refusal(kind, body) == reason


def test_strip_cuts_only_the_token_id_fields() -> None:
    """The shapes vLLM 0.29.0 sends with return_token_ids: prompt_token_ids on the chat chunk, token_ids on the choice."""
    first = (b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":'
             b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}')
    later = (b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":'
             b'{"content":"say \\"token_ids\\":[9]"},"logprobs":null,"finish_reason":null,"token_ids":[7, 8]}]}')
    completion = b'{"id":"c","choices":[{"index":0,"text":"a","prompt_token_ids":[4,5],"token_ids":[6]}]}'
    for raw in (first, later, completion):
        stripped = json.loads(strip_ids(raw))
        original = json.loads(raw)
        original.pop("prompt_token_ids", None)
        for choice in original["choices"]:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        assert stripped == original


def test_mock_continuation_from_k_tokens_is_the_tail() -> None:
    prompt = tokenize(("<user>", "hello"))
    assert prompt[-1] == MARK
    whole = greedy_answer(prompt, 30)
    for k in (0, 1, 17, 29):
        assert greedy_answer(prompt + whole[:k], 30 - k) == whole[k:]


async def _stack(config: ResumeConfig, settings: MockSettings):
    mock = MockServer(settings)
    port = await mock.start()
    relay = Relay(config, f"http://127.0.0.1:{port}")
    runner = web.AppRunner(relay.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return mock, relay, runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def _chat(url: str, stream: bool, **extra) -> tuple[list[dict], str]:
    body = {"model": "mock-model", "messages": MESSAGES, "max_tokens": 20, "stream": stream, **extra}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            if not stream:
                return [await resp.json()], ""
            events = [line[6:].strip() async for line in resp.content if line.startswith(b"data: ")]
    return [json.loads(e) for e in events if e != b"[DONE]"], events[-1].decode() if events else ""


def _run(config: ResumeConfig, settings: MockSettings, stream: bool = True, **extra):
    async def go():
        mock, relay, runner, url = await _stack(config, settings)
        try:
            return await _chat(url, stream, **extra), relay
        finally:
            await runner.cleanup()
            await mock.close()
    return asyncio.run(go())


def _text(chunks: list[dict]) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for chunk in chunks for c in chunk.get("choices") or ())


def _value(relay: Relay, name: str, **labels: str) -> float:
    from prometheus_client import generate_latest

    values = {}
    for line in generate_latest(relay.metrics.registry).decode().splitlines():
        if line.startswith("gennstack_resume_"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return metric(values, name, **labels)


def test_an_answer_broken_every_three_tokens_is_whole_and_once() -> None:
    """Every upstream answer (the continuations too) is cut after 3 chunks (the last after its 2 tokens, before its
    finish chunk): 6 continuations, one answer, the same id, the finish chunk written by the relay."""
    config = ResumeConfig.from_data({"models": {"mock-model": {}}, "max_attempts": 10})
    settings = MockSettings(ttft_s=0, itl_s=0.001, faults=(Fault("broken", 1, after_chunks=3),))
    (chunks, last), relay = _run(config, settings, stream_options={"include_usage": True})
    assert last == "[DONE]"
    assert _text(chunks) == chat_reference_text(MESSAGES, 20)
    assert {c["id"] for c in chunks} == {"chatcmpl-mock-1"} and len({c["model"] for c in chunks}) == 1
    assert all("token_ids" not in c for chunk in chunks for c in chunk["choices"]) and all("prompt_token_ids" not in c for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == ["length"]
    assert chunks[-1]["usage"] == {"prompt_tokens": len(tokenize(("<user>", "hello", "there", "relay"))), "completion_tokens": 20,
                                   "total_tokens": 25}
    assert _value(relay, "gennstack_resume_attempts_total", model="mock-model") == 6
    assert _value(relay, "gennstack_resume_succeeded_total", model="mock-model") == 1


def test_client_asked_token_ids_are_kept_whole() -> None:
    config = ResumeConfig.from_data({"models": {"mock-model": {}}, "max_attempts": 10})
    settings = MockSettings(ttft_s=0, itl_s=0.001, faults=(Fault("broken", 1, after_chunks=4),))
    (chunks, _), _relay = _run(config, settings, return_token_ids=True)
    ids = [t for chunk in chunks for c in chunk["choices"] for t in c.get("token_ids") or []]
    prompt = tokenize(("<user>", "hello", "there", "relay"))
    assert chunks[0]["prompt_token_ids"] == prompt
    assert ids == greedy_answer(prompt, 20)
    assert "".join(token_text(t) for t in ids) == _text(chunks)


def test_a_silent_upstream_counts_as_broken() -> None:
    """stall: the server stops sending and holds the connection; after upstream_idle_timeout_s the relay goes on."""
    config = ResumeConfig.from_data({"models": {"mock-model": {}}, "upstream_idle_timeout_s": 0.3, "max_attempts": 10})
    settings = MockSettings(ttft_s=0, itl_s=0.001, faults=(Fault("stall", 2, after_chunks=3),), stall_max_s=5)
    (chunks, last), relay = _run(config, settings)
    assert last == "[DONE]" and _text(chunks) == chat_reference_text(MESSAGES, 20)


@pytest.mark.parametrize(("bounds", "reason"), [({"max_replay_tokens": 8}, "replay_too_long"),
                                                ({"max_attempts": 2}, "attempts_exhausted")])
def test_bounds_end_the_answer_with_an_error_event(bounds: dict, reason: str) -> None:
    config = ResumeConfig.from_data({"models": {"mock-model": {}}, **bounds})
    settings = MockSettings(ttft_s=0, itl_s=0.001, faults=(Fault("broken", 1, after_chunks=3),))
    (chunks, last), relay = _run(config, settings)
    assert chunks[-1]["error"]["reason"] == reason and chunks[-1]["error"]["type"] == "resume_failed"
    assert last != "[DONE]"
    assert _value(relay, "gennstack_resume_failed_total", model="mock-model", reason=reason) == 1


def test_non_streaming_failure_is_an_error_status() -> None:
    config = ResumeConfig.from_data({"models": {"mock-model": {}}, "max_attempts": 1})
    settings = MockSettings(ttft_s=0, itl_s=0.001, faults=(Fault("broken", 1, after_chunks=3),))
    ([answer], _), _relay = _run(config, settings, stream=False)
    assert answer["error"]["reason"] == "attempts_exhausted"


def test_harmony_without_its_encoding_fails_counted_never_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPT-OSS continuation needs openai-harmony's encoding (its o200k_base vocabulary file); where it cannot be
    loaded (here: no network, TIKTOKEN_ENCODINGS_BASE at an empty folder), the answer ends with an error event."""
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "/nonexistent-gennstack")
    monkeypatch.setenv("TIKTOKEN_RS_CACHE_DIR", "/nonexistent-gennstack")
    config = ResumeConfig.from_data({"models": {"mock-model": {"harmony": True}}})
    settings = MockSettings(ttft_s=0, itl_s=0.001, faults=(Fault("broken", 1, after_chunks=3),))
    (chunks, _), relay = _run(config, settings)
    assert chunks[-1]["error"]["reason"] == "harmony_unavailable"
    assert _value(relay, "gennstack_resume_failed_total", model="mock-model", reason="harmony_unavailable") == 1


def test_sigterm_fails_healthz_finishes_the_stream_and_exits() -> None:
    server = start_process("--ttft", "0", "--itl", "0.02")
    port = free_ports(1)
    try:
        relay = RelayProcess.start(ResumeConfig.from_data({"models": {"mock-model": {}}}), port=port,
                                   upstream=server.base_url.removesuffix("/v1"))
        body = json.dumps({"model": "mock-model", "messages": MESSAGES, "max_tokens": 150, "stream": True}).encode()
        request = urllib.request.Request(relay.base_url + "/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.readline()
            relay.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 5
            status = 200
            while status == 200 and time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(relay.base_url + "/healthz", timeout=2)
                except urllib.error.HTTPError as exc:
                    status = exc.code
            rest = resp.read().decode()
        assert status == 503
        assert rest.rstrip().endswith("data: [DONE]")
        assert relay.proc.wait(timeout=30) == 0
    finally:
        server.stop()


def test_upstream_request_asks_for_token_ids_and_drops_x_envoy_headers() -> None:
    """What the routing half gets: stream true, return_token_ids, include_usage, the client's own fields and headers,
    and no x-envoy-* (Envoy trusts those from an internal address); a non-stream answer it passes on as it came."""
    from tests.mock_llm import RecordingServer

    async def go(url: str) -> tuple[int, dict]:
        relay = Relay(ResumeConfig(), url)
        runner = web.AppRunner(relay.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                        json={"model": "m", "messages": MESSAGES, "temperature": 0.5},
                                        headers={"x-envoy-max-retries": "9", "x-gennstack-client": "alice"}) as resp:
                    return resp.status, await resp.json()
        finally:
            await runner.cleanup()

    with RecordingServer() as server:
        status, answer = asyncio.run(go(server.base_url.removesuffix("/v1")))
        [(headers, raw)] = server.seen
    body = json.loads(raw)
    assert status == 200 and answer["choices"][0]["message"]["content"] == "ok"
    assert body == {"model": "m", "messages": MESSAGES, "temperature": 0.5, "stream": True, "return_token_ids": True,
                    "stream_options": {"include_usage": True}}
    assert headers["x-gennstack-client"] == "alice" and "x-envoy-max-retries" not in headers


def _sse_answer(text: str = "hi") -> bytes:
    """One whole vLLM-shaped streamed chat answer (vllm 0.29.0 chat_completion/protocol.py fields): the first chunk
    with the role, its token IDs and the prompt's, the finish, the usage chunk, [DONE]."""
    first = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "token_ids": [5],
                          "finish_reason": "stop"}], "prompt_token_ids": [1, 2]}
    usage = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": "mock-model",
             "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}
    return b"".join(b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in (first, usage)) + \
        b"data: [DONE]\n\n"


async def _relay_in_front_of(port: int, config: ResumeConfig):
    relay = Relay(config, f"http://127.0.0.1:{port}")
    runner = web.AppRunner(relay.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return relay, runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_a_first_chunk_later_than_the_idle_bound_is_waited_for_not_cut() -> None:
    """A server queueing or prefilling sends its headers at once and its first chunk only after its first token
    (vLLM's chat stream generator writes the role chunk inside its loop over the engine's outputs): the relay waits
    for it (the request's deadline bounds it), and applies upstream_idle_timeout_s only between chunks. Before: the
    read timed out at 0.3 s, the request was sent again 3 times and the client got resume_failed."""
    requests: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        requests.append(1)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(1.2)  # four times the idle bound below
        await response.write(_sse_answer())
        await response.write_eof()
        return response

    async def go():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        upstream = web.AppRunner(app)
        await upstream.setup()
        site = web.TCPSite(upstream, "127.0.0.1", 0)
        await site.start()
        config = ResumeConfig.from_data({"models": {"mock-model": {}}, "upstream_idle_timeout_s": 0.3})
        relay, runner, url = await _relay_in_front_of(site._server.sockets[0].getsockname()[1], config)
        try:
            return await _chat(url, True), relay
        finally:
            await runner.cleanup()
            await upstream.cleanup()

    (chunks, last), relay = asyncio.run(go())
    assert last == "[DONE]" and _text(chunks) == "hi"
    assert len(requests) == 1
    assert _value(relay, "gennstack_resume_attempts_total", model="mock-model") == 0


def test_a_request_written_onto_a_pooled_connection_the_proxy_closed_is_sent_again() -> None:
    """The routing proxy closes a kept-alive connection (draining, idle close) just as the relay writes the next
    request onto it: aiohttp 3.14.5 retries a reused connection only for idempotent methods (client.py
    IDEMPOTENT_METHODS has no POST), so the relay sends it again itself on a new connection (nothing of an answer
    had come). Here the fake proxy answers each connection's first request and closes it on the second unanswered.
    Before: the second client request got 502 upstream unreachable."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                if served:
                    return  # the second request on this connection: closed unanswered
                body = _sse_answer()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def go():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        config = ResumeConfig.from_data({"models": {"mock-model": {}}})
        relay, runner, url = await _relay_in_front_of(server.sockets[0].getsockname()[1], config)
        try:
            return [await _chat(url, True), await _chat(url, True)]
        finally:
            await runner.cleanup()
            server.close()

    answers = asyncio.run(go())
    assert [(_text(chunks), last) for chunks, last in answers] == [("hi", "[DONE]"), ("hi", "[DONE]")]
    assert len(connections) == 2


def test_text_that_begins_with_reasoning_is_not_a_reasoning_parser() -> None:
    """Only the delta's reasoning keys mark a reasoning parser's split; a content chunk whose text begins with
    the word (a real model wrote it: SmolLM2 on the demo token server) stays resumable."""
    def scanned(delta: dict) -> str | None:
        state = Stream(kind="chat", body={}, client_ids=False, client_stream=True, emit_usage=True, started=time.monotonic())
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "token_ids": [5]}]}
        Relay(ResumeConfig(), "http://127.0.0.1:1")._scan(state, json.dumps(chunk, separators=(",", ":")).encode())
        return state.resumable

    assert scanned({"content": "reasoning"}) is None and scanned({"content": 'reasoning": x'}) is None
    assert scanned({"reasoning": "think"}) == scanned({"reasoning_content": "think"}) == "reasoning_parser"
    assert scanned({"tool_calls": [{"index": 0}]}) == "tools"
