"""The local drill's resume cases (``gennstack drill --local``): what drain routing cannot save.

Two cases, each run with the resume relay off and on, on mock replicas behind the local gateway (real Envoy,
gennstack.resume.local.resume_stack):

* **no warning**: a replica is SIGKILLed mid-answer (hardware, kernel, OOM kill, a spot reclaim without
  notice): no drain could act;
* **longer than the grace**: a replica is warned and drained (its /health answers 503, the gateway sends it
  nothing new) and gone ``grace_s`` later, while its answers need longer than that.

``streams`` chat streams start together at the replicas (greedy, distinct prompts); a stream is *broken* when
the client's answer ends without its finish chunk (an error, a cut connection, or an error event). Each
resumed answer's text is compared with the mock's uninterrupted answer to the same prompt
(gennstack.bench.mockserver.chat_reference_text: greedy output is a pure function of the token IDs).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gennstack.bench.mockserver import chat_reference_text
from gennstack.resume.local import MODEL, metric, resume_stack

CASES = ("no warning (SIGKILL)", "longer than the grace")


@dataclass(frozen=True)
class ResumeDrillSettings:
    streams: int = 16
    max_tokens: int = 200
    ttft_s: float = 0.02
    itl_s: float = 0.01  # a 2 s answer
    kill_at_s: float = 0.5  # SIGKILL this long after every stream reached a replica (no warning)
    warning_at_s: float = 0.3  # the long-stream case: the warning this long after, then gone grace_s later
    grace_s: float = 0.7  # AWS's 120 s spot grace, scaled: the answers last longer than this


@dataclass
class ResumeRow:
    case: str
    resume: bool
    streams: int
    on_victim: int  # streams the lost replica held
    broken: int
    resumed: int  # streams the relay continued (its succeeded count)
    identical: int | None  # of the completed streams, text equal to the reference (None: resume off)
    completed_on_victim: int


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"drill stream {i}: tell me about lighthouses"}]


async def _one(session: aiohttp.ClientSession, url: str, i: int, settings: ResumeDrillSettings) -> tuple[bool, str, str]:
    """(finished, text, upstream host) of one streamed chat answer."""
    messages = _messages(i)
    body = {"model": MODEL, "messages": messages, "max_tokens": settings.max_tokens, "stream": True}
    parts, finished, host = [], False, ""
    try:
        async with session.post(url + "/chat/completions", json=body) as resp:
            host = resp.headers.get("x-gennstack-upstream-host", "")
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    break
                for choice in chunk.get("choices") or ():
                    parts.append((choice.get("delta") or {}).get("content") or "")
                    finished = finished or choice.get("finish_reason") is not None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        pass
    return finished, "".join(parts), host


def _wait_for_streams(replicas, streams: int, limit_s: float = 60.0) -> None:
    """Until the replicas have received ``streams`` chat requests between them (their own counters)."""
    deadline = time.monotonic() + limit_s
    while sum(r.stats()["chat_requests"] for r in replicas) < streams:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replicas received fewer than {streams} requests in {limit_s:g} s")
        time.sleep(0.02)


def run_case(case: str, *, resume: bool, settings: ResumeDrillSettings = ResumeDrillSettings()) -> ResumeRow:
    flags = ("--ttft", str(settings.ttft_s), "--itl", str(settings.itl_s))
    with resume_stack(2, flags=flags, resume=resume) as stack:
        victim = stack.replicas[0]

        async def go() -> list[tuple[bool, str, str]]:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
                tasks = [asyncio.create_task(_one(session, stack.base_url, i, settings)) for i in range(settings.streams)]
                # both cases act after every stream reached a replica (counted by the replicas, not assumed from
                # the clock: on a busy machine the streams may start late, and a warning that comes first drains
                # the victim before it holds any), so the victim holds streams mid-answer
                await asyncio.to_thread(_wait_for_streams, stack.replicas, settings.streams)
                if case == CASES[0]:
                    await asyncio.sleep(settings.kill_at_s)
                    await asyncio.to_thread(victim.kill)
                else:
                    await asyncio.to_thread(victim.doom, settings.warning_at_s, settings.grace_s, drain=True)
                return await asyncio.gather(*tasks)

        outcomes = asyncio.run(go())
        deadline = time.monotonic() + 10
        while case != CASES[0] and victim.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        resumed = int(metric(stack.relay.metrics(), "gennstack_resume_succeeded_total", model=MODEL)) if stack.relay else 0
        victim_host = f"{victim.host}:{victim.port}"
    identical = None
    if resume:  # the streams the lost replica held: each resumed answer against the uninterrupted one
        identical = sum(1 for i, (done, text, host) in enumerate(outcomes) if host == victim_host and done
                        and text == chat_reference_text(_messages(i), settings.max_tokens))
    return ResumeRow(case=case, resume=resume, streams=settings.streams,
                     on_victim=sum(1 for _, _, host in outcomes if host == victim_host),
                     broken=sum(1 for done, _, _ in outcomes if not done), resumed=resumed, identical=identical,
                     completed_on_victim=sum(1 for done, _, host in outcomes if done and host == victim_host))


def run_resume_drill(output: Path, settings: ResumeDrillSettings = ResumeDrillSettings()) -> list[ResumeRow]:
    rows = [run_case(case, resume=resume, settings=settings) for case in CASES for resume in (False, True)]
    write_report(output, "resume", settings, rows, resume_markdown(settings, rows))
    return rows


def write_report(output: Path, name: str, settings: Any, rows: list[Any], markdown: str) -> None:
    """``<name>.json`` (the settings and rows, dataclasses) and ``<name>.md`` (its table) in ``output``."""
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{name}.json").write_text(json.dumps({"settings": asdict(settings), "rows": [asdict(r) for r in rows]},
                                                    indent=1) + "\n", encoding="utf-8")
    (output / f"{name}.md").write_text(markdown, encoding="utf-8")


def resume_markdown(settings: ResumeDrillSettings, rows: list[ResumeRow]) -> str:
    stream_s = settings.ttft_s + settings.itl_s * (settings.max_tokens - 1)
    lines = [
        f"Resume cases: 2 mock replicas of `{MODEL}` behind the local gateway (real Envoy, the resume relay between "
        f"its halves when on); {settings.streams} greedy chat streams of {settings.max_tokens} tokens ({stream_s:g} s) "
        f"at once; no warning: one replica SIGKILLed {settings.kill_at_s:g} s in; longer than the grace: one replica "
        f"warned and drained {settings.warning_at_s:g} s in, gone {settings.grace_s:g} s later.",
        "",
        "| case | resume | streams on the lost replica | broken mid-way | resumed | resumed text = uninterrupted answer |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        same = ("n/a" if r.identical is None else
                f"{r.identical} of {r.on_victim} ({100 * r.identical // max(1, r.on_victim)} %)")
        lines.append(f"| {r.case} | {'on' if r.resume else 'off'} | {r.on_victim} of {r.streams} | {r.broken} | {r.resumed} | {same} |")
    return "\n".join(lines) + "\n"
