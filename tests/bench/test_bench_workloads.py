"""The multi-turn and shared-prefix workloads: what each request holds, end to end against the mock
server (which keeps every request it got, --record-requests), and their flags.

Upstream shapes followed (docs/benchmark.md#workloads): vLLM ``benchmarks/multi_turn``
(benchmark_serving_multi_turn.py: each request resends the conversation, the assistant turns being the
tested server's own answers), genai-perf's session flags (``--session-turns-mean``,
``--session-turn-delay-mean``), vLLM ``bench serve --dataset-name prefix_repetition``
(``--prefix-repetition-num-prefixes``, ``--prefix-repetition-prefix-len``) and inference-perf's
``shared_prefix`` (``num_groups``, ``system_prompt_len``, ``question_len``).
"""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest

from gennstack.bench.config import ConfigError, Distribution, Workload
from gennstack.bench.prompts import make_unit, system_prompt


def _run(bench_parser, monkeypatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["gennstack", *argv])
    args = bench_parser.parse_args(argv)
    return args.func(args)


def test_units_are_a_function_of_seed_and_index_only() -> None:
    fixed, lengths = Distribution.parse("12", option="--prompt-tokens"), Distribution.parse("uniform:3,9", option="--max-tokens")
    weights = Workload(kind="shared-prefix", num_prefixes=5, prefix_tokens=30, prefix_zipf=1.0).prefix_weights()
    a = [make_unit(i, seed=7, turns=3, prompt_tokens=fixed, max_tokens=lengths, weights=weights) for i in range(20)]
    b = [make_unit(i, seed=7, turns=3, prompt_tokens=fixed, max_tokens=lengths, weights=weights) for i in reversed(range(20))]
    assert a == list(reversed(b))  # the order they are drawn in changes nothing
    other = [make_unit(i, seed=8, turns=3, prompt_tokens=fixed, max_tokens=lengths, weights=weights) for i in range(20)]
    assert [u.turns for u in a] != [u.turns for u in other]
    texts = [t.text for u in a for t in u.turns]
    assert len(set(texts)) == len(texts)  # every user message distinct
    assert system_prompt(2, 30, 7) == system_prompt(2, 30, 7) != system_prompt(3, 30, 7)
    assert len(system_prompt(2, 30, 7).split()) == 30
    # distinct prefixes share at most their first four words ("You are assistant number")
    p2, p3 = system_prompt(2, 30, 7).split(), system_prompt(3, 30, 7).split()
    assert p2[:4] == p3[:4] and p2[4] != p3[4]


def test_zipf_weights_and_the_drawn_distribution() -> None:
    w = Workload(kind="shared-prefix", num_prefixes=3, prefix_tokens=10, prefix_zipf=1.0).prefix_weights()
    assert w == pytest.approx([6 / 11, 3 / 11, 2 / 11])  # 1, 1/2, 1/3 normalised
    assert Workload(kind="shared-prefix", num_prefixes=4, prefix_tokens=10).prefix_weights() == pytest.approx([0.25] * 4)
    weights = Workload(kind="shared-prefix", num_prefixes=8, prefix_tokens=10, prefix_zipf=1.2).prefix_weights()
    one = Distribution.parse("1", option="x")
    n = 20000
    counts = [0] * 8
    for i in range(n):
        counts[make_unit(i, seed=0, turns=1, prompt_tokens=one, max_tokens=one, weights=weights).prefix] += 1
    for k, p in enumerate(weights):
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(counts[k] - n * p) < 4.5 * sigma, (k, counts[k], n * p)
    assert counts == sorted(counts, reverse=True)  # rank 1 the most picked


def test_multi_turn_resends_the_history_with_the_servers_answers(mock_server, bench_parser, tmp_path, monkeypatch) -> None:
    seen = tmp_path / "seen.jsonl"
    server = mock_server("--ttft", "0.005", "--itl", "0.001", "--record-requests", str(seen))
    out = tmp_path / "run"
    argv = ["bench", "--base-url", server.base_url, "--model", "mock", "--workload", "multi-turn", "--turns", "4",
            "--think-time", "0.01", "--concurrency", "3", "--num-requests", "24", "--warmup-requests", "0",
            "--prompt-tokens", "12", "--max-tokens", "uniform:2,6", "--num-prefixes", "2", "--prefix-tokens", "20",
            "--seed", "5", "--output-dir", str(out), "--no-progress"]
    assert _run(bench_parser, monkeypatch, argv) == 0
    requests = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(requests) == 24
    with (out / "requests.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    by_conversation: dict[str, list[dict]] = {}
    for row in rows:
        by_conversation.setdefault(row["conversation"], []).append(row)
    assert len(by_conversation) == 6  # 24 requests, 4 turns each
    bodies = {tuple(m["content"] for m in r["messages"]): r for r in requests}
    for conv, turns in by_conversation.items():
        assert [int(r["turn"]) for r in sorted(turns, key=lambda r: int(r["index"]))] == [1, 2, 3, 4]
        assert len({r["prefix"] for r in turns}) == 1
    # each conversation's requests: turn t holds turn t-1's messages, the server's answer to it, and one new user message
    firsts = [r for r in requests if len(r["messages"]) == 2]
    assert len(firsts) == 6
    for first in firsts:
        chain = [first]
        while True:
            prev = chain[-1]
            nxt = [r for r in requests if len(r["messages"]) == len(prev["messages"]) + 2
                   and r["messages"][: len(prev["messages"])] == prev["messages"]]
            if not nxt:
                break
            assert len(nxt) == 1
            chain.append(nxt[0])
        assert len(chain) == 4
        assert chain[0]["messages"][0]["role"] == "system"
        for prev, cur in zip(chain, chain[1:]):
            answer = cur["messages"][len(prev["messages"])]
            # the mock streams " tok" per token: the answer resent is exactly what it sent
            assert answer == {"role": "assistant", "content": " tok" * prev["max_tokens"]}
            assert cur["messages"][-1]["role"] == "user"
    assert len(bodies) == 24
    result = json.loads((out / "result.json").read_text())
    assert result["settings"]["workload"] == {"kind": "multi-turn", "turns": 4, "think_time_s": 0.01,
                                              "num_prefixes": 2, "prefix_tokens": 20, "prefix_zipf": 0.0}
    block = result["levels"][0]["workload"]
    assert block["conversations"] == 6
    assert [(t["turn"], t["completed"]) for t in block["turns"]] == [(1, 6), (2, 6), (3, 6), (4, 6)]
    prompt_means = [t["prompt_tokens"]["mean"] for t in block["turns"]]
    assert prompt_means == sorted(prompt_means) and prompt_means[0] < prompt_means[-1]  # the history grows
    assert sum(block["requests_by_prefix"].values()) == 24
    assert block["later_turns_ttft_s"]["count"] == 18
    # the LLMPerf-compatible files stay what they were: one summary, one responses file per level
    files = sorted(p.name for p in (out / "llmperf" / "concurrency-3").iterdir())
    assert files == ["mock_12_4_individual_responses.json", "mock_12_4_summary.json"]
    responses = json.loads((out / "llmperf" / "concurrency-3" / files[0]).read_text())
    assert len(responses) == 24 and all("turn" not in r and "conversation" not in r for r in responses)


def test_same_seed_same_prompts(mock_server, bench_parser, tmp_path, monkeypatch) -> None:
    sent = []
    for name in ("a", "b"):
        seen = tmp_path / f"{name}.jsonl"
        server = mock_server("--ttft", "0.003", "--itl", "0.001", "--record-requests", str(seen))
        argv = ["bench", "--base-url", server.base_url, "--model", "mock", "--workload", "shared-prefix",
                "--num-prefixes", "4", "--prefix-tokens", "15", "--prefix-zipf", "1.1", "--concurrency", "4",
                "--num-requests", "16", "--warmup-requests", "0", "--prompt-tokens", "uniform:5,9", "--max-tokens", "3",
                "--seed", "11", "--output-dir", str(tmp_path / name), "--no-progress"]
        assert _run(bench_parser, monkeypatch, argv) == 0
        sent.append(sorted(json.dumps(json.loads(line)["messages"]) for line in seen.read_text().splitlines()))
    assert sent[0] == sent[1] and len(set(sent[0])) == 16
    systems = {json.loads(m)[0]["content"] for m in sent[0]}
    assert 1 < len(systems) <= 4  # 16 questions behind at most 4 system prompts
    assert all(json.loads(m)[0]["role"] == "system" and json.loads(m)[1]["role"] == "user" for m in sent[0])


def test_a_failed_turn_is_recorded_and_the_conversation_goes_on(mock_server, bench_parser, tmp_path, monkeypatch) -> None:
    seen = tmp_path / "seen.jsonl"
    server = mock_server("--ttft", "0.003", "--itl", "0.001", "--fault", "http:503:2", "--record-requests", str(seen))
    out = tmp_path / "run"
    argv = ["bench", "--base-url", server.base_url, "--model", "mock", "--workload", "multi-turn", "--turns", "3",
            "--concurrency", "1", "--num-requests", "6", "--warmup-requests", "0", "--prompt-tokens", "5",
            "--max-tokens", "2", "--output-dir", str(out), "--no-progress"]
    assert _run(bench_parser, monkeypatch, argv) == 0
    requests = [json.loads(line)["messages"] for line in seen.read_text().splitlines()]
    # every 2nd request fails. Conversation 0: turn 2 failed, so turn 3 resends turn 1 and its answer, not turn 2's
    # message; conversation 1: turn 1 failed, so turn 2 starts from nothing
    assert [len(m) for m in requests] == [1, 3, 3, 1, 1, 3]
    assert requests[2][:2] == requests[1][:2] and requests[2][2] != requests[1][2]
    turns = json.loads((out / "result.json").read_text())["levels"][0]["workload"]["turns"]
    assert [(t["turn"], t["completed"], t["failed"]) for t in turns] == [(1, 1, 1), (2, 1, 1), (3, 1, 1)]


def test_the_mock_prefix_cache_charges_only_what_it_does_not_hold(mock_server, bench_parser, tmp_path, monkeypatch) -> None:
    """Its TTFT is --ttft plus --prefill-per-token per word past the longest stored prefix, so turn 1 pays for the
    whole prompt and later turns only for the new message."""
    server = mock_server("--ttft", "0.005", "--itl", "0.001", "--prefix-cache-entries", "8", "--prefill-per-token", "0.002")
    out = tmp_path / "run"
    argv = ["bench", "--base-url", server.base_url, "--model", "mock", "--workload", "multi-turn", "--turns", "3",
            "--concurrency", "2", "--num-requests", "12", "--warmup-requests", "0", "--prompt-tokens", "10",
            "--max-tokens", "3", "--num-prefixes", "2", "--prefix-tokens", "150", "--output-dir", str(out), "--no-progress"]
    assert _run(bench_parser, monkeypatch, argv) == 0
    stats = server.stats()
    assert stats["prompt_words"] > stats["cached_prompt_words"] > 0
    turns = json.loads((out / "result.json").read_text())["levels"][0]["workload"]["turns"]
    # turn 1 misses (at least) its own question; later turns hit all but about 12 words (0.024 s)
    assert turns[0]["ttft_s"]["p50"] > turns[2]["ttft_s"]["p50"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--workload", "pipeline"], "invalid choice: 'pipeline'"),
    (["--workload", "multi-turn", "--turns", "0"], "--turns=0: must be an integer of at least 1"),
    (["--workload", "multi-turn", "--think-time", "-1"], "--think-time=-1.0: must be 0 or more seconds"),
    (["--turns", "3"], "--turns goes with --workload multi-turn, not --workload single"),
    (["--workload", "shared-prefix", "--think-time", "2"], "--think-time goes with --workload multi-turn"),
    (["--workload", "shared-prefix", "--num-prefixes", "4"], "needs --num-prefixes N and --prefix-tokens L"),
    (["--workload", "shared-prefix", "--num-prefixes", "4", "--prefix-tokens", "9", "--prefix-zipf", "-0.5"],
     "--prefix-zipf=-0.5: must be a finite number >= 0"),
    (["--workload", "shared-prefix", "--num-prefixes", "4", "--prefix-tokens", "9", "--prefix-zipf", "nan"],
     "--prefix-zipf=nan"),
    (["--workload", "shared-prefix", "--num-prefixes", "-2", "--prefix-tokens", "9"], "--num-prefixes=-2"),
    (["--workload", "multi-turn", "--prefix-tokens", "9"], "give --num-prefixes and --prefix-tokens together"),
    (["--num-prefixes", "3", "--prefix-tokens", "9"], "go with --workload shared-prefix or multi-turn, not --workload single"),
    (["--record-header", "x bad"], "--record-header='x bad': not an HTTP header name"),
])
def test_bad_workload_flags_get_a_clear_message(bench_parser, flags, message, capsys, monkeypatch) -> None:
    argv = ["bench", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--num-requests", "1", *flags]
    monkeypatch.setattr(sys, "argv", ["gennstack", *argv])
    try:
        args = bench_parser.parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2
    else:
        assert args.func(args) == 2
    assert message in capsys.readouterr().err


def test_workload_rejects_bad_values_directly() -> None:
    with pytest.raises(ConfigError, match="--workload='chat': expected one of single, multi-turn, shared-prefix"):
        Workload(kind="chat")
    assert Workload().to_dict() == {"kind": "single"}
    assert Workload(kind="multi-turn", turns=2, think_time_s=0.5).to_dict() == {"kind": "multi-turn", "turns": 2, "think_time_s": 0.5}
