"""Which generation's model server can take a resumed stream, at the pinned versions (docs/gateway.md,
"Stream resume").

The resume relay (gennstack/resume/) continues a broken stream by asking the server, on the first
attempt, for the token IDs (``return_token_ids``: the prompt's IDs in the first streamed chunk, each
chunk's delta IDs) and, on a continuation, for ``/v1/completions`` with a prompt of token IDs (the
prompt's plus those already generated). A generation whose server lacks either piece cannot be resumed
exactly; its streams are relayed, never resumed, and ``reason`` says why (``gennstack summary``, docs).

Each entry names the server and the upstream text it relies on (tests/gateway/test_gateway_resume_support.py
quotes it, read from the wheels at the pinned tags):

* gen3-g6e: vLLM 0.29.0 (the g6e image, gennstack.serving.support). ``CompletionRequest.prompt`` takes
  ``list[Annotated[int, Field(ge=0)]]`` and both ``CompletionRequest`` and ``ChatCompletionRequest`` take
  ``return_token_ids`` ("In streaming mode, prompt_token_ids is included only in the first chunk, and
  token_ids contains the delta tokens for each chunk"): vllm/entrypoints/openai/completion/protocol.py and
  vllm/entrypoints/openai/chat_completion/protocol.py in the vllm 0.29.0 wheel.
* gen2-trn2: the Neuron DLC's vLLM 0.13.0 (pytorch-inference-vllm-neuronx:0.13.0-...-sdk2.28.0), whose
  OpenAI server is vLLM's own; vllm-neuron (release-0.4.1) is a platform plugin below it. The same two
  fields in vllm/entrypoints/openai/protocol.py of the vllm 0.13.0 wheel (``prompt: list[int] |
  list[list[int]] | str | list[str] | None`` and ``return_token_ids`` with the same description).
* gen1-inf2: Ray Serve in front of that same vLLM 0.13.0 (``vllm serve`` in each replica,
  assets/charts/gennstack-serving/files/gennstack_serve.py): the Serve deployment forwards the request
  body unchanged (``data=await request.body()``) and streams the server's response back
  (``StreamingResponse`` of ``upstream.content.iter_any()``), so both fields pass through. A
  continuation goes to the Serve Service, which picks a live replica of the same model.

Plain data: no CDK, no import of the gateway config (which imports this).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSupport:
    """One generation's server and whether it has what a resumed stream needs."""

    server: str
    supported: bool
    # why not, where not supported (shown by `gennstack summary`)
    reason: str = ""
    # the upstream files the answer rests on
    source: str = ""


SERVER_SUPPORT: dict[str, ServerSupport] = {
    "g6e": ServerSupport(
        server="vLLM 0.29.0",
        supported=True,
        source="vllm 0.29.0: vllm/entrypoints/openai/completion/protocol.py, vllm/entrypoints/openai/chat_completion/protocol.py"),
    "trn2": ServerSupport(
        server="vLLM 0.13.0 (Neuron DLC 2.28.0, vllm-neuron)",
        supported=True,
        source="vllm 0.13.0: vllm/entrypoints/openai/protocol.py"),
    "inf2": ServerSupport(
        server="Ray Serve 2.60.0 in front of vLLM 0.13.0 (Neuron DLC 2.28.0)",
        supported=True,
        source="assets/charts/gennstack-serving/files/gennstack_serve.py; vllm 0.13.0: vllm/entrypoints/openai/protocol.py"),
}


def support(generation: str) -> ServerSupport:
    """The generation's entry; a KeyError names the generations known."""
    try:
        return SERVER_SUPPORT[generation]
    except KeyError:
        raise KeyError(f"{generation!r}: no resume support entry; known: {sorted(SERVER_SUPPORT)}") from None
