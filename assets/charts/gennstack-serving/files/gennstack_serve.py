"""Ray Serve application of gen1-inf2: each Serve replica runs vLLM's own OpenAI-compatible
server (`vllm.entrypoints.openai.api_server`, NxD Inference on Neuron) on its inf2 node and
forwards requests to it, streaming responses back.

Ray Serve does what it is good at (routing across replicas, autoscaling them on in-flight
requests, replacing unhealthy ones); vLLM serves the OpenAI API exactly as it does on trn2 and
g6e, so all three generations answer the same routes (/v1/chat/completions, /v1/completions,
/v1/models, /health). A replica becomes ready only once vLLM answers /health, i.e. after the
compiled model is loaded onto the NeuronCores.

    env (set on the Ray pods): VLLM_ARGS (JSON list of arguments), VLLM_PORT (default 8001);
    PYTHONPATH holds /scripts, where the chart mounts this file and vllm_serve.py.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Mapping

from vllm_serve import command  # the chart's launcher, beside this file in /scripts

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes.
_DROP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
         "transfer-encoding", "upgrade", "host", "content-length"}


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP}


def _deployment():
    import aiohttp
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse

    @serve.deployment(name="vllm")
    class VLLMServer:
        def __init__(self) -> None:
            self.base = f"http://127.0.0.1:{os.environ.get('VLLM_PORT', '8001')}"
            self.process = subprocess.Popen(command("127.0.0.1", os.environ.get("VLLM_PORT", "8001"), os.environ))
            while True:  # loading takes minutes; the replica is not ready until vLLM is
                if self.process.poll() is not None:
                    raise RuntimeError(f"vLLM exited with {self.process.returncode} while loading")
                try:
                    with urllib.request.urlopen(self.base + "/health", timeout=5) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(5)
            self.session: aiohttp.ClientSession | None = None

        async def check_health(self) -> None:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode}")
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
            if self.process.poll() is None:
                self.process.terminate()

    return VLLMServer


def __getattr__(name: str):
    # `import_path: gennstack_serve:app` in the Serve config; built on first access so that this
    # module imports (and its helpers test) without Ray installed.
    if name == "app":
        return _deployment().bind()
    raise AttributeError(name)
