"""Fixtures for the serving chart tests: the chart, its required values, the values CDK builds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gennstack.config import load_config
from gennstack.serving import ServingConfig, serving_values
from tests import helm
from tests.support import ROOT
from tests.serving.aws_fakes import MotoServer, PodIdentityAgent

CHART = ROOT / "assets" / "charts" / "gennstack-serving"
SCRIPTS = CHART / "files"
NAMESPACE = "gennstack-serving"
# The values without a default, as a plain `helm install` would pass them.
REQUIRED: dict[str, Any] = {
    "aws": {"region": "us-east-1"},
    "buckets": {"models": "gennstack-models-1a2b", "compileCache": "gennstack-compile-cache-1a2b"},
}
STAGING = {"staging": {"enabled": True, "hfTokenSecret": "gennstack/hugging-face-token"}}
GENERATIONS = ("inf2", "trn2", "g6e")


def only(*names: str) -> dict[str, Any]:
    """Values that enable exactly ``names``."""
    return {name: {"enabled": name in names} for name in GENERATIONS}


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cdk_values(context: dict[str, Any] | None = None, serving: ServingConfig | None = None, **tokens: str) -> dict[str, Any]:
    kwargs = {
        "models_bucket": "gennstack-models-1a2b",
        "compile_cache_bucket": "gennstack-compile-cache-1a2b",
        "region": "eu-west-1",
        "hf_token_secret": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:gennstack/hf-token-AbCdEf",
        **tokens,
    }
    return serving_values(load_config(context or {}), serving or ServingConfig(), **kwargs)


@pytest.fixture(scope="session")
def chart() -> Path:
    return CHART


@pytest.fixture(scope="session")
def rendered_all() -> list[dict]:
    """Every generation, with staging on: every kind of object the chart makes."""
    return helm.render(CHART, merged(REQUIRED, STAGING), namespace=NAMESPACE)


def load_script(name: str) -> ModuleType:
    """Import one of the chart's container scripts (``files/<name>.py``) as a module, for unit tests.
    files/ goes on sys.path, as /scripts is for `python3 /scripts/<name>.py` (its sys.path[0]), so a
    script's import of another (stage.py's kube_patch) resolves as in the pod."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The staging ServiceAccount's token, as the fake Kubernetes API (tests/serving/fake_kube_api.py) knows it.
STAGING_TOKEN = "eyJhbGciOiJSUzI1NiJ9.staging-service-account-token"
STAGING_USER = f"system:serviceaccount:{NAMESPACE}:gennstack-staging"
# Each Neuron generation's compile ServiceAccount (gennstack-compile-<gen>), which its upload runs as.
COMPILE_TOKENS = {gen: f"eyJhbGciOiJSUzI1NiJ9.compile-{gen}-service-account-token" for gen in ("inf2", "trn2")}
COMPILE_USERS = {gen: f"system:serviceaccount:{NAMESPACE}:gennstack-compile-{gen}" for gen in COMPILE_TOKENS}
BUCKETS = {"buckets": {"models": "models", "compileCache": "compile-cache"}}


def serve_kube_api(tmp_path: Path, values: dict[str, Any], *, workloads: bool = False):
    """A Kubernetes API on 127.0.0.1 holding what the chart renders with ``values``: its Roles and
    RoleBindings enforced, its staged-marker ConfigMaps empty (with ``workloads``, its Deployments,
    RayService and LeaderWorkerSets as well, as a first install left them). ``env`` is what the kubelet gives a
    staging pod (API address, ServiceAccount token of gennstack-staging, CA), ``compile_env[gen]``
    what it gives a Neuron generation's compile upload (the token of gennstack-compile-<gen>);
    ``kubeconfig`` is helm's (admin). A generator: the fixtures below yield from it."""
    from tests.lambdas.lambda_support import make_certificate
    from tests.serving.fake_kube_api import FakeKubeApi, in_cluster_env, install, service_account_dir, write_kubeconfig

    rendered = helm.render(CHART, values, namespace=NAMESPACE)
    tls = make_certificate(tmp_path, "kubernetes")
    # (batch/v1 Job as every API server serves it: with staging off the chart renders no Job but looks
    # one up, gennstack-serving.keptCompileJobs, and helm's lookup fails on a kind discovery lacks.)
    api = FakeKubeApi(tls.certfile, tls.keyfile, kinds={(o["apiVersion"], o["kind"]) for o in rendered} | {("batch/v1", "Job")},
                      tokens={"helm-admin": "admin", STAGING_TOKEN: STAGING_USER,
                              **{COMPILE_TOKENS[gen]: COMPILE_USERS[gen] for gen in COMPILE_TOKENS}})
    install(api, rendered, NAMESPACE, workloads=workloads)
    url = api.start()
    api.rendered = rendered
    api.env = in_cluster_env(api, service_account_dir(tmp_path / "pod", token=STAGING_TOKEN, namespace=NAMESPACE,
                                                      ca_file=tls.certfile))
    api.compile_env = {gen: in_cluster_env(api, service_account_dir(tmp_path / f"pod-compile-{gen}", token=token,
                                                                    namespace=NAMESPACE, ca_file=tls.certfile))
                       for gen, token in COMPILE_TOKENS.items()}
    api.kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=url, ca_b64=tls.ca_b64, namespace=NAMESPACE)
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def kube_api(tmp_path: Path):
    """serve_kube_api with every generation and staging on."""
    yield from serve_kube_api(tmp_path, merged(REQUIRED, STAGING, BUCKETS))


# A local S3 (moto in server mode) and a fake EKS Pod Identity agent, one of each per test module.
@pytest.fixture(scope="module")
def moto():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def agent(moto):
    fake = PodIdentityAgent(moto.credentials)
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def hf_secret(moto) -> str:
    """The Hugging Face token secret STAGING names, in the module's moto (what the stage Job reads)."""
    name = STAGING["staging"]["hfTokenSecret"]
    moto.client("secretsmanager").create_secret(Name=name, SecretString='{"token": "hf_test"}')
    return name
