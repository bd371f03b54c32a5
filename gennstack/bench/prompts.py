"""The synthetic prompt set that ships with the tool.

A prompt is a short instruction followed by words drawn, with a seeded generator, from
``data/words.txt`` (common words that tokenizers encode as one token each). Its requested
length is therefore close to, not exactly, the server's token count; the server's own
``usage.prompt_tokens`` is recorded whenever the server reports it. Every request gets a
different word sequence, so a server's prefix cache cannot serve one prompt for all.
"""

from __future__ import annotations

import random
from functools import cache
from importlib import resources

INSTRUCTION = "Continue the following list of words with more words, one after another:"
# words in INSTRUCTION, counted as tokens of the prompt
_INSTRUCTION_WORDS = len(INSTRUCTION.split())


@cache
def vocabulary() -> tuple[str, ...]:
    text = resources.files("gennstack.bench").joinpath("data/words.txt").read_text(encoding="utf-8")
    words = tuple(
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    )
    if len(words) < 100:
        raise RuntimeError("gennstack/bench/data/words.txt is damaged: fewer than 100 words")
    return words


def make_prompt(num_tokens: int, rng: random.Random) -> str:
    """A prompt of about ``num_tokens`` tokens (at least the instruction itself)."""
    words = vocabulary()
    body = max(0, num_tokens - _INSTRUCTION_WORDS)
    return INSTRUCTION + " " + " ".join(rng.choice(words) for _ in range(body))
