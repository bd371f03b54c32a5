"""The mock server's token mode (gennstack/bench/mockserver.py), what the resume tests stand on: vLLM 0.29.0's
return_token_ids shapes, token-ID prompts on /v1/completions, and a continuation that yields the rest exactly,
--output-tokens included (counted after the generation marker)."""

from __future__ import annotations

import json
import urllib.request

from gennstack.bench.mockserver import greedy_answer, start_process, token_text, tokenize


def _post(base: str, path: str, body: dict) -> list[dict] | dict:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        text = resp.read().decode()
    if not body.get("stream"):
        return json.loads(text)
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_chat_stream_with_return_token_ids_has_vllms_fields() -> None:
    server = start_process("--ttft", "0", "--itl", "0")
    try:
        messages = [{"role": "user", "content": "two words"}]
        chunks = _post(server.base_url, "/chat/completions", {"model": "m", "messages": messages, "max_tokens": 5,
                                                              "stream": True, "return_token_ids": True})
        plain = _post(server.base_url, "/chat/completions", {"model": "m", "messages": messages, "max_tokens": 2, "stream": True})
    finally:
        server.stop()
    prompt = tokenize(("<user>", "two", "words"))
    assert chunks[0]["prompt_token_ids"] == prompt and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    ids = [t for c in chunks for t in c["choices"][0].get("token_ids") or []]
    assert ids == greedy_answer(prompt, 5)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "".join(map(token_text, ids))
    # without return_token_ids: what it always sent
    assert "prompt_token_ids" not in plain[0] and plain[1]["choices"][0]["delta"] == {"content": " tok"}


def test_completion_continuation_from_token_ids_is_the_rest_of_the_answer() -> None:
    server = start_process("--ttft", "0", "--itl", "0", "--output-tokens", "12")
    try:
        whole = _post(server.base_url, "/completions", {"model": "m", "prompt": "once upon", "max_tokens": 50,
                                                         "return_token_ids": True})
        choice = whole["choices"][0]
        prompt, ids = choice["prompt_token_ids"], choice["token_ids"]
        rest = _post(server.base_url, "/completions", {"model": "m", "prompt": prompt + ids[:5], "max_tokens": 45,
                                                        "stream": True, "return_token_ids": True})
    finally:
        server.stop()
    assert prompt == tokenize(("once", "upon")) and len(ids) == 12 and choice["finish_reason"] == "stop"
    assert rest[0]["choices"][0]["prompt_token_ids"] == prompt + ids[:5]
    assert [t for c in rest for t in c["choices"][0].get("token_ids") or []] == ids[5:]
    assert "".join(c["choices"][0]["text"] for c in rest) == "".join(map(token_text, ids[5:]))
    assert rest[-1]["choices"][0]["finish_reason"] == "stop"
