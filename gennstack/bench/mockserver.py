"""A local OpenAI-compatible server that streams on a programmed, fixed schedule.

It is the ground truth the benchmark is tested against, and a way for users to try the tool
without a GPU: ``gennstack bench mock-server --ttft 0.2 --itl 0.05``.

Schedule of one streamed chat completion, all times on the server's monotonic clock from
``t_recv`` (the moment the request body has been read):

* at ``t_recv``: a role chunk with empty content (what vLLM and OpenAI send first; a client
  must not count it as the first token);
* chunk ``k`` (k = 0 .. C-1) at ``t_recv + ttft + k * itl``, each holding ``tokens_per_chunk``
  tokens (the last one the remainder), so ``C = ceil(n / tokens_per_chunk)``. Targets are
  absolute, so a late wake-up never delays the chunks after it;
* right after the last chunk: a chunk with ``finish_reason``, a usage chunk (when the client
  asked with ``stream_options.include_usage`` and usage is on), ``data: [DONE]``.

``n`` is the request's ``max_tokens`` (or ``--output-tokens`` when set). Faults are injected by
request number, counting chat completion requests from 1 in arrival order: the first
``Fault`` whose ``every`` divides that number applies, so a test knows exactly which
requests fail and how.

Doomed mode models a spot node being reclaimed: ``--doomed-warning-at W --doomed-gone-after G``
(or ``POST /doom`` with ``{"warning_in_s": W, "gone_after_s": G}``) records an interruption
warning W seconds later (W from the server's start for the flags, from the call for the API) and,
G seconds after the warning (120 on AWS; scaled down for tests), is gone: the listening socket
closes, every open connection is closed at once, as when a process is killed (streams in flight
are cut mid-way, without ``[DONE]``), and ``gennstack bench mock-server`` exits. Between warning
and gone it serves as usual, as a node does unless something drains it. With ``--doomed-drain``
(``"drain": true``) its ``/health`` answers 503 from the warning on while it keeps serving whatever
reaches it, which a gateway's active health check turns into "no new requests" (drain routing
itself takes the pod out of its Service's DNS answer instead: ``gennstack drill --local``,
docs/spot-drills.md). :class:`MockProcess` and :func:`start_process` run a server as a process.
With ``--events-file``, the warning and the gone moment are appended as ``interruption_warning``
and ``replica_gone`` lines in the format of ``gennstack drill``'s ``drill-events.jsonl`` (the gone
line carries the server's final ``chat_requests``, ``chat_requests_after_warning``, ``completed_streams``
and ``streams_in_flight``: the streams it cuts, begun and not ended).
``/stats`` reports ``doomed`` (the schedule), ``chat_requests_after_warning`` and ``streams_in_flight``.

Prefix cache (``--prefix-cache-entries N --prefill-per-token S``) imitates a model server that keeps the
KV state of what it served and computes only the part of a new prompt it does not hold, as
llama-cpp-python 0.3.36 does (``Llama.generate`` evaluates the tokens after the longest common prefix
with its current state; a ``LlamaRAMCache`` restores the cached state of the longest matching prefix)
and vLLM's automatic prefix caching does per block: a prompt is its messages as words (``<role>`` then
the content's words), every completed stream stores its prompt plus ``<assistant>`` and its answer's
words (the last N, least recently used evicted), and the first chunk waits ``--ttft`` plus ``S`` per
word after the longest stored prefix. ``/stats`` counts ``prompt_words`` and ``cached_prompt_words``
(vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``, in words). ``--record-requests FILE`` appends
each chat request's ``messages`` and ``max_tokens`` to FILE as one JSON line.

The server is a small HTTP/1.1 implementation on asyncio streams (keep-alive, chunked
transfer encoding), so that the scheduling cost per chunk stays low and predictable. It closes a
keep-alive connection on which no new request has begun ``--keep-alive-timeout`` seconds (5 by default)
after its last response, as vLLM's API server does: uvicorn with timeout_keep_alive =
VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default (vllm 0.29.0 vllm/envs.py; uvicorn 0.55.0
protocols/http/httptools_impl.py on_response_complete arms the timer, timeout_keep_alive_handler closes
the transport, any byte received first cancels it). ``/stats`` counts them in ``keep_alive_closes`` (and the connections held now in ``connections_open``).

Token IDs (for the resume relay, gennstack/resume/): a request with ``return_token_ids: true``, and every
``/v1/completions`` request, is answered in token mode, as vLLM 0.29.0 does with return_token_ids
(vllm/entrypoints/openai/chat_completion/protocol.py ChatCompletionStreamResponse.prompt_token_ids on the
first chunk, ChatCompletionResponseStreamChoice.token_ids per chunk; completion/protocol.py
CompletionResponseStreamChoice.prompt_token_ids and token_ids). The mock's tokenizer maps each prompt word
to an ID (``word_id``) and ends every prompt it tokenizes with its generation marker ``MARK``; a
``/v1/completions`` prompt may be a list of token IDs, taken as is. Greedy output is a pure function of
the token sequence (``next_token``: a rolling hash over every ID before it), and ``--output-tokens`` counts
the tokens after the last ``MARK``: so a continuation whose prompt is (prompt IDs + the first k generated
IDs) yields exactly tokens k+1.. of the uninterrupted answer, with the same texts (``token_text``).
Faults count chat and completion requests together (``generation_requests``), from 1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
_MAX_BODY = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Fault:
    """``kind`` is ``http`` (answer ``status`` at once), ``stall`` (stop sending after
    ``after_chunks`` content chunks and hold the connection open), ``broken`` (reset the
    connection after ``after_chunks`` content chunks) or ``reset`` (reset the connection before any
    byte of a response, as a client sees a request written onto a connection the server was closing)."""

    kind: str
    every: int
    status: int = 500
    after_chunks: int = 2

    @classmethod
    def parse(cls, spec: str, *, after_chunks: int = 2) -> Fault:
        """``http:STATUS:EVERY``, ``stall:EVERY``, ``broken:EVERY`` or ``reset:EVERY``."""
        parts = spec.split(":")
        try:
            if parts[0] == "http" and len(parts) == 3:
                status, every = int(parts[1]), int(parts[2])
                if not 400 <= status <= 599:
                    raise ValueError
                fault = cls("http", every, status=status, after_chunks=after_chunks)
            elif parts[0] in ("stall", "broken", "reset") and len(parts) == 2:
                fault = cls(parts[0], int(parts[1]), after_chunks=after_chunks)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"--fault={spec!r}: expected http:STATUS:EVERY (STATUS 400-599), stall:EVERY, broken:EVERY or reset:EVERY"
            ) from None
        if fault.every < 1:
            raise ValueError(f"--fault={spec!r}: EVERY must be at least 1")
        return fault


@dataclass(frozen=True, slots=True)
class MockSettings:
    ttft_s: float = 0.1
    itl_s: float = 0.02
    tokens_per_chunk: int = 1
    output_tokens: int | None = None  # None: honour the request's max_tokens
    default_max_tokens: int = 64
    reasoning_tokens: int = 0  # the first R tokens stream as reasoning_content
    usage: bool = True
    faults: tuple[Fault, ...] = ()
    stall_max_s: float = 300.0
    doomed_warning_at_s: float | None = None  # seconds from start(); None: not doomed
    doomed_gone_after_s: float = 120.0  # seconds from the warning to gone
    doomed_drain: bool = False  # /health answers 503 from the warning on
    events_file: str | None = None
    # a non-streaming answer is sent whole when the stream's last chunk would be (ttft + (C-1) x itl), as
    # vLLM sends nothing before a non-streaming answer is done; False: at once
    paced_non_streaming: bool = False
    prefix_cache_entries: int = 0  # 0: no prefix cache
    prefill_s_per_token: float = 0.0  # extra TTFT per prompt word not in the prefix cache
    record_file: str | None = None
    # seconds an idle keep-alive connection is kept after a response (uvicorn's and vLLM's default, 5); 0: forever
    keep_alive_s: float = 5.0
    # a stream's TTFT and ITL are multiplied by 1 + F x (streams in flight when it arrives): a server that slows
    # down with its batch, so an open-loop sweep finds a saturated rate; 0: every stream on the programmed schedule
    slowdown_per_stream: float = 0.0

    def fault_for(self, request_number: int) -> Fault | None:
        for fault in self.faults:
            if request_number % fault.every == 0:
                return fault
        return None


@dataclass(slots=True)
class MockStats:
    chat_requests: int = 0
    completion_requests: int = 0  # /v1/completions
    generation_requests: int = 0  # chat + completions: the count faults go by
    completed_streams: int = 0
    chunks_sent: int = 0
    tokens_sent: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    max_lateness_s: float = 0.0
    total_lateness_s: float = 0.0
    first_chunks: int = 0  # streams that sent their first content chunk
    total_ttft_s: float = 0.0  # over those: seconds from t_recv to that chunk, as sent
    chat_requests_after_warning: int = 0
    streams_in_flight: int = 0  # streamed responses begun (headers written) and not ended
    completed_answers: int = 0  # non-streaming answers sent whole
    abandoned_answers: int = 0  # paced non-streaming answers whose client went away before they were done
    doomed: dict | None = None
    prompt_words: int = 0
    cached_prompt_words: int = 0
    keep_alive_closes: int = 0  # idle keep-alive connections this server closed (keep_alive_s)

    def to_dict(self) -> dict:
        return {
            "chat_requests": self.chat_requests,
            "completion_requests": self.completion_requests,
            "generation_requests": self.generation_requests,
            "chat_requests_after_warning": self.chat_requests_after_warning,
            "streams_in_flight": self.streams_in_flight,
            "doomed": self.doomed,
            "completed_streams": self.completed_streams,
            "completed_answers": self.completed_answers,
            "abandoned_answers": self.abandoned_answers,
            "chunks_sent": self.chunks_sent,
            "tokens_sent": self.tokens_sent,
            "faults": dict(self.faults),
            "max_lateness_s": self.max_lateness_s,
            "mean_lateness_s": self.total_lateness_s / self.chunks_sent if self.chunks_sent else 0.0,
            "mean_ttft_s": self.total_ttft_s / self.first_chunks if self.first_chunks else None,
            "prompt_words": self.prompt_words,
            "cached_prompt_words": self.cached_prompt_words,
            "keep_alive_closes": self.keep_alive_closes,
        }


def prompt_words(messages) -> tuple[str, ...]:
    """A chat prompt as the prefix cache sees it: per message ``<role>`` and the content's words."""
    words: list[str] = []
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            words.append(f"<{message.get('role')}>")
            words.extend(str(message.get("content") or "").split())
    return tuple(words)


def common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _frame(payload: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


MARK = 999  # the generation marker every prompt the mock tokenizes ends with
_VOCAB = 50000
_MASK = (1 << 61) - 1


def word_id(word: str) -> int:
    """The mock tokenizer: one ID per prompt word, 1000 .. 1000 + _VOCAB - 1."""
    return 1000 + zlib.crc32(word.encode()) % _VOCAB


def tokenize(words: tuple[str, ...] | list[str]) -> list[int]:
    return [word_id(word) for word in words] + [MARK]


def fold(state: int, token: int) -> int:
    """The rolling hash greedy decoding continues from (a pure function of every ID so far)."""
    return (state * 1000003 + token + 1) & _MASK


def sequence_state(ids: list[int]) -> int:
    state = 0
    for token in ids:
        state = fold(state, token)
    return state


def next_token(state: int) -> int:
    return 1000 + (state >> 17) % _VOCAB


def token_text(token: int) -> str:
    return f" w{token}"


def greedy_answer(prompt_ids: list[int], n: int) -> list[int]:
    """The n tokens the mock answers ``prompt_ids`` with (token mode, no --output-tokens)."""
    state, out = sequence_state(prompt_ids), []
    for _ in range(n):
        token = next_token(state)
        out.append(token)
        state = fold(state, token)
    return out


def chat_reference_text(messages: list[dict], n: int) -> str:
    """The text of the mock's uninterrupted greedy chat answer in token mode (what a resumed answer must equal)."""
    return "".join(token_text(t) for t in greedy_answer(tokenize(prompt_words(messages)), n))


def already_generated(ids: list[int]) -> int:
    """Tokens after the last generation marker: what a continuation's prompt holds of the answer."""
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == MARK:
            return len(ids) - 1 - i
    return 0


class MockServer:
    """Serve ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health`` and ``/stats``."""

    def __init__(self, settings: MockSettings, *, model: str = "mock-model") -> None:
        self.settings = settings
        self.model = model
        self.stats = MockStats()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._streaming: set[asyncio.StreamWriter] = set()  # connections with a streamed response begun, not ended
        self._warned = False
        self._doom_task: asyncio.Task | None = None
        self.gone = asyncio.Event()
        self._prefix_cache: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._on_connect, host, port, backlog=4096)
        if self.settings.doomed_warning_at_s is not None:
            self.doom(self.settings.doomed_warning_at_s, self.settings.doomed_gone_after_s, drain=self.settings.doomed_drain)
        return self._server.sockets[0].getsockname()[1]

    def doom(self, warning_in_s: float, gone_after_s: float, *, drain: bool = False) -> None:
        """Schedule the warning ``warning_in_s`` from now and gone ``gone_after_s`` after it (replaces
        an earlier schedule that has not fired); ``drain``: fail ``/health`` from the warning on."""
        if warning_in_s < 0 or gone_after_s < 0:
            raise ValueError(f"warning_in_s={warning_in_s!r} and gone_after_s={gone_after_s!r} must be >= 0")
        if not isinstance(drain, bool):
            raise ValueError(f"drain={drain!r} must be true or false")
        if self._doom_task is not None:
            self._doom_task.cancel()
        self._warned = False
        self.stats.doomed = {"warning_in_s": warning_in_s, "gone_after_s": gone_after_s, "drain": drain,
                             "warned": False, "gone": False}
        self._doom_task = asyncio.get_running_loop().create_task(self._doom(warning_in_s, gone_after_s))

    async def _doom(self, warning_in_s: float, gone_after_s: float) -> None:
        await asyncio.sleep(warning_in_s)
        self._warned = True
        self.stats.doomed["warned"] = True
        self._event("interruption_warning", gone_after_s=gone_after_s)
        await asyncio.sleep(gone_after_s)
        self.stats.doomed["gone"] = True
        # its last counts go with the event: nobody can ask /stats once it is gone
        self._event("replica_gone", chat_requests=self.stats.chat_requests,
                    chat_requests_after_warning=self.stats.chat_requests_after_warning,
                    completed_streams=self.stats.completed_streams, streams_in_flight=self.stats.streams_in_flight)
        self._go()

    def _event(self, event: str, **fields) -> None:
        if not self.settings.events_file:
            return
        stamp = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        record = {"time": stamp, "event": event, "source": "mock-server", "model": self.model, **fields}
        with Path(self.settings.events_file).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")

    def _go(self) -> None:
        """Gone, as a reclaimed node: stop listening and close every connection at once (no [DONE], no end of body)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        self.gone.set()

    async def close(self) -> None:
        if self._doom_task is not None:
            self._doom_task.cancel()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.gone.is_set():
            writer.transport.abort()
            return
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            first = b""
            while await self._serve_one(reader, writer, first):
                first = await self._next_request(reader)
                if first is None:
                    self.stats.keep_alive_closes += 1
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            self._streamed(writer, False)
            if not writer.transport.is_closing():
                writer.close()

    async def _next_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """The first byte of the next request on a keep-alive connection, or None when none began within
        keep_alive_s of the last response (the caller then closes the connection, as uvicorn does)."""
        if not self.settings.keep_alive_s:
            return b""
        try:
            return await asyncio.wait_for(reader.readexactly(1), timeout=self.settings.keep_alive_s)
        except asyncio.TimeoutError:
            return None

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes = b"") -> bool:
        head = first + await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self._write_json(writer, 411, {"error": {"message": "send Content-Length"}}, keep_alive=False)
            return False
        length = int(headers.get("content-length", "0"))
        if length > _MAX_BODY:
            self._write_json(writer, 400, {"error": {"message": "body too large"}}, keep_alive=False)
            return False
        body = await reader.readexactly(length) if length else b""
        t_recv = time.monotonic()
        keep_alive = headers.get("connection", "").lower() != "close"
        path = target.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            if method != "POST":
                self._write_json(writer, 405, {"error": {"message": "use POST"}}, keep_alive)
                return keep_alive
            return await self._chat(reader, writer, body, t_recv, keep_alive)
        if path.endswith("/completions"):
            if method != "POST":
                self._write_json(writer, 405, {"error": {"message": "use POST"}}, keep_alive)
                return keep_alive
            return await self._chat(reader, writer, body, t_recv, keep_alive, completion=True)
        if path.endswith("/models") and method == "GET":
            self._write_json(writer, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}, keep_alive)
        elif path in ("/health", "/healthz") and method == "GET":
            if self._warned and self.stats.doomed and self.stats.doomed["drain"]:
                self._write_json(writer, 503, {"status": "draining"}, keep_alive)
            else:
                self._write_json(writer, 200, {"status": "ok"}, keep_alive)
        elif path == "/doom" and method == "POST":
            try:
                spec = json.loads(body or b"{}")
                self.doom(float(spec["warning_in_s"]), float(spec.get("gone_after_s", 120.0)), drain=spec.get("drain", False))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                self._write_json(writer, 400, {"error": {"message": f"POST /doom wants {{\"warning_in_s\": SECONDS >= 0, "
                                                         f"\"gone_after_s\": SECONDS >= 0, \"drain\": BOOL}}: {exc}"}}, keep_alive)
            else:
                self._write_json(writer, 200, {"doomed": self.stats.doomed}, keep_alive)
        elif path == "/stats" and method == "GET":
            # connections_open: client connections held now, this one excluded
            self._write_json(writer, 200, {**self.stats.to_dict(), "connections_open": len(self._writers) - 1}, keep_alive)
        else:
            self._write_json(writer, 404, {"error": {"message": f"no route {method} {path}"}}, keep_alive)
        await writer.drain()
        return keep_alive

    def _remember(self, words: tuple[str, ...]) -> None:
        self._prefix_cache[words] = None
        self._prefix_cache.move_to_end(words)
        while len(self._prefix_cache) > self.settings.prefix_cache_entries:
            self._prefix_cache.popitem(last=False)

    def _streamed(self, writer: asyncio.StreamWriter, begun: bool) -> None:
        """Keep ``streams_in_flight``: a streamed response begins with its headers and ends with its
        last byte or its connection."""
        if begun:
            self._streaming.add(writer)
        else:
            self._streaming.discard(writer)
        self.stats.streams_in_flight = len(self._streaming)

    @staticmethod
    def _write_json(writer: asyncio.StreamWriter, status: int, obj: dict, keep_alive: bool) -> None:
        body = json.dumps(obj).encode()
        writer.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n%s"
            % (status, _REASONS.get(status, "Error").encode(), len(body), b"keep-alive" if keep_alive else b"close", body)
        )

    async def _chat(self, reader, writer, body: bytes, t_recv: float, keep_alive: bool, completion: bool = False) -> bool:
        s = self.settings
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ValueError
        except ValueError:
            self._write_json(writer, 400, {"error": {"message": "body is not a JSON object"}}, keep_alive)
            await writer.drain()
            return keep_alive
        prompt = request.get("prompt")
        if completion and not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                                            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))):
            self._write_json(writer, 400, {"error": {"message": "prompt: a string or a non-empty list of token IDs"}}, keep_alive)
            await writer.drain()
            return keep_alive
        if completion:
            self.stats.completion_requests += 1
        else:
            self.stats.chat_requests += 1
        self.stats.generation_requests += 1
        self.stats.chat_requests_after_warning += self._warned
        if s.record_file:
            with Path(s.record_file).open("a", encoding="utf-8") as fh:
                record = {"prompt": prompt} if completion else {"messages": request.get("messages")}
                fh.write(json.dumps({**record, "max_tokens": request.get("max_tokens")}) + "\n")
        number = self.stats.generation_requests
        fault = s.fault_for(number)
        if fault is not None:
            self.stats.faults[fault.kind] = self.stats.faults.get(fault.kind, 0) + 1
        if fault is not None and fault.kind == "reset":
            writer.transport.abort()
            return False
        if fault is not None and fault.kind == "http":
            self._write_json(writer, fault.status, {"error": {"message": f"injected HTTP {fault.status}", "code": fault.status}}, keep_alive)
            await writer.drain()
            return keep_alive

        # token mode: what vLLM does with return_token_ids; every /v1/completions request (its text is the tokens')
        token_mode = completion or bool(request.get("return_token_ids"))
        return_ids = bool(request.get("return_token_ids"))
        requested = request.get("max_tokens") or request.get("max_completion_tokens") or s.default_max_tokens
        if completion:
            words = tuple(prompt.split()) if isinstance(prompt, str) else ()
            prompt_ids = tokenize(words) if isinstance(prompt, str) else list(prompt)
        else:
            words = prompt_words(request.get("messages"))
            prompt_ids = tokenize(words) if token_mode else []
        done_before = already_generated(prompt_ids) if token_mode else 0
        finish = "length"
        if token_mode:
            n = int(requested)
            if s.output_tokens is not None and s.output_tokens - done_before <= n:
                n, finish = max(0, s.output_tokens - done_before), "stop"
        else:
            n = int(s.output_tokens or requested)
        chunks = max(1, math.ceil(n / s.tokens_per_chunk)) if n else 0
        prompt_tokens = len(prompt_ids) if token_mode else len(str(request.get("messages", "")).split())
        cached = 0
        if s.prefix_cache_entries:
            best = None
            for entry in self._prefix_cache:
                length = common_prefix(entry, words)
                if length > cached:
                    cached, best = length, entry
            if best is not None:
                self._prefix_cache.move_to_end(best)
        self.stats.prompt_words += len(words)
        self.stats.cached_prompt_words += cached
        ttft_s = s.ttft_s + s.prefill_s_per_token * (len(words) - cached)
        itl_s = s.itl_s
        if s.slowdown_per_stream:
            factor = 1 + s.slowdown_per_stream * len(self._streaming)
            ttft_s, itl_s = ttft_s * factor, itl_s * factor
        rid = f"{'cmpl' if completion else 'chatcmpl'}-mock-{number}"
        created = int(time.time())
        model = request.get("model") or self.model
        state = sequence_state(prompt_ids) if token_mode else 0
        obj = "text_completion" if completion else "chat.completion.chunk"

        def tokens(count: int) -> list[int]:
            nonlocal state
            out = []
            for _ in range(count):
                token = next_token(state)
                out.append(token)
                state = fold(state, token)
            return out

        def chunk(delta: dict, finish_reason: str | None = None, ids: list[int] | None = None, first: bool = False) -> bytes:
            if completion:
                choice = {"index": 0, "text": delta.get("content", ""), "logprobs": None, "finish_reason": finish_reason,
                          "stop_reason": None}
                if return_ids and first:
                    choice["prompt_token_ids"] = prompt_ids
                if return_ids and ids is not None:
                    choice["token_ids"] = ids
                payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
            else:
                choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
                if return_ids and ids is not None:
                    choice["token_ids"] = ids
                payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
                if return_ids and first:
                    payload["prompt_token_ids"] = prompt_ids
            return _frame(json.dumps(payload, separators=(",", ":")).encode())

        def usage() -> dict:
            return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}

        if not request.get("stream"):
            if s.paced_non_streaming:
                # wait as long as the stream would take, watching the connection: a client that goes away
                # (a gateway's timeout) ends the request, as vLLM aborts a request whose client disconnected
                delay = t_recv + ttft_s + (chunks - 1) * itl_s - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(reader.read(1), timeout=delay)
                    except asyncio.TimeoutError:
                        pass
                    else:
                        self.stats.abandoned_answers += 1
                        return False
            ids = tokens(n) if token_mode else []
            text = "".join(token_text(t) for t in ids) if token_mode else " tok" * n
            if completion:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
                if return_ids:
                    choice.update(prompt_token_ids=prompt_ids, token_ids=ids)
                answer = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
                          "usage": usage()}
            else:
                choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                if return_ids:
                    choice["token_ids"] = ids
                answer = {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
                          "usage": usage()}
                if return_ids:
                    answer["prompt_token_ids"] = prompt_ids
            self._write_json(writer, 200, answer, keep_alive)
            await writer.drain()
            self.stats.completed_answers += 1
            return keep_alive

        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\nconnection: %s\r\n\r\n" % (b"keep-alive" if keep_alive else b"close")
        )
        first_pending = True
        if not completion:
            writer.write(chunk({"role": "assistant", "content": ""}, first=True))
            first_pending = False
        self._streamed(writer, True)
        sent_tokens = 0
        for k in range(chunks):
            size = min(s.tokens_per_chunk, n - sent_tokens)
            target = t_recv + ttft_s + k * itl_s
            delay = target - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            late = time.monotonic() - target
            if late > 0:
                self.stats.total_lateness_s += late
                self.stats.max_lateness_s = max(self.stats.max_lateness_s, late)
            ids = tokens(size) if token_mode else None
            if completion:
                writer.write(chunk({"content": "".join(token_text(t) for t in ids)}, ids=ids, first=first_pending))
                first_pending = False
            else:
                position = done_before + sent_tokens
                reasoning = max(0, min(size, s.reasoning_tokens - position))
                delta: dict = {}
                if token_mode:
                    if reasoning:
                        delta["reasoning_content"] = "".join(token_text(t) for t in ids[:reasoning])
                    if size - reasoning:
                        delta["content"] = "".join(token_text(t) for t in ids[reasoning:])
                else:
                    if reasoning:
                        delta["reasoning_content"] = " think" * reasoning
                    if size - reasoning:
                        delta["content"] = " tok" * (size - reasoning)
                writer.write(chunk(delta, ids=ids))
            if k == 0:
                self.stats.first_chunks += 1
                self.stats.total_ttft_s += time.monotonic() - t_recv
            sent_tokens += size
            self.stats.chunks_sent += 1
            self.stats.tokens_sent += size
            if fault is not None and k + 1 >= min(fault.after_chunks, chunks):
                await writer.drain()
                if fault.kind == "broken":
                    writer.transport.abort()
                    return False
                # stall: hold the connection open until the client gives up (or stall_max_s)
                try:
                    await asyncio.wait_for(reader.read(1), timeout=s.stall_max_s)
                except asyncio.TimeoutError:
                    pass
                writer.transport.abort()
                return False
            await writer.drain()
        if completion:
            writer.write(chunk({}, finish_reason=finish, ids=[] if first_pending else None, first=first_pending))
        else:
            writer.write(chunk({}, finish_reason=finish, ids=[] if token_mode else None))
        stream_options = request.get("stream_options") or {}
        if s.usage and stream_options.get("include_usage"):
            writer.write(_frame(json.dumps({
                "id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(),
            }, separators=(",", ":")).encode()))
        writer.write(_frame(b"[DONE]"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.stats.completed_streams += 1
        if s.prefix_cache_entries and not completion:
            self._remember(words + ("<assistant>",) + ("tok",) * (n - min(n, s.reasoning_tokens)))
        self._streamed(writer, False)
        return keep_alive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default: %(default)s)")
    parser.add_argument("--ttft", type=float, default=0.1, help="seconds from request to first content chunk (default: %(default)s)")
    parser.add_argument("--itl", type=float, default=0.02, help="seconds between content chunks (default: %(default)s)")
    parser.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens in each content chunk (default: %(default)s)")
    parser.add_argument("--output-tokens", type=int, default=None, help="tokens per response; default: the request's max_tokens")
    parser.add_argument("--reasoning-tokens", type=int, default=0, help="the first N tokens stream as reasoning_content (default: %(default)s)")
    parser.add_argument("--no-usage", action="store_true", help="never send a usage chunk, even when asked")
    parser.add_argument("--paced-non-streaming", action="store_true",
                        help="send a non-streaming answer when its stream would end (ttft + itl per chunk), as vLLM does; default: at once")
    parser.add_argument(
        "--fault", action="append", default=[], metavar="SPEC",
        help="inject a fault into every EVERY-th request: http:STATUS:EVERY, stall:EVERY, broken:EVERY or reset:EVERY (repeatable; first match wins)",
    )
    parser.add_argument("--fault-after-chunks", type=int, default=2, help="content chunks sent before a stall or broken stream (default: %(default)s)")
    parser.add_argument("--stall-max", type=float, default=300.0, help="longest a stalled stream is held open, seconds (default: %(default)s)")
    parser.add_argument("--model-name", default="mock-model", help="model id served at /v1/models (default: %(default)s)")
    parser.add_argument("--doomed-warning-at", type=float, default=None, metavar="S",
                        help="doomed mode: an interruption warning S seconds after start (see --doomed-gone-after)")
    parser.add_argument("--doomed-gone-after", type=float, default=120.0, metavar="S",
                        help="doomed mode: S seconds after the warning, close every connection and exit (default: %(default)s)")
    parser.add_argument("--doomed-drain", action="store_true",
                        help="doomed mode: /health answers 503 from the warning on (a gateway's health check stops new requests)")
    parser.add_argument("--prefix-cache-entries", type=int, default=0, metavar="N",
                        help="keep the last N served prompts (with their answers) as a prefix cache; 0: none (default: %(default)s)")
    parser.add_argument("--prefill-per-token", type=float, default=0.0, metavar="S",
                        help="extra seconds before the first chunk per prompt word not in the prefix cache (default: %(default)s)")
    parser.add_argument("--record-requests", default=None, metavar="FILE",
                        help="append each chat request's messages and max_tokens to FILE, one JSON line each")
    parser.add_argument("--keep-alive-timeout", type=float, default=5.0, metavar="S",
                        help="close a keep-alive connection on which no request began S seconds after the last "
                             "response, as vLLM's uvicorn does; 0: never (default: %(default)s)")
    parser.add_argument("--slowdown-per-stream", type=float, default=0.0, metavar="F",
                        help="TTFT and ITL times 1 + F x the streams in flight when a request arrives (default: %(default)s)")
    parser.add_argument("--events-file", default=None, metavar="FILE",
                        help="append the doomed-mode warning and gone moments to FILE (drill-events.jsonl format)")


def settings_from_args(args: argparse.Namespace) -> MockSettings:
    if args.ttft < 0 or args.itl < 0 or args.tokens_per_chunk < 1:
        raise ValueError("--ttft and --itl must be >= 0 and --tokens-per-chunk >= 1")
    if args.prefix_cache_entries < 0 or not args.prefill_per_token >= 0:
        raise ValueError(f"--prefix-cache-entries={args.prefix_cache_entries} must be >= 0 and "
                         f"--prefill-per-token={args.prefill_per_token} >= 0 seconds")
    if not args.slowdown_per_stream >= 0:
        raise ValueError(f"--slowdown-per-stream={args.slowdown_per_stream}: must be a number >= 0")
    if not args.keep_alive_timeout >= 0:
        raise ValueError(f"--keep-alive-timeout={args.keep_alive_timeout}: must be a number of seconds >= 0")
    for flag, value in (("--doomed-warning-at", args.doomed_warning_at), ("--doomed-gone-after", args.doomed_gone_after)):
        if value is not None and not value >= 0:
            raise ValueError(f"{flag}={value}: must be a number of seconds >= 0")
    return MockSettings(
        ttft_s=args.ttft,
        itl_s=args.itl,
        tokens_per_chunk=args.tokens_per_chunk,
        output_tokens=args.output_tokens,
        reasoning_tokens=args.reasoning_tokens,
        usage=not args.no_usage,
        faults=tuple(Fault.parse(spec, after_chunks=args.fault_after_chunks) for spec in args.fault),
        stall_max_s=args.stall_max,
        doomed_warning_at_s=args.doomed_warning_at,
        doomed_gone_after_s=args.doomed_gone_after,
        doomed_drain=args.doomed_drain,
        events_file=args.events_file,
        paced_non_streaming=args.paced_non_streaming,
        prefix_cache_entries=args.prefix_cache_entries,
        prefill_s_per_token=args.prefill_per_token,
        record_file=args.record_requests,
        keep_alive_s=args.keep_alive_timeout,
        slowdown_per_stream=args.slowdown_per_stream,
    )


async def serve(settings: MockSettings, host: str, port: int, model: str) -> None:
    server = MockServer(settings, model=model)
    bound = await server.start(host, port)
    print(f"mock OpenAI server listening on http://{host}:{bound}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-POSIX
            pass
    stopped, gone = asyncio.ensure_future(stop.wait()), asyncio.ensure_future(server.gone.wait())
    await asyncio.wait({stopped, gone}, return_when=asyncio.FIRST_COMPLETED)
    for waiter in (stopped, gone):
        waiter.cancel()
    if server.gone.is_set():
        print("mock OpenAI server: doomed replica gone", flush=True)
    await server.close()


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(settings, args.host, args.port, args.model_name))
    return 0


class MockProcess:
    """A mock server running as its own process (``python -m gennstack.bench.mockserver``), so its
    fixed streaming schedule does not share an event loop with the client under test and it can be
    killed mid-load; :func:`start_process` starts one."""

    def __init__(self, proc: subprocess.Popen[str], base_url: str) -> None:
        self.proc = proc
        self.base_url = base_url
        # Keep reading its output (the last lines kept for errors): a pipe nobody reads fills up and
        # blocks the server at its next print.
        self.output: collections.deque[str] = collections.deque(maxlen=100)
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.output.append(line.rstrip("\n"))

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    @property
    def port(self) -> int:
        return int(urlsplit(self.base_url).port or 0)

    def _call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url.removesuffix("/v1") + path, data=data,
                                         method="GET" if body is None else "POST",
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())

    def stats(self) -> dict:
        """The server's own count of requests by outcome (``/stats``)."""
        return self._call("/stats")

    def doom(self, warning_in_s: float, gone_after_s: float, *, drain: bool = False) -> dict:
        """Doomed mode: a warning ``warning_in_s`` from now, gone ``gone_after_s`` later (``POST /doom``)."""
        return self._call("/doom", {"warning_in_s": warning_in_s, "gone_after_s": gone_after_s, "drain": drain})

    def kill(self) -> None:
        """Die at once, as a spot-reclaimed node would."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=10)


def start_process(*flags: str, host: str = "127.0.0.1", port: int = 0) -> MockProcess:
    """Start a mock server process on ``host:port`` (0: a free port) with ``flags`` (this module's
    command line); returns once it listens. Raises RuntimeError with its output if it does not."""
    # The same interpreter, so the same installed gennstack (whatever the working directory).
    proc = subprocess.Popen(
        [sys.executable, "-m", "gennstack.bench.mockserver", *flags, "--host", host, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://\S+/v1)", line)
    if not match:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        rest = line + proc.stdout.read()
        proc.stdout.close()
        raise RuntimeError(f"mock server on {host}:{port} did not start: {rest.strip()!r}")
    return MockProcess(proc, match.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gennstack.bench.mockserver", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
