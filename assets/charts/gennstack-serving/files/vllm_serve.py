"""Starts vLLM's OpenAI-compatible server with the arguments the chart put in VLLM_ARGS (a JSON
list), so no argument is ever re-split by a shell. Serving pods, the inf2 Ray Serve replicas and
the compile Jobs all start vLLM through `command()`, with the same arguments.

    usage: python3 vllm_serve.py HOST PORT
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping


def command(host: str, port: str, env: Mapping[str, str]) -> list[str]:
    args = json.loads(env["VLLM_ARGS"])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError("VLLM_ARGS must be a JSON list of strings")
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", host, "--port", port, *args]


if __name__ == "__main__":
    argv = command(sys.argv[1], sys.argv[2], os.environ)
    os.execv(argv[0], argv)
