"""The resume relay through real Envoy (the local gateway's two halves), mock replicas SIGKILLed mid-answer,
an unmodified openai-python client (openai 3.57): its text equals the uninterrupted answer's.

The mock's greedy output is a pure function of the token IDs (gennstack/bench/mockserver.py), so the
reference is the same request answered by an untouched replica.
"""

from __future__ import annotations

import threading
import time

import openai
import pytest

from gennstack.resume.local import metric
from tests.resume.resume_support import MODEL, reference, reference_text, resume_stack, wait_streaming

MESSAGES = [{"role": "user", "content": "tell me a long story about a lighthouse"}]
MAX_TOKENS = 60
KILL_AFTER = 10  # content chunks the client has before its replica is SIGKILLed


def _client(stack, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=60)


def _stream_and_kill(stack, stream, text_of) -> tuple[str, object]:
    """Read ``stream``; SIGKILL its replica after KILL_AFTER chunks with text; the text and the usage."""
    host = stream.response.headers["x-gennstack-upstream-host"]
    victim = stack.replica_at(host)
    parts, usage, seen = [], None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = text_of(choice)
            if piece:
                parts.append(piece)
                seen += 1
                if seen == KILL_AFTER:
                    victim.kill()
    assert victim.proc.poll() is not None, "the replica was never killed: the answer was too short"
    return "".join(parts), usage


def test_chat_stream_survives_a_sigkilled_replica() -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    expected = reference(kind="chat", body=body)
    with resume_stack() as stack:
        stream = _client(stack).chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
        text, usage = _stream_and_kill(stack, stream, lambda c: c.delta.content)
        metrics = stack.relay.metrics()
    assert text == expected["choices"][0]["message"]["content"]
    # the client's prompt once, every output token once
    assert (usage.prompt_tokens, usage.completion_tokens) == (expected["usage"]["prompt_tokens"], MAX_TOKENS)
    assert metric(metrics, "gennstack_resume_succeeded_total", model=MODEL) == 1
    assert metric(metrics, "gennstack_resume_attempts_total", model=MODEL) == 1
    assert metric(metrics, "gennstack_resume_replayed_tokens_total", model=MODEL) == expected["usage"]["prompt_tokens"] + KILL_AFTER


def test_completions_stream_survives_a_sigkilled_replica() -> None:
    body = {"model": MODEL, "prompt": "once upon a time there was", "max_tokens": MAX_TOKENS}
    expected = reference_text("completion", body)
    with resume_stack() as stack:
        stream = _client(stack).completions.create(**body, stream=True)
        text, _ = _stream_and_kill(stack, stream, lambda c: c.text)
        assert metric(stack.relay.metrics(), "gennstack_resume_succeeded_total", model=MODEL) == 1
    assert text == expected


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_non_streaming_answer_survives_a_sigkilled_replica(kind: str) -> None:
    body = {"model": MODEL, "max_tokens": MAX_TOKENS,
            **({"messages": MESSAGES} if kind == "chat" else {"prompt": "once upon a time"})}
    expected = reference(kind, body)
    with resume_stack() as stack:
        client = _client(stack)
        result = {}

        def call() -> None:
            create = client.chat.completions.create if kind == "chat" else client.completions.create
            result["answer"] = create(**body)

        worker = threading.Thread(target=call)
        worker.start()
        victim = wait_streaming(stack.replicas)
        time.sleep(0.3)  # some tokens generated (itl 0.02 s): then it dies
        victim.kill()
        worker.join(timeout=60)
        metrics = stack.relay.metrics()
    answer = result["answer"]
    if kind == "chat":
        assert answer.choices[0].message.content == expected["choices"][0]["message"]["content"]
    else:
        assert answer.choices[0].text == expected["choices"][0]["text"]
    assert answer.usage.completion_tokens == MAX_TOKENS
    assert answer.usage.prompt_tokens == expected["usage"]["prompt_tokens"]
    assert metric(metrics, "gennstack_resume_succeeded_total", model=MODEL) == 1


def test_no_replica_left_ends_the_stream_with_an_error_event() -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    with resume_stack(replicas=1, resume_data={"max_attempts": 2}) as stack:
        stream = _client(stack).chat.completions.create(**body, stream=True)
        with pytest.raises(openai.APIError, match="could not be resumed"):
            _stream_and_kill(stack, stream, lambda c: c.delta.content)
        metrics = stack.relay.metrics()
    assert metric(metrics, "gennstack_resume_attempts_total", model=MODEL) == 2
    assert metric(metrics, "gennstack_resume_failed_total", model=MODEL, reason="no_replica") == 1
    assert metric(metrics, "gennstack_resume_succeeded_total", model=MODEL) == 0


def test_refused_request_is_served_and_its_break_is_an_error() -> None:
    """response_format (structured output): the grammar's state is not in the token IDs; served, never resumed."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "response_format": {"type": "json_object"}}
    with resume_stack() as stack:
        stream = _client(stack).chat.completions.create(**body, stream=True)
        with pytest.raises((openai.APIError, openai.APIConnectionError)):
            _stream_and_kill(stack, stream, lambda c: c.delta.content)
        assert _client(stack).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, n=2).choices
        metrics = stack.relay.metrics()
    assert metric(metrics, "gennstack_resume_refused_total", model=MODEL, reason="structured_output") == 1
    assert metric(metrics, "gennstack_resume_refused_total", model=MODEL, reason="n") == 1
    assert metric(metrics, "gennstack_resume_attempts_total", model=MODEL) == 0


def test_model_with_resume_off_is_not_resumed() -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    off = {"models": {MODEL: {"resume": False, "reason_off": "test"}}}
    with resume_stack(resume_data=off) as stack:
        stream = _client(stack).chat.completions.create(**body, stream=True)
        with pytest.raises(openai.APIError, match="not resumable"):
            _stream_and_kill(stack, stream, lambda c: c.delta.content)
        metrics = stack.relay.metrics()
    assert metric(metrics, "gennstack_resume_refused_total", model=MODEL, reason="model_off") == 1
    assert metric(metrics, "gennstack_resume_failed_total", model=MODEL, reason="not_resumable") == 1


def test_a_continuation_is_not_charged_to_the_client() -> None:
    """2 requests a minute for client alice: one broken and resumed answer, then a second request
    still passes (the continuation went through the routing half only), the third gets 429."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    with resume_stack(api_keys=(("alice", "key-a"),), rate_limit=2) as stack:
        client = _client(stack, "key-a")
        stream = client.chat.completions.create(**body, stream=True)
        _stream_and_kill(stack, stream, lambda c: c.delta.content)
        assert metric(stack.relay.metrics(), "gennstack_resume_succeeded_total", model=MODEL) == 1
        assert client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2).choices
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            _client(stack, "wrong").chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)


def test_a_replica_lost_before_its_first_token_is_asked_again() -> None:
    """A completion stream sends nothing before its first token (vLLM's neither: its first chunk follows the
    prefill); a replica SIGKILLed then leaves no token IDs to resume from, so the relay sends the request again."""
    body = {"model": MODEL, "prompt": "a prompt whose prefill takes long", "max_tokens": 20}
    expected = reference_text("completion", body)
    with resume_stack(flags=("--ttft", "1.5", "--itl", "0.01")) as stack:
        client = _client(stack)
        result = {}
        worker = threading.Thread(target=lambda: result.update(text="".join(
            c.choices[0].text for c in client.completions.create(**body, stream=True) if c.choices)))
        worker.start()
        wait_streaming(stack.replicas).kill()
        worker.join(timeout=60)
        metrics = stack.relay.metrics()
    assert result["text"] == expected
    assert metric(metrics, "gennstack_resume_attempts_total", model=MODEL) == 1
    assert metric(metrics, "gennstack_resume_replayed_tokens_total", model=MODEL) == 0
