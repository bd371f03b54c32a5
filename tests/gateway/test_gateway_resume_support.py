"""Which generation's server can take a resumed stream (gennstack/gateway/resume_support.py), pinned to the
upstream text at the versions GenNStack runs (the serving support matrix, gennstack/serving/support.py).

A continuation needs two pieces of vLLM's OpenAI server: ``return_token_ids`` on the first attempt (the
prompt's IDs in the first streamed chunk, the delta IDs in every chunk) and a ``/v1/completions`` prompt of
token IDs. The text below is quoted from the wheels of those tags (`pip download vllm==0.29.0`,
`vllm==0.13.0`); with GENNSTACK_VLLM_WHEELS naming a folder that holds them, the test reads the files
from the wheels themselves. gen1's Ray Serve app is the project's own file, read here."""

from __future__ import annotations

import ast
import os
import zipfile
from pathlib import Path

import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig
from gennstack.gateway.resume_support import SERVER_SUPPORT, ServerSupport
from gennstack.serving.support import SUPPORT as MATRIX

ROOT = Path(__file__).resolve().parents[2]
RETURN_TOKEN_IDS = ('''    return_token_ids: bool | None = Field(
        default=None,
        description=(
            "If specified, the result will include token IDs alongside the "
            "generated text. In streaming mode, prompt_token_ids is included "
            "only in the first chunk, and token_ids contains the delta tokens "
            "for each chunk.''')
# vllm 0.29.0 vllm/entrypoints/openai/completion/protocol.py, class CompletionRequest
PROMPT_IDS_0_29 = '''    prompt: (
        list[Annotated[int, Field(ge=0)]]
        | list[list[Annotated[int, Field(ge=0)]]]
        | str
        | list[str]
        | None
    ) = None'''
# vllm 0.13.0 vllm/entrypoints/openai/protocol.py, class CompletionRequest
PROMPT_IDS_0_13 = "    prompt: list[int] | list[list[int]] | str | list[str] | None = None"
UPSTREAM = {
    "0.29.0": {"vllm/entrypoints/openai/completion/protocol.py": [RETURN_TOKEN_IDS, PROMPT_IDS_0_29],
               "vllm/entrypoints/openai/chat_completion/protocol.py": [RETURN_TOKEN_IDS]},
    # one protocol module for both requests: return_token_ids twice (chat and completion)
    "0.13.0": {"vllm/entrypoints/openai/protocol.py": [RETURN_TOKEN_IDS, PROMPT_IDS_0_13]},
}


def test_each_generation_names_its_server_at_the_pinned_version() -> None:
    assert set(SERVER_SUPPORT) == set(MATRIX)
    for generation, entry in SERVER_SUPPORT.items():
        version = MATRIX[generation].vllm
        assert f"vLLM {version}" in entry.server, generation
        for path in UPSTREAM[version]:
            assert path in entry.source, (generation, path)
        assert entry.supported and not entry.reason


@pytest.mark.parametrize("version", sorted(UPSTREAM))
def test_the_quoted_text_is_in_the_wheel(version: str) -> None:
    folder = os.environ.get("GENNSTACK_VLLM_WHEELS")
    if not folder:
        pytest.skip("GENNSTACK_VLLM_WHEELS is unset: set it to a folder with the vllm wheels to read the text from them")
    (wheel,) = Path(folder).glob(f"vllm-{version}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for path, quotes in UPSTREAM[version].items():
            text = archive.read(path).decode()
            for quote in quotes:
                assert quote in text, (version, path, quote[:60])
    if version == "0.13.0":
        assert text.count(RETURN_TOKEN_IDS) == 2  # ChatCompletionRequest and CompletionRequest


def _call_method(tree: ast.Module) -> ast.AsyncFunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "__call__")


def test_gen1_serve_app_passes_the_body_and_the_stream_through() -> None:
    """The Serve deployment forwards the request body as it came (``data=await request.body()``) and streams
    the server's response back chunk by chunk (``StreamingResponse`` over ``upstream.content.iter_any()``), and
    keeps the continuation header: vLLM 0.13.0 behind it sees return_token_ids and token-ID prompts."""
    import sys

    source = ROOT / "assets" / "charts" / "gennstack-serving" / "files" / "gennstack_serve.py"
    call = _call_method(ast.parse(source.read_text()))
    text = ast.unparse(call)
    assert "data=await request.body()" in text
    assert "StreamingResponse(body()" in text and "upstream.content.iter_any()" in text
    sys.path.insert(0, str(source.parent))
    try:
        from gennstack_serve import forwarded_headers
    finally:
        sys.path.remove(str(source.parent))
    kept = forwarded_headers({"x-gennstack-resume": "continuation", "content-type": "application/json", "connection": "close"})
    assert kept == {"x-gennstack-resume": "continuation", "content-type": "application/json"}


def test_a_generation_without_support_cannot_be_turned_on(monkeypatch) -> None:
    import gennstack.gateway.config as config

    missing = ServerSupport(server="vLLM 0.1.0", supported=False, reason="no return_token_ids")
    monkeypatch.setitem(config.SERVER_SUPPORT, "inf2", missing)
    with pytest.raises(ValueError, match="inf2: its server \\(vLLM 0.1.0\\) cannot resume a stream: no return_token_ids"):
        GatewayConfig.model_validate(frozen({"resume": {"generations": {"inf2": True}}}))
    gateway = GatewayConfig.model_validate(frozen({"resume": {"generations": {"inf2": False}}}))
    assert gateway.resume.reason_off("inf2") == "vLLM 0.1.0: no return_token_ids"
    assert gateway.resume.reason_off("g6e") is None
    off = GatewayConfig.model_validate(frozen({"resume": {"enabled": False}}))
    assert off.resume.reason_off("g6e") == "gateway.resume.enabled is false"
