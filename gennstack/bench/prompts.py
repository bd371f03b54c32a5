"""The synthetic prompt set that ships with the tool.

A prompt is a short instruction followed by words drawn, with a seeded generator, from
``data/words.txt`` (common words that tokenizers encode as one token each). Its requested
length is therefore close to, not exactly, the server's token count; the server's own
``usage.prompt_tokens`` is recorded whenever the server reports it. Every request gets a
different word sequence, so a server's prefix cache cannot serve one prompt for all.

The ``multi-turn`` and ``shared-prefix`` workloads reuse text on purpose: a conversation resends its
history, and requests of one prefix share a system prompt (:func:`system_prompt`, :func:`make_unit`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
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


# ---- the multi-turn and shared-prefix workloads (gennstack.bench.config.Workload) ------------------
# Every text below is a function of (seed, index) alone, never of timing or of which worker asks, so
# two runs with one seed send the same prompts (the server's answers aside) in whatever order they go.

SYSTEM_INSTRUCTION = "You are assistant number {index}. Keep these reference words in mind:"
# a turn's own instruction is short, so that even a short message is mostly random words (distinct)
TURN_INSTRUCTION = "Continue with more words:"


def make_message(num_tokens: int, rng: random.Random) -> str:
    """A user message of about ``num_tokens`` tokens: :data:`TURN_INSTRUCTION`, then random words."""
    body = max(1, num_tokens - len(TURN_INSTRUCTION.split()))
    return TURN_INSTRUCTION + " " + " ".join(rng.choice(vocabulary()) for _ in range(body))


def system_prompt(index: int, num_tokens: int, seed: int) -> str:
    """Shared prefix ``index`` (0-based) of about ``num_tokens`` tokens; distinct prefixes differ from
    their fifth word on (the index), so no two share more than four words."""
    rng = random.Random(f"{seed}:prefix:{index}")
    head = SYSTEM_INSTRUCTION.format(index=index)
    body = max(0, num_tokens - len(head.split()))
    return head + " " + " ".join(rng.choice(vocabulary()) for _ in range(body))


def pick_prefix(weights: list[float], rng: random.Random) -> int:
    """A prefix index drawn with ``weights`` (gennstack.bench.config.Workload.prefix_weights)."""
    return rng.choices(range(len(weights)), weights=weights)[0]


@dataclass(frozen=True, slots=True)
class Turn:
    text: str
    prompt_tokens: int  # the new user message's requested length
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Unit:
    """What one request (``shared-prefix``) or one conversation (``multi-turn``) sends, drawn from its
    own generator seeded with (seed, index). ``prefix``: the index of its system prompt, or None."""

    index: int
    prefix: int | None
    turns: tuple[Turn, ...]


def make_unit(index: int, *, seed: int, turns: int, prompt_tokens, max_tokens, weights: list[float] | None) -> Unit:
    """Unit ``index``: its prefix (when ``weights``), then per turn a user message of ``prompt_tokens`` and a
    ``max_tokens`` (both gennstack.bench.config.Distribution), in that order from one generator."""
    rng = random.Random(f"{seed}:unit:{index}")
    prefix = pick_prefix(weights, rng) if weights else None
    out = []
    for _ in range(turns):
        n = prompt_tokens.sample(rng)
        m = max_tokens.sample(rng)
        out.append(Turn(make_message(n, rng), n, m))
    return Unit(index, prefix, tuple(out))
