"""The Kubernetes client against a local HTTPS API server: path, content type, token, TLS, and every failure."""

from __future__ import annotations

import base64
import socket
import time

import pytest

from lambdas.interruption_handler.errors import HandlerError, Reason
from lambdas.interruption_handler.kube import KubeClient, Scale
from lambdas.interruption_handler.settings import Settings
from tests.lambdas.lambda_support import CLUSTER, NAMESPACE, SECRET_KEY, Tls
from tests.lambdas.fake_kubernetes import FakeKubernetes
from tests.lambdas.sigv4 import verify_presigned_url

PATH = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/inf2-warm-spare/scale"


def test_get_scale(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    assert kube.get_scale(NAMESPACE, "inf2-warm-spare") == Scale(0, "1")  # replicas 0 is omitted by the API
    assert kube.get_scale(NAMESPACE, "g6e-warm-spare") == Scale(1, "1")
    seen = kubernetes.requests[0]
    assert (seen.method, seen.path, seen.status) == ("GET", PATH, 200)
    assert seen.headers["accept"] == "application/json"
    assert "content-type" not in seen.headers


def test_patch_scale_is_a_conditional_merge_patch(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    assert kube.patch_scale(NAMESPACE, "inf2-warm-spare", 2, "1") == Scale(2, "2")
    seen = kubernetes.patches()[0]
    assert seen.path == PATH
    assert seen.headers["content-type"] == "application/merge-patch+json"
    assert seen.body == {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 2}}
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 2


def test_bearer_token_is_a_signed_sts_url_for_this_cluster(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    kube.get_scale(NAMESPACE, "inf2-warm-spare")
    auth = kubernetes.requests[0].headers["authorization"]
    scheme, token = auth.split(" ", 1)
    assert scheme == "Bearer" and token.startswith("k8s-aws-v1.") and "=" not in token
    body = token[len("k8s-aws-v1.") :]
    url = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    assert url.startswith("https://sts.us-east-1.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15&")
    query = verify_presigned_url(url, secret_key=SECRET_KEY, headers={"x-k8s-aws-id": CLUSTER})
    assert query["X-Amz-SignedHeaders"] == "host;x-k8s-aws-id"
    assert query["X-Amz-Expires"] == "60"


def test_a_token_for_another_cluster_is_rejected_with_401(settings: Settings, kubernetes: FakeKubernetes) -> None:
    from lambdas.interruption_handler.eks_auth import eks_token
    import boto3

    creds = boto3.Session().get_credentials()
    client = KubeClient(
        endpoint=settings.cluster_endpoint,
        ca_pem=settings.cluster_ca_pem,
        token=lambda: eks_token(creds, region="us-east-1", cluster_name="someone-else"),
        timeout=0.5,
    )
    with pytest.raises(HandlerError) as caught:
        client.get_scale(NAMESPACE, "inf2-warm-spare")
    assert caught.value.reason is Reason.KUBE_UNAUTHORIZED
    assert len(kubernetes.requests) == 1, "401 is not retried"


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (401, Reason.KUBE_UNAUTHORIZED),
        (403, Reason.KUBE_FORBIDDEN),
        (404, Reason.KUBE_NOT_FOUND),
        (409, Reason.KUBE_CONFLICT),
        (422, Reason.KUBE_BAD_RESPONSE),
    ],
)
def test_client_errors_fail_at_once_with_their_reason(kube: KubeClient, kubernetes: FakeKubernetes, status: int, reason: Reason) -> None:
    kubernetes.faults.append(status)
    with pytest.raises(HandlerError) as caught:
        kube.patch_scale(NAMESPACE, "inf2-warm-spare", 1, "1")
    error = caught.value
    assert error.reason is reason
    assert error.context["status"] == status
    assert error.context["path"] == PATH and error.context["method"] == "PATCH"
    assert f"injected {status}" in error.message  # the API's Status message is kept for the log
    assert len(kubernetes.requests) == 1
    assert kubernetes.replicas(NAMESPACE, "inf2-warm-spare") == 0


def test_a_missing_deployment_is_404(kube: KubeClient) -> None:
    with pytest.raises(HandlerError) as caught:
        kube.get_scale(NAMESPACE, "no-such-spare")
    assert caught.value.reason is Reason.KUBE_NOT_FOUND


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_server_errors_are_retried_then_succeed(kube: KubeClient, kubernetes: FakeKubernetes, status: int) -> None:
    kubernetes.faults.extend([status, status])
    assert kube.patch_scale(NAMESPACE, "inf2-warm-spare", 1, "1") == Scale(1, "2")
    assert [r.status for r in kubernetes.requests] == [status, status, 200]


def test_server_errors_that_persist_fail_after_three_attempts(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    kubernetes.faults.extend([503, 503, 503, 503])
    with pytest.raises(HandlerError) as caught:
        kube.get_scale(NAMESPACE, "inf2-warm-spare")
    assert caught.value.reason is Reason.KUBE_SERVER_ERROR
    assert caught.value.context["attempts"] == 3
    assert len(kubernetes.requests) == 3


def test_timeouts_are_retried_then_classified(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    kubernetes.hang_seconds = 6.0
    kubernetes.faults.extend(["hang", "hang", "hang"])
    started = time.monotonic()
    with pytest.raises(HandlerError) as caught:
        kube.get_scale(NAMESPACE, "inf2-warm-spare")
    elapsed = time.monotonic() - started
    assert caught.value.reason is Reason.KUBE_TIMEOUT
    assert caught.value.context["attempts"] == 3
    assert elapsed < 6.0, "three attempts of 1 s each, not one wait for the server's 6 s"


def test_a_timeout_then_an_answer_succeeds(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    kubernetes.hang_seconds = 2.0
    kubernetes.faults.append("hang")
    assert kube.get_scale(NAMESPACE, "g6e-warm-spare").replicas == 1


def test_no_retry_when_the_invocation_has_no_time_left(settings: Settings, kubernetes: FakeKubernetes, kube: KubeClient) -> None:
    client = KubeClient(
        endpoint=settings.cluster_endpoint, ca_pem=settings.cluster_ca_pem, token=kube._token, timeout=0.5, deadline=lambda: 0.6
    )  # time for one call (0.5 s) but not for a pause and another (0.2 + 0.5 s)
    kubernetes.faults.extend([503, 503])
    with pytest.raises(HandlerError) as caught:
        client.get_scale(NAMESPACE, "inf2-warm-spare")
    assert caught.value.reason is Reason.KUBE_SERVER_ERROR
    assert len(kubernetes.requests) == 1


def test_no_call_starts_without_time_for_it(settings: Settings, kubernetes: FakeKubernetes, kube: KubeClient) -> None:
    client = KubeClient(
        endpoint=settings.cluster_endpoint, ca_pem=settings.cluster_ca_pem, token=kube._token, timeout=0.5, deadline=lambda: 0.2
    )
    with pytest.raises(HandlerError) as caught:
        client.patch_scale(NAMESPACE, "inf2-warm-spare", 1, "1")
    assert caught.value.reason is Reason.KUBE_TIMEOUT
    assert "no time left" in caught.value.message
    assert kubernetes.requests == []


def test_a_200_that_is_not_a_scale_is_a_bad_response(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    kubernetes.faults.append("not-json")
    with pytest.raises(HandlerError) as caught:
        kube.get_scale(NAMESPACE, "inf2-warm-spare")
    assert caught.value.reason is Reason.KUBE_BAD_RESPONSE


def test_tls_is_verified_against_the_cluster_ca(settings: Settings, other_tls: Tls, kubernetes: FakeKubernetes, kube: KubeClient) -> None:
    impostor_ca = base64.b64decode(other_tls.ca_b64).decode()
    client = KubeClient(endpoint=settings.cluster_endpoint, ca_pem=impostor_ca, token=kube._token, timeout=0.5)
    with pytest.raises(HandlerError) as caught:
        client.get_scale(NAMESPACE, "inf2-warm-spare")
    assert caught.value.reason is Reason.KUBE_UNREACHABLE
    assert "TLS verification" in caught.value.message
    assert kubernetes.requests == [], "no request (and no token) went to a server we could not verify"


def test_unreachable_endpoint(settings: Settings, kube: KubeClient) -> None:
    with socket.socket() as probe:  # a port with nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = KubeClient(endpoint=f"https://127.0.0.1:{port}", ca_pem=settings.cluster_ca_pem, token=kube._token, timeout=0.5, backoff=0.01)
    with pytest.raises(HandlerError) as caught:
        client.get_scale(NAMESPACE, "inf2-warm-spare")
    assert caught.value.reason is Reason.KUBE_UNREACHABLE
    assert caught.value.context["attempts"] == 3


def test_names_are_quoted_into_the_path() -> None:
    assert KubeClient.scale_path("ns", "a/b") == "/apis/apps/v1/namespaces/ns/deployments/a%2Fb/scale"
