"""Shared helpers for the interruption handler tests: sample events, a certificate, a clock, a Lambda context."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

EVENTS = Path(__file__).parent / "events"
REGION = "us-east-1"
# The account of every sample event in events/ (the function's own in these tests).
ACCOUNT = "123456789012"
CLUSTER = "gennstack"
ACCESS_KEY = "AKIDEXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
NAMESPACE = "gennstack-serving"
WARM_SPARES = {
    "gen1-inf2-spot": {"generation": "inf2", "namespace": NAMESPACE, "deployment": "inf2-warm-spare", "baseline": 0, "cap": 2},
    "gen1-inf2-on-demand": {"generation": "inf2", "namespace": NAMESPACE, "deployment": "inf2-warm-spare", "baseline": 0, "cap": 2},
    "gen3-g6e-spot": {"generation": "g6e", "namespace": NAMESPACE, "deployment": "g6e-warm-spare", "baseline": 1, "cap": 3},
}
AMI = "ami-12c6146b"  # one of moto's built-in AMIs


def load_event(
    name: str,
    *,
    instance_id: str | None = None,
    instance_ids: list[str] | None = None,
    fields: dict[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A sample from events/ with its instance(s) replaced and ``fields``/``detail`` entries overridden."""
    event = json.loads((EVENTS / f"{name}.json").read_text())
    if instance_id is not None:
        if "instance-id" in event["detail"]:
            event["detail"]["instance-id"] = instance_id
            event["resources"] = [f"arn:aws:ec2:{REGION}:123456789012:instance/{instance_id}"]
        else:
            instance_ids = [instance_id]
    if instance_ids is not None:
        event["resources"] = list(instance_ids)
        entity = event["detail"]["affectedEntities"][0]
        event["detail"]["affectedEntities"] = [dict(entity, entityValue=i) for i in instance_ids]
    event.update(fields or {})
    if detail:
        event["detail"].update(detail)
    return event


@dataclass
class Tls:
    certfile: str
    keyfile: str
    ca_b64: str


def make_certificate(tmp: Path, name: str) -> Tls:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    certfile, keyfile = tmp / f"{name}.crt", tmp / f"{name}.key"
    certfile.write_bytes(pem)
    keyfile.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return Tls(str(certfile), str(keyfile), base64.b64encode(pem).decode())


class Clock:
    """A settable clock for the logic functions (epoch seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class LambdaContext:
    function_name: str = "GenNStack-InterruptionHandler"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:123456789012:function:GenNStack-InterruptionHandler"
    aws_request_id: str = "52fdfc07-2182-154f-163f-5f0f9a621d72"
    remaining_ms: int = 30_000

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


class CurrentStdout:
    """Whatever ``sys.stdout`` is when a line is logged (capsys swaps it per test)."""

    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()
