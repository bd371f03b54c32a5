"""EKS bearer tokens without kubectl or aws-iam-authenticator.

The token is ``k8s-aws-v1.`` + base64url (no padding) of a presigned STS ``GetCallerIdentity`` URL
whose SigV4 signature covers the ``x-k8s-aws-id: <cluster name>`` header. EKS calls STS with that
URL to learn who is calling, and the signed header binds the token to one cluster. Presigning is
local (no network call); the URL is valid for ``expires_in`` seconds (EKS honours at most 15 minutes).
"""

from __future__ import annotations

import base64

from botocore.credentials import Credentials
from botocore.hooks import HierarchicalEmitter
from botocore.model import ServiceId
from botocore.signers import RequestSigner

from .errors import HandlerError, Reason

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
TOKEN_EXPIRES_IN = 60
# RequestSigner keeps only a weak reference to its event emitter; this one lives as long as the module.
_NO_HOOKS = HierarchicalEmitter()


def sts_host(region: str) -> str:
    """The regional STS endpoint's host (EKS requires the token's STS host to be its own region's or global)."""
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"sts.{region}.{suffix}"


def eks_token(credentials: Credentials | None, *, region: str, cluster_name: str, expires_in: int = TOKEN_EXPIRES_IN) -> str:
    if credentials is None:
        raise HandlerError(Reason.CREDENTIALS, "no AWS credentials to sign the EKS token with")
    signer = RequestSigner(ServiceId("sts"), region, "sts", "v4", credentials, _NO_HOOKS)
    request = {
        "method": "GET",
        "url": f"https://{sts_host(region)}/?Action=GetCallerIdentity&Version=2011-06-15",
        "body": {},
        "headers": {CLUSTER_ID_HEADER: cluster_name},
        "context": {},
    }
    url = signer.generate_presigned_url(request, "GetCallerIdentity", expires_in=expires_in, region_name=region)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode("utf-8")).decode("ascii").rstrip("=")
