"""Fixtures for the interruption handler's offline tests: AWS via moto, Kubernetes via a local HTTPS server."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from lambdas.interruption_handler.kube import KubeClient
from lambdas.interruption_handler.settings import Settings
from tests.lambdas.fake_kubernetes import Deployment, FakeKubernetes
from tests.lambdas.lambda_support import (
    ACCESS_KEY,
    ACCOUNT,
    AMI,
    CLUSTER,
    NAMESPACE,
    REGION,
    SECRET_KEY,
    WARM_SPARES,
    Clock,
    CurrentStdout,
    LambdaContext,
    Tls,
    make_certificate,
)


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """The fake API server's self-signed certificate (its own CA, like EKS's cluster CA)."""
    return make_certificate(tmp_path_factory.mktemp("tls"), "kubernetes")


@pytest.fixture(scope="session")
def other_tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A certificate from another CA: trusting it must not let the client talk to the server."""
    return make_certificate(tmp_path_factory.mktemp("tls-other"), "impostor")


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and region, so nothing can reach a real account."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "interruption-handler")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "GenNStackTest")


@pytest.fixture
def kubernetes(tls: Tls) -> Iterator[FakeKubernetes]:
    fake = FakeKubernetes(
        cluster_name=CLUSTER,
        secret_key=lambda: os.environ["AWS_SECRET_ACCESS_KEY"],
        certfile=tls.certfile,
        keyfile=tls.keyfile,
    )
    fake.deployments[(NAMESPACE, "inf2-warm-spare")] = Deployment(replicas=0)
    fake.deployments[(NAMESPACE, "g6e-warm-spare")] = Deployment(replicas=1)
    fake.endpoint = fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def env(kubernetes: FakeKubernetes, tls: Tls, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The function's environment, as the CDK construct sets it, pointing at the fake API server."""
    values = {
        "CLUSTER_NAME": CLUSTER,
        "CLUSTER_ENDPOINT": kubernetes.endpoint,
        "CLUSTER_CA": tls.ca_b64,
        "TABLE_NAME": "interruptions",
        "ACCOUNT_ID": ACCOUNT,
        "WARM_SPARES": json.dumps(WARM_SPARES),
        "RECORD_TTL_SECONDS": "1800",
        "REPLACEMENT_GRACE_SECONDS": "600",
        "KUBE_TIMEOUT_SECONDS": "1.0",  # generous for a loaded 2-core machine; the hang tests hang longer
        "LOG_LEVEL": "INFO",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


@pytest.fixture
def settings(env: dict[str, str]) -> Settings:
    return Settings.from_env(os.environ)


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        boto3.client("dynamodb", region_name=REGION).create_table(
            TableName="interruptions",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield


@pytest.fixture
def ec2(aws: None) -> Any:
    return boto3.client("ec2", region_name=REGION)


@pytest.fixture
def table(aws: None) -> Any:
    return boto3.resource("dynamodb", region_name=REGION).Table("interruptions")


@pytest.fixture
def launch(ec2: Any) -> Callable[..., str]:
    """Start an instance shaped like a Karpenter node of ``pool``; returns its id."""

    def _launch(pool: str | None = "gen1-inf2-spot", *, spot: bool = True, cluster: str | None = CLUSTER, instance_type: str = "inf2.xlarge") -> str:
        tags = []
        if pool is not None:
            tags.append({"Key": "karpenter.sh/nodepool", "Value": pool})
        if cluster is not None:
            tags += [
                {"Key": "eks:eks-cluster-name", "Value": cluster},
                {"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned"},
            ]
        kwargs: dict[str, Any] = {"ImageId": AMI, "MinCount": 1, "MaxCount": 1, "InstanceType": instance_type}
        if tags:
            kwargs["TagSpecifications"] = [{"ResourceType": "instance", "Tags": tags}]
        if spot:
            kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}
        return ec2.run_instances(**kwargs)["Instances"][0]["InstanceId"]

    return _launch


@pytest.fixture
def kube(settings: Settings) -> KubeClient:
    """The client as the handler builds it, signing with the fake credentials."""
    from lambdas.interruption_handler.eks_auth import eks_token

    session = boto3.Session(region_name=REGION)
    return KubeClient(
        endpoint=settings.cluster_endpoint,
        ca_pem=settings.cluster_ca_pem,
        token=lambda: eks_token(session.get_credentials(), region=REGION, cluster_name=CLUSTER),
        timeout=settings.kube_timeout_seconds,
        backoff=0.01,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock(dt.datetime(2026, 3, 2, 10, 15, 30, tzinfo=dt.UTC).timestamp())


@pytest.fixture
def lambda_context() -> LambdaContext:
    return LambdaContext()


@pytest.fixture
def handler(env: dict[str, str], aws: None, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """The Lambda module with a fresh cold start (settings and clients rebuilt from this test's env).

    Its Powertools logger writes to this test's captured stdout, next to the EMF metrics.
    """
    from lambdas.interruption_handler import handler as module

    stream_handler = module.logger.registered_handler
    assert isinstance(stream_handler, logging.StreamHandler)
    stream_handler.stream = CurrentStdout()  # not setStream: that flushes a previous test's closed stream
    module.runtime.cache_clear()
    yield module
    module.runtime.cache_clear()
