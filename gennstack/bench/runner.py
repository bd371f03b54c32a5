"""The load generator: closed-loop asyncio workers streaming chat completions.

One process, one event loop, ``concurrency`` worker coroutines per level. Each worker sends
a request, reads its stream to the end, records it, and sends the next one at once (closed
loop). Every timestamp is ``time.monotonic()`` (the event loop's clock) relative to the
level's start. One ``aiohttp.ClientSession`` per level pools at most
``concurrency`` keep-alive connections. aiohttp, not httpx: with its C HTTP parser it cost
about half the CPU per streamed chunk in our measurement (about 85 against 175 microseconds
at 200 streams), which is what lets one core hold hundreds of streams.

The stream is read as raw bytes and split into SSE lines here rather than through a
higher-level SSE helper: a chunk's arrival time is the time its bytes were read, and this is
the client's hot loop (see benchmarks/bench_client.py for its cost per token).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from gennstack.bench.arrivals import schedule
from gennstack.bench.config import BenchConfig
from gennstack.bench.prompts import Unit, make_prompt, make_unit, system_prompt

# Request status
COMPLETED = "completed"
INCOMPLETE = "incomplete"  # still streaming when a --duration window closed
FAILED = "failed"
IN_FLIGHT = "in_flight"

# Failure classes (an HTTP error is "http_<status>")
TIMEOUT = "timeout"
BROKEN_STREAM = "broken_stream"
CONNECTION = "connection_error"


@dataclass(slots=True)
class RequestRecord:
    """One request, as measured. Times are seconds from the level's start."""

    index: int
    worker: int
    warmup: bool
    prompt_tokens_requested: int
    max_tokens: int
    t_send: float = 0.0
    t_end: float | None = None
    status: str = IN_FLIGHT
    error_class: str | None = None
    error_detail: str = ""
    http_status: int | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrivals of non-empty content/reasoning chunks
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    saw_done: bool = False
    # multi-turn / shared-prefix workloads: which conversation (or request unit), turn (1-based) and prefix
    conversation: int | None = None
    turn: int | None = None
    prefix: int | None = None
    upstream: str | None = None  # the value of --record-header in the response
    content: list[str] | None = None  # the answer's text, kept only where a later turn resends it
    t_due: float | None = None  # open loop: when its schedule said to send it (None: closed loop)

    # ---- derived measurements -------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return len(self.chunk_times)

    @property
    def token_source(self) -> str:
        return "usage" if self.usage_completion_tokens is not None else "chunks"

    @property
    def output_tokens(self) -> int:
        """``n``: the server's usage report where given, else the number of content chunks."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.n_chunks

    @property
    def prompt_tokens(self) -> int:
        return self.usage_prompt_tokens if self.usage_prompt_tokens is not None else self.prompt_tokens_requested

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.t_send if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        return self.t_end - self.t_send if self.t_end is not None else None

    @property
    def itl(self) -> float | None:
        """``(t_last - t_first) / (n - 1)``: inter-token latency excluding the first token."""
        n = self.output_tokens
        if len(self.chunk_times) < 1 or n < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (n - 1)

    @property
    def chunk_gaps(self) -> list[float]:
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    @property
    def user_tokens_per_s(self) -> float | None:
        e2e = self.e2e
        return self.output_tokens / e2e if e2e else None


@dataclass(slots=True)
class LevelRun:
    """The raw outcome of one concurrency level."""

    concurrency: int
    records: list[RequestRecord]
    window_start: float
    window_end: float
    started_wall: float  # time.time() at the level's start
    mode: str  # "duration" or "requests"
    workload: str = "single"
    rate: float | None = None  # open loop: the level's requests (or conversations) per second; None: closed loop
    peak_in_flight: int = 0  # open loop: the most requests streaming at once
    not_sent: int = 0  # open loop, --duration: requests due before the window closed and never sent (the cap was full)


def _build_body(config: BenchConfig, prompt: str | list[dict], max_tokens: int) -> bytes:
    """``prompt``: one user message's text, or the whole ``messages`` list."""
    body = {
        "model": config.model,
        "messages": [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
        "max_tokens": max_tokens,
        "stream": True,
    }
    if config.include_usage:
        body["stream_options"] = {"include_usage": True}
    if config.ignore_eos:
        body["ignore_eos"] = True
    body.update(config.extra_body)
    return json.dumps(body, separators=(",", ":")).encode()


def _handle_event(rec: RequestRecord, payload: bytes, t: float) -> None:
    if payload == b"[DONE]":
        rec.saw_done = True
        return
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        return
    if obj.get("error"):
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else str(err)
        raise _StreamError(f"error event in stream: {message}")
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            rec.chunk_times.append(t)
            if rec.content is not None and delta.get("content"):
                rec.content.append(delta["content"])
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]
    usage = obj.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        rec.usage_completion_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            rec.usage_prompt_tokens = int(usage["prompt_tokens"])


class _StreamError(Exception):
    pass


async def stream_request(
    session: aiohttp.ClientSession,
    config: BenchConfig,
    headers: dict[str, str],
    body: bytes,
    rec: RequestRecord,
    clock: Callable[[], float],
) -> None:
    """Send one request and fill ``rec`` in; never raises except on cancellation."""
    rec.t_send = clock()
    buffer = b""
    try:
        async with asyncio.timeout(config.request_timeout_s):
            async with session.post(config.chat_url, data=body, headers=headers) as response:
                if response.status != 200:
                    rec.http_status = response.status
                    if config.record_header:
                        rec.upstream = response.headers.get(config.record_header)
                    detail = (await response.content.read(300)).decode("utf-8", "replace")
                    rec.t_end = clock()
                    rec.status, rec.error_class, rec.error_detail = FAILED, f"http_{response.status}", detail
                    return
                rec.http_status = 200
                if config.record_header:
                    rec.upstream = response.headers.get(config.record_header)
                async for raw in response.content.iter_any():
                    t = clock()
                    buffer += raw
                    if b"\n" not in raw:
                        continue
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.startswith(b"data:"):
                            _handle_event(rec, line[5:].strip(), t)
        rec.t_end = clock()
        if buffer.strip().startswith(b"data:"):
            _handle_event(rec, buffer.strip()[5:].strip(), rec.t_end)
        if rec.saw_done or rec.finish_reason:
            rec.status = COMPLETED
        else:
            rec.status, rec.error_class = FAILED, BROKEN_STREAM
            rec.error_detail = "stream ended without [DONE] or finish_reason"
    except TimeoutError as exc:  # asyncio.timeout, and aiohttp's connect/read timeouts
        rec.t_end = clock()
        rec.status, rec.error_class = FAILED, TIMEOUT
        if isinstance(exc, aiohttp.ClientError):
            rec.error_detail = f"{type(exc).__name__}: nothing received for --stall-timeout={config.stall_timeout_s}s"
        else:
            rec.error_detail = f"no complete response within --timeout={config.request_timeout_s}s"
    except aiohttp.ClientConnectorError as exc:
        rec.t_end = clock()
        rec.status, rec.error_class, rec.error_detail = FAILED, CONNECTION, f"{type(exc).__name__}: {exc}"[:300]
    except (aiohttp.ClientError, _StreamError, ValueError) as exc:
        # ClientPayloadError / ServerDisconnectedError / ClientOSError: the peer closed or
        # reset mid-body; ValueError: a data line that is not JSON.
        rec.t_end = clock()
        rec.status, rec.error_class, rec.error_detail = FAILED, BROKEN_STREAM, f"{type(exc).__name__}: {exc}"[:300]


def tls_context(config: BenchConfig) -> ssl.SSLContext | bool:
    """Certificate checks for https: the public roots (aiohttp's default), or only ``--ca-file``."""
    return ssl.create_default_context(cafile=config.ca_file) if config.ca_file else True


async def run_level(
    config: BenchConfig,
    concurrency: int,
    *,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> LevelRun:
    """Run one concurrency level to the end of its window and return every request.

    ``--duration``: the window is ``[ramp_up + warmup_s, ramp_up + warmup_s + duration]``;
    requests sent before it are warm-up, and requests still streaming at its end are
    cancelled and counted as incomplete. ``--num-requests``: the first ``warmup_requests``
    requests are warm-up, then ``num_requests`` are measured and all run to the end; the
    window runs from the first measured send to the last measured end.
    """
    rng = random.Random(f"{config.seed}:{concurrency}")
    headers = {"content-type": "application/json", "accept": "text/event-stream", "accept-encoding": "identity"}
    if config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    records: list[RequestRecord] = []
    clock0 = time.monotonic()
    started_wall = time.time()

    def clock() -> float:
        return time.monotonic() - clock0

    warmup_requests = config.warmup_requests_for(concurrency)
    total = None if config.num_requests is None else warmup_requests + config.num_requests
    measure_from = config.ramp_up_s + config.warmup_s if config.duration_s is not None else 0.0
    stop_at = measure_from + config.duration_s if config.duration_s is not None else None
    next_index = 0

    def new_record(worker_id: int, prompt_tokens: int | None = None, max_tokens: int | None = None) -> RequestRecord | None:
        nonlocal next_index
        if total is not None and next_index >= total:
            return None
        index = next_index
        next_index += 1
        warmup = index < warmup_requests if total is not None else clock() < measure_from
        rec = RequestRecord(index=index, worker=worker_id, warmup=warmup,
                            prompt_tokens_requested=config.prompt_tokens.sample(rng) if prompt_tokens is None else prompt_tokens,
                            max_tokens=config.max_tokens.sample(rng) if max_tokens is None else max_tokens)
        records.append(rec)
        return rec

    async def worker(worker_id: int, session: aiohttp.ClientSession) -> None:
        if config.ramp_up_s:
            await asyncio.sleep(config.ramp_up_s * worker_id / concurrency)
        while (rec := new_record(worker_id)) is not None:
            body = _build_body(config, make_prompt(rec.prompt_tokens_requested, rng), rec.max_tokens)
            await stream_request(session, config, headers, body, rec, clock)
            if on_record is not None:
                on_record(rec)

    workload = config.workload
    weights = workload.prefix_weights() if workload.has_prefixes else None
    prefixes: dict[int, str] = {}
    next_unit = 0
    reserved = 0  # requests the units taken so far will send (--num-requests: no unit starts that cannot run)

    def take_unit() -> Unit | None:
        nonlocal next_unit, reserved
        if total is not None and reserved >= total:
            return None
        reserved += workload.turns
        unit = make_unit(next_unit, seed=config.seed, turns=workload.turns, prompt_tokens=config.prompt_tokens,
                         max_tokens=config.max_tokens, weights=weights)
        next_unit += 1
        return unit

    def opening(unit: Unit) -> list[dict]:
        if unit.prefix is None:
            return []
        if unit.prefix not in prefixes:
            prefixes[unit.prefix] = system_prompt(unit.prefix, workload.prefix_tokens, config.seed)
        return [{"role": "system", "content": prefixes[unit.prefix]}]

    async def unit_worker(worker_id: int, session: aiohttp.ClientSession) -> None:
        """multi-turn and shared-prefix: units (conversations, or single requests behind a prefix) one
        after another. With ``--num-requests`` a conversation starts only while the ones started before it
        leave requests to send, so conversations run whole (the last one short when the count is not a
        multiple of ``--turns``). A turn resends the history: its system prompt, every earlier user message and the
        server's answer to it. A failed turn leaves the history as it was (its user message dropped), so
        the conversation goes on with its next turn."""
        if config.ramp_up_s:
            await asyncio.sleep(config.ramp_up_s * worker_id / concurrency)
        while (unit := take_unit()) is not None:
            history = opening(unit)
            history_tokens = workload.prefix_tokens if unit.prefix is not None else 0
            for number, turn in enumerate(unit.turns, start=1):
                if number > 1 and workload.think_time_s:
                    await asyncio.sleep(workload.think_time_s)
                rec = new_record(worker_id, history_tokens + turn.prompt_tokens, turn.max_tokens)
                if rec is None:
                    return
                rec.conversation, rec.turn, rec.prefix = unit.index, number, unit.prefix
                more = number < len(unit.turns)
                if more:
                    rec.content = []
                messages = [*history, {"role": "user", "content": turn.text}]
                await stream_request(session, config, headers, _build_body(config, messages, rec.max_tokens), rec, clock)
                if more and rec.status == COMPLETED:
                    history = [*messages, {"role": "assistant", "content": "".join(rec.content)}]
                    history_tokens += turn.prompt_tokens + rec.output_tokens
                rec.content = None
                if on_record is not None:
                    on_record(rec)

    loop_body = worker if workload.kind == "single" else unit_worker

    timeout = aiohttp.ClientTimeout(total=None, connect=config.stall_timeout_s, sock_read=config.stall_timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, ssl=tls_context(config))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False, trust_env=False) as session:
        tasks = [asyncio.create_task(loop_body(i, session)) for i in range(concurrency)]
        if stop_at is not None:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, stop_at - clock()))
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            window = (measure_from, stop_at)
        else:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            measured = [r for r in records if not r.warmup]
            window = (min(r.t_send for r in measured), max(r.t_end for r in measured))

    for rec in records:
        if rec.status == IN_FLIGHT:
            rec.status = INCOMPLETE
    mode = "duration" if config.duration_s is not None else "requests"
    return LevelRun(concurrency, records, window[0], window[1], started_wall, mode, workload.kind)


def _headers(config: BenchConfig) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "text/event-stream", "accept-encoding": "identity"}
    if config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    return headers


async def run_rate_level(
    config: BenchConfig,
    rate: float,
    *,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> LevelRun:
    """Run one open-loop level: requests (multi-turn: conversations) arrive on the seeded schedule of
    :mod:`gennstack.bench.arrivals` at ``rate`` per second and are sent when due, whatever is in flight, up to
    ``--max-in-flight`` at once. A request due while the cap is full waits for a free slot and goes out late;
    each record keeps its due time (``t_due``) beside its send time, so the result says how far the client fell
    behind its schedule instead of quietly becoming a closed loop.

    multi-turn: a conversation's first turn is due at its arrival, each later turn ``--think-time`` after the
    answer to the turn before it (due = end of that answer + think time). ``--duration``: the schedule runs for
    ``warmup + duration`` seconds; requests due before ``warmup`` are warm-up; when the window closes, requests
    still streaming run to their end (throughput still counts only what arrived inside the window), those still
    waiting for a slot are counted as not sent, and no conversation sends another turn. ``--num-requests``: the schedule
    holds ``warmup_requests + num_requests`` requests (multi-turn: enough conversations for them, the last one
    short), all run to the end. Request bodies of single and shared-prefix levels are built before the clock
    starts, so the dispatcher only sleeps and starts tasks.
    """
    rng = random.Random(f"{config.seed}:rate:{rate!r}")
    headers = _headers(config)
    workload = config.workload
    warmup_requests = config.warmup_requests_for(0)
    total = None if config.num_requests is None else warmup_requests + config.num_requests
    measure_from = config.warmup_s if config.duration_s is not None else 0.0
    stop_at = measure_from + config.duration_s if config.duration_s is not None else None
    arrivals = schedule(rate, arrival=config.arrival, burstiness=config.burstiness, seed=config.seed,
                        count=None if total is None else math.ceil(total / workload.turns), until=stop_at)
    weights = workload.prefix_weights() if workload.has_prefixes else None
    prefixes: dict[int, str] = {}

    def opening(unit: Unit) -> list[dict]:
        if unit.prefix is None:
            return []
        if unit.prefix not in prefixes:
            prefixes[unit.prefix] = system_prompt(unit.prefix, workload.prefix_tokens, config.seed)
        return [{"role": "system", "content": prefixes[unit.prefix]}]

    def unit(index: int) -> Unit:
        return make_unit(index, seed=config.seed, turns=workload.turns, prompt_tokens=config.prompt_tokens,
                         max_tokens=config.max_tokens, weights=weights)

    # (prompt tokens, max tokens, body, unit) per arrival, for the one-request-per-arrival workloads
    prepared: list[tuple[int, int, bytes, Unit | None]] = []
    if workload.kind == "single":
        for _ in arrivals:
            p, m = config.prompt_tokens.sample(rng), config.max_tokens.sample(rng)
            prepared.append((p, m, _build_body(config, make_prompt(p, rng), m), None))
    elif workload.turns == 1:
        for i in range(len(arrivals)):
            u = unit(i)
            turn = u.turns[0]
            messages = [*opening(u), {"role": "user", "content": turn.text}]
            history = workload.prefix_tokens if u.prefix is not None else 0
            prepared.append((history + turn.prompt_tokens, turn.max_tokens, _build_body(config, messages, turn.max_tokens), u))

    records: list[RequestRecord] = []
    next_index = 0
    in_flight = peak = not_sent = 0
    closing = False
    cap = asyncio.Semaphore(config.max_in_flight)
    clock0 = time.monotonic()
    started_wall = time.time()

    def clock() -> float:
        return time.monotonic() - clock0

    def new_record(arrival: int, due: float, prompt_tokens: int, max_tokens: int) -> RequestRecord | None:
        nonlocal next_index
        if total is not None and next_index >= total:
            return None
        index = next_index
        next_index += 1
        warmup = index < warmup_requests if total is not None else due < measure_from
        rec = RequestRecord(index=index, worker=arrival, warmup=warmup, prompt_tokens_requested=prompt_tokens,
                            max_tokens=max_tokens, t_due=due)
        records.append(rec)
        return rec

    def refuse(due: float) -> bool:
        """After the window closed nothing new goes out; one that was due inside it counts as not sent."""
        nonlocal not_sent
        if closing and stop_at is not None and due < stop_at:
            not_sent += 1
        return closing

    async def send(session: aiohttp.ClientSession, rec: RequestRecord, body: bytes) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await stream_request(session, config, headers, body, rec, clock)
        finally:
            in_flight -= 1
            cap.release()
        if on_record is not None:
            on_record(rec)

    async def one(session: aiohttp.ClientSession, arrival: int, due: float) -> None:
        prompt_tokens, max_tokens, body, u = prepared[arrival]
        await cap.acquire()
        rec = None if refuse(due) else new_record(arrival, due, prompt_tokens, max_tokens)
        if rec is None:
            cap.release()
            return
        if u is not None:
            rec.conversation, rec.turn, rec.prefix = u.index, 1, u.prefix
        await send(session, rec, body)

    async def conversation(session: aiohttp.ClientSession, arrival: int, due: float) -> None:
        u = unit(arrival)
        history = opening(u)
        history_tokens = workload.prefix_tokens if u.prefix is not None else 0
        for number, turn in enumerate(u.turns, start=1):
            if number > 1:
                due = clock() + workload.think_time_s
                if workload.think_time_s:
                    await asyncio.sleep(workload.think_time_s)
                if closing:
                    return
            await cap.acquire()
            rec = None if refuse(due) else new_record(arrival, due, history_tokens + turn.prompt_tokens, turn.max_tokens)
            if rec is None:
                cap.release()
                return
            rec.conversation, rec.turn, rec.prefix = u.index, number, u.prefix
            more = number < len(u.turns)
            if more:
                rec.content = []
            messages = [*history, {"role": "user", "content": turn.text}]
            await send(session, rec, _build_body(config, messages, rec.max_tokens))
            if more and rec.status == COMPLETED:
                history = [*messages, {"role": "assistant", "content": "".join(rec.content)}]
                history_tokens += turn.prompt_tokens + rec.output_tokens
            rec.content = None

    start = conversation if workload.turns > 1 else one
    tasks: set[asyncio.Task] = set()

    async def dispatch(session: aiohttp.ClientSession) -> None:
        for arrival, due in enumerate(arrivals):
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.add(asyncio.create_task(start(session, arrival, due)))

    timeout = aiohttp.ClientTimeout(total=None, connect=config.stall_timeout_s, sock_read=config.stall_timeout_s)
    connector = aiohttp.TCPConnector(limit=config.max_in_flight, limit_per_host=0, ssl=tls_context(config))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False, trust_env=False) as session:
        dispatcher = asyncio.create_task(dispatch(session))
        if stop_at is not None:
            await asyncio.wait([dispatcher], timeout=max(0.0, stop_at - clock()))
            await asyncio.sleep(max(0.0, stop_at - clock()))
            # the window is over: nothing new goes out (a request still waiting for a slot is counted as not
            # sent, a conversation sends no further turn), and the requests in flight run to their end, so each
            # request due in the window has an outcome to hold against the SLO
            closing = True
            dispatcher.cancel()
            results = await asyncio.gather(dispatcher, *tasks, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
            if errors:
                raise errors[0]
            window = (measure_from, stop_at)
        else:
            await dispatcher
            results = await asyncio.gather(*tasks, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                raise errors[0]
            measured = [r for r in records if not r.warmup]
            window = (min(r.t_send for r in measured), max(r.t_end for r in measured)) if measured else (0.0, clock())

    for rec in records:
        if rec.status == IN_FLIGHT:
            rec.status = INCOMPLETE
    mode = "duration" if config.duration_s is not None else "requests"
    return LevelRun(config.max_in_flight, records, window[0], window[1], started_wall, mode, workload.kind,
                    rate=rate, peak_in_flight=peak, not_sent=not_sent)
