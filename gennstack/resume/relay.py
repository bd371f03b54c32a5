"""The resume relay: holds the client's stream and, when the upstream answer breaks, continues it.

It sits between the gateway's front Envoy (TLS, API keys, per-client limits, body limit) and its routing
Envoy (model Lua, alias, failover, prefix key, retries, outlier ejection, health checks). For every
``/v1/chat/completions`` and ``/v1/completions`` request it may resume (:func:`refusal`), it asks the routing
Envoy for a stream with ``return_token_ids: true`` (vLLM 0.29.0, vllm/entrypoints/openai/chat_completion/
protocol.py ``ChatCompletionRequest.return_token_ids``: "In streaming mode, prompt_token_ids is included only
in the first chunk, and token_ids contains the delta tokens for each chunk"; the chat stream carries
``prompt_token_ids`` on the chunk (``ChatCompletionStreamResponse``), completions on the choice
(completion/protocol.py ``CompletionResponseStreamChoice``)) and remembers the prompt IDs, the generated IDs
and the served ``model``, ``id``, ``created``. On a break (connection reset, a stream ended without
finish_reason, an upstream silent for ``upstream_idle_timeout_s``, an error event) it sends ``/v1/completions``
with prompt = prompt IDs + generated IDs (completion/protocol.py ``CompletionRequest.prompt`` takes token IDs),
``max_tokens`` reduced by what was generated, the same sampling parameters and the concrete served model
(never the alias), with header ``x-gennstack-resume: continuation``, and re-emits its tokens as chunks of the
original stream. The client's usage counts its prompt once and every output token once.

Non-streaming requests are relayed streaming upstream and answered whole, so they resume too.

GPT-OSS (``harmony: true``): the chat's Harmony parser does not run on ``/v1/completions``; the relay feeds
openai-harmony's ``StreamableParser`` the generated IDs and then the continuation's, mapping channels as vLLM
0.29.0 does (vllm/parser/harmony.py ``_SegmentType.from_channel_and_recipient``: analysis -> ``reasoning``,
final or recipient-less commentary -> ``content``, a function recipient -> a tool call, anything else dropped).

The hot path parses only the first chunk as JSON; later chunks are scanned as bytes (token IDs, finish_reason)
and, unless the client asked for token IDs itself, the ID fields are cut out of the bytes.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gennstack.resume.config import ResumeConfig

RESUME_HEADER = "x-gennstack-resume"
CONTINUATION = "continuation"
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# the front Envoy enforces the gateway's body limit; the relay takes whatever it passed on
MAX_BODY = 64 * 1024 * 1024
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "content-length", "host", "content-encoding"})

_IDS = re.compile(rb'"token_ids":\[([0-9, ]*)\]')
_STRIP = re.compile(rb',"(?:prompt_)?token_ids":(?:\[[0-9, ]*\]|null)|"(?:prompt_)?token_ids":(?:\[[0-9, ]*\]|null),?')
_FINISHED = re.compile(rb'"finish_reason":"([^"]*)"')

# Request fields that make a replay inexact or impossible, with the reason counted (vLLM 0.29.0
# chat_completion/protocol.py ChatCompletionRequest, completion/protocol.py CompletionRequest).
_REFUSED_FIELDS: tuple[tuple[str, str], ...] = (
    ("structured_outputs", "structured_output"),   # a grammar's state is not in the token IDs
    ("guided_json", "structured_output"), ("guided_regex", "structured_output"), ("guided_choice", "structured_output"),
    ("guided_grammar", "structured_output"),
    ("tools", "tools"),  # a tool parser runs on chat output only; not on /v1/completions
    ("best_of", "best_of"),
    ("use_beam_search", "beam_search"),
    ("prompt_logprobs", "logprobs"), ("logprob_token_ids", "logprobs"),
    ("suffix", "suffix"),
    ("prompt_embeds", "prompt_embeds"),
    ("kv_transfer_params", "kv_transfer"), ("ec_transfer_params", "kv_transfer"),
    ("thinking_token_budget", "thinking_budget"),  # counted by the reasoning parser of the chat only
    ("repetition_detection", "repetition_detection"),
)
# sampling parameters a continuation carries over unchanged (both endpoints take them)
_CARRIED = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "stop_token_ids", "ignore_eos",
            "logit_bias", "allowed_token_ids", "bad_words", "skip_special_tokens", "spaces_between_special_tokens",
            "include_stop_str_in_output", "length_penalty", "priority", "cache_salt", "user")


def refusal(kind: str, body: dict[str, Any]) -> str | None:
    """Why this request cannot be replayed exactly (the ``refused`` reason), or None: resumable."""
    for key, reason in _REFUSED_FIELDS:
        if body.get(key) not in (None, False, [], {}, 0) and not (key == "best_of" and body.get(key) == 1):
            return reason
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        return "structured_output"
    if (body.get("n") or 1) != 1:
        return "n"
    if body.get("echo"):
        return "echo"
    if body.get("logprobs") or body.get("top_logprobs"):
        return "logprobs"
    # presence and frequency penalties count only output tokens: replayed ones become prompt and stop counting
    if body.get("presence_penalty") or body.get("frequency_penalty"):
        return "penalties"
    # a stop string may straddle the break: the continuation's output never holds the part before it
    if body.get("stop"):
        return "stop_strings"
    if (body.get("stream_options") or {}).get("continuous_usage_stats"):
        return "continuous_usage"
    if kind == "chat":
        if body.get("include_reasoning") is False:  # vLLM then hides token_ids (serving.py hide_stream_metadata)
            return "reasoning_hidden"
        if body.get("tool_choice") not in (None, "none"):
            return "tools"
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) and not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return "batch_prompt"  # several prompts in one request: several answers
    if not isinstance(body.get("model"), str):
        return "no_model"
    return None


class Metrics:
    """The metric names of the interface (docs/gateway.md), in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.attempts = Counter("gennstack_resume_attempts", "continuation requests sent", ["model"], registry=self.registry)
        self.succeeded = Counter("gennstack_resume_succeeded", "broken streams resumed to their end", ["model"],
                                 registry=self.registry)
        self.refused = Counter("gennstack_resume_refused", "requests relayed without resume, by reason",
                               ["model", "reason"], registry=self.registry)
        self.failed = Counter("gennstack_resume_failed", "broken streams that could not be resumed, by reason",
                              ["model", "reason"], registry=self.registry)
        self.replayed = Counter("gennstack_resume_replayed_tokens", "prompt + generated token IDs sent again",
                                ["model"], registry=self.registry)
        self.in_flight = Gauge("gennstack_resume_streams_in_flight", "client requests being relayed now",
                               registry=self.registry)


class Break(Exception):
    """The upstream answer stopped before its end (the message says how)."""


class ResumeFailed(Exception):
    def __init__(self, reason: str, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.reason, self.status = reason, status


@dataclass
class Stream:
    """What the relay knows of one client request's answer."""

    kind: str  # "chat" | "completion"
    body: dict[str, Any]
    client_ids: bool  # the client asked for token IDs itself
    client_stream: bool
    emit_usage: bool
    started: float
    id: str | None = None
    created: int | None = None
    model: str | None = None
    prompt_ids: list[int] | None = None
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None
    usage_raw: bytes | None = None
    resumable: str | None = None  # None: yes; else the refusal reason
    resumed: bool = False
    # non-streaming assembly
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_key: str = "reasoning"
    harmony: Any = None
    attempts: int = 0  # upstream requests after the first (continuations and restarts), per client request
    path: str = ""
    upstream_body: dict[str, Any] = field(default_factory=dict)


def _ids(raw: bytes) -> list[int]:
    return [int(x) for x in raw.split(b",") if x.strip()] if raw else []


_TOKEN_KEY = b',"token_ids":'
_PROMPT_KEY = b',"prompt_token_ids":'


def _cut(data: bytes, key: bytes) -> bytes:
    """``data`` without the field ``key`` (a list of integers or null), found by bytes, not by parsing."""
    i = data.find(key)
    if i < 0:
        return data
    start = i + len(key)
    if data.startswith(b"null", start):
        return data[:i] + data[start + 4:]
    end = data.find(b"]", start)
    return data[:i] + data[end + 1:] if end > 0 else data


def strip_ids(data: bytes) -> bytes:
    """The chunk without vLLM's token ID fields (they follow other fields, so a comma precedes them)."""
    if b"token_ids" not in data:
        return data
    data = _cut(_cut(data, _TOKEN_KEY), _PROMPT_KEY)
    return _STRIP.sub(b"", data) if b'token_ids"' in data else data


class Relay:
    def __init__(self, config: ResumeConfig, upstream: str, metrics: Metrics | None = None) -> None:
        self.config = config
        self.upstream = upstream.rstrip("/")
        self.metrics = metrics or Metrics()
        self.draining = False
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self._session: aiohttp.ClientSession | None = None
        self._harmony_encoding: Any = None

    # --- app ---------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
        # read_bufsize: a first chunk carries every prompt token ID on one line (32768 IDs: ~200 KB)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False, read_bufsize=2 ** 22,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def _close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def _healthz(self, _request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        return web.json_response({"status": "ok"})

    def _enter(self) -> None:
        self.in_flight += 1
        self.idle.clear()
        self.metrics.in_flight.set(self.in_flight)

    def _leave(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)
        if not self.in_flight:
            self.idle.set()

    @staticmethod
    def _headers(headers: Any) -> dict[str, str]:
        return {k: v for k, v in headers.items() if k.lower() not in _HOP}

    @staticmethod
    def _request_headers(headers: Any) -> dict[str, str]:
        """What goes upstream: no hop-by-hop headers and no x-envoy-* (the routing Envoy trusts those from an
        internal address: a client's x-envoy-max-retries must not reach it through the relay)."""
        return {k: v for k, v in headers.items() if k.lower() not in _HOP and not k.lower().startswith("x-envoy-")}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._enter()
        try:
            body = await request.read()
            path = request.path
            if request.method == "POST" and path in GENERATION_PATHS:
                kind = "chat" if path.endswith("chat/completions") else "completion"
                try:
                    parsed = json.loads(body)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    reason = refusal(kind, parsed)
                    if reason is None:
                        return await self._resumable(request, kind, parsed)
                    self.metrics.refused.labels(str(parsed.get("model")), reason).inc()
            return await self._pass(request, body)
        finally:
            self._leave()

    async def _pass(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Relay the request and its answer unchanged."""
        assert self._session is not None
        url = self.upstream + request.rel_url.path_qs
        try:
            upstream = await self._session.request(request.method, url, data=body if body else None,
                                                   headers=self._request_headers(request.headers))
        except (aiohttp.ClientError, OSError) as exc:
            return _error_response(502, f"upstream unreachable: {exc}")
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                          headers=self._headers(upstream.headers))
            await response.prepare(request)
            try:
                async for data in upstream.content.iter_any():
                    await response.write(data)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                # not resumable: the client must see a broken answer, never a silent end
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write_eof()
            return response

    # --- resumable requests -----------------------------------------------------------------------
    async def _resumable(self, request: web.Request, kind: str, body: dict[str, Any]) -> web.StreamResponse:
        client_stream = bool(body.get("stream"))
        stream_options = body.get("stream_options") or {}
        # the gateway adds include_usage to streaming chat (the AI Gateway does): the client sees usage there
        emit_usage = client_stream and (kind == "chat" or bool(stream_options.get("include_usage"))) or not client_stream
        state = Stream(kind=kind, body=body, client_ids=bool(body.get("return_token_ids")), client_stream=client_stream,
                       emit_usage=emit_usage, started=time.monotonic())
        upstream_body = {**body, "stream": True, "return_token_ids": True,
                         "stream_options": {**stream_options, "include_usage": True}}
        state.path, state.upstream_body = request.path, upstream_body
        headers = self._request_headers(request.headers)
        headers["content-type"] = "application/json"
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)  # reads: bounded by _read_bound
        # A pooled connection the routing proxy closed (draining, idle close) fails the write, and aiohttp 3.14.5
        # retries a reused connection only for idempotent methods (client.py IDEMPOTENT_METHODS, no POST): so the
        # relay tries again itself, on a new connection, before any byte of an answer came (nothing to lose).
        upstream = None
        for tried in range(self.config.max_attempts + 1):
            try:
                upstream = await self._session.post(self.upstream + request.path, data=json.dumps(upstream_body).encode(),
                                                    headers=headers, timeout=timeout)
                break
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                error = exc
                if tried < self.config.max_attempts:
                    await asyncio.sleep(min(1.0, 0.1 * 2 ** tried))
        if upstream is None:
            return _error_response(502, f"upstream unreachable ({self.config.max_attempts + 1} tries): {error}")
        if upstream.status != 200 or not upstream.headers.get("content-type", "").startswith("text/event-stream"):
            # nothing was generated: the routing Envoy already retried; the client gets its answer as is
            async with upstream:
                data = await upstream.read()
                return web.Response(status=upstream.status, body=data, headers=self._headers(upstream.headers))
        response: web.StreamResponse | None = None
        if client_stream:
            out_headers = self._headers(upstream.headers)
            response = web.StreamResponse(status=200, headers=out_headers)
            await response.prepare(request)
        write = _client_writer(response) if response is not None else _discard
        try:
            return await self._answer(request, response, upstream, state, headers, write)
        except ClientGone:
            return response  # type: ignore[return-value]

    async def _answer(self, request: web.Request, response: web.StreamResponse | None, upstream: aiohttp.ClientResponse,
                      state: Stream, headers: dict[str, str], write) -> web.StreamResponse:
        body = state.body
        broken: str | None = None
        async with upstream:
            try:
                await self._relay_first(upstream, state, write)
            except Break as exc:
                broken = str(exc)
        while broken is not None:
            if state.id is None:
                # broken before its first chunk (a server lost during prefill): nothing of the answer came, so
                # the request is sent again as it was (as Envoy retries before headers), from the same budget
                try:
                    broken = await self._restart(state, headers, write)
                except ResumeFailed as exc:
                    self.metrics.failed.labels(str(body.get("model")), exc.reason).inc()
                    return await self._fail(request, response, state, exc)
                continue
            if state.resumable is not None:
                self.metrics.failed.labels(str(state.model or body.get("model")), "not_resumable").inc()
                return await self._fail(request, response, state, ResumeFailed(
                    "not_resumable", f"the upstream answer broke ({broken}) and this request is not resumable "
                                     f"({state.resumable})", 502))
            try:
                broken = await self._continue(state, headers, write)
            except ResumeFailed as exc:
                self.metrics.failed.labels(str(state.model), exc.reason).inc()
                return await self._fail(request, response, state, exc)
        if state.resumed:
            self.metrics.succeeded.labels(str(state.model)).inc()
        return await self._finish(request, response, state, write)

    async def _fail(self, request: web.Request, response: web.StreamResponse | None, state: Stream,
                    exc: ResumeFailed) -> web.StreamResponse:
        error = {"error": {"message": f"the answer broke and could not be resumed: {exc}", "type": "resume_failed",
                           "code": exc.status, "reason": exc.reason}}
        if response is None:
            return web.json_response(error, status=exc.status)
        try:
            await response.write(b"data: " + json.dumps(error).encode() + b"\n\n")
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return response

    async def _finish(self, request: web.Request, response: web.StreamResponse | None, state: Stream, write) -> web.StreamResponse:
        if response is not None:
            if state.resumed and state.emit_usage:
                await write(_sse(self._chunk(state, None, usage=self._usage(state))))
            elif state.usage_raw is not None and state.emit_usage:
                await write(b"data: " + state.usage_raw + b"\n\n")
            await write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response(self._assembled(state))

    def _usage(self, state: Stream) -> dict[str, Any]:
        prompt = len(state.prompt_ids or ())
        return {"prompt_tokens": prompt, "completion_tokens": len(state.generated), "total_tokens": prompt + len(state.generated)}

    def _assembled(self, state: Stream) -> dict[str, Any]:
        """The non-streaming answer, in vLLM 0.29.0's ChatCompletionResponse / CompletionResponse shape."""
        usage = self._usage(state) if state.resumed or state.usage is None else state.usage
        text = "".join(state.content)
        if state.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                                       "audio": None, "function_call": None, "tool_calls": [],
                                       "reasoning": "".join(state.reasoning) or None}
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": state.finish_reason, "stop_reason": state.stop_reason}
            if state.client_ids:
                choice["token_ids"] = state.generated
            answer = {"id": state.id, "object": "chat.completion", "created": state.created, "model": state.model,
                      "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": usage,
                      "prompt_logprobs": None, "prompt_token_ids": state.prompt_ids if state.client_ids else None,
                      "kv_transfer_params": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": state.finish_reason,
                      "stop_reason": state.stop_reason, "prompt_logprobs": None}
            if state.client_ids:
                choice.update(token_ids=state.generated, prompt_token_ids=state.prompt_ids)
            answer = {"id": state.id, "object": "text_completion", "created": state.created, "model": state.model,
                      "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": usage,
                      "kv_transfer_params": None}
        return answer

    async def _relay_first(self, upstream: aiohttp.ClientResponse, state: Stream, write) -> None:
        """Relay the first upstream answer; raises Break where it stops before its end.

        Reads whatever bytes have arrived, splits them into events itself and writes what it relays of
        them at once (not a line and a write per event: the relay's cost per token)."""
        first = True
        ended = False
        buffer = b""
        try:
            while True:
                async with asyncio.timeout(self._read_bound(state, waiting_first=first)):
                    piece = await upstream.content.readany()
                if not piece:
                    break
                buffer += piece
                if b"\n\n" not in buffer:
                    if b"\r\n\r\n" not in buffer:
                        continue
                    buffer = buffer.replace(b"\r\n", b"\n")
                *events, buffer = buffer.split(b"\n\n")
                out = []
                for event in events:
                    if not event.startswith(b"data:"):
                        event = next((line for line in event.split(b"\n") if line.startswith(b"data:")), b"")
                        if not event:
                            continue
                    data = event[5:].strip()
                    if data == b"[DONE]":
                        ended = True
                        break
                    if first:
                        first = False
                        self._first_chunk(state, data)
                    if data.startswith(b'{"error"'):
                        if out:
                            await write(b"".join(out))
                        raise Break(f"an error event: {data[:200].decode(errors='replace')}")
                    if b'"choices":[]' in data and b'"usage"' in data:
                        state.usage = json.loads(data).get("usage")
                        state.usage_raw = data if state.client_ids else strip_ids(data)
                        continue  # the relay writes the usage chunk itself (once, at the end)
                    self._scan(state, data)
                    if state.client_stream:
                        out.append(b"data: " + (data if state.client_ids else strip_ids(data)) + b"\n\n")
                if out:
                    await write(b"".join(out))
                if ended:
                    break
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise Break(f"connection lost: {type(exc).__name__}") from None
        except TimeoutError:
            raise Break("no first chunk before the deadline" if first else
                        f"no byte for {self.config.upstream_idle_timeout_s} s") from None
        if not ended and state.finish_reason is None:
            raise Break("the stream ended without finish_reason")

    def _read_bound(self, state: Stream, *, waiting_first: bool) -> float:
        """How long the next upstream read may wait. Before an answer's first chunk the server is queueing or
        prefilling (a continuation prefills the whole replay): only the request's deadline bounds it, and the
        routing Envoy's own stream idle timeout, which resets a silent try; between chunks,
        upstream_idle_timeout_s (a server that stopped mid-answer)."""
        if waiting_first:
            return max(1.0, self.config.deadline_s - (time.monotonic() - state.started))
        return float(self.config.upstream_idle_timeout_s)

    def _first_chunk(self, state: Stream, data: bytes) -> None:
        try:
            chunk = json.loads(data)
        except ValueError:
            state.resumable = "unparsable_chunk"
            return
        if "error" in chunk:
            return
        state.id, state.created, state.model = chunk.get("id"), chunk.get("created"), chunk.get("model")
        choices = chunk.get("choices") or [{}]
        prompt = chunk.get("prompt_token_ids") if state.kind == "chat" else choices[0].get("prompt_token_ids")
        state.prompt_ids = prompt
        model = self.config.model(str(state.model))
        reason = None
        if model is None:
            reason = "model_unknown"
        elif not model.resume:
            reason = "model_off"
        elif not isinstance(prompt, list):
            reason = "no_token_ids"  # the server ignored return_token_ids
        elif len(prompt) > self.config.max_replay_tokens:
            reason = "prompt_too_long"
        if model is not None and model.harmony and state.kind == "chat":
            state.harmony = True
        if reason is not None:
            state.resumable = reason
            self.metrics.refused.labels(str(state.model), reason).inc()

    def _scan(self, state: Stream, data: bytes) -> None:
        """The bytes of one chunk: its token IDs, its finish_reason; the texts only when answering whole."""
        i = data.find(_TOKEN_KEY)
        if i >= 0 and data[i + len(_TOKEN_KEY)] == 91:  # "["
            start = i + len(_TOKEN_KEY) + 1
            state.generated.extend(_ids(data[start:data.find(b"]", start)]))
        elif i < 0 and b'"token_ids":[' in data:
            match = _IDS.search(data)
            if match is not None:
                state.generated.extend(_ids(match.group(1)))
        finished = _FINISHED.search(data) if b'"finish_reason":"' in data else None
        if finished is not None:
            state.finish_reason = finished.group(1).decode()
            if b'"stop_reason":' in data and b'"stop_reason":null' not in data:
                state.stop_reason = (json.loads(data)["choices"] or [{}])[0].get("stop_reason")
        if state.kind == "chat" and state.resumable is None and not state.harmony and (
                b'"reasoning":' in data or b'"reasoning_content":' in data or b'"tool_calls":[{' in data):
            # a reasoning or tool parser's split of the output: /v1/completions output is never parsed. Matched as
            # keys (a quote, the name, a quote and a colon): text that begins with "reasoning" is a string's content
            state.resumable = "tools" if b'"tool_calls":[{' in data else "reasoning_parser"
            self.metrics.refused.labels(str(state.model), state.resumable).inc()
        if not state.client_stream:
            chunk = json.loads(data)
            for choice in chunk.get("choices") or ():
                if state.kind == "chat":
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        state.content.append(delta["content"])
                    for key in ("reasoning", "reasoning_content"):
                        if delta.get(key):
                            state.reasoning.append(delta[key])
                elif choice.get("text"):
                    state.content.append(choice["text"])

    # --- continuation ------------------------------------------------------------------------------
    def _continuation_body(self, state: Stream) -> dict[str, Any]:
        body = state.body
        replay = list(state.prompt_ids or ()) + state.generated
        request: dict[str, Any] = {"model": state.model, "prompt": replay, "stream": True, "return_token_ids": True,
                                   "stream_options": {"include_usage": True}}
        for key in _CARRIED:
            if key in body:
                request[key] = body[key]
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if limit is not None:
            request["max_tokens"] = int(limit) - len(state.generated)
        if body.get("min_tokens"):
            request["min_tokens"] = max(0, int(body["min_tokens"]) - len(state.generated))
        if state.kind == "chat":
            # chat answers skip special tokens unless told; the completion of the continuation does the same
            request.setdefault("skip_special_tokens", body.get("skip_special_tokens", True))
        return request

    async def _spend_attempt(self, state: Stream, model: str, last: str) -> None:
        if state.attempts >= self.config.max_attempts:
            raise ResumeFailed("attempts_exhausted" if last != "no_replica" else "no_replica",
                               f"{state.attempts} attempts used up (last: {last})")
        if time.monotonic() - state.started > self.config.deadline_s:
            raise ResumeFailed("deadline", f"past the request's deadline of {self.config.deadline_s} s")
        state.attempts += 1
        self.metrics.attempts.labels(model).inc()
        if state.attempts > 1:
            await asyncio.sleep(min(1.0, 0.1 * 2 ** (state.attempts - 2)))

    async def _restart(self, state: Stream, headers: dict[str, str], write) -> str | None:
        """The original request again; None at its end, or why it broke."""
        last = "no_replica"
        while True:
            await self._spend_attempt(state, str(state.body.get("model")), last)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)  # reads: bounded by _read_bound
            assert self._session is not None
            try:
                upstream = await self._session.post(self.upstream + state.path, data=json.dumps(state.upstream_body).encode(),
                                                    headers=headers, timeout=timeout)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                continue
            async with upstream:
                if upstream.status != 200:
                    last = "no_replica" if upstream.status in (502, 503, 504) else f"HTTP {upstream.status}"
                    continue
                try:
                    await self._relay_first(upstream, state, write)
                except Break as exc:
                    return str(exc)
                return None

    async def _continue(self, state: Stream, headers: dict[str, str], write) -> str | None:
        """One continuation; returns None at the answer's end, or why it broke again. ResumeFailed when it may not go on."""
        model = str(state.model)
        last = ""
        while True:
            body = self._continuation_body(state)
            if "max_tokens" in body and body["max_tokens"] <= 0:
                # every token it may have is here: the break took only the finish chunk
                state.resumed = True
                await self._emit(state, [], "", "length", None, write)
                return None
            if len(body["prompt"]) > self.config.max_replay_tokens:
                raise ResumeFailed("replay_too_long", f"the replay ({len(body['prompt'])} tokens) exceeds "
                                                      f"max_replay_tokens {self.config.max_replay_tokens}")
            await self._spend_attempt(state, model, last)
            self.metrics.replayed.labels(model).inc(len(body["prompt"]))
            send = {**headers, RESUME_HEADER: CONTINUATION, "content-type": "application/json"}
            assert self._session is not None
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)  # reads: bounded by _read_bound
            try:
                upstream = await self._session.post(self.upstream + "/v1/completions", data=json.dumps(body).encode(),
                                                    headers=send, timeout=timeout)
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                last = "no_replica"
                del exc
                continue
            async with upstream:
                if upstream.status >= 500 or upstream.status == 429:
                    last = "no_replica" if upstream.status in (502, 503, 504) else f"HTTP {upstream.status}"
                    continue
                if upstream.status != 200:
                    text = (await upstream.read())[:300].decode(errors="replace")
                    raise ResumeFailed("continuation_rejected", f"the continuation got HTTP {upstream.status}: {text}",
                                       502)
                state.resumed = True
                try:
                    await self._relay_continuation(upstream, state, write)
                except Break as exc:
                    last = str(exc)
                    if state.finish_reason is not None:
                        return None
                    # tokens it relayed are kept: the next attempt goes on from there
                    continue
                return None

    async def _relay_continuation(self, upstream: aiohttp.ClientResponse, state: Stream, write) -> None:
        ended = False
        first = True
        try:
            while True:
                async with asyncio.timeout(self._read_bound(state, waiting_first=first)):
                    line = await upstream.content.readline()
                if not line:
                    break
                first = False
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    ended = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise Break(f"an error event: {str(chunk['error'])[:200]}")
                for choice in chunk.get("choices") or ():
                    ids = choice.get("token_ids") or []
                    text = choice.get("text") or ""
                    finish = choice.get("finish_reason")
                    await self._emit(state, ids, text, finish, choice.get("stop_reason"), write)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise Break(f"connection lost: {type(exc).__name__}") from None
        except TimeoutError:
            raise Break("no first chunk before the deadline" if first else
                        f"no byte for {self.config.upstream_idle_timeout_s} s") from None
        if not ended and state.finish_reason is None:
            raise Break("the continuation ended without finish_reason")

    async def _emit(self, state: Stream, ids: list[int], text: str, finish: str | None, stop_reason: Any, write) -> None:
        """One continuation chunk as a chunk of the original answer."""
        state.generated.extend(ids)
        if finish is not None:
            state.finish_reason, state.stop_reason = finish, stop_reason
        content, reasoning = text, ""
        if state.harmony is not None and state.kind == "chat":
            content, reasoning = self._harmony_delta(state, ids)
        if state.harmony is not None and not content and not reasoning and finish is None:
            return  # Harmony's control tokens: vLLM sends no chunk for them either (parser/harmony.py parse_delta)
        if not state.client_stream:
            if content:
                state.content.append(content)
            if reasoning:
                state.reasoning.append(reasoning)
            return
        if state.kind == "chat":
            delta: dict[str, Any] = {}
            if reasoning:
                delta[state.reasoning_key] = reasoning
            if content or not reasoning:
                delta["content"] = content
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = stop_reason
                choice["delta"] = {} if not (content or reasoning) else delta
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason}
        if state.client_ids:
            choice["token_ids"] = ids
        if not ids and finish is None:
            return
        await write(_sse(self._chunk(state, choice)))

    def _chunk(self, state: Stream, choice: dict[str, Any] | None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": state.id, "object": _object(state), "created": state.created, "model": state.model,
                                 "choices": [choice] if choice is not None else []}
        if usage is not None:
            chunk["usage"] = usage
        return chunk

    def _harmony_delta(self, state: Stream, ids: list[int]) -> tuple[str, str]:
        """(content, reasoning) of the continuation's ``ids``, parsed on from every ID generated before them."""
        from openai_harmony import HarmonyEncodingName, Role, StreamableParser, load_harmony_encoding

        if state.harmony is True:
            if self._harmony_encoding is None:
                try:
                    self._harmony_encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
                except Exception as exc:  # HarmonyError: its vocabulary (o200k_base) could not be read or fetched
                    raise ResumeFailed("harmony_unavailable", f"openai-harmony could not load its encoding: {exc}") from None
            parser = StreamableParser(self._harmony_encoding, role=Role.ASSISTANT)
            for token in state.generated[:len(state.generated) - len(ids)]:
                parser.process(token)
            state.harmony = parser
        parser = state.harmony
        content, reasoning = [], []
        for token in ids:
            parser.process(token)
            delta = parser.last_content_delta or ""
            channel, recipient = parser.current_channel, parser.current_recipient
            if recipient and recipient.startswith("functions."):
                raise ResumeFailed("harmony_tool_call", "a Harmony tool call in a continuation is not resumed", 502)
            if channel == "analysis":
                reasoning.append(delta)
            elif channel == "final" or (channel == "commentary" and recipient is None):
                content.append(delta)
        return "".join(content), "".join(reasoning)


def _object(state: Stream) -> str:
    return "chat.completion.chunk" if state.kind == "chat" else "text_completion"


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _discard(_data: bytes) -> None:
    return None


class ClientGone(Exception):
    """The client (the front Envoy) closed its connection: nothing more to relay."""


def _client_writer(response: web.StreamResponse):
    async def write(data: bytes) -> None:
        try:
            await response.write(data)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from None
    return write


def _error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "upstream_error", "code": status}}, status=status)


# --- serving ---------------------------------------------------------------------------------------
async def run(config: ResumeConfig, listen: tuple[str, int], upstream: str,
              metrics_listen: tuple[str, int] | None = None, *, ready: Iterable[Any] = ()) -> None:
    """Serve until SIGTERM/SIGINT: then /healthz answers 503, the listener closes, in-flight requests finish."""
    relay = Relay(config, upstream)
    runner = web.AppRunner(relay.app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, listen[0], listen[1], backlog=4096, reuse_address=True)
    await site.start()
    metrics_runner = None
    if metrics_listen is not None:
        metrics_app = web.Application()

        async def _metrics(_request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(relay.metrics.registry), headers={"content-type": CONTENT_TYPE_LATEST})

        metrics_app.router.add_get("/metrics", _metrics)
        metrics_runner = web.AppRunner(metrics_app, access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, metrics_listen[0], metrics_listen[1]).start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else listen[1]  # type: ignore[union-attr]
    print(f"gennstack resume relay listening on http://{listen[0]}:{bound} -> {upstream}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    relay.draining = True
    print("gennstack resume relay: stopping; finishing in-flight streams", flush=True)
    # a last health check or two sees 503 (the front Envoy stops sending), then the listener closes
    await asyncio.sleep(min(2.0, config.upstream_idle_timeout_s))
    if site._server is not None:  # type: ignore[union-attr]
        site._server.close()  # type: ignore[union-attr]
    # the request being served on each connection is finished; wait for them all
    await relay.idle.wait()
    await runner.cleanup()
    if metrics_runner is not None:
        await metrics_runner.cleanup()


def serve_forever(config: ResumeConfig, *, listen: tuple[str, int], upstream: str,
                  metrics_listen: tuple[str, int] | None = None) -> int:
    try:
        # uvloop where installed (uvicorn[standard] brings it): the same program, a faster event loop
        try:
            import uvloop
        except ImportError:
            factory = None
        else:
            factory = uvloop.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(run(config, listen, upstream, metrics_listen))
    except OSError as exc:
        print(f"gennstack resume serve: {exc}", file=sys.stderr)
        return 2
    return 0
