"""Starts vLLM's OpenAI-compatible server (`vllm serve`, the CLI entry point of both pinned vLLMs:
0.13.0 in the Neuron 2.28.0 DLC, 0.29.0 in vllm-openai) with the arguments the chart put in VLLM_ARGS (a
JSON list), so no argument is ever re-split by a shell. Serving pods, the inf2 Ray Serve replicas
and the compile Jobs all start vLLM through `command()` and `environment()`, with the same arguments.

`vllm serve` takes the model as its first positional argument (`--model` is deprecated there and
only rewritten with a warning, vllm/utils/argparse_utils.py), so the `--model` pair of VLLM_ARGS
becomes that positional. The chart's own variables (VLLM_ARGS, GENNSTACK_*) are not passed on:
vLLM 0.29.0 warns about every unknown `VLLM_*` variable (vllm/envs.py validate_environ).

    usage: python3 vllm_serve.py HOST PORT
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

# Variables for this launcher only; vLLM never sees them.
OWN_VARIABLES = ("VLLM_ARGS",)
OWN_PREFIX = "GENNSTACK_"


def command(host: str, port: str, env: Mapping[str, str]) -> list[str]:
    args = json.loads(env["VLLM_ARGS"])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError("VLLM_ARGS must be a JSON list of strings")
    model, rest = _model(args)
    return ["vllm", "serve", model, *rest, "--host", host, "--port", port]


def environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment vLLM runs with: ``env`` without the launcher's own variables."""
    return {k: v for k, v in env.items() if k not in OWN_VARIABLES and not k.startswith(OWN_PREFIX)}


def _model(args: list[str]) -> tuple[str, list[str]]:
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            return args[i + 1], args[:i] + args[i + 2:]
        if arg.startswith("--model="):
            return arg.removeprefix("--model="), args[:i] + args[i + 1:]
    raise ValueError(f"VLLM_ARGS must name the model with --model; got {args!r}")


if __name__ == "__main__":
    argv = command(sys.argv[1], sys.argv[2], os.environ)
    os.execvpe(argv[0], argv, environment(os.environ))
