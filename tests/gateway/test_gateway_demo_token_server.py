"""The demo token server (gennstack/gateway/demo_token_server.py): its request checks without llama.cpp, and
its answers on SmolLM2 in vLLM 0.29.0's shapes with ``return_token_ids`` (read in the vllm-0.29.0 wheel:
chat_completion/serving.py sends ``prompt_token_ids`` on the chat stream's role chunk and ``token_ids`` on each
choice; completion/serving.py ``prompt_token_ids`` on the first choice, ``null`` after it), and the property the
resume relay needs from it: a continuation (prompt IDs + the IDs generated so far, as ``/v1/completions``)
generates exactly the rest of the uninterrupted greedy answer. The real-model parts skip without
`make setup-demo` and fail under CI=true (tests/gateway/test_gateway_smollm2.py)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from gennstack.gateway.demo_token_server import BadRequest, Job, Sampling, _sampling, chat_messages, unsupported_fields
from tests.gateway.test_gateway_smollm2 import _require_llama_cpp


def test_fields_it_cannot_honour_are_named() -> None:
    assert unsupported_fields({"model": "m", "messages": [], "temperature": 0, "n": 1, "stop": None,
                               "stream_options": {"include_usage": True}}) == []
    assert unsupported_fields({"n": 2, "stop": ["\n"], "logprobs": True, "presence_penalty": 0.5,
                               "response_format": {"type": "json_object"}, "tools": [{"type": "function"}],
                               "stream_options": {"continuous_usage_stats": True}}) == [
        "n", "logprobs", "stop", "presence_penalty", "tools", "response_format", "stream_options.continuous_usage_stats"]


def test_messages_and_sampling_are_checked() -> None:
    assert chat_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]) == [
        {"role": "user", "content": "a\nb"}]
    for bad, message in (([], "non-empty list"), ([{"content": "x"}], r"messages\[0\]: an object with a string role"),
                         ([{"role": "user", "content": [{"type": "image_url"}]}], "only text parts"),
                         ([{"role": "user", "content": 3}], "a string or a list of text parts")):
        with pytest.raises(BadRequest, match=message):
            chat_messages(bad)
    assert _sampling({}) == Sampling(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None)
    assert _sampling({"temperature": 0, "top_k": -1, "seed": 7}).top_k == 0
    for body, message in (({"temperature": 3}, "temperature: a number from 0 to 2"), ({"top_k": 1.5}, "top_k"),
                          ({"seed": -1}, "seed"), ({"top_p": True}, "top_p")):
        with pytest.raises(BadRequest, match=message):
            _sampling(body)


@pytest.fixture(scope="module")
def model():
    _require_llama_cpp()
    from gennstack.gateway.demo import demo_model_path
    from gennstack.gateway.demo_token_server import Model

    return Model(demo_model_path(), n_threads=1)


def _greedy(model, prompt_ids: list[int], n: int) -> list[tuple[int, str, str | None]]:
    out: list[tuple[int, str, str | None]] = []
    job = Job(kind="completion", model="m", prompt_ids=prompt_ids, max_tokens=n, sampling=Sampling(0.0, 1.0, 0, 0.0, None),
              skip_special=True, stream=True, return_ids=True, include_usage=False)
    model.generate(job, lambda token, text, finish: out.append((token, text, finish)), threading.Event())
    return out


def test_a_continuation_generates_the_rest_of_the_greedy_answer(model) -> None:
    """Cut an answer of 64 tokens at 1, 17 and 45 tokens and ask for the rest with a prompt of token IDs: the
    same tokens and text, with llama.cpp evaluating one token at a time (n_batch 1, the server's default; with
    llama-cpp-python's default 512 the continuations diverged: the module's docstring has the numbers)."""
    prompt = model.chat_prompt_ids([{"role": "user", "content": "Write a long story about a lighthouse keeper."}])
    whole = _greedy(model, prompt, 64)
    ids = [token for token, _, _ in whole]
    assert len(ids) == 64 and whole[-1][2] == "length"
    for cut in (1, 17, 45):
        rest = _greedy(model, prompt + ids[:cut], 64 - cut)
        assert [token for token, _, _ in rest] == ids[cut:], cut
        assert "".join(text for _, text, _ in whole[:cut]) + "".join(text for _, text, _ in rest) == \
            "".join(text for _, text, _ in whole)
    model.reuse_prefix = True  # llama-cpp-python's KV prefix reuse: the same answer after another request
    try:
        _greedy(model, model.chat_prompt_ids([{"role": "user", "content": "Write a short poem."}]), 4)
        assert [token for token, _, _ in _greedy(model, prompt, 64)] == ids
    finally:
        model.reuse_prefix = False


def test_chat_prompt_ids_are_the_chat_handlers(model) -> None:
    """The prompt IDs equal those llama-cpp-python's own chat completion evaluates (its context holds them
    before the generated tokens): the same template, the same tokenization."""
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    ids = model.chat_prompt_ids(messages)
    model.llama.reset()
    model.llama.create_chat_completion(messages=messages, max_tokens=1, temperature=0)
    assert list(model.llama._input_ids[:len(ids)]) == ids and model.llama.n_tokens == len(ids)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One token server process (`python -m gennstack.gateway.demo_token_server`, as --demo starts it)."""
    _require_llama_cpp()
    from gennstack.gateway.demo import start_replicas, wait_ready
    from gennstack.gateway.ports import free_ports

    (replica,) = start_replicas(1, free_ports(1), tmp_path_factory.mktemp("token-server"), server="token")
    try:
        wait_ready([replica])
        yield replica.url
    finally:
        replica.stop()


def _events(url: str, body: dict) -> list[dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line.decode().strip() for line in resp if line.strip()]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_streams_in_vllms_shapes_and_resumes_by_token_ids(server) -> None:
    chat = {"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 12,
            "temperature": 0, "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    events = _events(server + "/chat/completions", chat)
    first, *tokens, last, usage = events
    assert first["model"] == "gpt-oss-20b" and first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and "token_ids" not in first["choices"][0]
    prompt_ids = first["prompt_token_ids"]
    ids = [t for e in tokens + [last] for t in e["choices"][0]["token_ids"]]
    assert all(len(e["choices"][0]["token_ids"]) == 1 for e in tokens + [last])
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["stop_reason"] is None
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 12,
                                                         "total_tokens": len(prompt_ids) + 12}
    text = "".join(e["choices"][0]["delta"]["content"] for e in tokens + [last])
    # the relay's continuation: prompt IDs + generated IDs on /v1/completions, the rest of the answer
    cont = _events(server + "/completions", {"model": "gpt-oss-20b", "prompt": prompt_ids + ids[:5], "max_tokens": 7,
                                             "temperature": 0, "stream": True, "return_token_ids": True})
    assert cont[0]["choices"][0]["prompt_token_ids"] == prompt_ids + ids[:5]
    assert all(e["choices"][0]["prompt_token_ids"] is None for e in cont[1:])
    assert [t for e in cont for t in e["choices"][0]["token_ids"]] == ids[5:]
    head = "".join(e["choices"][0]["delta"]["content"] for e in tokens[:5])
    assert head + "".join(e["choices"][0]["text"] for e in cont) == text
    # without return_token_ids: no ID fields
    plain = _events(server + "/chat/completions", {**chat, "return_token_ids": False})
    assert "prompt_token_ids" not in plain[0] and all("token_ids" not in e["choices"][0] for e in plain[1:-1])


def test_bad_requests_get_a_400_that_names_the_field(server) -> None:
    for body, message in (({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
                          ({"model": "m", "prompt": [1, -2]}, "prompt: token IDs from 0"),
                          ({"model": "m", "prompt": "hi", "max_tokens": 5000}, "maximum context length is 2048"),
                          ({"model": "m", "prompt": "hi", "stop": ["."]}, "stop")):
        path = "/chat/completions" if "messages" in body else "/completions"
        request = urllib.request.Request(server + path, data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 400
        assert message in json.loads(caught.value.read())["error"]["message"]


def test_a_client_gone_mid_answer_frees_the_model_for_the_next(server) -> None:
    """A client that closes its stream after the first chunk: the server goes on serving, and the next request
    gets its whole answer, its usage counting its own tokens."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(server)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    connection.request("POST", "/v1/completions", body=json.dumps({"model": "m", "prompt": "Once upon a time",
                                                                   "max_tokens": 1500, "stream": True}),
                       headers={"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.read(6) == b"data: "
    connection.close()
    body = {"model": "m", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    events = _events(server + "/chat/completions", body)
    assert events[-1]["usage"]["completion_tokens"] == sum(1 for e in events[1:-1] if e["choices"])


def test_a_character_split_across_the_break_is_completed() -> None:
    """A byte-level BPE can split a character over tokens: here "é" (0xC3 0xA9) as two tokens of one byte.
    The uninterrupted answer holds the first byte back and sends the character with the second; a continuation
    whose prompt ends with the first byte sends it whole too, not a replacement character."""
    from gennstack.gateway.demo_token_server import TextStream

    pieces = {1: b"caf", 2: b"\xc3", 3: b"\xa9", 4: b" au lait"}
    whole = TextStream(pieces.__getitem__, [])
    assert [whole.next(t) for t in (1, 2, 3, 4)] == ["caf", "", "\u00e9", " au lait"]
    rest = TextStream(pieces.__getitem__, [1, 2])  # cut after the first byte: the prompt ends inside the character
    assert [rest.next(t) for t in (3, 4)] == ["\u00e9", " au lait"]
