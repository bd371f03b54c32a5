#!/usr/bin/env python3
"""Benchmark of drain routing's handler latency (not a test): from a spot interruption warning handed
to ``lambda_handler`` (warm) to the last pod ``PATCH`` (``gennstack.io/routable: "false"``) arriving at
the Kubernetes API, offline.

What runs where: the Kubernetes API is ``tests/lambdas/fake_kubernetes.py`` (HTTPS on 127.0.0.1, every
token's SigV4 signature verified) in this process, stamping each request as its headers arrive with
``time.perf_counter_ns()``; EC2 and DynamoDB are moto in this process (their time is included, no
network round trip to AWS is). The work per sample: DescribeInstances, a conditional PutItem that
succeeds, the node list, the pod list (the generation's serving pods on every node: ``--pods`` on the
doomed node and one Ready on another, so the last-replica guard lets the drain happen), one PATCH per
serving pod on the doomed node, then the warm spare's scan, GET and PATCH (after the drain, so not in
the measured span). Between samples (untimed) the record is deleted, the pods relabelled ``"true"``
and the warm spare set back.

It excludes EventBridge delivery, Lambda's runtime, VPC networking and real round trips to EC2,
DynamoDB and the EKS API server; Lambda at 256 MB has less CPU than this machine. The real figure is
the function's ``DrainLatency`` metric.

    .venv/bin/python benchmarks/bench_drain_routing.py                # ~30 s
    .venv/bin/python benchmarks/bench_drain_routing.py --samples 300 --pods 4

Writes ``benchmarks/results/drain_routing.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

NAMESPACE = "gennstack-serving"
POOL = "gen3-g6e-spot"
SELECTOR = "app.kubernetes.io/name=gen3-g6e,app.kubernetes.io/component=server"
ROUTABLE = "gennstack.io/routable"


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def rank(p: float) -> float:  # nearest rank
        return ordered[max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))]

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": ordered[-1], "min": ordered[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--pods", type=int, default=2, help="serving pods on the doomed node (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "drain_routing.json")
    args = parser.parse_args(argv)

    import boto3
    from moto import mock_aws

    from tests.lambdas.fake_kubernetes import Deployment, FakeKubernetes
    from tests.lambdas.lambda_support import ACCESS_KEY, AMI, CLUSTER, REGION, SECRET_KEY, WARM_SPARES, LambdaContext, load_event, make_certificate

    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
        "POWERTOOLS_SERVICE_NAME": "interruption-handler", "POWERTOOLS_METRICS_NAMESPACE": "Bench", "LOG_LEVEL": "ERROR",
    }
    os.environ.update(env)
    tls = make_certificate(Path(tempfile.mkdtemp()), "kubernetes")

    class Stamped(FakeKubernetes):
        def _serve(self, h):  # type: ignore[no-untyped-def]
            self.arrivals.append((h.command, h.path, time.perf_counter_ns()))
            super()._serve(h)

    fake = Stamped(cluster_name=CLUSTER, secret_key=lambda: os.environ["AWS_SECRET_ACCESS_KEY"], certfile=tls.certfile, keyfile=tls.keyfile)
    fake.arrivals = []
    fake.deployments[(NAMESPACE, "g6e-warm-spare")] = Deployment(replicas=1)
    fake.deployments[(NAMESPACE, "inf2-warm-spare")] = Deployment(replicas=0)
    endpoint = fake.start()
    os.environ.update({
        "CLUSTER_NAME": CLUSTER, "CLUSTER_ENDPOINT": endpoint, "CLUSTER_CA": tls.ca_b64, "TABLE_NAME": "interruptions",
        "WARM_SPARES": json.dumps(WARM_SPARES), "KUBE_TIMEOUT_SECONDS": "5",
        "DRAIN_ON": json.dumps({POOL: {"signals": ["spot_interruption_warning"], "pods": SELECTOR}}),
    })
    spans_ms: list[float] = []
    try:
        with mock_aws():
            boto3.client("dynamodb", region_name=REGION).create_table(
                TableName="interruptions", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST")
            instance_id = boto3.client("ec2", region_name=REGION).run_instances(
                ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="g6e.12xlarge",
                InstanceMarketOptions={"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}},
                TagSpecifications=[{"ResourceType": "instance", "Tags": [
                    {"Key": "karpenter.sh/nodepool", "Value": POOL}, {"Key": "eks:eks-cluster-name", "Value": CLUSTER}]}],
            )["Instances"][0]["InstanceId"]
            fake.add_node("ip-10-0-1-1.ec2.internal", pool=POOL, instance_id=instance_id)
            fake.add_node("ip-10-0-2-2.ec2.internal", pool=POOL, instance_id="i-0bbbbbbbbbbbbbbbb")
            labels = {"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "server"}
            for n in range(args.pods):
                fake.add_pod(NAMESPACE, f"gen3-g6e-{n}", node="ip-10-0-1-1.ec2.internal", labels={**labels, ROUTABLE: "true"})
            fake.add_pod(NAMESPACE, "gen3-g6e-other", node="ip-10-0-2-2.ec2.internal", labels={**labels, ROUTABLE: "true"})
            table = boto3.resource("dynamodb", region_name=REGION).Table("interruptions")

            from lambdas.interruption_handler import handler as module

            event = load_event("spot_interruption_warning", instance_id=instance_id)

            def reset() -> None:
                table.delete_item(Key={"pk": f"instance#{instance_id}"})
                for (_, _), pod in fake.pods.items():
                    pod["metadata"]["labels"][ROUTABLE] = "true"
                fake.deployments[(NAMESPACE, "g6e-warm-spare")].replicas = 1
                fake.arrivals.clear()

            sink = io.StringIO()  # the EMF metrics the handler prints
            with contextlib.redirect_stdout(sink):
                module.lambda_handler(event, LambdaContext())  # the first (cold) invocation is not counted
            for _ in range(args.samples):
                reset()
                started = time.perf_counter_ns()
                with contextlib.redirect_stdout(sink):
                    result = module.lambda_handler(event, LambdaContext())
                sink.seek(0)
                sink.truncate()
                pod_patches = [t for method, path, t in fake.arrivals if method == "PATCH" and "/pods/" in path]
                assert len(pod_patches) == args.pods and result["results"][0]["drained_pods"], result
                assert not result["results"][0]["kept_pods"], result
                spans_ms.append((max(pod_patches) - started) / 1e6)
    finally:
        fake.stop()
    report = {
        "what": "warm lambda_handler: spot warning handed over -> last pod PATCH (routable=false) arriving at the fake API",
        "samples": args.samples,
        "pods_on_node": args.pods,
        "event_to_last_pod_patch_ms": {k: round(v, 2) for k, v in _percentiles(spans_ms).items()},
        "includes": "moto EC2 and DynamoDB in process; the node list, the pod list and the pod PATCHes over local HTTPS",
        "excludes": "EventBridge delivery, Lambda runtime and cold start, VPC networking, real AWS and EKS round trips",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "raw_ms": [round(v, 3) for v in spans_ms],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    p = report["event_to_last_pod_patch_ms"]
    print("| pods on node | samples | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|")
    print(f"| {args.pods} | {args.samples} | {p['p50']} | {p['p90']} | {p['p99']} | {p['max']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
