#!/usr/bin/env python3
"""Benchmark of the spot interruption handler's own latency (not a test): from a spot interruption
warning handed to ``lambda_handler`` to the ``PATCH .../deployments/<name>/scale`` arriving at the
Kubernetes API, cold and warm, offline.

What runs where
    * The Kubernetes API is ``tests/lambdas/fake_kubernetes.py`` (HTTPS on 127.0.0.1, certificate
      from ``tests/lambdas/lambda_support.make_certificate``, every bearer token's SigV4 signature
      verified). It runs in this process and stamps each request when its request line and headers
      have been read (before the body), with ``time.time_ns()`` and ``time.perf_counter_ns()``.
    * EC2 and DynamoDB are moto (``mock_aws``) **in the handler's process**: no network round trip to
      AWS is included. The time moto spends answering (its ``before-send`` hook, which stands in for
      the HTTP round trip and the service) is measured and reported, and subtracted in the
      "without moto" rows; nothing is estimated in its place. The real figures come from the
      function's ``HandlerLatency`` / ``PrewarmLatency`` metrics (and the Lambda ``Init Duration``).

Scenarios (all with a real-shaped ``EC2 Spot Instance Interruption Warning`` from
``tests/lambdas/events``, for a moto instance tagged like a Karpenter spot node of ``gen1-inf2-spot``)
    * cold: one fresh ``python`` subprocess per sample. It imports ``interruption_handler.handler``
      exactly as Lambda does (``lambdas/`` on ``sys.path``) from a copy of the package without
      ``__pycache__`` and with bytecode writing off (the CDK asset excludes ``__pycache__`` and
      ``/var/task`` is read-only), timing the import; then, untimed, starts moto, creates the table and
      the instance; then hands the event to ``lambda_handler``. The first invocation builds the
      settings, the boto3 session and its clients. Clock: ``time.time_ns()`` (CLOCK_REALTIME, one
      system-wide clock) because the server is in another process. "import + event" adds the timed
      import to event -> PATCH: what a Lambda cold start adds on top of the runtime's own init
      (interpreter start-up is not counted).
    * warm: in this process, after one discarded first invocation, ``--warm`` events for distinct
      instances. Between samples (untimed) the previous record is deleted and the Deployment is set
      back to 0 replicas, so every sample does the same work: DescribeInstances, a conditional PutItem
      that succeeds, a Scan, GET scale, PATCH scale. Clock: ``time.perf_counter_ns()`` (same process).
    * duplicate: in this process, an event is delivered (untimed) and then delivered again (timed):
      the conditional write fails, an UpdateItem adds the signal, the GET finds the count right and
      no PATCH is sent (checked). Measured to ``lambda_handler`` returning.

On this 2-core machine the server thread and the handler are pinned apart where possible (this
process on the last core, cold children on core 0). Lambda gives a function CPU in proportion to its
memory (one vCPU at 1,769 MB; this function has 256 MB), so CPU-bound parts run slower there.

    .venv/bin/python benchmarks/bench_interruption_handler.py            # ~1 minute
    .venv/bin/python benchmarks/bench_interruption_handler.py --cold 30 --warm 200 --duplicate 100

Writes ``benchmarks/results/interruption_handler.json`` and prints a markdown table.
"""

# Only modules the handler imports anyway are imported at the top: a cold child runs this file, and
# anything imported before its timed import would make that import look cheaper than it is.
from __future__ import annotations

import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET_S = 120  # the spot interruption warning's two minutes
NAMESPACE = "gennstack-serving"
DEPLOYMENT = "inf2-warm-spare"
POOL = "gen1-inf2-spot"
TABLE = "interruptions"


class _Context:
    """The Lambda context attributes Powertools reads (as ``tests/lambdas/lambda_support.LambdaContext``)."""

    function_name = "GenNStack-InterruptionHandler"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:GenNStack-InterruptionHandler"
    aws_request_id = "52fdfc07-2182-154f-163f-5f0f9a621d72"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000


class _MotoClock:
    """Time spent inside moto's ``before-send`` hook: what replaces the AWS round trip offline."""

    def __init__(self) -> None:
        self.ns = 0
        self.calls = 0

    def reset(self) -> None:
        self.ns = 0
        self.calls = 0


def _install_moto_clock() -> _MotoClock:
    from moto.core.botocore_stubber import BotocoreStubber

    clock = _MotoClock()
    original = BotocoreStubber.__call__

    def timed(self, event_name, request, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter_ns()
        try:
            return original(self, event_name, request, **kwargs)
        finally:
            clock.ns += time.perf_counter_ns() - started
            clock.calls += 1

    BotocoreStubber.__call__ = timed  # type: ignore[method-assign]
    return clock


def _aws_fixtures(count: int, region: str) -> list[str]:
    """The DynamoDB table and ``count`` instances shaped like Karpenter spot nodes (as conftest's ``launch``)."""
    import boto3

    boto3.client("dynamodb", region_name=region).create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    cluster = os.environ["CLUSTER_NAME"]
    tags = [
        {"Key": "karpenter.sh/nodepool", "Value": POOL},
        {"Key": "eks:eks-cluster-name", "Value": cluster},
        {"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned"},
    ]
    reservation = boto3.client("ec2", region_name=region).run_instances(
        ImageId="ami-12c6146b",  # one of moto's built-in AMIs
        MinCount=count,
        MaxCount=count,
        InstanceType="inf2.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        InstanceMarketOptions={"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}},
    )
    return [instance["InstanceId"] for instance in reservation["Instances"]]


def _with_instance(event: dict, instance_id: str, n: int) -> dict:
    event = json.loads(json.dumps(event))
    event["id"] = f"{n:08x}-1234-1234-1234-123456789012"
    event["detail"]["instance-id"] = instance_id
    event["resources"] = [f"arn:aws:ec2:{event['region']}:123456789012:instance/{instance_id}"]
    return event


# --- cold: one sample per fresh process ----------------------------------------------------------


def cold_child(config_path: str, result_path: str) -> None:
    with open(config_path) as handle:
        config = json.load(handle)
    if config["core"] is not None:
        os.sched_setaffinity(0, {config["core"]})
    sys.dont_write_bytecode = True  # like /var/task: the handler's modules compile from source
    sys.path.insert(0, config["asset_dir"])
    before = set(sys.modules)

    started = time.perf_counter_ns()
    from interruption_handler import handler as module  # what Lambda's init does

    import_ns = time.perf_counter_ns() - started
    imported = set(sys.modules) - before

    # Untimed set-up. moto is imported after the handler, so the handler's import paid for boto3 and
    # botocore itself; moto's own set-up uses boto3's default session, not the handler's (created on
    # the first invocation, with its own loader and clients).
    moto_clock = _install_moto_clock()
    from moto import mock_aws

    mock = mock_aws()
    mock.start()
    [instance_id] = _aws_fixtures(1, os.environ["AWS_REGION"])
    event = _with_instance(config["event"], instance_id, config["sample"])
    preloaded = sorted(set(sys.modules) - before - imported)
    handler_packages = {name.split(".")[0] for name in imported}
    # Time the first invocation's settings + boto3 session and clients (``runtime()``, cached after).
    build = module.runtime
    runtime_ns = []

    def timed_runtime():  # type: ignore[no-untyped-def]
        started = time.perf_counter_ns()
        try:
            return build()
        finally:
            runtime_ns.append(time.perf_counter_ns() - started)

    module.runtime = timed_runtime
    context = _Context()
    moto_clock.reset()

    event_wall_ns = time.time_ns()
    started = time.perf_counter_ns()
    result = module.lambda_handler(event, context)
    handler_ns = time.perf_counter_ns() - started
    mock.stop()
    with open(result_path, "w") as handle:
        json.dump(
            {
                "import_ns": import_ns,
                "modules_imported_by_handler": len(imported),
                "modules_preloaded_by_setup": len(preloaded),
                "preloaded_in_handler_packages": [name for name in preloaded if name.split(".")[0] in handler_packages],
                "runtime_ns": runtime_ns[0],
                "event_wall_ns": event_wall_ns,
                "handler_ns": handler_ns,
                "moto_ns": moto_clock.ns,
                "moto_calls": moto_clock.calls,
                "outcome": [r["outcome"] for r in result.get("results", [])],
            },
            handle,
        )


# --- the parent ------------------------------------------------------------------------------------


def _percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p90 (a value that was measured), plus min, mean and max; milliseconds."""
    import math

    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    return {
        "n": len(ordered),
        "min": round(ordered[0], 3),
        "p50": round(rank(50), 3),
        "p90": round(rank(90), 3),
        "max": round(ordered[-1], 3),
        "mean": round(sum(ordered) / len(ordered), 3),
    }


def _machine() -> dict:
    import platform
    from importlib import metadata

    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {
            name: metadata.version(name) for name in ("boto3", "botocore", "aws-lambda-powertools", "pydantic", "moto")
        },
        "lambda_runtime_note": "the function runs Python 3.14 on x86_64 with 256 MB; this benchmark runs the local interpreter",
    }


def main() -> int:
    import argparse
    import contextlib
    import datetime as dt
    import shutil
    import socket
    import subprocess
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", type=int, default=30, help="cold samples (one process each)")
    parser.add_argument("--warm", type=int, default=200, help="warm samples")
    parser.add_argument("--duplicate", type=int, default=100, help="duplicate-delivery samples")
    parser.add_argument(
        "--no-nodelay", action="store_true", help="leave Nagle on in the fake API server (shows its ~40 ms artefact)"
    )
    parser.add_argument("--json", default=os.path.join(REPO_ROOT, "benchmarks", "results", "interruption_handler.json"))
    args = parser.parse_args()

    sys.path.insert(0, REPO_ROOT)
    from tests.lambdas.fake_kubernetes import Deployment, FakeKubernetes
    from tests.lambdas.lambda_support import CLUSTER, REGION, WARM_SPARES, load_event, make_certificate

    nodelay = not args.no_nodelay
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pinned = len(cores) >= 2
    if pinned:
        os.sched_setaffinity(0, {cores[-1]})  # the fake API server and the warm loop
    child_core = cores[0] if pinned else None

    class StampedKubernetes(FakeKubernetes):
        """The fake API server, stamping each request as its headers arrive."""

        arrivals: list[tuple[str, str, int, int]]

        def _serve(self, h):  # type: ignore[no-untyped-def]
            self.arrivals.append((h.command, h.path, time.time_ns(), time.perf_counter_ns()))
            if nodelay:
                # fake_kubernetes writes a response's headers and body in two writes; without
                # TCP_NODELAY, Nagle holds the body until the client's delayed ACK (~40 ms on
                # Linux). Go's net/http, and so the Kubernetes API server, sets TCP_NODELAY.
                h.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            super()._serve(h)

    work = tempfile.mkdtemp(prefix="bench-interruption-")
    tls = make_certificate(Path(work), "kubernetes")
    asset_dir = os.path.join(work, "asset")
    shutil.copytree(
        os.path.join(REPO_ROOT, "lambdas", "interruption_handler"),
        os.path.join(asset_dir, "interruption_handler"),
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "README.md"),
    )

    for key in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
    ):
        os.environ.pop(key, None)
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "POWERTOOLS_SERVICE_NAME": "interruption-handler",
            "POWERTOOLS_METRICS_NAMESPACE": "GenNStackBench",
            "LOG_LEVEL": "INFO",
        }
    )
    moto_clock = _install_moto_clock()
    from moto import mock_aws

    # moto swaps in its own fake credentials while it is active (here and in each child): the server
    # checks signatures against whatever this process's environment holds, as conftest's server does.
    mock = mock_aws()
    mock.start()
    fake = StampedKubernetes(
        cluster_name=CLUSTER,
        secret_key=lambda: os.environ["AWS_SECRET_ACCESS_KEY"],
        certfile=tls.certfile,
        keyfile=tls.keyfile,
    )
    fake.arrivals = []
    fake.deployments[(NAMESPACE, DEPLOYMENT)] = Deployment(replicas=0)
    fake.deployments[(NAMESPACE, "g6e-warm-spare")] = Deployment(replicas=1)
    endpoint = fake.start()
    os.environ.update(
        {
            "CLUSTER_NAME": CLUSTER,
            "CLUSTER_ENDPOINT": endpoint,
            "CLUSTER_CA": tls.ca_b64,
            "TABLE_NAME": TABLE,
            "WARM_SPARES": json.dumps(WARM_SPARES),
            "RECORD_TTL_SECONDS": "1800",
            "REPLACEMENT_GRACE_SECONDS": "600",
            "KUBE_TIMEOUT_SECONDS": "5",
        }
    )
    base_event = load_event("spot_interruption_warning")
    patch_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}/scale"

    def reset_deployment() -> None:
        deployment = fake.deployments[(NAMESPACE, DEPLOYMENT)]
        deployment.replicas = 0
        deployment.resource_version += 1
        fake.arrivals.clear()
        fake.requests.clear()

    def arrivals(method: str) -> list[tuple[str, str, int, int]]:
        return [a for a in fake.arrivals if a[0] == method]

    load_before = os.getloadavg()
    started_all = time.monotonic()
    raw: dict[str, dict[str, list[float]]] = {"cold": {}, "warm": {}, "duplicate": {}}

    def add(scenario: str, name: str, value_ns: float) -> None:
        raw[scenario].setdefault(name, []).append(value_ns / 1e6)

    # --- cold ---------------------------------------------------------------------------------
    cold_meta: dict[str, list] = {
        "modules_imported_by_handler": [],
        "modules_preloaded_by_setup": [],
        "preloaded_in_handler_packages": [],
        "moto_calls": [],
    }
    for n in range(args.cold):
        reset_deployment()
        config_path, result_path = os.path.join(work, "cold.json"), os.path.join(work, "cold-result.json")
        with open(config_path, "w") as handle:
            json.dump({"core": child_core, "asset_dir": asset_dir, "event": base_event, "sample": n}, handle)
        if os.path.exists(result_path):
            os.remove(result_path)
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--cold-child", config_path, result_path],
            cwd=work,
            env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
            stdout=subprocess.DEVNULL,  # the handler's logs and EMF metrics (Lambda sends them to CloudWatch)
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
        if child.returncode != 0:
            raise SystemExit(f"cold sample {n} failed:\n{child.stderr}")
        with open(result_path) as handle:
            result = json.load(handle)
        gets, patches = arrivals("GET"), arrivals("PATCH")
        statuses = [seen.status for seen in fake.requests]
        if (
            result["outcome"] != ["recorded"]
            or len(patches) != 1
            or patches[0][1] != patch_path
            or statuses != [200, 200]
        ):
            raise SystemExit(
                f"cold sample {n}: unexpected outcome {result['outcome']}, requests {fake.arrivals}, statuses {statuses}"
            )
        event_ns = result["event_wall_ns"]
        add("cold", "import", result["import_ns"])
        add("cold", "event_to_get", gets[0][2] - event_ns)
        add("cold", "event_to_patch", patches[0][2] - event_ns)
        add("cold", "import_plus_event_to_patch", result["import_ns"] + patches[0][2] - event_ns)
        add("cold", "event_to_patch_without_moto", patches[0][2] - event_ns - result["moto_ns"])
        add("cold", "event_to_return", result["handler_ns"])
        add("cold", "moto", result["moto_ns"])
        add("cold", "runtime_build", result["runtime_ns"])
        for key in cold_meta:
            cold_meta[key].append(result[key])
    cold_s = time.monotonic() - started_all

    # --- warm and duplicate, in this process ----------------------------------------------------
    sys.path.insert(0, os.path.join(REPO_ROOT, "lambdas"))  # as Lambda: interruption_handler.handler
    from interruption_handler import handler as module

    instance_ids = _aws_fixtures(1 + args.warm + 2 * args.duplicate, REGION)
    import boto3

    table = boto3.resource("dynamodb", region_name=REGION).Table(TABLE)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - the handler's logs and metrics, for the whole run
    module.logger.registered_handler.stream = devnull
    context = _Context()
    ids = iter(instance_ids)
    counter = iter(range(1_000_000))

    def deliver(event: dict) -> tuple[dict, int, int]:
        moto_clock.reset()
        started = time.perf_counter_ns()
        result = module.lambda_handler(event, context)
        return result, started, time.perf_counter_ns()

    started_warm = time.monotonic()
    with contextlib.redirect_stdout(devnull):
        module.runtime.cache_clear()
        first = _with_instance(base_event, next(ids), next(counter))
        reset_deployment()
        deliver(first)  # the first invocation in this process: builds the clients; not a warm sample
        previous = first["detail"]["instance-id"]
        for n in range(args.warm):
            table.delete_item(Key={"pk": f"instance#{previous}"})
            reset_deployment()
            event = _with_instance(base_event, next(ids), next(counter))
            result, started, returned = deliver(event)
            gets, patches = arrivals("GET"), arrivals("PATCH")
            if [r["outcome"] for r in result["results"]] != ["recorded"] or len(patches) != 1 or len(gets) != 1:
                raise SystemExit(f"warm sample {n}: unexpected {result}, requests {fake.arrivals}")
            add("warm", "event_to_get", gets[0][3] - started)
            add("warm", "event_to_patch", patches[0][3] - started)
            add("warm", "event_to_patch_without_moto", patches[0][3] - started - moto_clock.ns)
            add("warm", "event_to_return", returned - started)
            add("warm", "moto", moto_clock.ns)
            previous = event["detail"]["instance-id"]

        for n in range(args.duplicate):
            table.delete_item(Key={"pk": f"instance#{previous}"})
            reset_deployment()
            event = _with_instance(base_event, next(ids), next(counter))
            deliver(event)  # the first delivery, untimed
            fake.arrivals.clear()
            result, started, returned = deliver(event)
            if (
                [r["outcome"] for r in result["results"]] != ["duplicate"]
                or arrivals("PATCH")
                or len(arrivals("GET")) != 1
            ):
                raise SystemExit(f"duplicate sample {n}: unexpected {result}, requests {fake.arrivals}")
            add("duplicate", "event_to_return", returned - started)
            add("duplicate", "event_to_return_without_moto", returned - started - moto_clock.ns)
            add("duplicate", "moto", moto_clock.ns)
            previous = event["detail"]["instance-id"]
    warm_s = time.monotonic() - started_warm
    fake.stop()
    mock.stop()
    shutil.rmtree(work, ignore_errors=True)

    summary = {
        scenario: {name: _percentiles(values) for name, values in rows.items()} for scenario, rows in raw.items()
    }
    report = {
        "benchmark": "benchmarks/bench_interruption_handler.py",
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "budget_s": BUDGET_S,
        "machine": dict(
            _machine(),
            pinned=pinned,
            server_core=cores[-1] if pinned else None,
            cold_child_core=child_core,
            loadavg_1_5_15_before=[round(x, 2) for x in load_before],
            loadavg_1_5_15_after=[round(x, 2) for x in os.getloadavg()],
        ),
        "method": {
            "event": "EC2 Spot Instance Interruption Warning (tests/lambdas/events), a moto spot instance tagged karpenter.sh/nodepool=gen1-inf2-spot",
            "end_point": "the PATCH of deployments/inf2-warm-spare/scale arriving at the fake Kubernetes API (request line and headers read, body not yet)",
            "clocks": {
                "cold": "time.time_ns() in the child (event handed over) and in the server's process (PATCH arrival); import timed with perf_counter_ns in the child",
                "warm": "time.perf_counter_ns() in one process (handler and server thread)",
                "duplicate": "time.perf_counter_ns(), event handed over to lambda_handler returning (no PATCH is sent)",
            },
            "aws": (
                "EC2 and DynamoDB are moto in the handler's process: no AWS network round trip is included. "
                "'moto' is the time inside moto's before-send hook (the stand-in for round trip + service); "
                "'*_without_moto' subtracts it per sample. Nothing is estimated in its place: the real figures are the "
                "function's HandlerLatency and PrewarmLatency metrics and Lambda's Init Duration."
            ),
            "kubernetes": "a local HTTPS server (fake_kubernetes.py) on 127.0.0.1: a fresh TLS connection and EKS token per request, as in the handler; no real API server, no network",
            "tcp_nodelay": (
                f"{'set' if nodelay else 'NOT set'} on the fake server's connections. fake_kubernetes.py writes headers and body "
                "separately; without TCP_NODELAY each response waits ~40 ms for the client's delayed ACK (Nagle), an artefact of "
                "the fake (Go's net/http, and so the API server, sets TCP_NODELAY). --no-nodelay shows it."
            ),
            "cold_import": (
                "interruption_handler.handler imported from a copy of the package without __pycache__, bytecode writing off "
                "(the asset excludes __pycache__); dependencies from the venv with their .pyc. Interpreter start-up not counted."
            ),
            "percentiles": "nearest rank over the samples; milliseconds",
            "cpu_note": "Lambda allocates CPU in proportion to memory (one vCPU at 1,769 MB); the function has 256 MB, so CPU-bound work runs slower there than here",
        },
        "samples": {"cold": args.cold, "warm": args.warm, "duplicate": args.duplicate},
        "cold_process_details": {
            "modules_imported_by_handler_import": cold_meta["modules_imported_by_handler"][0] if args.cold else None,
            "modules_preloaded_by_untimed_setup": sorted(set(cold_meta["modules_preloaded_by_setup"])),
            "preloaded_modules_in_the_handlers_packages": sorted(
                {m for ms in cold_meta["preloaded_in_handler_packages"] for m in ms}
            ),
            "preload_note": (
                "moto's set-up runs after the timed import and before the event; these are the modules it loaded that "
                "belong to packages the handler imports (the handler would otherwise load any it needs itself). "
                "moto is imported after the handler, so boto3/botocore/pydantic/Powertools are paid by the import."
            ),
            "aws_calls_per_event": sorted(set(cold_meta["moto_calls"])),
        },
        "results_ms": summary,
        "samples_ms": {
            scenario: {name: [round(v, 3) for v in values] for name, values in rows.items()}
            for scenario, rows in raw.items()
        },
        "wall_s": {"cold": round(cold_s, 1), "warm_and_duplicate": round(warm_s, 1)},
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    print(_markdown(report))
    print(f"\nwritten to {os.path.relpath(args.json, REPO_ROOT)}")
    return 0


ROWS = [
    ("cold", "import", "cold: import `interruption_handler.handler`"),
    ("cold", "event_to_patch", "cold: event -> PATCH (first invocation, clients built)"),
    ("cold", "import_plus_event_to_patch", "cold: import + event -> PATCH"),
    ("cold", "runtime_build", "cold: of which settings + boto3 session and clients (`runtime()`)"),
    ("cold", "event_to_patch_without_moto", "cold: event -> PATCH, moto time subtracted"),
    ("cold", "moto", "cold: of which moto (EC2/DynamoDB stand-in)"),
    ("warm", "event_to_patch", "warm: event -> PATCH"),
    ("warm", "event_to_patch_without_moto", "warm: event -> PATCH, moto time subtracted"),
    ("warm", "moto", "warm: of which moto (EC2/DynamoDB stand-in)"),
    ("warm", "event_to_return", "warm: event -> handler returns"),
    ("duplicate", "event_to_return", "duplicate delivery: event -> returns (no PATCH)"),
    ("duplicate", "event_to_return_without_moto", "duplicate: moto time subtracted"),
]


def _markdown(report: dict) -> str:
    machine = report["machine"]
    lines = [
        f"Spot interruption handler, offline: {machine['cpus']} cores ({machine['cpu_model']}), "
        f"Python {machine['python']}, samples cold {report['samples']['cold']} / warm {report['samples']['warm']} / "
        f"duplicate {report['samples']['duplicate']}. AWS calls are moto in-process (no AWS round trip).",
        "",
        "| measurement | n | p50 ms | p90 ms | max ms | max / 2-min budget |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for scenario, name, label in ROWS:
        stats = report["results_ms"][scenario].get(name)
        if not stats:
            continue
        share = stats["max"] / (report["budget_s"] * 1000) * 100
        lines.append(
            f"| {label} | {stats['n']} | {stats['p50']:.1f} | {stats['p90']:.1f} | {stats['max']:.1f} | {share:.2f} % |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--cold-child":
        cold_child(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
