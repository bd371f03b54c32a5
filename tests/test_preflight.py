"""`gennstack preflight`: every check against botocore-Stubber clients, the command's output and exit codes.

No test reaches AWS: clients are real botocore clients wrapped in ``Stubber`` (which validates
every request parameter and response against the service model and fails on any call that was not
queued), credentials are fake, and any socket connection except to 127.0.0.1 raises. Responses
live in tests/events/preflight (see its README).
"""

from __future__ import annotations

import io
import json
import re
import socket
import textwrap
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gennstack.config import load_config
from gennstack.preflight import aws as preflight_aws
from gennstack.preflight import capacity, checks, zones
from gennstack.preflight.checks import Context, run_preflight
from gennstack.cli_config import read_config, resolve_region
from gennstack.preflight.cli import run
from gennstack.preflight.report import table
from gennstack.preflight.results import FAIL, PASS, WARN, Result
from tests.support import ROOT, Synth

EVENTS = ROOT / "tests" / "events" / "preflight"
NOW = datetime(2026, 11, 3, 12, 0, tzinfo=timezone.utc)
SERVICES = ("sts", "ssm", "service-quotas", "ec2", "eks", "lambda", "iam")
HEALTHY_ADMIN = (
    "arn:aws:iam::111122223333:role/aws-reserved/sso.amazonaws.com/eu-west-2/AWSReservedSSO_AdministratorAccess_0123456789abcdef"
)
FRESH_ADMIN = (
    "arn:aws:iam::444455556666:role/aws-reserved/sso.amazonaws.com/us-east-1/AWSReservedSSO_AdministratorAccess_fedcba9876543210"
)
HEALTHY_CONFIG = {"region": "us-east-2", "cluster": {"admin_role_arns": [HEALTHY_ADMIN]}}
# Quota values: a prepared account (each exactly what the default config can launch) and a new
# account's defaults (5 vCPUs Standard, 0 for the accelerator families).
HEALTHY_QUOTAS = {"L-1216C47A": 72.0, "L-34B43A08": 64.0, "L-B5D1601B": 768.0, "L-1945791B": 768.0,
                  "L-6B0D517C": 384.0, "L-2C3B7624": 384.0, "L-3819A6DF": 384.0, "L-DB2E81BA": 384.0}
FRESH_QUOTAS = {code: (5.0 if code in ("L-1216C47A", "L-34B43A08") else 0.0) for code in HEALTHY_QUOTAS}
ADDONS = ("vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent")
_DATES = {"Timestamp", "StartDate", "EndDate", "CreateDate", "LastModifiedDate", "LastUsedDate"}


# ---- environment: fake credentials, no network ----------------------------------------------------


@pytest.fixture(autouse=True)
def offline_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("AWS_PROFILE", "AWS_REGION", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    real_connect = socket.socket.connect

    def loopback_only(self: socket.socket, address: Any) -> Any:
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "localhost"):
            raise AssertionError(f"a preflight test tried to reach {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)


# ---- recorded responses and stubbed clients -------------------------------------------------------


def _dates(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (datetime.fromisoformat(v) if k in _DATES and isinstance(v, str) else _dates(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_dates(item) for item in value]
    return value


def event(name: str) -> dict[str, Any]:
    return _dates(json.loads((EVENTS / f"{name}.json").read_text(encoding="utf-8")))


def quota_response(code: str, value: float, region: str, account: str) -> dict[str, Any]:
    response = json.loads(json.dumps(event("service-quotas.get_service_quota.ec2")[code]))
    response["Quota"]["Value"] = value
    response["Quota"]["QuotaArn"] = response["Quota"]["QuotaArn"].replace("REGION", region).replace("ACCOUNT", account)
    return response


class Stubs:
    """One Stubber-wrapped client per service; ``factory`` is the preflight's client factory."""

    def __init__(self, region: str = "us-east-2") -> None:
        session = boto3.Session(region_name=region)
        self.region = region
        self.clients = {name: session.client(name, region_name=region) for name in SERVICES}
        self.stubbers = {name: Stubber(client) for name, client in self.clients.items()}
        for stubber in self.stubbers.values():
            stubber.activate()
        self.operations: list[str] = []

    def factory(self, service: str) -> Any:
        return self.clients[service]

    def add(self, service: str, method: str, response: dict[str, Any], params: dict[str, Any] | None = None) -> None:
        self.stubbers[service].add_response(method, response, params)
        self.operations.append(self.clients[service].meta.method_to_api_mapping[method])

    def error(self, service: str, method: str, code: str, message: str, status: int = 400,
              params: dict[str, Any] | None = None) -> None:
        self.stubbers[service].add_client_error(method, service_error_code=code, service_message=message,
                                                http_status_code=status, expected_params=params)
        self.operations.append(self.clients[service].meta.method_to_api_mapping[method])

    def assert_done(self, results: list[Result]) -> None:
        """Every queued response was used, and no call went unstubbed (Stubber errors are BotoCoreErrors)."""
        for stubber in self.stubbers.values():
            stubber.assert_no_pending_responses()
        stray = [row for row in results if "Stub" in row.summary or "Stub" in row.fix]
        assert not stray, stray


def config_of(overrides: dict[str, Any]) -> Any:
    """cdk.json's defaults with ``overrides`` deep-merged, as ``-c config=FILE`` would."""
    from tests.support import _merged_defaults

    return load_config(_merged_defaults(overrides))


def context(stubs: Stubs, overrides: dict[str, Any] | None = None, *, region: str | None = None,
            account: str | None = None, caller: str | None = None) -> Context:
    ctx = Context(config=config_of(overrides or {}), region=region or stubs.region, region_source="config",
                  clients=stubs.factory, now=NOW)
    ctx.account, ctx.caller_arn = account, caller
    return ctx


# ---- whole runs, queued in the order the checks call AWS ---------------------------------------------

QUOTA_ORDER = ("L-1216C47A", "L-34B43A08", "L-B5D1601B", "L-1945791B", "L-6B0D517C", "L-2C3B7624", "L-3819A6DF", "L-DB2E81BA")
ALL_TYPES = ["g6e.12xlarge", "g6e.2xlarge", "g6e.4xlarge", "g6e.8xlarge", "g6e.xlarge", "inf2.48xlarge",
             "m6i.large", "m7a.large", "m7i.large", "trn2.48xlarge"]
GEN_TYPES = [t for t in ALL_TYPES if not t.startswith("m")]


def queue_quotas(stubs: Stubs, values: dict[str, Any], account: str) -> None:
    stubs.add("ec2", "describe_instance_types", event("ec2.describe_instance_types.system"),
              {"InstanceTypes": ["m7i.large", "m6i.large", "m7a.large"]})
    for code in QUOTA_ORDER:
        value = values[code]
        if isinstance(value, tuple):  # (error code, message)
            stubs.error("service-quotas", "get_service_quota", value[0], value[1], params={"ServiceCode": "ec2", "QuotaCode": code})
        else:
            stubs.add("service-quotas", "get_service_quota", quota_response(code, value, stubs.region, account),
                      {"ServiceCode": "ec2", "QuotaCode": code})


def queue_zones(stubs: Stubs, *, default_subnets: bool = True) -> None:
    stubs.add("ec2", "describe_availability_zones", event(f"ec2.describe_availability_zones.{stubs.region}"), {})
    if default_subnets:
        stubs.add("ec2", "describe_subnets", event(f"ec2.describe_subnets.default-{stubs.region}"),
                  {"Filters": [{"Name": "default-for-az", "Values": ["true"]}]})
    stubs.add("ec2", "describe_instance_type_offerings", event(f"ec2.describe_instance_type_offerings.{stubs.region}"),
              {"LocationType": "availability-zone-id", "Filters": [{"Name": "instance-type", "Values": ALL_TYPES}]})


def queue_addons(stubs: Stubs, fixtures: dict[str, str] | None = None) -> None:
    for name in ADDONS:
        stubs.add("eks", "describe_addon_versions", event((fixtures or {}).get(name, f"eks.describe_addon_versions.{name}")),
                  {"addonName": name, "kubernetesVersion": "1.36"})


def queue_spot(stubs: Stubs, zone_names: list[str]) -> None:
    stubs.add("ec2", "describe_spot_price_history", event(f"ec2.describe_spot_price_history.{stubs.region}"),
              {"InstanceTypes": GEN_TYPES, "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW,
               "Filters": [{"Name": "availability-zone", "Values": zone_names}]})


def queue_healthy(stubs: Stubs, **replace: Any) -> None:
    """The prepared us-east-2 account, call by call; ``replace`` swaps a step for ``f(stubs)``."""
    steps = {
        "sts": lambda s: s.add("sts", "get_caller_identity", event("sts.get_caller_identity.sso-us-east-2"), {}),
        "ssm": lambda s: s.add("ssm", "get_parameter", event("ssm.get_parameter.cdk-bootstrap-version"),
                               {"Name": "/cdk-bootstrap/hnb659fds/version"}),
        "quotas": lambda s: queue_quotas(s, HEALTHY_QUOTAS, "111122223333"),
        "zones": lambda s: queue_zones(s),
        "addons": lambda s: queue_addons(s),
        "lambda": lambda s: s.add("lambda", "get_account_settings", event("lambda.get_account_settings.default"), {}),
        "iam": lambda s: s.add("iam", "get_role", event("iam.get_role.sso-admin-us-east-2"),
                               {"RoleName": "AWSReservedSSO_AdministratorAccess_0123456789abcdef"}),
        "spot": lambda s: queue_spot(s, ["us-east-2a", "us-east-2b", "us-east-2c"]),
        "reservations": lambda s: None,
    }
    steps.update(replace)
    for step in steps.values():
        step(stubs)


def queue_fresh(stubs: Stubs) -> None:
    """A new account in us-east-1: nothing prepared, default quotas."""
    stubs.add("sts", "get_caller_identity", event("sts.get_caller_identity.fresh-account"), {})
    stubs.error("ssm", "get_parameter", "ParameterNotFound", "", params={"Name": "/cdk-bootstrap/hnb659fds/version"})
    queue_quotas(stubs, FRESH_QUOTAS, "444455556666")
    queue_zones(stubs)
    queue_addons(stubs)
    stubs.add("lambda", "get_account_settings", event("lambda.get_account_settings.new-account"), {})
    stubs.add("iam", "get_role", event("iam.get_role.sso-admin-fresh-account"),
              {"RoleName": "AWSReservedSSO_AdministratorAccess_fedcba9876543210"})
    queue_spot(stubs, ["us-east-1a", "us-east-1b", "us-east-1c"])


def write_config(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "preflight.json"
    path.write_text(json.dumps(data))
    return str(path)


def run_cli(stubs: Stubs, argv: list[str]) -> tuple[int, str, str]:
    from gennstack.cli import build_parser

    args = build_parser().parse_args(["preflight", "--cdk-json", str(ROOT / "cdk.json"), *argv])
    out, err = io.StringIO(), io.StringIO()
    code = run(args, make_clients=lambda session, region: stubs.factory, now=NOW, stdout=out, stderr=err)
    for stubber in stubs.stubbers.values():
        stubber.assert_no_pending_responses()
    assert "Stub" not in out.getvalue(), out.getvalue()
    return code, out.getvalue(), err.getvalue()


def rows_of(text: str) -> dict[str, tuple[str, str]]:
    """CHECK -> (STATUS, RESULT) from the table."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^(PASS|WARN|FAIL)\s+(\S+)\s+(.*)$", line)
        if match:
            rows[match.group(2)] = (match.group(1), match.group(3))
    return rows


def healthy_run(tmp_path: Path, extra_config: dict[str, Any] | None = None, **replace: Any) -> tuple[int, str, str]:
    stubs = Stubs("us-east-2")
    queue_healthy(stubs, **replace)
    config = json.loads(json.dumps(HEALTHY_CONFIG))
    for key, value in (extra_config or {}).items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return run_cli(stubs, ["--config", write_config(tmp_path, config)])


# ---- the command, end to end --------------------------------------------------------------------


def test_healthy_account_passes_everything(tmp_path: Path) -> None:
    code, out, err = healthy_run(tmp_path)
    rows = rows_of(out)
    assert code == 0, out
    assert {status for status, _ in rows.values()} == {PASS}, out
    assert out.startswith("GenNStack preflight: account 111122223333, region us-east-2 (from config)\n")
    assert rows["credentials"][1] == (
        "arn:aws:sts::111122223333:assumed-role/AWSReservedSSO_AdministratorAccess_0123456789abcdef/alice@example.com "
        "in account 111122223333; region us-east-2 (from config)"
    )
    assert rows["cdk-bootstrap"][1] == "version 29 (the template requires >= 6)"
    assert rows["quota.trn.spot"][1] == (
        "All Trn Spot Instance Requests (L-6B0D517C) is 384 vCPUs; the config can launch 384 "
        "(trn2 spot pool 2 x 192), one node needs 192"
    )
    assert rows["quota.standard.on-demand"][1].endswith(
        "the config can launch 72 (system node group 4 x 2 + general pool 64), 4 system nodes need 8")
    assert rows["zones"][1] == "us-east-2a (use2-az1), us-east-2b (use2-az2), us-east-2c (use2-az3) (the first 3 of Fn::GetAZs)"
    assert rows["zones.trn2"][1] == "trn2 (trn2.48xlarge) offered in all 3 zones"
    assert rows["spot.g6e"][1].startswith("g6e.xlarge $0.6512-0.7034/h (cheapest us-east-2a); g6e.2xlarge $0.8129-0.8843/h")
    assert rows["spot.trn2"][1] == "trn2.48xlarge $14.8320-15.3912/h (cheapest us-east-2a)"
    assert rows["admins.you"][1] == "your role AWSReservedSSO_AdministratorAccess_0123456789abcdef is a cluster admin"
    assert rows["reservations"][1] == "none configured (generations.<name>.capacity_reservation_ids)"
    assert out.rstrip().endswith("23 PASS, 0 WARN, 0 FAIL: ready for `make deploy`.")
    # progress on stderr, one line per check, nothing else
    assert err.splitlines()[2] == "checking service quotas (3/9)..."
    assert len(err.splitlines()) == 9


def test_json_output_and_no_progress_on_stdout(tmp_path: Path) -> None:
    stubs = Stubs("us-east-2")
    queue_healthy(stubs)
    code, out, err = run_cli(stubs, ["--config", write_config(tmp_path, HEALTHY_CONFIG), "--json"])
    document = json.loads(out)  # stdout is exactly one JSON document
    assert code == 0 and document["exit_code"] == 0
    assert document["account"] == "111122223333" and document["region"] == "us-east-2" and document["region_source"] == "config"
    assert document["counts"] == {"PASS": 23, "WARN": 0, "FAIL": 0}
    assert document["results"][0] == {
        "id": "credentials", "status": "PASS", "fix": "",
        "summary": "arn:aws:sts::111122223333:assumed-role/AWSReservedSSO_AdministratorAccess_0123456789abcdef/alice@example.com "
                   "in account 111122223333; region us-east-2 (from config)",
    }
    assert "checking" not in out and "checking credentials (1/9)..." in err


def fresh_output() -> tuple[int, str, str]:
    stubs = Stubs("us-east-1")
    queue_fresh(stubs)
    return run_cli(stubs, [])


def test_fresh_account(monkeypatch: pytest.MonkeyPatch) -> None:
    """No region in config: the profile's region is used and said so; each unprepared thing FAILs with its fix."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    code, out, _ = fresh_output()
    rows = rows_of(out)
    assert code == 1
    assert out.startswith("GenNStack preflight: account 444455556666, region us-east-1 (from your AWS profile/environment)")
    # missing bootstrap
    assert rows["cdk-bootstrap"] == (FAIL, "aws://444455556666/us-east-1 is not bootstrapped (no SSM parameter /cdk-bootstrap/hnb659fds/version)")
    assert "  fix: npx cdk bootstrap aws://444455556666/us-east-1\n" in out
    # quota below one node: name, code, value, needed, the request command
    assert rows["quota.g-vt.spot"] == (FAIL, "All G and VT Spot Instance Requests (L-3819A6DF) is 0 vCPUs, below one node (4 vCPUs); "
                                             "the config can launch 384 (g6e spot pool 8 x 48), one node needs 4")
    assert ("fix: aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-3819A6DF "
            "--desired-value 384 --region us-east-1, or lower generations.g6e.max_nodes") in out
    assert "--quota-code L-DB2E81BA --desired-value 384 --region us-east-1, or set generations.g6e.on_demand_fallback: false" in out
    # 5 vCPUs: below the system nodes' minimum (4 x 2)
    assert rows["quota.standard.on-demand"] == (FAIL, "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances "
                                                      "(L-1216C47A) is 5 vCPUs, below 4 system nodes (8 vCPUs); the config can "
                                                      "launch 72 (system node group 4 x 2 + general pool 64), 4 system nodes need 8")
    # us-east-1b is use1-az3 in this account: EKS cannot use it
    assert rows["zones"] == (FAIL, "EKS cannot use us-east-1b (use1-az3) for its control plane; zones: us-east-1a (use1-az6), "
                                   "us-east-1b (use1-az3), us-east-1c (use1-az1) (the first 3 of Fn::GetAZs)")
    assert ("fix: set network.availability_zones: [us-east-1a, us-east-1c, us-east-1d] (zone IDs use1-az6, use1-az1, use1-az2; "
            "needs `region: us-east-1`); no 3 EKS zones offer all of trn2") in out
    # a region without trn2
    assert rows["zones.trn2"] == (FAIL, "trn2 (trn2.48xlarge) offered in none of the chosen zones (not offered in any zone of us-east-1)")
    assert ("fix: reserve trn2.48xlarge (Capacity Block for ML or an On-Demand Capacity Reservation) and list it in "
            "generations.trn2.capacity_reservation_ids; or set generations.trn2.enabled: false") in out
    assert rows["zones.inf2"][0] == WARN and "(not us-east-1b (use1-az3))" in rows["zones.inf2"][1]
    # empty admin list: says what to put, the exact ARN with its IAM Identity Center path
    assert rows["admins"] == (FAIL, "cluster.admin_role_arns is empty: nobody but CDK's kubectl role could use the cluster")
    assert f'fix: add your role: cluster.admin_role_arns: ["{FRESH_ADMIN}"]' in out
    assert rows["lambda-concurrency"][0] == WARN and rows["lambda-concurrency"][1].startswith("10 concurrent executions")
    assert "--service-code lambda --quota-code L-B99A9384 --desired-value 1000 --region us-east-1" in out
    assert rows["spot.trn2"][0] == WARN and rows["spot.inf2"] == (PASS, "inf2.48xlarge $3.7401-3.9120/h (cheapest us-east-1c)")
    assert out.rstrip().endswith("fix each FAIL, then run `gennstack preflight` again before `make deploy`.")


def test_readme_sample_is_what_preflight_prints_for_the_fresh_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    _, out, _ = fresh_output()
    readme = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    sample = re.search(r"```text\n( *GenNStack preflight: .*?)\n *```", readme, re.DOTALL)
    assert sample, "docs/deploy.md lost its `gennstack preflight` sample"
    printed = out.splitlines()
    lines = [line for line in textwrap.dedent(sample.group(1)).splitlines() if line.strip() != "..."]
    assert len(lines) >= 10
    for line in lines:
        assert line in printed, f"README shows {line!r}; the fresh-account fixture prints:\n{out}"


def test_readme_lists_exactly_the_iam_actions_preflight_uses() -> None:
    readme = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    section = readme.split("## Steps", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z0-9-]+:[A-Za-z]+)`", section))
    assert set(preflight_aws.ACTIONS.values()) == listed, sorted(set(preflight_aws.ACTIONS.values()) ^ listed)
    assert all(re.match(r"^[a-z0-9]+:(Get|Describe)", action) for action in preflight_aws.ACTIONS.values())


def test_every_call_the_runs_make_is_a_listed_read_only_action(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stubs = Stubs("us-east-2")
    queue_healthy(stubs, reservations=lambda s: s.add(
        "ec2", "describe_capacity_reservations", event("ec2.describe_capacity_reservations.capacity-block-trn2"),
        {"CapacityReservationIds": ["cr-0a1b2c3d4e5f60718"]}))
    fresh = Stubs("us-east-1")
    queue_fresh(fresh)
    assert set(stubs.operations + fresh.operations) <= set(preflight_aws.ACTIONS)
    assert {"DescribeCapacityReservations", "GetCallerIdentity", "DescribeSpotPriceHistory"} <= set(stubs.operations)


def test_throttled_call_is_reported_not_raised(tmp_path: Path) -> None:
    """DescribeAvailabilityZones throttled (after botocore's retries): zones and spot prices say so, the rest runs."""
    code, out, _ = healthy_run(
        tmp_path,
        zones=lambda s: s.error("ec2", "describe_availability_zones", "RequestLimitExceeded", "Request limit exceeded.", params={}),
        spot=lambda s: None,  # the failed zone lookup is remembered, not repeated
    )
    rows = rows_of(out)
    assert code == 0
    throttled = "could not check: throttled (RequestLimitExceeded from ec2:DescribeAvailabilityZones)"
    assert rows["zones"] == (WARN, throttled) and rows["spot"] == (WARN, throttled)
    assert "fix: run `gennstack preflight` again in a minute" in out
    assert rows["eks-addons"][0] == PASS and rows["admins.you"][0] == PASS


def test_access_denied_names_the_missing_action(tmp_path: Path) -> None:
    denied = ("AccessDeniedException", "User: arn:aws:sts::111122223333:assumed-role/ReadOnly/alice is not authorized "
                                       "to perform: servicequotas:GetServiceQuota")
    code, out, _ = healthy_run(tmp_path, quotas=lambda s: queue_quotas(s, {**HEALTHY_QUOTAS, "L-6B0D517C": denied}, "111122223333"))
    rows = rows_of(out)
    assert code == 0
    assert rows["quota.trn.spot"] == (WARN, "All Trn Spot Instance Requests: could not check: access denied to "
                                            "servicequotas:GetServiceQuota (AccessDeniedException)")
    assert ("fix: allow servicequotas:GetServiceQuota for your role (README: 'Deploying for real' lists the read-only actions)"
            in out)
    assert rows["quota.trn.on-demand"][0] == PASS  # the next quota was still read


def test_ec2_unauthorized_operation_is_access_denied(tmp_path: Path) -> None:
    code, out, _ = healthy_run(
        tmp_path,
        spot=lambda s: s.error("ec2", "describe_spot_price_history", "UnauthorizedOperation",
                               "You are not authorized to perform this operation."),
    )
    assert rows_of(out)["spot"] == (WARN, "could not check: access denied to ec2:DescribeSpotPriceHistory (UnauthorizedOperation)")


def test_missing_addon_build_fails_naming_the_newest(tmp_path: Path) -> None:
    code, out, _ = healthy_run(tmp_path, addons=lambda s: queue_addons(s, {"coredns": "eks.describe_addon_versions.coredns-without-pinned"}))
    assert code == 1
    assert rows_of(out)["eks-addons"] == (FAIL, "not offered for Kubernetes 1.36 in us-east-2: coredns v1.14.7-eksbuild.11")
    assert "fix: pin the newest listed in gennstack/versions.py KUBERNETES['1.36']: \"coredns\": \"v1.14.10-eksbuild.1\"" in out


def _run_with_trn2_capacity_block(tmp_path: Path) -> tuple[int, str, str]:
    """A healthy account whose config lists one scheduled trn2 Capacity Block."""
    return healthy_run(
        tmp_path,
        {"generations": {"trn2": {"capacity_reservation_ids": ["cr-0a1b2c3d4e5f60718"]}}},
        reservations=lambda s: s.add("ec2", "describe_capacity_reservations",
                                     event("ec2.describe_capacity_reservations.capacity-block-trn2"),
                                     {"CapacityReservationIds": ["cr-0a1b2c3d4e5f60718"]}),
    )


def test_scheduled_capacity_block_warns_with_its_start(tmp_path: Path) -> None:
    code, out, _ = _run_with_trn2_capacity_block(tmp_path)
    assert code == 0
    assert rows_of(out)["reservation.cr-0a1b2c3d4e5f60718"] == (
        WARN, "trn2: cr-0a1b2c3d4e5f60718 (capacity-block, 1 x trn2.48xlarge in us-east-2c) is scheduled: usable from 2026-11-10 11:30 UTC")


def test_reserved_pool_counts_on_the_on_demand_quota(tmp_path: Path) -> None:
    """The ``trn2-reserved`` NodePool launches into the reservation, which EC2 holds out of the
    On-Demand quota (EC2 User Guide, "Create a Capacity Reservation": a request fails when "the
    requested quantity exceeds your On-Demand Instance limit for the selected instance family"), so
    the reserved and on-demand pools add up on Running On-Demand Trn instances: 384 covered the
    on-demand pool alone, not both."""
    code, out, _ = _run_with_trn2_capacity_block(tmp_path)
    assert code == 0
    assert rows_of(out)["quota.trn.on-demand"] == (
        WARN, "Running On-Demand Trn instances (L-2C3B7624) is 384 vCPUs; the config can launch 768 "
              "(trn2 reserved pool 2 x 192 + trn2 on-demand pool 2 x 192), one node needs 192")
    # the reserved pool alone fits 384: dropping the fallback is a way out
    assert ("--quota-code L-2C3B7624 --desired-value 768 --region us-east-2, "
            "or set generations.trn2.on_demand_fallback: false") in out


def test_reserved_pool_without_fallback_still_uses_the_on_demand_quota() -> None:
    system = {"m7i.large": 2, "m6i.large": 2, "m7a.large": 2}
    config = config_of({"generations": {"trn2": {"capacity_reservation_ids": ["cr-0a1b2c3d4e5f60718"], "on_demand_fallback": False}}})
    [need] = [n for n in capacity.vcpu_needs(config, system) if (n.quota_class, n.purchase) == ("trn", "on-demand")]
    assert [(n.what, n.max_vcpus, n.min_vcpus) for n in need.needs] == [("trn2 reserved pool", 2 * 192, 192)]
    row = checks.quota_row(context(Stubs()), need, 0.0)
    assert row.status == FAIL and row.summary == (
        "Running On-Demand Trn instances (L-2C3B7624) is 0 vCPUs, below one node (192 vCPUs); "
        "the config can launch 384 (trn2 reserved pool 2 x 192), one node needs 192")
    # no fallback to drop: the way out is fewer nodes
    assert row.fix.endswith("--desired-value 384 --region us-east-2, or lower generations.trn2.max_nodes")
    both = capacity.vcpu_needs(config_of({"generations": {"trn2": {"capacity_reservation_ids": ["cr-0a1b2c3d4e5f60718"]}}}), system)
    [need] = [n for n in both if (n.quota_class, n.purchase) == ("trn", "on-demand")]
    assert checks.quota_row(context(Stubs()), need, 200.0).fix.endswith(", or lower generations.trn2.max_nodes")


def test_credentials_failure_stops_the_run(tmp_path: Path) -> None:
    stubs = Stubs("us-east-2")
    stubs.error("sts", "get_caller_identity", "ExpiredToken", "The security token included in the request is expired", 403)
    code, out, _ = run_cli(stubs, ["--config", write_config(tmp_path, HEALTHY_CONFIG)])
    assert code == 1
    assert rows_of(out) == {"credentials": (FAIL, "could not check: the credentials were rejected "
                                                  "(ExpiredToken: The security token included in the request is expired)")}
    assert "fix: refresh them (`aws sso login --profile NAME`, or new access keys) and run again" in out


def test_config_error_exits_2_with_the_message(tmp_path: Path) -> None:
    stubs = Stubs("us-east-2")
    code, out, err = run_cli(stubs, ["--config", write_config(tmp_path, {"network": {"nat_gateways": 4}})])
    assert (code, out) == (2, "")
    assert "gennstack preflight: GenNStack config is invalid:\n  network.nat_gateways: got 4; allowed: at most az_count (3)" in err


def test_missing_cdk_json_exits_2(tmp_path: Path) -> None:
    from gennstack.cli import build_parser

    args = build_parser().parse_args(["preflight", "--cdk-json", str(tmp_path / "cdk.json")])
    err = io.StringIO()
    assert run(args, stdout=io.StringIO(), stderr=err) == 2
    assert "cdk.json not found" in err.getvalue()


def test_unknown_profile_is_a_credentials_fail(tmp_path: Path) -> None:
    from gennstack.cli import build_parser

    args = build_parser().parse_args(["preflight", "--cdk-json", str(ROOT / "cdk.json"), "--profile", "nope", "--region", "us-east-2"])
    out = io.StringIO()
    assert run(args, stdout=out, stderr=io.StringIO()) == 1
    assert rows_of(out.getvalue())["credentials"] == (FAIL, "cannot use AWS profile 'nope': The config profile (nope) could not be found")


def test_no_region_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    stubs = Stubs("us-east-2")
    code, out, _ = run_cli(stubs, [])
    assert code == 1 and rows_of(out)["credentials"][1] == "no region: none in config, --region or your AWS profile/environment"


def test_the_no_region_fix_names_the_variable_boto3_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore reads the region from AWS_DEFAULT_REGION only (``configprovider.py``
    BOTOCORE_DEFAULT_SESSION_VARIABLES ``'region': ('region', 'AWS_DEFAULT_REGION', None, None)``):
    with AWS_REGION alone, the session has no region, so the fix must not say AWS_REGION."""
    import boto3

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "us-east-2")
    assert boto3.Session().region_name is None
    code, out, _ = run_cli(Stubs("us-east-2"), [])
    assert code == 1 and "no region" in rows_of(out)["credentials"][1]
    assert "fix: set `region` in config, pass --region REGION, or export AWS_DEFAULT_REGION" in out
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-2")
    assert boto3.Session().region_name == "us-east-2"


def test_read_config_merges_the_file_like_the_synth(tmp_path: Path) -> None:
    from gennstack_infra.app import build_app  # noqa: F401  (the synth's reader; the preflight must not import app.py)

    config = read_config(ROOT / "cdk.json", write_config(tmp_path, {"region": "eu-west-1", "generations": {"trn2": {"enabled": False}}}))
    assert config.region == "eu-west-1" and not config.generations.trn2.enabled and config.generations.inf2.enabled
    assert config.cluster.system_node_instance_types == ("m7i.large", "m6i.large", "m7a.large")  # from cdk.json


def test_region_resolution_order() -> None:
    config = config_of({"region": "eu-west-1"})
    assert resolve_region("us-west-2", config, "ap-south-1") == ("us-west-2", "--region")
    assert resolve_region(None, config, "ap-south-1") == ("eu-west-1", "config")
    assert resolve_region(None, config_of({}), "ap-south-1") == ("ap-south-1", "your AWS profile/environment")


# ---- the checks one by one -----------------------------------------------------------------------


def test_credentials_account_mismatch() -> None:
    stubs = Stubs()
    stubs.add("sts", "get_caller_identity", event("sts.get_caller_identity.sso-us-east-2"), {})
    ctx = context(stubs, {"account": "999988887777", "region": "us-east-2"})
    [row] = checks.check_credentials(ctx)
    assert row.status == FAIL and row.summary.startswith("config account is 999988887777, but the credentials are for 111122223333")
    assert row.fix == 'use credentials for account 999988887777 (--profile), or set `account: "111122223333"`'


def test_bootstrap_too_old() -> None:
    stubs = Stubs()
    response = event("ssm.get_parameter.cdk-bootstrap-version")
    response["Parameter"]["Value"] = "5"
    stubs.add("ssm", "get_parameter", response, {"Name": checks.BOOTSTRAP_PARAMETER})
    [row] = checks.check_bootstrap(context(stubs, account="111122223333"))
    assert row == Result("cdk-bootstrap", FAIL, "bootstrap version 5 is older than the 6 the template requires",
                         "npx cdk bootstrap aws://111122223333/us-east-2 (upgrades the CDKToolkit stack)")


def test_bootstrap_version_matches_the_template_rule(synth: Synth) -> None:
    """The constant is what the synthesized template's CheckBootstrapVersion rule requires (it lists the
    versions it rejects), read from the same SSM parameter the BootstrapVersion parameter names."""
    template = synth.template
    assert template["Parameters"]["BootstrapVersion"]["Default"] == checks.BOOTSTRAP_PARAMETER
    [assertion] = template["Rules"]["CheckBootstrapVersion"]["Assertions"]
    rejected = assertion["Assert"]["Fn::Not"][0]["Fn::Contains"][0]
    assert [int(v) for v in rejected] == list(range(1, checks.REQUIRED_BOOTSTRAP_VERSION))
    assert f"version {checks.REQUIRED_BOOTSTRAP_VERSION} required" in assertion["AssertDescription"]
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    required = [a["properties"].get("requiresBootstrapStackVersion", 0) for a in manifest["artifacts"].values()
                if "properties" in a]
    assert max(required) <= checks.REQUIRED_BOOTSTRAP_VERSION


def test_quota_codes_are_the_service_quotas_names() -> None:
    """gruntwork-io/terraform-aws-utilities docs/quotas.md @ 04f58839c5610804899dfcd815df374aea681ffd
    (a ListAWSDefaultServiceQuotas dump, service code ec2): these codes carry these names."""
    assert {(c, p): (q.code, q.name) for (c, p), q in capacity.QUOTAS.items()} == {
        ("standard", "on-demand"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
        ("standard", "spot"): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
        ("g-vt", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
        ("g-vt", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
        ("inf", "on-demand"): ("L-1945791B", "Running On-Demand Inf instances"),
        ("inf", "spot"): ("L-B5D1601B", "All Inf Spot Instance Requests"),
        ("trn", "on-demand"): ("L-2C3B7624", "Running On-Demand Trn instances"),
        ("trn", "spot"): ("L-6B0D517C", "All Trn Spot Instance Requests"),
    }
    assert checks.LAMBDA_CONCURRENCY_QUOTA == "L-B99A9384"  # same dump: AWS Lambda, "Concurrent executions"
    recorded = event("service-quotas.get_service_quota.ec2")
    assert {code: r["Quota"]["QuotaName"] for code, r in recorded.items()} == {q.code: q.name for q in capacity.QUOTAS.values()}


def test_vcpu_needs_of_the_default_config() -> None:
    needs = {(n.quota_class, n.purchase): (n.max_vcpus, n.min_vcpus) for n in capacity.vcpu_needs(
        config_of({}), {"m7i.large": 2, "m6i.large": 2, "m7a.large": 2})}
    assert needs == {
        ("standard", "on-demand"): (4 * 2 + 64, 4 * 2), ("standard", "spot"): (64, 0),
        ("inf", "spot"): (4 * 192, 192), ("inf", "on-demand"): (4 * 192, 192),
        ("trn", "spot"): (2 * 192, 192), ("trn", "on-demand"): (2 * 192, 192),
        ("g-vt", "spot"): (8 * 48, 4), ("g-vt", "on-demand"): (8 * 48, 4),
    }
    no_fallback = capacity.vcpu_needs(config_of({"generations": {"g6e": {"on_demand_fallback": False}, "trn2": {"enabled": False}}}),
                                      {"m7i.large": 2, "m6i.large": 2, "m7a.large": 2})
    assert [(n.quota_class, n.purchase) for n in no_fallback] == [
        ("standard", "on-demand"), ("standard", "spot"), ("inf", "spot"), ("inf", "on-demand"), ("g-vt", "spot")]


@pytest.mark.parametrize(("value", "status", "text"), [
    (384.0, PASS, "is 384 vCPUs; the config can launch 384"),
    (100.0, WARN, "is 100 vCPUs: fits 2 of 8 48-vCPU nodes; the config can launch 384"),
    (4.0, WARN, "is 4 vCPUs: fits 0 of 8 48-vCPU nodes;"),
    (3.0, FAIL, "is 3 vCPUs, below one node (4 vCPUs); the config can launch 384 (g6e spot pool 8 x 48), one node needs 4"),
])
def test_quota_row_thresholds(value: float, status: str, text: str) -> None:
    need = next(n for n in capacity.vcpu_needs(config_of({}), {"m7i.large": 2, "m6i.large": 2, "m7a.large": 2})
                if (n.quota_class, n.purchase) == ("g-vt", "spot"))
    row = checks.quota_row(context(Stubs()), need, value)
    assert row.status == status and text in row.summary and row.id == "quota.g-vt.spot"


def test_quota_falls_back_to_the_aws_default_then_says_unknown() -> None:
    stubs = Stubs()
    params = {"ServiceCode": "ec2", "QuotaCode": "L-6B0D517C"}
    stubs.error("service-quotas", "get_service_quota", "NoSuchResourceException", "The request failed because the specified service quota does not exist.", params=params)
    stubs.add("service-quotas", "get_aws_default_service_quota", quota_response("L-6B0D517C", 0.0, "us-east-2", ""), params)
    stubs.error("service-quotas", "get_service_quota", "NoSuchResourceException", "no such quota", params=params)
    stubs.error("service-quotas", "get_aws_default_service_quota", "NoSuchResourceException", "no such quota", params=params)
    ctx = context(stubs)
    assert checks.quota_value(ctx, "L-6B0D517C") == 0.0
    assert checks.quota_value(ctx, "L-6B0D517C") is None
    stubs.assert_done([])


def test_unknown_system_instance_type_fails() -> None:
    stubs = Stubs()
    stubs.error("ec2", "describe_instance_types", "InvalidInstanceType",
                "The following supplied instance types do not exist: [m7i.large]")
    [row] = checks.check_quotas(context(stubs))
    assert row.status == FAIL and row.id == "quota.system-types" and "[m7i.large]" in row.summary


def test_get_azs_follows_default_subnets() -> None:
    region = zones.region_zones(event("ec2.describe_availability_zones.us-east-1")["AvailabilityZones"])
    assert [z.name for z in zones.get_azs(region, {"us-east-1d", "us-east-1a"})] == ["us-east-1a", "us-east-1d"]
    assert [z.name for z in zones.get_azs(region, set())] == [f"us-east-1{x}" for x in "abcdef"]


def test_region_zones_skips_local_zones() -> None:
    listed = event("ec2.describe_availability_zones.us-east-2")["AvailabilityZones"]
    local = {**listed[0], "ZoneName": "us-east-1-chi-2a", "ZoneId": "use1-chi2-az1", "ZoneType": "local-zone"}
    assert [z.zone_id for z in zones.region_zones([*listed, local])] == ["use2-az1", "use2-az2", "use2-az3"]


def test_eks_disallowed_zones_pinned() -> None:
    """awsdocs/amazon-eks-user-guide latest/ug/networking/network-reqs.adoc @ 101184ecc138f7f661b484f2cabac7022b726a6b."""
    assert zones.EKS_DISALLOWED_ZONE_IDS == {
        "us-east-1": {"use1-az3"}, "us-west-1": {"usw1-az2"}, "ca-central-1": {"cac1-az3"}}


def test_suggest_zones_keeps_a_zone_for_a_rare_type() -> None:
    region = [zones.Zone(f"us-east-2{x}", f"use2-az{i}") for i, x in enumerate("abcd", 1)]
    offerings = {"g6e.xlarge": {"use2-az1", "use2-az2", "use2-az3"}, "trn2.48xlarge": {"use2-az4"}, "m7i.large": {"use2-az1", "use2-az2", "use2-az3", "use2-az4"}}
    groups = {"system": ("m7i.large",), "trn2": ("trn2.48xlarge",), "g6e": ("g6e.xlarge",)}
    chosen, lacking = zones.suggest_zones("us-east-2", region, groups, offerings, 3)
    assert [z.name for z in chosen] == ["us-east-2a", "us-east-2b", "us-east-2d"] and lacking == ["trn2", "g6e"]
    assert zones.config_line(chosen) == "network.availability_zones: [us-east-2a, us-east-2b, us-east-2d]"


def test_configured_zone_names_that_do_not_exist_fail() -> None:
    stubs = Stubs()
    stubs.add("ec2", "describe_availability_zones", event("ec2.describe_availability_zones.us-east-2"), {})
    stubs.add("ec2", "describe_instance_type_offerings", event("ec2.describe_instance_type_offerings.us-east-2"))
    ctx = context(stubs, {"region": "us-east-2", "network": {"availability_zones": ["us-east-2a", "us-east-2b", "us-east-2d"]}})
    rows = checks.check_zones(ctx)
    assert rows[0].status == FAIL and "us-east-2d" in rows[0].summary
    assert rows[0].fix.startswith("set network.availability_zones: [us-east-2a, us-east-2b, us-east-2c]")


def test_lambda_concurrency_below_100_warns() -> None:
    stubs = Stubs()
    stubs.add("lambda", "get_account_settings", event("lambda.get_account_settings.new-account"), {})
    [row] = checks.check_lambda(context(stubs))
    assert row.status == WARN and row.fix.endswith("--quota-code L-B99A9384 --desired-value 1000 --region us-east-2")


CALLER = "arn:aws:sts::111122223333:assumed-role/AWSReservedSSO_AdministratorAccess_0123456789abcdef/alice@example.com"


def test_admin_role_missing_fails_and_caller_not_admin_warns() -> None:
    stubs = Stubs()
    stubs.error("iam", "get_role", "NoSuchEntity", "The role with name platform-admins cannot be found.", 404,
                params={"RoleName": "platform-admins"})
    stubs.add("iam", "get_role", event("iam.get_role.sso-admin-us-east-2"), {"RoleName": "AWSReservedSSO_AdministratorAccess_0123456789abcdef"})
    ctx = context(stubs, {"cluster": {"admin_role_arns": ["arn:aws:iam::111122223333:role/platform-admins"]}},
                  account="111122223333", caller=CALLER)
    missing, you = checks.check_admins(ctx)
    assert missing.status == FAIL and missing.summary == (
        "arn:aws:iam::111122223333:role/platform-admins: no role platform-admins in account 111122223333")
    assert you.status == WARN and you.summary.endswith("you will not be able to run kubectl")
    assert you.fix == f'add "{HEALTHY_ADMIN}" to cluster.admin_role_arns, or use one of its roles'


def test_admin_arn_without_the_sso_path_fails_with_the_exact_arn() -> None:
    """EKS access entries take role ARNs with their path (awsdocs/amazon-eks-user-guide
    latest/ug/manage-access/k8s-access/creating-access-entries.adoc @ 1b1d3dfc05c983f1df2fa0cb7cc1a1cb76d0fe3d):
    the ARN to list is the role's own, aws-reserved/sso.amazonaws.com/REGION/ included."""
    stubs = Stubs()
    stubs.add("iam", "get_role", event("iam.get_role.sso-admin-us-east-2"), {"RoleName": "AWSReservedSSO_AdministratorAccess_0123456789abcdef"})
    short = "arn:aws:iam::111122223333:role/AWSReservedSSO_AdministratorAccess_0123456789abcdef"
    ctx = context(stubs, {"cluster": {"admin_role_arns": [short]}}, account="111122223333", caller=CALLER)
    wrong, you = checks.check_admins(ctx)
    assert wrong == Result("admins.1", FAIL,
                           f"{short}: the role's ARN is {HEALTHY_ADMIN}",
                           f"list {HEALTHY_ADMIN} in cluster.admin_role_arns (the exact ARN, path included)")
    assert you.status == PASS


def test_admin_in_another_account_and_iam_user_caller() -> None:
    ctx = context(Stubs(), {"cluster": {"admin_role_arns": ["arn:aws:iam::999988887777:role/ops"]}},
                  account="111122223333", caller="arn:aws:iam::111122223333:user/ci")
    other, you = checks.check_admins(ctx)
    assert other.status == WARN and "not checked" in other.summary
    assert you.status == WARN and you.summary.startswith("you are arn:aws:iam::111122223333:user/ci, not an assumed role")


def test_spot_prices_paginate_and_warn_without_spot() -> None:
    stubs = Stubs()
    stubs.add("ec2", "describe_availability_zones", event("ec2.describe_availability_zones.us-east-2"), {})
    stubs.add("ec2", "describe_subnets", event("ec2.describe_subnets.default-us-east-2"))
    history = event("ec2.describe_spot_price_history.us-east-2")["SpotPriceHistory"]
    priced = [h for h in history if not h["InstanceType"].startswith("trn2")]
    stubs.add("ec2", "describe_spot_price_history", {"NextToken": "page-2", "SpotPriceHistory": priced[:10]})
    stubs.add("ec2", "describe_spot_price_history", {"NextToken": "", "SpotPriceHistory": priced[10:]},
              {"InstanceTypes": GEN_TYPES, "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW,
               "Filters": [{"Name": "availability-zone", "Values": ["us-east-2a", "us-east-2b", "us-east-2c"]}],
               "NextToken": "page-2"})
    rows = {row.id: row for row in checks.check_spot_prices(context(stubs))}
    assert rows["spot.inf2"].summary == "inf2.48xlarge $3.2988-3.6650/h (cheapest us-east-2c)"
    assert rows["spot.trn2"].status == WARN
    assert rows["spot.trn2"].summary == "no spot price for trn2.48xlarge in the chosen zones: spot is not offered there"
    stubs.assert_done(list(rows.values()))


def _reservation(**changes: Any) -> dict[str, Any]:
    return {**event("ec2.describe_capacity_reservations.capacity-block-trn2")["CapacityReservations"][0], **changes}


@pytest.mark.parametrize(("changes", "status", "text"), [
    ({"State": "active"}, PASS, "is active"),
    ({"State": "expired"}, FAIL, "is expired, not active"),
    ({"State": "active", "InstanceType": "trn1.32xlarge"}, FAIL, "is not one of generations.trn2.instance_types ['trn2.48xlarge']"),
    ({"State": "active", "AvailabilityZone": "us-east-2d", "AvailabilityZoneId": "use2-az4"}, FAIL, "is outside the chosen zones"),
])
def test_reservation_rows(changes: dict[str, Any], status: str, text: str) -> None:
    ctx = context(Stubs(), account="111122223333")
    chosen = [zones.Zone(f"us-east-2{x}", f"use2-az{i}") for i, x in enumerate("abc", 1)]
    row = checks.reservation_row(ctx, "trn2", "cr-0a1b2c3d4e5f60718", _reservation(**changes), chosen)
    assert row.status == status and text in row.summary


def test_reservation_that_does_not_exist_fails() -> None:
    stubs = Stubs()
    stubs.add("ec2", "describe_availability_zones", event("ec2.describe_availability_zones.us-east-2"), {})
    stubs.add("ec2", "describe_subnets", event("ec2.describe_subnets.default-us-east-2"))
    stubs.error("ec2", "describe_capacity_reservations", "InvalidCapacityReservationId.NotFound",
                "The capacity reservation ID 'cr-0123456789abcdef0' does not exist", params={"CapacityReservationIds": ["cr-0123456789abcdef0"]})
    ctx = context(stubs, {"generations": {"trn2": {"capacity_reservation_ids": ["cr-0123456789abcdef0"]}}}, account="111122223333")
    [row] = checks.check_reservations(ctx)
    assert row == Result("reservation.cr-0123456789abcdef0", FAIL, "trn2: cr-0123456789abcdef0 does not exist in aws://111122223333/us-east-2",
                         "remove it from generations.trn2.capacity_reservation_ids")


def test_trn2_with_a_reservation_is_not_an_offering_failure() -> None:
    stubs = Stubs("us-east-1")
    queue_zones(stubs)
    ctx = context(stubs, {"generations": {"trn2": {"capacity_reservation_ids": ["cr-0a1b2c3d4e5f60718"]}}}, region="us-east-1")
    rows = {row.id: row for row in checks.check_zones(ctx)}
    assert rows["zones.trn2"].status == WARN and "only through its capacity reservations" in rows["zones.trn2"].summary


# ---- errors and retries: botocore's behaviour, for real ------------------------------------------


def test_throttling_codes_are_botocores() -> None:
    """botocore/retries/standard.py (botocore 1.44.8), ThrottledRetryableChecker._THROTTLED_ERROR_CODES."""
    from botocore.retries.standard import ThrottledRetryableChecker

    assert preflight_aws.THROTTLING_CODES == frozenset(ThrottledRetryableChecker._THROTTLED_ERROR_CODES)


class _ThrottlingSSM(BaseHTTPRequestHandler):
    """A local SSM endpoint (JSON protocol): throttles the first ``throttle`` requests, then answers."""

    throttle = 0
    seen = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen += 1
        if type(self).seen <= type(self).throttle:
            body, status = {"__type": "ThrottlingException", "message": "Rate exceeded"}, 400
        else:
            body, status = event("ssm.get_parameter.cdk-bootstrap-version"), 200
            body["Parameter"]["LastModifiedDate"] = 1778490847.312
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("throttle", "status"), [(2, PASS), (3, WARN)])
def test_standard_retries_then_throttled_warning(monkeypatch: pytest.MonkeyPatch, throttle: int, status: str) -> None:
    """Real botocore clients from ``session_clients`` against a local endpoint: standard-mode retries
    absorb two throttles; a third exhausts them and the check reports it."""
    handler = type("Handler", (_ThrottlingSSM,), {"throttle": throttle, "seen": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSM", f"http://127.0.0.1:{server.server_address[1]}")
        clients = preflight_aws.session_clients(boto3.Session(), "us-east-2", max_attempts=3)
        assert clients("ssm").meta.config.retries == {"mode": "standard", "total_max_attempts": 3}
        ctx = Context(config=config_of({}), region="us-east-2", region_source="config", clients=clients, now=NOW, account="111122223333")
        rows = [row for row in run_only(ctx, "cdk-bootstrap")]
    finally:
        server.shutdown()
    assert handler.seen == 3
    assert rows[0].status == status
    if status == WARN:
        assert rows[0].summary == "could not check: throttled (ThrottlingException from ssm:GetParameter, after 3 attempts)"


def run_only(ctx: Context, check_id: str) -> list[Result]:
    """One check through the runner's error handling."""
    return run_preflight(ctx, checks=[c for c in checks.CHECKS if c[0] == check_id])


def test_default_clients_use_standard_retries() -> None:
    clients = preflight_aws.session_clients(boto3.Session(), "us-east-2")
    assert clients("ec2").meta.config.retries == {"mode": "standard", "total_max_attempts": preflight_aws.MAX_ATTEMPTS}
    assert clients("ec2") is clients("ec2") and clients("ec2").meta.region_name == "us-east-2"


def test_result_rows_need_a_fix_unless_they_pass() -> None:
    with pytest.raises(ValueError, match="needs a fix"):
        Result("x", WARN, "something")
    with pytest.raises(ValueError, match="status must be one of"):
        Result("x", "OK", "something")


def test_table_layout() -> None:
    text = table([Result("credentials", PASS, "ok"), Result("quota.trn.spot", FAIL, "too low", "ask for more")],
                 account="111122223333", region="us-east-2", region_source="--region")
    assert text.splitlines() == [
        "GenNStack preflight: account 111122223333, region us-east-2 (from --region)",
        "STATUS  CHECK           RESULT",
        "PASS    credentials     ok",
        "FAIL    quota.trn.spot  too low",
        "                        fix: ask for more",
        "1 PASS, 0 WARN, 1 FAIL: fix each FAIL, then run `gennstack preflight` again before `make deploy`.",
    ]


def test_an_unstubbed_call_is_caught_by_the_guard() -> None:
    """The runner turns BotoCoreErrors into rows; Stubber's errors are BotoCoreErrors, so the tests'
    guard (no row mentions a Stub error) is what catches a call nobody queued."""
    stubs = Stubs()
    results = run_preflight(context(stubs))
    assert "UnStubbedResponseError" in results[0].summary
    with pytest.raises(AssertionError):
        stubs.assert_done(results)
