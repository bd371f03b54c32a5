"""EKS token generation under a frozen clock, checked by an independent SigV4 computation."""

from __future__ import annotations

import base64
import datetime as dt
import re
from urllib.parse import parse_qs, urlsplit

import botocore.auth
import pytest
from botocore.credentials import Credentials

from lambdas.interruption_handler.eks_auth import eks_token
from lambdas.interruption_handler.errors import HandlerError, Reason
from tests.lambdas.lambda_support import ACCESS_KEY, SECRET_KEY
from tests.lambdas.sigv4 import BadSignature, verify_presigned_url

FROZEN = dt.datetime(2026, 3, 2, 10, 15, 0)


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda remove_tzinfo=True: FROZEN)


def _decode(token: str) -> str:
    assert token.startswith("k8s-aws-v1.")
    body = token[len("k8s-aws-v1.") :]
    assert "=" not in body, "base64url without padding"
    assert re.fullmatch(r"[A-Za-z0-9_-]+", body)
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def test_token_is_a_presigned_get_caller_identity_url() -> None:
    token = eks_token(Credentials(ACCESS_KEY, SECRET_KEY), region="eu-west-1", cluster_name="gennstack")
    url = _decode(token)
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert (parts.scheme, parts.hostname, parts.path) == ("https", "sts.eu-west-1.amazonaws.com", "/")
    assert query["Action"] == "GetCallerIdentity"
    assert query["Version"] == "2011-06-15"
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert query["X-Amz-Credential"] == f"{ACCESS_KEY}/20260302/eu-west-1/sts/aws4_request"
    assert query["X-Amz-Date"] == "20260302T101500Z"
    assert query["X-Amz-Expires"] == "60"
    assert query["X-Amz-SignedHeaders"] == "host;x-k8s-aws-id"
    assert "X-Amz-Security-Token" not in query
    verify_presigned_url(url, secret_key=SECRET_KEY, headers={"x-k8s-aws-id": "gennstack"})


def test_signature_binds_the_cluster_name() -> None:
    url = _decode(eks_token(Credentials(ACCESS_KEY, SECRET_KEY), region="us-east-1", cluster_name="gennstack"))
    with pytest.raises(BadSignature):
        verify_presigned_url(url, secret_key=SECRET_KEY, headers={"x-k8s-aws-id": "another-cluster"})
    with pytest.raises(BadSignature):
        verify_presigned_url(url, secret_key="wrong-secret", headers={"x-k8s-aws-id": "gennstack"})


def test_same_clock_same_token_and_the_clock_moves_it() -> None:
    creds = Credentials(ACCESS_KEY, SECRET_KEY)
    first = eks_token(creds, region="us-east-1", cluster_name="gennstack")
    assert eks_token(creds, region="us-east-1", cluster_name="gennstack") == first
    assert eks_token(creds, region="us-east-1", cluster_name="other") != first


def test_session_token_is_signed_into_the_url() -> None:
    url = _decode(eks_token(Credentials(ACCESS_KEY, SECRET_KEY, "FwoGZXIvYXdzEXAMPLE"), region="us-east-1", cluster_name="gennstack"))
    query = verify_presigned_url(url, secret_key=SECRET_KEY, headers={"x-k8s-aws-id": "gennstack"})
    assert query["X-Amz-Security-Token"] == "FwoGZXIvYXdzEXAMPLE"


def test_china_regions_use_their_partition_host() -> None:
    url = _decode(eks_token(Credentials(ACCESS_KEY, SECRET_KEY), region="cn-north-1", cluster_name="gennstack"))
    assert urlsplit(url).hostname == "sts.cn-north-1.amazonaws.com.cn"


def test_no_credentials_is_a_classified_failure() -> None:
    with pytest.raises(HandlerError) as caught:
        eks_token(None, region="us-east-1", cluster_name="gennstack")
    assert caught.value.reason is Reason.CREDENTIALS
