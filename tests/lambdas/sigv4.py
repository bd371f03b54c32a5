"""An independent SigV4 check of a presigned STS URL, written from the SigV4 specification.

It recomputes the signature from the URL and the headers the signer claims to have signed, so a
token whose ``x-k8s-aws-id`` header was not signed, or was signed for another cluster, fails here.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl, quote, urlsplit


class BadSignature(AssertionError):
    pass


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def verify_presigned_url(url: str, *, secret_key: str, headers: dict[str, str]) -> dict[str, str]:
    """Return the query parameters if the URL's signature is right for ``headers`` (lower-case names)."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
    query = dict(pairs)
    signature = query.get("X-Amz-Signature", "")
    signed = query["X-Amz-SignedHeaders"].split(";")
    values = {"host": parts.netloc, **headers}
    missing = [name for name in signed if name not in values]
    if missing:
        raise BadSignature(f"signed headers {missing} have no value to check")
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(pairs) if k != "X-Amz-Signature"
    )
    canonical_request = "\n".join(
        [
            "GET",
            parts.path or "/",
            canonical_query,
            "".join(f"{name}:{values[name].strip()}\n" for name in signed),
            ";".join(signed),
            hashlib.sha256(b"").hexdigest(),  # a GET has an empty body, and its hash is signed
        ]
    )
    _access_key, date, region, service, terminator = query["X-Amz-Credential"].split("/")
    scope = "/".join([date, region, service, terminator])
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", query["X-Amz-Date"], scope, hashlib.sha256(canonical_request.encode()).hexdigest()]
    )
    key = _hmac(f"AWS4{secret_key}".encode(), date)
    for part in (region, service, terminator):
        key = _hmac(key, part)
    expected = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise BadSignature("signature does not match")
    return query
