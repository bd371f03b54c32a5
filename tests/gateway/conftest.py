"""Fixtures for the gateway tests: helm from the kubectl layer package, local mock model servers,
and the local gateway on real Envoy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helm import binary as helm_binary
from tests.mock_llm import MockServer, mock_servers

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm v4 from the kubectl layer package (tests/helm.py)."""
    return helm_binary()


MockBackend = MockServer


@pytest.fixture
def mock_backends() -> Iterator[Callable[..., MockServer]]:
    """Local OpenAI-compatible backends, each its own process and killable mid-load (tests/mock_llm.py)."""
    with mock_servers() as start:
        yield start




def validate_chart_objects(docs: list[dict]) -> None:
    """Every rendered object of the gateway chart against its schema and CEL rules (../shared/crds,
    External Secrets' v2.9.0 too; Kubernetes' own kinds). The EnvoyPatchPolicy, whose CRD is not
    there, is checked against its Go types in test_gateway_patches.py."""
    from tests.k8s_schema import crd_dir, validate

    crd_dir()
    for doc in docs:
        if doc["kind"] != "EnvoyPatchPolicy":
            validate(doc)


def start_local_gateway(gateway, endpoints: dict[str, str], **settings):
    """The local gateway for ``gateway`` on free ports, waited until every backend is healthy
    (stopped again if that fails); ``settings`` go to LocalSettings."""
    from gennstack.gateway.config import routing_table
    from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap

    bootstrap = envoy_bootstrap(routing_table(gateway), endpoints, gateway,
                                LocalSettings(listen_port=0, admin_port=0, **settings))
    gw = LocalGateway.start(bootstrap)
    try:
        gw.wait_healthy()
    except BaseException:
        gw.stop()
        raise
    return gw


# The relay's image in chart renders (the construct passes its DockerImageAsset's URI).
RELAY_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gennstack-resume:1"
# The objects of the stream-resume relay and of the routing Gateway (templates/resume*.yaml), checked in
# tests/gateway/test_gateway_resume_chart.py; tests of the public Gateway and the model routes leave them out.
RESUME_OBJECTS = {"gennstack-gateway-resume", "gennstack-gateway-front", "gennstack-gateway-routing"}


def without_resume(docs: list[dict]) -> list[dict]:
    """``docs`` without the resume relay's and the routing Gateway's objects (RESUME_OBJECTS)."""
    return [d for d in docs if d["metadata"]["name"] not in RESUME_OBJECTS]
