"""The preflight checks, each a function of a :class:`Context` that returns result rows.

Checks run in :data:`CHECKS` order; facts several checks need (zones, offerings) are fetched once
through :meth:`Context.memo`, which also remembers a failed call so it is not repeated. An AWS error
stops only the check it happened in: the runner turns it into a WARN ("could not check: ...")
naming the IAM action or the throttling, or a FAIL for the credentials check, after which nothing
else can run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from gennstack.config import GenNStackConfig
from gennstack.deploy_warnings import FIND_YOUR_ROLE
from gennstack.preflight.aws import ClientFactory, describe_error, error_code
from gennstack.preflight.capacity import QuotaNeed, vcpu_needs
from gennstack.preflight.results import FAIL, PASS, WARN, Result
from gennstack.preflight.zones import (
    Zone,
    config_line,
    describe,
    eks_supported,
    get_azs,
    offered_in,
    region_zones,
    suggest_zones,
)

# What the CDK CLI and the template's BootstrapVersion parameter read (default qualifier).
BOOTSTRAP_PARAMETER = "/cdk-bootstrap/hnb659fds/version"
# The version the synthesized template's CheckBootstrapVersion rule requires (it rejects 1-5);
# tests/test_preflight.py reads the rule from a synthesized template and asserts this matches.
REQUIRED_BOOTSTRAP_VERSION = 6
# Below this, Lambda throttles CloudFormation's custom resources (CDK's kubectl provider runs one
# invocation per manifest and chart) and the interruption handler: AWS Lambda quota
# "Concurrent executions", code L-B99A9384 (same Service Quotas dump as capacity.QUOTAS; the Lambda
# quotas page: "New AWS accounts have reduced concurrency and memory quotas").
LAMBDA_CONCURRENCY_QUOTA = "L-B99A9384"
MIN_LAMBDA_CONCURRENCY = 100
SPOT_PRODUCT = "Linux/UNIX"


@dataclass
class Context:
    """What the checks share: the config, where to look, the AWS clients and what was learned."""

    config: GenNStackConfig
    region: str | None
    region_source: str  # "--region", "config" or "your AWS profile/environment"
    clients: ClientFactory
    now: datetime
    account: str | None = None
    caller_arn: str | None = None
    _memo: dict[str, tuple[bool, Any]] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        return self.clients(service)

    def memo(self, key: str, fetch: Callable[[], Any]) -> Any:
        """``fetch()`` once; a failure is remembered and raised again to later callers."""
        if key not in self._memo:
            try:
                self._memo[key] = (True, fetch())
            except (ClientError, BotoCoreError) as exc:
                self._memo[key] = (False, exc)
        ok, value = self._memo[key]
        if not ok:
            raise value
        return value

    @property
    def where(self) -> str:
        return f"aws://{self.account}/{self.region}"


def _paginate(client: Any, operation: str, key: str, **params: Any) -> list[Any]:
    items: list[Any] = []
    for page in client.get_paginator(operation).paginate(**params):
        items.extend(page.get(key, []))
    return items


def _generation_types(config: GenNStackConfig) -> dict[str, tuple[str, ...]]:
    return {name: gen.instance_types for name, gen in config.generations.enabled().items()}


# ---- facts shared by several checks -------------------------------------------------------------


@dataclass(frozen=True)
class ZoneFacts:
    zones: list[Zone]  # the region's Availability Zones
    chosen: list[Zone]  # the ones the stack will use
    source: str  # how they were chosen
    unknown_names: list[str]  # configured names the account does not have


def zone_facts(ctx: Context) -> ZoneFacts:
    def fetch() -> ZoneFacts:
        ec2 = ctx.client("ec2")
        zones = region_zones(ec2.describe_availability_zones()["AvailabilityZones"])
        names = ctx.config.network.availability_zones
        if names is not None:
            by_name = {zone.name: zone for zone in zones}
            chosen = [by_name[name] for name in names if name in by_name]
            unknown = [name for name in names if name not in by_name]
            return ZoneFacts(zones, chosen, "network.availability_zones", unknown)
        subnets = _paginate(ec2, "describe_subnets", "Subnets", Filters=[{"Name": "default-for-az", "Values": ["true"]}])
        count = ctx.config.network.az_count
        get_azs_zones = get_azs(zones, {subnet["AvailabilityZone"] for subnet in subnets})
        return ZoneFacts(zones, get_azs_zones[:count], f"the first {count} of Fn::GetAZs", [])

    return ctx.memo("zones", fetch)


def type_offerings(ctx: Context) -> dict[str, set[str]]:
    """Instance type -> IDs of the region's zones that offer it, for every configured type."""

    def fetch() -> dict[str, set[str]]:
        types = sorted({t for types in _generation_types(ctx.config).values() for t in types}
                       | set(ctx.config.cluster.system_node_instance_types))
        offerings = _paginate(
            ctx.client("ec2"),
            "describe_instance_type_offerings",
            "InstanceTypeOfferings",
            LocationType="availability-zone-id",
            Filters=[{"Name": "instance-type", "Values": types}],
        )
        out: dict[str, set[str]] = {t: set() for t in types}
        for offering in offerings:
            out.setdefault(offering["InstanceType"], set()).add(offering["Location"])
        return out

    return ctx.memo("offerings", fetch)


def system_type_vcpus(ctx: Context) -> dict[str, int]:
    def fetch() -> dict[str, int]:
        types = list(ctx.config.cluster.system_node_instance_types)
        described = _paginate(ctx.client("ec2"), "describe_instance_types", "InstanceTypes", InstanceTypes=types)
        return {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in described}

    return ctx.memo("system-vcpus", fetch)


# ---- 1. credentials and region ------------------------------------------------------------------


def check_credentials(ctx: Context) -> list[Result]:
    """Whose credentials, which account and region; a config ``account`` must match."""
    if not ctx.region:
        return [Result("credentials", FAIL, "no region: none in config, --region or your AWS profile/environment",
                       # boto3 reads AWS_DEFAULT_REGION, not AWS_REGION (botocore configprovider.py)
                       "set `region` in config, pass --region REGION, or export AWS_DEFAULT_REGION")]
    try:
        identity = ctx.client("sts").get_caller_identity()
    except NoCredentialsError:
        return [Result("credentials", FAIL, "no AWS credentials found",
                       "log in (`aws sso login --profile NAME`) and pass --profile NAME, or export AWS_PROFILE")]
    ctx.account, ctx.caller_arn = identity["Account"], identity["Arn"]
    where = f"{ctx.caller_arn} in account {ctx.account}; region {ctx.region} (from {ctx.region_source})"
    wanted = ctx.config.account
    if wanted and wanted != ctx.account:
        return [Result("credentials", FAIL, f"config account is {wanted}, but the credentials are for {ctx.account}: {where}",
                       f"use credentials for account {wanted} (--profile), or set `account: \"{ctx.account}\"`")]
    return [Result("credentials", PASS, where)]


# ---- 2. CDK bootstrap ---------------------------------------------------------------------------


def check_bootstrap(ctx: Context) -> list[Result]:
    """The CDK bootstrap stack's version parameter, at least what the template requires."""
    fix = f"npx cdk bootstrap {ctx.where}"
    try:
        value = ctx.client("ssm").get_parameter(Name=BOOTSTRAP_PARAMETER)["Parameter"]["Value"]
    except ClientError as exc:
        if error_code(exc) != "ParameterNotFound":
            raise
        return [Result("cdk-bootstrap", FAIL, f"{ctx.where} is not bootstrapped (no SSM parameter {BOOTSTRAP_PARAMETER})", fix)]
    if not value.isdigit():
        return [Result("cdk-bootstrap", FAIL, f"{BOOTSTRAP_PARAMETER} is {value!r}, not a version number", fix)]
    if int(value) < REQUIRED_BOOTSTRAP_VERSION:
        return [Result("cdk-bootstrap", FAIL,
                       f"bootstrap version {value} is older than the {REQUIRED_BOOTSTRAP_VERSION} the template requires",
                       f"{fix} (upgrades the CDKToolkit stack)")]
    return [Result("cdk-bootstrap", PASS, f"version {value} (the template requires >= {REQUIRED_BOOTSTRAP_VERSION})")]


# ---- 3. EC2 vCPU quotas -------------------------------------------------------------------------


def quota_value(ctx: Context, code: str) -> float | None:
    """The applied value of EC2 quota ``code``, else its AWS default; None if the region has neither."""
    quotas = ctx.client("service-quotas")
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if error_code(exc) != "NoSuchResourceException":
            raise
    try:
        return float(quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if error_code(exc) != "NoSuchResourceException":
            raise
    return None


def _needs_text(need: QuotaNeed) -> str:
    parts = [f"{n.what} {n.max_nodes} x {n.node_vcpus}" if n.max_nodes else f"{n.what} {n.max_vcpus}" for n in need.needs]
    return " + ".join(parts)


def quota_row(ctx: Context, need: QuotaNeed, value: float | None) -> Result:
    """PASS when the quota covers everything the config can launch, WARN when at least one node, else FAIL."""
    quota, row_id = need.quota, f"quota.{need.quota_class}.{need.purchase}"
    label = f"{quota.name} ({quota.code})"
    request = (f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {quota.code} "
               f"--desired-value {need.max_vcpus} --region {ctx.region}")
    if need.max_vcpus == 0:
        return Result(row_id, PASS, f"{label}: not used by this config")
    if value is None:
        return Result(row_id, WARN, f"{label}: Service Quotas knows no such quota in {ctx.region}",
                      f"check the EC2 limits page of the console for {ctx.region}")
    have = f"{label} is {value:g} vCPUs"
    wants = f"the config can launch {need.max_vcpus} ({_needs_text(need)})"
    if need.min_vcpus:
        wants += f", {need.min_what} need {need.min_vcpus}" if need.min_what != "one node" else f", one node needs {need.min_vcpus}"
    if value >= need.max_vcpus:
        return Result(row_id, PASS, f"{have}; {wants}")
    alternative = ""
    pools = [n for n in need.needs if n.what.endswith(" pool") and n.what != "general pool"]
    if pools:
        gen = pools[0].what.split()[0]
        # The reserved pool (capacity_reservation_ids) also uses the on-demand quota: dropping the
        # fallback is a way out only when the reserved pool alone fits.
        fallback = next((n for n in pools if n.what == f"{gen} on-demand pool"), None)
        alternative = (f", or set generations.{gen}.on_demand_fallback: false"
                       if need.purchase == "on-demand" and fallback and value >= need.max_vcpus - fallback.max_vcpus
                       else f", or lower generations.{gen}.max_nodes")
    if value >= need.min_vcpus:
        fits = ""
        if len(need.needs) == 1 and need.needs[0].node_vcpus:
            only = need.needs[0]
            fits = f": fits {math.floor(value / only.node_vcpus)} of {only.max_nodes} {only.node_vcpus}-vCPU nodes"
        return Result(row_id, WARN, f"{have}{fits}; {wants}", request + alternative)
    return Result(row_id, FAIL, f"{have}, below {need.min_what} ({need.min_vcpus} vCPUs); {wants}", request + alternative)


def check_quotas(ctx: Context) -> list[Result]:
    """Spot and on-demand vCPU quotas of every instance family the config launches."""
    try:
        system_vcpus = system_type_vcpus(ctx)
    except ClientError as exc:
        if error_code(exc) != "InvalidInstanceType":
            raise
        message = exc.response.get("Error", {}).get("Message", "")
        return [Result("quota.system-types", FAIL, f"{ctx.region} does not know a system node type: {message}",
                       "set cluster.system_node_instance_types to types offered in the region (e.g. m7i.large, m6i.large)")]
    rows = []
    for need in vcpu_needs(ctx.config, system_vcpus):
        try:
            rows.append(quota_row(ctx, need, quota_value(ctx, need.quota.code)))
        except (ClientError, BotoCoreError) as exc:
            summary, fix = describe_error(exc)
            rows.append(Result(f"quota.{need.quota_class}.{need.purchase}", WARN, f"{need.quota.name}: {summary}", fix))
    return rows


# ---- 4. zones and instance offerings ------------------------------------------------------------


def _suggestion(ctx: Context, facts: ZoneFacts, groups: dict[str, tuple[str, ...]], offerings: dict[str, set[str]]) -> str:
    zones, lacking = suggest_zones(ctx.region or "", facts.zones, groups, offerings, ctx.config.network.az_count)
    if len(zones) < ctx.config.network.az_count:
        return f"the region has only {len(zones)} zones EKS supports; lower network.az_count"
    if zones == facts.chosen:
        return ""
    line = f"set {config_line(zones)} (zone IDs {', '.join(z.zone_id for z in zones)}; needs `region: {ctx.region}`)"
    if lacking:
        line += f"; no {len(zones)} EKS zones offer all of {', '.join(lacking)}"
    return line


def check_zones(ctx: Context) -> list[Result]:
    """The chosen zones exist, EKS supports them, and offer every enabled generation's instance types."""
    facts, offerings = zone_facts(ctx), type_offerings(ctx)
    config = ctx.config
    groups = {"system": config.cluster.system_node_instance_types, **_generation_types(config)}
    suggestion = _suggestion(ctx, facts, groups, offerings)
    rows = []
    if facts.unknown_names:
        rows.append(Result("zones", FAIL, f"network.availability_zones names zones {ctx.region} does not have here: "
                                          f"{', '.join(facts.unknown_names)} (zones: {describe(facts.zones)})",
                           suggestion or "use zone names from `aws ec2 describe-availability-zones`"))
        return rows
    if len(facts.chosen) < config.network.az_count:
        rows.append(Result("zones", FAIL, f"Fn::GetAZs gives {len(facts.chosen)} zones ({describe(facts.chosen)}); "
                                          f"network.az_count is {config.network.az_count}",
                           suggestion or f"set network.az_count: {len(facts.chosen)}"))
        return rows
    unsupported = [zone for zone in facts.chosen if not eks_supported(ctx.region or "", zone)]
    chosen_text = f"{describe(facts.chosen)} ({facts.source})"
    if unsupported:
        rows.append(Result("zones", FAIL, f"EKS cannot use {describe(unsupported)} for its control plane; zones: {chosen_text}",
                           suggestion or "choose other zones with network.availability_zones"))
    else:
        rows.append(Result("zones", PASS, chosen_text))
    for name, types in groups.items():
        rows.append(_offering_row(ctx, name, types, facts, offerings, suggestion))
    return rows


def _offering_row(ctx: Context, name: str, types: tuple[str, ...], facts: ZoneFacts,
                  offerings: dict[str, set[str]], suggestion: str) -> Result:
    row_id, label = f"zones.{name}", f"{name} ({', '.join(types)})"
    offered = {zone: offered_in(offerings, types, zone) for zone in facts.chosen}
    missing = [zone for zone, got in offered.items() if not got]
    in_region = [zone for zone in facts.zones if offered_in(offerings, types, zone)]
    key = "cluster.system_node_instance_types" if name == "system" else f"generations.{name}.instance_types"
    if not missing:
        return Result(row_id, PASS, f"{label} offered in all {len(facts.chosen)} zones")
    where = f"in {len(facts.chosen) - len(missing)} of {len(facts.chosen)} chosen zones (not {describe(missing)})"
    if len(missing) < len(facts.chosen):
        return Result(row_id, WARN, f"{label} offered {where}: Karpenter launches it only where offered",
                      suggestion or f"nothing to do; or widen {key}")
    reservations = name != "system" and ctx.config.generations.enabled()[name].capacity_reservation_ids
    if reservations:
        return Result(row_id, WARN, f"{label} not offered in the chosen zones: only through its capacity reservations",
                      "see the capacity reservation rows")
    region_text = (f"offered in {describe(in_region)}" if in_region else f"not offered in any zone of {ctx.region}")
    fixes = [suggestion] if suggestion and in_region else []
    if name == "trn2":
        fixes.append("reserve trn2.48xlarge (Capacity Block for ML or an On-Demand Capacity Reservation) and list it in "
                     "generations.trn2.capacity_reservation_ids")
    if name == "system":
        fixes.append(f"set {key} to types offered in these zones")
    else:
        fixes.append(f"set generations.{name}.enabled: false")
    return Result(row_id, FAIL, f"{label} offered in none of the chosen zones ({region_text})", "; or ".join(fixes))


# ---- 5. EKS add-ons -----------------------------------------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def check_addons(ctx: Context) -> list[Result]:
    """Each pinned managed add-on build is offered for the cluster's Kubernetes version."""
    from gennstack.versions import KUBERNETES

    kubernetes = ctx.config.cluster.kubernetes_version
    release = KUBERNETES[kubernetes]
    pinned = {**release.addons, "eks-pod-identity-agent": release.pod_identity_agent}
    eks = ctx.client("eks")
    missing, fixes = [], []
    for name, version in pinned.items():
        addons = _paginate(eks, "describe_addon_versions", "addons", addonName=name, kubernetesVersion=kubernetes)
        listed = sorted({v["addonVersion"] for a in addons for v in a.get("addonVersions", [])}, key=_version_key)
        if version in listed:
            continue
        missing.append(f"{name} {version}")
        if listed:
            fixes.append(f'"{name}": "{listed[-1]}"')
        else:
            fixes.append(f"{name}: no build for Kubernetes {kubernetes} in {ctx.region}")
    if missing:
        return [Result("eks-addons", FAIL, f"not offered for Kubernetes {kubernetes} in {ctx.region}: {', '.join(missing)}",
                       f"pin the newest listed in gennstack/versions.py KUBERNETES[{kubernetes!r}]: {', '.join(fixes)}")]
    return [Result("eks-addons", PASS, f"{', '.join(f'{n} {v}' for n, v in pinned.items())} offered for Kubernetes {kubernetes}")]


# ---- 6. Lambda concurrency ----------------------------------------------------------------------


def check_lambda(ctx: Context) -> list[Result]:
    """The account's Lambda concurrency, which CDK's custom resources and the interruption handler share."""
    limit = int(ctx.client("lambda").get_account_settings()["AccountLimit"]["ConcurrentExecutions"])
    if limit >= MIN_LAMBDA_CONCURRENCY:
        return [Result("lambda-concurrency", PASS, f"{limit} concurrent executions")]
    return [Result(
        "lambda-concurrency", WARN,
        f"{limit} concurrent executions (new accounts start low): CloudFormation's kubectl and Helm custom resources "
        "and the interruption handler can be throttled during the deploy",
        f"aws service-quotas request-service-quota-increase --service-code lambda --quota-code {LAMBDA_CONCURRENCY_QUOTA} "
        f"--desired-value 1000 --region {ctx.region}",
    )]


# ---- 7. cluster admins --------------------------------------------------------------------------

_ASSUMED_ROLE = re.compile(r"^arn:(?P<partition>aws[a-z-]*):sts::(?P<account>\d{12}):assumed-role/(?P<role>[^/]+)/")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::(?P<account>\d{12}):role/(?:.*/)?(?P<role>[^/]+)$")


def _caller_role(ctx: Context) -> str | None:
    match = _ASSUMED_ROLE.match(ctx.caller_arn or "")
    return match.group("role") if match else None


def _role_arn(ctx: Context, role: str) -> str | None:
    try:
        return ctx.client("iam").get_role(RoleName=role)["Role"]["Arn"]
    except ClientError as exc:
        if error_code(exc) == "NoSuchEntity":
            return None
        raise


def _own_role_arn(ctx: Context, role: str) -> str | None:
    """The caller's role ARN for a fix text; None when IAM will not say (the fix then explains how to find it)."""
    try:
        return _role_arn(ctx, role)
    except (ClientError, BotoCoreError):
        return None


def check_admins(ctx: Context) -> list[Result]:
    """``cluster.admin_role_arns`` is not empty, each role exists, and the caller is one of them."""
    arns = ctx.config.cluster.admin_role_arns
    caller_role = _caller_role(ctx)
    if not arns:
        fix = FIND_YOUR_ROLE
        if caller_role and (own := _own_role_arn(ctx, caller_role)):
            fix = f"add your role: cluster.admin_role_arns: [\"{own}\"] ({FIND_YOUR_ROLE})"
        return [Result("admins", FAIL, "cluster.admin_role_arns is empty: nobody but CDK's kubectl role could use the cluster", fix)]
    rows, names = [], set()
    for index, arn in enumerate(arns, start=1):
        row_id = f"admins.{index}"
        match = _ROLE_ARN.match(arn)
        role, account = (match.group("role"), match.group("account")) if match else (arn, "")
        names.add((account, role))
        if account != ctx.account:
            rows.append(Result(row_id, WARN, f"{arn} is in account {account}, not {ctx.account}: not checked",
                               f"make sure the role exists in account {account}"))
            continue
        actual = _role_arn(ctx, role)
        if actual is None:
            rows.append(Result(row_id, FAIL, f"{arn}: no role {role} in account {ctx.account}", FIND_YOUR_ROLE))
        elif actual != arn:
            rows.append(Result(row_id, FAIL, f"{arn}: the role's ARN is {actual}",
                               f"list {actual} in cluster.admin_role_arns (the exact ARN, path included)"))
        else:
            rows.append(Result(row_id, PASS, f"{arn} exists"))
    if caller_role is None:
        rows.append(Result("admins.you", WARN, f"you are {ctx.caller_arn}, not an assumed role: you will not be able to run kubectl",
                           "use one of cluster.admin_role_arns to run kubectl (`aws eks update-kubeconfig --role-arn ...`)"))
    elif (ctx.account, caller_role) not in names:
        own = _own_role_arn(ctx, caller_role)
        rows.append(Result("admins.you", WARN, f"your role {caller_role} is not in cluster.admin_role_arns: "
                                               "you will not be able to run kubectl",
                           f"add \"{own or caller_role}\" to cluster.admin_role_arns, or use one of its roles"))
    else:
        rows.append(Result("admins.you", PASS, f"your role {caller_role} is a cluster admin"))
    return rows


# ---- 8. spot prices -----------------------------------------------------------------------------


def check_spot_prices(ctx: Context) -> list[Result]:
    """Current spot price range per enabled instance type across the chosen zones."""
    facts = zone_facts(ctx)
    generations = _generation_types(ctx.config)
    types = sorted({t for ts in generations.values() for t in ts})
    history = _paginate(
        ctx.client("ec2"), "describe_spot_price_history", "SpotPriceHistory",
        InstanceTypes=types, ProductDescriptions=[SPOT_PRODUCT], StartTime=ctx.now,
        Filters=[{"Name": "availability-zone", "Values": [zone.name for zone in facts.chosen]}],
    )
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for item in history:
        key = (item["InstanceType"], item["AvailabilityZone"])
        stamp, price = item["Timestamp"], float(item["SpotPrice"])
        if key not in latest or stamp > latest[key][0]:
            latest[key] = (stamp, price)
    rows = []
    for name, gen_types in generations.items():
        parts, unpriced = [], []
        for instance_type in gen_types:
            prices = {zone: price for (t, zone), (_, price) in latest.items() if t == instance_type}
            if not prices:
                unpriced.append(instance_type)
                continue
            cheapest = min(sorted(prices), key=lambda zone: prices[zone])
            low, high = min(prices.values()), max(prices.values())
            parts.append(f"{instance_type} ${low:.4f}-{high:.4f}/h (cheapest {cheapest})")
        summary = "; ".join(parts)
        if unpriced:
            rows.append(Result(f"spot.{name}", WARN,
                               f"no spot price for {', '.join(unpriced)} in the chosen zones: spot is not offered there"
                               + (f"; {summary}" if summary else ""),
                               "expect on-demand (fallback pool) or reserved capacity for it, or choose other zones"))
        else:
            rows.append(Result(f"spot.{name}", PASS, summary))
    return rows


# ---- 9. capacity reservations -------------------------------------------------------------------


def reservation_row(ctx: Context, generation: str, reservation_id: str, reservation: dict[str, Any] | None,
                    chosen: list[Zone]) -> Result:
    row_id = f"reservation.{reservation_id}"
    key = f"generations.{generation}.capacity_reservation_ids"
    if reservation is None:
        return Result(row_id, FAIL, f"{generation}: {reservation_id} does not exist in {ctx.where}", f"remove it from {key}")
    allowed = ctx.config.generations.enabled()[generation].instance_types
    instance_type, zone_id, zone_name = reservation["InstanceType"], reservation.get("AvailabilityZoneId"), reservation.get("AvailabilityZone")
    state = reservation["State"]
    what = f"{generation}: {reservation_id} ({reservation.get('ReservationType', 'default')}, {reservation.get('TotalInstanceCount', '?')} x {instance_type} in {zone_name})"
    if instance_type not in allowed:
        return Result(row_id, FAIL, f"{what} is not one of generations.{generation}.instance_types {list(allowed)}",
                      f"add {instance_type} to generations.{generation}.instance_types, or remove it from {key}")
    if not any(zone.zone_id == zone_id or zone.name == zone_name for zone in chosen):
        return Result(row_id, FAIL, f"{what} is outside the chosen zones ({describe(chosen)})",
                      f"include {zone_name} in network.availability_zones, or remove it from {key}")
    if state == "active":
        return Result(row_id, PASS, f"{what} is active")
    if state == "scheduled":
        start = reservation.get("StartDate")
        when = start.strftime("%Y-%m-%d %H:%M UTC") if isinstance(start, datetime) else "its start date"
        return Result(row_id, WARN, f"{what} is scheduled: usable from {when}", "nothing to do; it serves from that time")
    return Result(row_id, FAIL, f"{what} is {state}, not active", f"remove it from {key}, or reserve new capacity")


def check_reservations(ctx: Context) -> list[Result]:
    """Each configured capacity reservation exists, is active, fits its generation and a chosen zone."""
    configured = [(name, rid) for name, gen in ctx.config.generations.enabled().items() for rid in gen.capacity_reservation_ids]
    if not configured:
        return [Result("reservations", PASS, "none configured (generations.<name>.capacity_reservation_ids)")]
    chosen = zone_facts(ctx).chosen
    ec2 = ctx.client("ec2")
    rows = []
    for name, reservation_id in configured:
        try:
            found = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])["CapacityReservations"]
        except ClientError as exc:
            if not error_code(exc).startswith("InvalidCapacityReservationId"):
                raise
            found = []
        rows.append(reservation_row(ctx, name, reservation_id, found[0] if found else None, chosen))
    return rows


# ---- the runner ---------------------------------------------------------------------------------

Check = Callable[[Context], list[Result]]
CHECKS: tuple[tuple[str, str, Check], ...] = (
    ("credentials", "credentials", check_credentials),
    ("cdk-bootstrap", "CDK bootstrap", check_bootstrap),
    ("quota", "service quotas", check_quotas),
    ("zones", "zones and instance offerings", check_zones),
    ("eks-addons", "EKS add-on builds", check_addons),
    ("lambda-concurrency", "Lambda concurrency", check_lambda),
    ("admins", "cluster admins", check_admins),
    ("spot", "spot prices", check_spot_prices),
    ("reservations", "capacity reservations", check_reservations),
)


def run_preflight(ctx: Context, progress: Callable[[str], None] = lambda _: None,
                  checks: Sequence[tuple[str, str, Check]] = CHECKS) -> list[Result]:
    """The checks in order; an AWS error becomes that check's WARN (FAIL for credentials, which stops the run)."""
    results: list[Result] = []
    for index, (check_id, label, check) in enumerate(checks, start=1):
        progress(f"checking {label} ({index}/{len(checks)})...")
        try:
            rows = check(ctx)
        except (ClientError, BotoCoreError) as exc:
            summary, fix = describe_error(exc)
            rows = [Result(check_id, FAIL if check_id == "credentials" else WARN, summary, fix)]
        results.extend(rows)
        if check_id == "credentials" and any(row.status == FAIL for row in rows):
            break
    return results
