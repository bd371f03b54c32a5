"""AWS clients for the preflight, the IAM actions it uses, and what an AWS error means for a check.

Every call the preflight makes is a read: :data:`ACTIONS` maps each API operation to its IAM action
(the README lists them as the permissions to grant). Clients come from a :data:`ClientFactory`
(service name -> client), so tests hand in botocore ``Stubber``-wrapped clients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

ClientFactory = Callable[[str], Any]

# API operation -> the IAM action that allows it. Only these are ever called, all read-only.
ACTIONS: dict[str, str] = {
    "GetCallerIdentity": "sts:GetCallerIdentity",
    "GetParameter": "ssm:GetParameter",
    "GetServiceQuota": "servicequotas:GetServiceQuota",
    "GetAWSDefaultServiceQuota": "servicequotas:GetAWSDefaultServiceQuota",
    "DescribeInstanceTypes": "ec2:DescribeInstanceTypes",
    "DescribeAvailabilityZones": "ec2:DescribeAvailabilityZones",
    "DescribeSubnets": "ec2:DescribeSubnets",
    "DescribeInstanceTypeOfferings": "ec2:DescribeInstanceTypeOfferings",
    "DescribeSpotPriceHistory": "ec2:DescribeSpotPriceHistory",
    "DescribeCapacityReservations": "ec2:DescribeCapacityReservations",
    "DescribeAddonVersions": "eks:DescribeAddonVersions",
    "GetAccountSettings": "lambda:GetAccountSettings",
    "GetRole": "iam:GetRole",
}

# The error codes botocore's standard retry mode treats as throttling
# (botocore/retries/standard.py, ThrottledRetryableChecker, botocore 1.44.8): after its retries
# the check reports "could not check: throttled" instead of a result.
THROTTLING_CODES: frozenset[str] = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)
# EC2 says UnauthorizedOperation; the JSON and query APIs AccessDenied(Exception).
ACCESS_DENIED_CODES: frozenset[str] = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})
# The credentials themselves are bad (expired SSO session, deleted key).
BAD_CREDENTIALS_CODES: frozenset[str] = frozenset(
    {"ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch"}
)

# Retries: botocore's standard mode (exponential backoff with jitter, throttling codes above); attempts in
# all, the first included.
MAX_ATTEMPTS = 5


def client_config(max_attempts: int = MAX_ATTEMPTS) -> Config:
    return Config(retries={"mode": "standard", "total_max_attempts": max_attempts}, user_agent_extra="gennstack-preflight")


def session_clients(session: Any, region: str, *, max_attempts: int = MAX_ATTEMPTS) -> ClientFactory:
    """A factory of ``session`` clients in ``region`` with standard retries, one client per service."""
    cache: dict[str, Any] = {}
    config = client_config(max_attempts)

    def factory(service: str) -> Any:
        if service not in cache:
            cache[service] = session.client(service, region_name=region, config=config)
        return cache[service]

    return factory


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def action_of(exc: ClientError) -> str:
    """The IAM action of the failed call, e.g. ``servicequotas:GetServiceQuota``."""
    return ACTIONS.get(exc.operation_name, exc.operation_name)


def is_throttled(exc: ClientError) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return error_code(exc) in THROTTLING_CODES or status == 429


def describe_error(exc: BotoCoreError | ClientError) -> tuple[str, str]:
    """(summary, fix) for an AWS error that kept a check from finishing."""
    if isinstance(exc, ClientError):
        code, action = error_code(exc), action_of(exc)
        message = exc.response.get("Error", {}).get("Message", "")
        if is_throttled(exc):
            retries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts")
            attempts = f", after {retries + 1} attempts" if isinstance(retries, int) else ""
            return (
                f"could not check: throttled ({code or 'HTTP 429'} from {action}{attempts})",
                "run `gennstack preflight` again in a minute",
            )
        if code in ACCESS_DENIED_CODES:
            return (
                f"could not check: access denied to {action} ({code})",
                f"allow {action} for your role (README: 'Deploying for real' lists the read-only actions)",
            )
        if code in BAD_CREDENTIALS_CODES:
            return (
                f"could not check: the credentials were rejected ({code}: {message})",
                "refresh them (`aws sso login --profile NAME`, or new access keys) and run again",
            )
        return f"could not check: {action} failed with {code}: {message}", f"look into the {code} error from {action}"
    return f"could not check: {type(exc).__name__}: {exc}", "check your network, profile and credentials, then run again"
