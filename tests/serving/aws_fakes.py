"""Local stand-ins for what the chart's pods talk to, so that the real programs run against them.

- :class:`MotoServer`: moto in server mode on 127.0.0.1 **with authentication on**. Before any
  test request it creates an IAM role allowed ``s3:*`` / ``secretsmanager:GetSecretValue``,
  assumes it (temporary ``ASIA...`` credentials with a session token, like a Pod Identity
  role's) and creates the buckets; after those bootstrap calls moto checks every request's
  SigV4 signature and session token against that role. An unsigned request, or one signed with
  other credentials, is refused.
- :class:`PodIdentityAgent`: the EKS Pod Identity agent's credentials endpoint on 127.0.0.1. It
  answers ``GET /v1/credentials`` with the agent's JSON (AccessKeyId, SecretAccessKey, Token,
  AccountId, Expiration) only when the ``Authorization`` header equals the pod's service-account
  token, and 403 otherwise; it records every call.
- :func:`pod_env`: exactly the environment the Pod Identity webhook injects
  (``AWS_CONTAINER_CREDENTIALS_FULL_URI``, ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE``) plus an
  endpoint override, and no other credential source: no ``AWS_ACCESS_KEY_ID``, no ``~/.aws``
  (HOME is a fresh directory and the config/credentials file variables point at nothing), IMDS
  off (``AWS_EC2_METADATA_DISABLED=true``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKETS = ("models", "compile-cache")
TOKEN = "eyJhbGciOiJSUzI1NiJ9.pod-identity-service-account-token"
# IAM role + policy + AssumeRole + one CreateBucket per bucket: the calls moto serves before it
# starts enforcing authentication (INITIAL_NO_AUTH_ACTION_COUNT).
_BOOTSTRAP_CALLS = 3 + len(BUCKETS)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, process: subprocess.Popen | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


class MotoServer:
    """moto in server mode (a subprocess) with SigV4 authentication enforced after bootstrap."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_BOOTSTRAP_CALLS),
               "MOTO_ACCOUNT_ID": ACCOUNT}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait_for(f"{self.endpoint}/moto-api/", self.process)
        self.credentials = self._bootstrap()

    def _bootstrap(self) -> dict[str, str]:
        bootstrap = {"endpoint_url": self.endpoint, "region_name": REGION,
                     "aws_access_key_id": "bootstrap", "aws_secret_access_key": "bootstrap"}
        iam, sts = boto3.client("iam", **bootstrap), boto3.client("sts", **bootstrap)
        trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["sts:AssumeRole", "sts:TagSession"],
                                                         "Principal": {"Service": "pods.eks.amazonaws.com"}}]}
        iam.create_role(RoleName="pod-role", AssumeRolePolicyDocument=json.dumps(trust))
        policy = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["s3:*", "secretsmanager:GetSecretValue", "secretsmanager:CreateSecret"], "Resource": "*"}]}
        iam.put_role_policy(RoleName="pod-role", PolicyName="pod", PolicyDocument=json.dumps(policy))
        role = sts.assume_role(RoleArn=f"arn:aws:iam::{ACCOUNT}:role/pod-role", RoleSessionName="eks-pod")["Credentials"]
        s3 = boto3.client("s3", **bootstrap)
        for bucket in BUCKETS:
            s3.create_bucket(Bucket=bucket)
        return {"AccessKeyId": role["AccessKeyId"], "SecretAccessKey": role["SecretAccessKey"],
                "Token": role["SessionToken"]}

    def client(self, service: str):
        """A client signed with the role's credentials (what the test itself uses to arrange and inspect)."""
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.credentials["AccessKeyId"],
                            aws_secret_access_key=self.credentials["SecretAccessKey"],
                            aws_session_token=self.credentials["Token"])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


class PodIdentityAgent:
    """The Pod Identity agent's credentials endpoint, strict about the Authorization header."""

    def __init__(self, credentials: dict[str, str], token: str = TOKEN) -> None:
        self.token = token
        self.calls: list[tuple[str, int]] = []  # (Authorization header, status answered)
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                auth = self.headers.get("Authorization", "")
                if self.path != "/v1/credentials" or auth != agent.token:
                    agent.calls.append((auth, 403))
                    body = json.dumps({"message": "invalid service account token"}).encode()
                    self.send_response(403)
                else:
                    agent.calls.append((auth, 200))
                    expiration = (datetime.now(UTC) + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")
                    body = json.dumps({**credentials, "AccountId": ACCOUNT, "Expiration": expiration}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/credentials"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def served(self) -> int:
        return sum(1 for _, status in self.calls if status == 200)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# Variables that would give a program credentials (or a region/endpoint) from somewhere else.
_CREDENTIAL_VARIABLES = ("AWS_", "BOTO_", "HF_", "HUGGING")


def pod_env(home: Path, agent: PodIdentityAgent, *, token: str = TOKEN, **extra: str) -> dict[str, str]:
    """The environment of a pod whose ServiceAccount has a Pod Identity association, and nothing else.

    ``token`` is what the projected token file holds (pass another value to simulate a wrong one).
    """
    home.mkdir(parents=True, exist_ok=True)
    token_file = home / "eks-pod-identity-token"
    token_file.write_text(token)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CREDENTIAL_VARIABLES)}
    env.update({
        "HOME": str(home),
        "AWS_CONFIG_FILE": str(home / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        # What the EKS Pod Identity webhook injects (the real agent listens on 169.254.170.23).
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": agent.url,
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token_file),
    })
    env.update(extra)
    return env
