"""The environment contract: a valid environment parses; every bad value fails naming the variable."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from lambdas.interruption_handler.settings import ConfigError, Settings, WarmSpare
from tests.lambdas.lambda_support import WARM_SPARES

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
VALID = {
    "CLUSTER_NAME": "gennstack",
    "CLUSTER_ENDPOINT": "https://ABCDEF0123456789.gr7.us-east-1.eks.amazonaws.com",
    "CLUSTER_CA": base64.b64encode(PEM.encode()).decode(),
    "TABLE_NAME": "GenNStack-InterruptionTable-1ABC",
    "WARM_SPARES": json.dumps(WARM_SPARES),
    "AWS_REGION": "us-east-1",
    "ACCOUNT_ID": "123456789012",
    "POWERTOOLS_METRICS_NAMESPACE": "GenNStack",
}


def test_valid_environment() -> None:
    settings = Settings.from_env(VALID)
    assert settings.record_ttl_seconds == 1800
    assert settings.replacement_grace_seconds == 600
    assert settings.cluster_ca_pem == PEM
    assert settings.warm_spares["gen3-g6e-spot"] == WarmSpare("g6e", "gennstack-serving", "g6e-warm-spare", 1, 3)
    assert set(settings.generations) == {"inf2", "g6e"}
    with pytest.raises(TypeError):
        settings.warm_spares["new"] = settings.warm_spares["gen3-g6e-spot"]  # type: ignore[index]


@pytest.mark.parametrize(("baseline", "cap", "active", "desired"), [(0, 2, 0, 0), (0, 2, 1, 1), (0, 2, 7, 2), (1, 3, 1, 2), (1, 3, 5, 3), (2, 2, 4, 2)])
def test_desired_replicas_is_capped(baseline: int, cap: int, active: int, desired: int) -> None:
    assert WarmSpare("g", "ns", "d", baseline, cap).desired_replicas(active) == desired


def _spares(**changes: Any) -> str:
    entry = {"generation": "inf2", "namespace": "gennstack-serving", "deployment": "inf2-warm-spare", "baseline": 0, "cap": 2}
    entry.update(changes)
    return json.dumps({"gen1-inf2-spot": {k: v for k, v in entry.items() if v is not ...}})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"CLUSTER_NAME": ""}, "CLUSTER_NAME is required"),
        ({"CLUSTER_NAME": "bad name!"}, "CLUSTER_NAME="),
        ({"CLUSTER_ENDPOINT": "http://example.com"}, "CLUSTER_ENDPOINT="),
        ({"CLUSTER_ENDPOINT": "https://example.com/api"}, "CLUSTER_ENDPOINT="),
        ({"CLUSTER_ENDPOINT": "https://example.com:99999"}, "invalid port"),
        ({"CLUSTER_CA": "not base64!"}, "CLUSTER_CA must be base64"),
        ({"CLUSTER_CA": base64.b64encode(b"hello").decode()}, "no PEM certificate"),
        ({"TABLE_NAME": " "}, "TABLE_NAME is required"),
        ({"AWS_REGION": ""}, "AWS_REGION is required"),
        ({"ACCOUNT_ID": ""}, "ACCOUNT_ID is required"),
        ({"ACCOUNT_ID": "12345678901"}, "ACCOUNT_ID='12345678901' is not a 12-digit AWS account id"),
        ({"ACCOUNT_ID": "${Token[AWS.AccountId.7]}"}, "ACCOUNT_ID="),
        ({"POWERTOOLS_METRICS_NAMESPACE": ""}, "POWERTOOLS_METRICS_NAMESPACE is required"),
        ({"RECORD_TTL_SECONDS": "soon"}, "RECORD_TTL_SECONDS='soon' must be an integer"),
        ({"RECORD_TTL_SECONDS": "30"}, "RECORD_TTL_SECONDS=30 must be at least 60"),
        ({"REPLACEMENT_GRACE_SECONDS": "-1"}, "REPLACEMENT_GRACE_SECONDS=-1"),
        ({"KUBE_TIMEOUT_SECONDS": "nan"}, "KUBE_TIMEOUT_SECONDS"),
        ({"KUBE_TIMEOUT_SECONDS": "0"}, "KUBE_TIMEOUT_SECONDS"),
        ({"WARM_SPARES": "{"}, "WARM_SPARES is not JSON"),
        ({"WARM_SPARES": "[]"}, "non-empty JSON object"),
        ({"WARM_SPARES": "{}"}, "non-empty JSON object"),
        ({"WARM_SPARES": json.dumps({"gen1-inf2-spot": 3})}, "must be an object"),
        ({"WARM_SPARES": json.dumps({"Bad_Pool": {}})}, "is not a Kubernetes object name"),
        ({"WARM_SPARES": _spares(cap=...)}, "expected exactly"),
        ({"WARM_SPARES": _spares(replicas=1)}, "expected exactly"),
        ({"WARM_SPARES": _spares(namespace="Kube_System")}, ".namespace="),
        ({"WARM_SPARES": _spares(deployment="a/../b")}, ".deployment="),
        ({"WARM_SPARES": _spares(baseline=True)}, ".baseline=True"),
        ({"WARM_SPARES": _spares(baseline="1")}, ".baseline='1'"),
        ({"WARM_SPARES": _spares(cap=-1)}, ".cap=-1"),
        ({"WARM_SPARES": _spares(baseline=3, cap=2)}, "cap=2 is below baseline=3"),
    ],
)
def test_bad_values_name_the_variable(changes: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[").replace("?", r"\?")):
        Settings.from_env({**VALID, **changes})


def test_pools_of_one_generation_must_agree() -> None:
    spares = json.loads(VALID["WARM_SPARES"])
    spares["gen1-inf2-on-demand"]["cap"] = 5
    with pytest.raises(ConfigError, match="disagrees with another NodePool of generation 'inf2'"):
        Settings.from_env({**VALID, "WARM_SPARES": json.dumps(spares)})


def test_generations_may_not_share_a_deployment() -> None:
    spares = json.loads(VALID["WARM_SPARES"])
    spares["gen3-g6e-spot"]["deployment"] = "inf2-warm-spare"
    with pytest.raises(ConfigError, match="shared by generations 'inf2' and 'g6e'"):
        Settings.from_env({**VALID, "WARM_SPARES": json.dumps(spares)})
