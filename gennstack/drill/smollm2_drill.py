"""The local drill's real-model case (``gennstack drill --local --cases smollm2``, after ``make setup-demo``).

SmolLM2-135M replicas on the demo token server (gennstack/gateway/demo_token_server.py) behind the local
gateway (real Envoy, gennstack.gateway.demo.demo_gateway), the resume relay between its halves when on.
``streams`` greedy chat streams start together; the replica serving the first stream to reach
``kill_after_chunks`` text chunks (counted from the stream, not by the clock) is SIGKILLed. A stream is
*broken* when its answer ends without a finish chunk. Each answer's text is compared with the same request
answered whole by a replica that was not killed, directly (no gateway, no relay).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from gennstack.drill.resume_drill import write_report

MODEL = "gpt-oss-20b"  # a served model of the routing table; every one is SmolLM2 in the demo
# greedy answers that run to 112 tokens and more on the token server (measured), so a stream is mid-answer at a kill
PROMPTS = ("Write a long story about a lighthouse keeper and a storm.",
           "Describe the history of the city of Rome in many paragraphs.",
           "List twenty fruits and say something about each one.",
           "Tell me everything you know about the planets of the solar system.",
           "Write a letter to a friend about a trip to the mountains.",
           "Write a detailed recipe for bread and explain each step.")


@dataclass(frozen=True)
class DemoDrillSettings:
    replicas: int = 2
    streams: int = 4
    max_tokens: int = 96
    kill_after_chunks: int = 24

    def check(self) -> None:
        if not 2 <= self.replicas <= 8:
            raise ValueError(f"replicas {self.replicas}: 2 to 8 (one is killed, one must stay)")
        if not 1 <= self.streams <= len(PROMPTS):
            raise ValueError(f"streams {self.streams}: 1 to {len(PROMPTS)} (one prompt each)")
        if not 1 <= self.kill_after_chunks < self.max_tokens:
            raise ValueError(f"kill_after_chunks {self.kill_after_chunks}: 1 to max_tokens - 1 ({self.max_tokens - 1})")


@dataclass
class DemoRow:
    resume: bool
    streams: int
    on_victim: int  # streams whose answer began on the killed replica
    mid_answer: int  # of those, with text received and no finish at the kill
    broken: int
    resumed: int  # the relay's succeeded count (0 without it)
    identical: int  # answers whose text equals the untouched replica's
    cut_at: list[int] = field(default_factory=list)  # text chunks each mid-answer stream had at the kill


@dataclass
class _Stream:
    prompt: str
    host: str = ""
    parts: list[str] = field(default_factory=list)
    finished: bool = False


async def _read(session: aiohttp.ClientSession, url: str, stream: _Stream, max_tokens: int) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": stream.prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    try:
        async with session.post(url + "/chat/completions", json=body) as resp:
            stream.host = resp.headers.get("x-gennstack-upstream-host", "")
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        stream.parts.append(text)
                    stream.finished = stream.finished or choice.get("finish_reason") is not None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return


def _answer(url: str, prompt: str, max_tokens: int) -> str:
    import urllib.request

    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as resp:
        return json.loads(resp.read())["choices"][0]["message"]["content"]


def run_demo_case(resume: bool, settings: DemoDrillSettings = DemoDrillSettings(), log_dir: Path | None = None,
                  limit_s: float = 600.0) -> DemoRow:
    from gennstack.gateway.demo import demo_gateway
    from gennstack.gateway.ports import free_ports
    from gennstack.resume.local import metric

    settings.check()
    with demo_gateway(settings.replicas, "least_request", first_port=free_ports(settings.replicas), log_dir=log_dir,
                      resume=resume, server="token") as stack:
        streams = [_Stream(prompt) for prompt in PROMPTS[:settings.streams]]

        async def go() -> tuple[str, dict[int, int]]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit_s)) as session:
                tasks = [asyncio.create_task(_read(session, stack.base_url, s, settings.max_tokens)) for s in streams]
                deadline = time.monotonic() + limit_s
                while not any(len(s.parts) >= settings.kill_after_chunks for s in streams):
                    if time.monotonic() > deadline or all(t.done() for t in tasks):
                        raise RuntimeError(f"no stream reached {settings.kill_after_chunks} text chunks "
                                           f"({[len(s.parts) for s in streams]})")
                    await asyncio.sleep(0.01)
                host = next(s.host for s in streams if len(s.parts) >= settings.kill_after_chunks)
                victim = next(r for r in stack.replicas if r.address == host)
                await asyncio.to_thread(victim.kill)
                cut = {i: len(s.parts) for i, s in enumerate(streams) if s.host == host and s.parts and not s.finished}
                await asyncio.gather(*tasks)
                return host, cut

        host, cut = asyncio.run(go())
        survivor = next(r for r in stack.replicas if r.address != host)
        references = [_answer(survivor.url, s.prompt, settings.max_tokens) for s in streams]
        resumed = int(metric(stack.relay.metrics(), "gennstack_resume_succeeded_total", model=MODEL)) if stack.relay else 0
    return DemoRow(resume=resume, streams=len(streams), on_victim=sum(1 for s in streams if s.host == host),
                   mid_answer=len(cut), broken=sum(1 for s in streams if not s.finished), resumed=resumed,
                   identical=sum(1 for s, ref in zip(streams, references, strict=True) if s.finished and "".join(s.parts) == ref),
                   cut_at=sorted(cut.values()))


def run_demo_drill(output: Path, settings: DemoDrillSettings = DemoDrillSettings()) -> list[DemoRow]:
    rows = [run_demo_case(resume, settings) for resume in (False, True)]
    write_report(output, "smollm2", settings, rows, demo_markdown(settings, rows))
    return rows


def demo_markdown(settings: DemoDrillSettings, rows: list[DemoRow]) -> str:
    lines = [
        f"Real model: {settings.replicas} SmolLM2-135M replicas on the demo token server (llama.cpp, 1 thread each) "
        f"behind the local gateway (real Envoy, the resume relay between its halves when on); {settings.streams} "
        f"greedy chat streams of up to {settings.max_tokens} tokens at once; the replica serving the first stream "
        f"to reach {settings.kill_after_chunks} text chunks SIGKILLed; each text compared with the same request "
        "answered by a replica that was not killed.",
        "",
        "| resume | streams begun on the killed replica | mid-answer at the kill | broken | resumed | text = untouched replica's |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {'on' if r.resume else 'off'} | {r.on_victim} of {r.streams} | {r.mid_answer} | {r.broken} | "
                     f"{r.resumed} | {r.identical} of {r.streams} |")
    return "\n".join(lines) + "\n"
