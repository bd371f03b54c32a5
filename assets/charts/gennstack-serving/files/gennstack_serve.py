"""Ray Serve application of gen1-inf2: each Serve replica runs vLLM's own OpenAI-compatible
server (`vllm serve`, NxD Inference on Neuron) on its inf2 node and
forwards requests to it, streaming responses back.

Ray Serve does what it is good at (routing across replicas, autoscaling them on in-flight
requests, replacing unhealthy ones); vLLM serves the OpenAI API exactly as it does on trn2 and
g6e, so all three generations answer the same routes (/v1/chat/completions, /v1/completions,
/v1/models, /health). A replica becomes ready only once vLLM answers /health, i.e. after the
compiled model is loaded onto the NeuronCores.

vLLM runs in its own process group (`ServerProcess`), and stopping the replica stops the whole
group: vLLM's engine and worker processes included, never an orphan holding NeuronCores. Ray
forces OMP_NUM_THREADS=1 on an actor that asks for one CPU (ray/_private/utils.py,
set_omp_num_threads_if_unset, Ray 2.60.0), and the vLLM child would inherit it; the chart's
GENNSTACK_OMP_NUM_THREADS (the worker pod's CPUs: one vLLM per pod) replaces it.

    env (set on the Ray pods): VLLM_ARGS (JSON list of arguments), GENNSTACK_VLLM_PORT (default
    8001; not VLLM_PORT, which vLLM reads as the base of its own internal ports, vllm/envs.py),
    GENNSTACK_OMP_NUM_THREADS; PYTHONPATH holds /scripts, where the chart mounts this file and
    vllm_serve.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence

from vllm_serve import command, environment  # the chart's launcher, beside this file in /scripts

# Seconds vLLM gets to exit after SIGTERM before its process group is killed. The Neuron DLC's
# vLLM 0.13.0 aborts in-flight requests on SIGTERM (it has no --shutdown-timeout), so exiting
# takes seconds; Ray Serve has already drained the replica's requests before it calls __del__.
STOP_TIMEOUT_S = 10.0

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes.
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "host", "content-length"}


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP}


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """vLLM's environment under Ray: the launcher's, with the chart's thread count for OpenMP."""
    env = environment(environ)
    env["OMP_NUM_THREADS"] = environ["GENNSTACK_OMP_NUM_THREADS"]
    return env


class ServerProcess:
    """A server started as the leader of a new process group (session), stopped as a group."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.process = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)

    def exited(self) -> int | None:
        return self.process.poll()

    def wait_healthy(self, url: str, interval: float = 5.0) -> None:
        """Return once ``url`` answers 200; raise if the server exits first (loading takes minutes)."""
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode} while loading")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(interval)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to the whole group; SIGKILL to whatever of it is left after ``timeout`` seconds."""
        group = self.process.pid  # the leader's pid is the group's id (start_new_session)
        self._signal(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._alive(group):
            time.sleep(0.1)
        self._signal(group, signal.SIGKILL)
        self.process.wait()

    def _alive(self, group: int) -> bool:
        self.process.poll()  # reap the leader, so a dead leader does not count
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True

    @staticmethod
    def _signal(group: int, sig: signal.Signals) -> None:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass


def _deployment():
    import aiohttp
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse

    @serve.deployment(name="vllm")
    class VLLMServer:
        def __init__(self) -> None:
            port = os.environ.get("GENNSTACK_VLLM_PORT", "8001")
            self.base = f"http://127.0.0.1:{port}"
            self.session: aiohttp.ClientSession | None = None
            self.server = ServerProcess(command("127.0.0.1", port, os.environ), server_environment(os.environ))
            try:  # the replica is not ready until vLLM is
                self.server.wait_healthy(self.base + "/health")
            except BaseException:
                self.server.stop()
                raise

        async def check_health(self) -> None:
            if (code := self.server.exited()) is not None:
                raise RuntimeError(f"vLLM exited with {code}")
            session = await self._session()
            async with session.get(self.base + "/health", timeout=aiohttp.ClientTimeout(total=10)) as response:
                if response.status != 200:
                    raise RuntimeError(f"vLLM /health answered {response.status}")

        async def _session(self) -> aiohttp.ClientSession:
            if self.session is None:
                self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
            return self.session

        async def __call__(self, request: Request) -> Response:
            session = await self._session()
            upstream = await session.request(
                request.method, self.base + request.url.path, params=list(request.query_params.multi_items()),
                headers=forwarded_headers(dict(request.headers)), data=await request.body(),
            )
            headers = forwarded_headers(dict(upstream.headers))

            async def body() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream.content.iter_any():
                        yield chunk
                finally:
                    upstream.release()

            return StreamingResponse(body(), status_code=upstream.status, headers=headers)

        def __del__(self) -> None:
            # Ray Serve calls this after draining the replica (graceful_shutdown_wait_loop_s /
            # graceful_shutdown_timeout_s in the Serve config); stop vLLM's whole process group.
            server = getattr(self, "server", None)
            if server is not None:
                server.stop()

    return VLLMServer


def __getattr__(name: str):
    # `import_path: gennstack_serve:app` in the Serve config; built on first access so that this
    # module imports (and its helpers test) without Ray installed.
    if name == "app":
        return _deployment().bind()
    raise AttributeError(name)
