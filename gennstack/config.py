"""GenNStack's one typed configuration.

``app.py`` reads the ``gennstack`` object from ``cdk.json`` context (plus an optional file
named by ``-c config=PATH``, deep-merged over it), builds a frozen :class:`GenNStackConfig`
with :func:`load_config`, and hands slices of it to stacks and constructs. Nothing else
reads context or the environment.

Every bad value raises :class:`ConfigError`, whose message names the key, the value and
what is allowed. Validation is pydantic's (strict types, ``extra="forbid"``); this module
adds the cross-field rules pydantic cannot express and turns errors into one readable
message.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from gennstack.config_base import GENERATION_NAMES, ConfigError, FieldError, StrictModel, frozen
from gennstack.instances import family
from gennstack.drill.config import DrillsConfig
from gennstack.generations import FAMILIES, GenerationConfig, GenerationsConfig
from gennstack.gateway.config import GatewayConfig
from gennstack.observability.config import MonitoringConfig
from gennstack.serving.config import ServingConfig
from gennstack.serving.fit import check_fits
from gennstack.serving.multinode import check_multi_node_zones, warm_spare_namespace

__all__ = [
    "ConfigError",
    "FieldError",
    "StrictModel",
    "GENERATION_NAMES",
    "GenNStackConfig",
    "GenerationConfig",
    "GenerationsConfig",
    "INTERFACE_ENDPOINTS",
    "NetworkConfig",
    "StorageConfig",
    "load_config",
]


# Interface endpoints GenNStack knows how to create, by the service name used in config.
# Maps to the suffix of the AWS service name (com.amazonaws.<region>.<suffix>).
INTERFACE_ENDPOINTS: dict[str, str] = {
    "ecr.api": "ecr.api",  # image manifests (layers come through the S3 gateway endpoint)
    "ecr.dkr": "ecr.dkr",
    "sts": "sts",  # IRSA / Pod Identity credential exchange
    "sqs": "sqs",  # Karpenter's interruption queue
    "ec2": "ec2",  # Karpenter and the VPC CNI call the EC2 API
    "logs": "logs",  # CloudWatch Logs agents
    "eks": "eks",
    "eks-auth": "eks-auth",  # EKS Pod Identity agent
    "ssm": "ssm",
    "ssmmessages": "ssmmessages",
    "ec2messages": "ec2messages",
    "kms": "kms",
    "secretsmanager": "secretsmanager",
    "elasticloadbalancing": "elasticloadbalancing",
    "autoscaling": "autoscaling",
    "monitoring": "monitoring",
}


_ACCOUNT_RE = re.compile(r"^\d{12}$")
_REGION_RE = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d+$")
# Real region names are at most 14 characters; IAM policy sizes are computed for this bound
# (tests/test_policy_sizes.py), so config holds region names to it.
MAX_REGION_LENGTH = 20
_CLUSTER_NAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{0,99}$")
_ROLE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_INSTANCE_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")


class NetworkConfig(StrictModel):
    """The VPC: address space, zones, egress and private endpoints."""

    vpc_cidr: str = "10.0.0.0/16"
    """The VPC's private (RFC 1918) IPv4 CIDR, /16 to /24; the subnets of every zone must fit in it."""
    az_count: Annotated[int, Field(ge=2, le=6)] = 3
    """How many availability zones the VPC spans. Spot capacity is per zone: more zones, fewer simultaneous
    interruptions."""
    availability_zones: tuple[str, ...] | None = None
    """Exactly az_count zone names of region (only with region); unset: the first az_count zones Fn::GetAZs lists
    (`gennstack preflight` suggests a set)."""
    nat_gateways: Annotated[int, Field(ge=1, le=6)] = 1
    """NAT gateways, 1 to az_count: 1 is cheapest, one per zone survives a zone outage."""
    public_subnet_mask: Annotated[int, Field(ge=16, le=28)] = 24
    """Prefix length of each zone's public subnet."""
    private_subnet_mask: Annotated[int, Field(ge=16, le=28)] = 18
    """Prefix length of each zone's private subnet; pods get VPC addresses, so these are large."""
    interface_endpoints: tuple[str, ...] = ("ecr.api", "ecr.dkr", "sts", "sqs", "ec2", "logs")
    """Interface VPC endpoints to create; the allowed names are ecr.api, ecr.dkr, sts, sqs, ec2, logs, eks, eks-auth,
    ssm, ssmmessages, ec2messages, kms, secretsmanager, elasticloadbalancing, autoscaling, monitoring."""
    # VPC flow logs are always on (to the access-log bucket, Parquet). REJECT logs only rejected
    # traffic: far smaller, still shows blocked connections.
    flow_log_traffic: Literal["ALL", "REJECT"] = "ALL"
    """What VPC flow logs record (they are always on, to the access-log bucket): ALL, or only REJECTed traffic."""

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"must be an IPv4 CIDR block such as 10.0.0.0/16 ({exc})") from None
        if not 16 <= network.prefixlen <= 24:
            raise ValueError("prefix length must be between /16 and /24 (the VPC limits)")
        if not network.is_private:
            raise ValueError("must be a private (RFC 1918) range")
        return value

    @field_validator("interface_endpoints")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in value if name not in INTERFACE_ENDPOINTS]
        if unknown:
            raise ValueError(f"unknown endpoint(s) {unknown}; allowed: {sorted(INTERFACE_ENDPOINTS)}")
        if len(set(value)) != len(value):
            raise ValueError("lists an endpoint more than once")
        return value

    @model_validator(mode="after")
    def _fits(self) -> NetworkConfig:
        if self.nat_gateways > self.az_count:
            raise FieldError("nat_gateways", self.nat_gateways, f"at most az_count ({self.az_count})")
        if self.availability_zones is not None and len(self.availability_zones) != self.az_count:
            raise FieldError(
                "availability_zones",
                list(self.availability_zones),
                f"exactly az_count ({self.az_count}) zone names, or null to pick them from Fn::GetAZs",
            )
        vpc = ipaddress.IPv4Network(self.vpc_cidr)
        needed = self.az_count * (2 ** (32 - self.public_subnet_mask) + 2 ** (32 - self.private_subnet_mask))
        if needed > vpc.num_addresses:
            raise FieldError(
                "private_subnet_mask",
                self.private_subnet_mask,
                f"subnets that fit in vpc_cidr {self.vpc_cidr} ({vpc.num_addresses} addresses): "
                f"{self.az_count} zones x (/{self.public_subnet_mask} public + /{self.private_subnet_mask} private) "
                f"need {needed}",
            )
        return self


class StorageConfig(StrictModel):
    """Model weights, Neuron compile cache and access-log buckets."""

    # retain: buckets (and their KMS key) stay when the stack is deleted. destroy: they are
    # emptied and deleted with the stack (for throwaway test deployments only).
    removal_policy: Literal["retain", "destroy"] = "retain"
    """retain: the buckets and their KMS key outlive the stack; destroy: emptied and deleted with it (throwaway stacks
    only)."""
    noncurrent_version_expiry_days: Annotated[int, Field(ge=1, le=3650)] = 30
    """Days an overwritten or deleted model file stays restorable (noncurrent versions)."""
    # Compile-cache objects expire this many days after upload; 0: never. Keys carry the Neuron
    # SDK version, so old entries belong to SDKs nobody runs any more. (Not null: CDK context
    # drops null values, so "never" needs a number.)
    compile_cache_expiry_days: Annotated[int, Field(ge=0, le=3650)] = 365
    """Days after upload a Neuron compile-cache object expires: 0 (never) or 30 to 3650."""
    abort_incomplete_upload_days: Annotated[int, Field(ge=1, le=30)] = 2
    """Days after which an unfinished multipart upload is aborted."""
    access_log_expiry_days: Annotated[int, Field(ge=1, le=3650)] = 365
    """Days the access-log bucket keeps S3 access logs and flow logs."""


    @field_validator("compile_cache_expiry_days")
    @classmethod
    def _expiry(cls, value: int) -> int:
        if 0 < value < 30:
            raise ValueError("must be 0 (never expire) or at least 30 days, so a running model's cache is not lost")
        return value


class ClusterConfig(StrictModel):
    """The EKS control plane and the small on-demand node group for system pods."""

    # Only versions whose kubectl layer package is installed (see gennstack.versions).
    kubernetes_version: Literal["1.36"] = "1.36"
    """The EKS Kubernetes minor: the versions gennstack/versions.py has a kubectl layer and pinned add-ons for."""
    # CIDRs allowed to reach the public API endpoint. Empty (the default): the endpoint is
    # private, reachable only from the VPC (and through it, VPN or Direct Connect).
    public_endpoint_cidrs: tuple[str, ...] = ()
    """IPv4 CIDRs allowed to reach the public API endpoint; empty: the endpoint is private only."""
    # IAM role ARNs granted cluster-admin through EKS access entries.
    admin_role_arns: tuple[str, ...] = ()
    """IAM role ARNs (with their path, e.g. aws-reserved/sso.amazonaws.com/...) that get cluster-admin through EKS
    access entries."""
    system_node_instance_types: tuple[str, ...] = ("m7i.large", "m6i.large", "m7a.large")
    """Instance types of the on-demand system node group: m5, m6a, m6i, m7a or m7i, large to 4xlarge (the smallest
    sizes the fit check)."""
    # 4: the system pods fit with one node down, every optional one on (gennstack/system_capacity.py).
    system_nodes_min: Annotated[int, Field(ge=2, le=10)] = 4
    """System nodes; the system pods must fit in one node fewer (synth says what they request)."""
    system_nodes_max: Annotated[int, Field(ge=2, le=20)] = 4
    """Upper size of the system node group, at least system_nodes_min (nothing autoscales it)."""
    # Days CloudWatch keeps EKS control-plane logs (a CloudWatch Logs retention period).
    control_plane_log_retention_days: Literal[7, 14, 30, 60, 90, 180, 365, 731, 1827, 3653] = 90
    """Days CloudWatch keeps the EKS control-plane logs (a CloudWatch Logs retention period)."""
    # vCPU limit of Karpenter's general-purpose (CPU) NodePool.
    general_pool_max_vcpu: Annotated[int, Field(ge=0, le=1000)] = 64
    """vCPU limit of Karpenter's general-purpose (CPU) NodePool."""
    # Default-deny NetworkPolicies in GenNStack's namespaces, then only the flows the system needs
    # (gennstack/network_policy.py, docs/security.md). The VPC CNI enforces them (enableNetworkPolicy).
    network_policies: bool = True
    """Default-deny NetworkPolicies in GenNStack's namespaces, then only the flows the system needs (docs/security.md)."""

    @field_validator("public_endpoint_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            try:
                ipaddress.IPv4Network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not an IPv4 CIDR block ({exc})") from None
        return value

    @field_validator("admin_role_arns")
    @classmethod
    def _arns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arn in value:
            if not _ROLE_ARN_RE.match(arn):
                raise ValueError(f"{arn!r} is not an IAM role ARN (arn:aws:iam::123456789012:role/name)")
        return value

    @field_validator("system_node_instance_types")
    @classmethod
    def _system_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must list at least one instance type")
        for instance_type in value:
            if not _INSTANCE_TYPE_RE.match(instance_type) or family(instance_type) in FAMILIES:
                raise ValueError(f"{instance_type!r} is not a general-purpose instance type such as 'm7i.large'")
        return value

    @model_validator(mode="after")
    def _sizes(self) -> ClusterConfig:
        if self.system_nodes_max < self.system_nodes_min:
            raise FieldError("system_nodes_max", self.system_nodes_max, f"at least system_nodes_min ({self.system_nodes_min})")
        return self


DrainSignal = Literal["rebalance", "warning", "scheduled_change"]


class DrainOn(StrictModel):
    """Per generation, the interruption signals on which the handler drains a node's serving pods."""

    # gen1-inf2's Service belongs to KubeRay, which owns its selector (see docs/spot-drills.md).
    inf2: tuple[DrainSignal, ...] = ()
    """Signals that drain gen1-inf2's serving pods: must stay empty (KubeRay owns gen1-inf2-serve-svc and its
    selector)."""
    trn2: tuple[DrainSignal, ...] = ("warning",)
    """Signals that take a gen2-trn2 node's serving pods out of load balancing: rebalance, warning, scheduled_change."""
    g6e: tuple[DrainSignal, ...] = ("rebalance", "warning")
    """Signals that take a gen3-g6e node's serving pods out of load balancing: rebalance, warning, scheduled_change."""

    @model_validator(mode="after")
    def _supported(self) -> DrainOn:
        if self.inf2:
            raise FieldError(
                "inf2", list(self.inf2), "[] (KubeRay owns gen1-inf2-serve-svc and its selector, so a drain label cannot take a Ray worker out of it)"
            )
        for name in ("trn2", "g6e"):
            signals = getattr(self, name)
            if len(set(signals)) != len(signals):
                raise FieldError(name, list(signals), "each signal at most once")
        return self


class ReturnToSpotConfig(StrictModel):
    """Back to spot after an on-demand fallback (gen2-trn2, gen3-g6e: docs/spot-drills.md "The move"):
    the reconciler raises the generation's ScaledObject minimum by one, and once the new replica is
    Ready on spot drains the on-demand one and puts the minimum back. Needs scale_down_on_demand_first."""

    # On by default. The move merge-patches the ScaledObject's spec.minReplicaCount, a field the serving chart's
    # release owns through Helm 4.2.3's server-side apply (conflicts not forced: helm v4.2.3 pkg/cmd/upgrade.go); after
    # each write it hands the field back to helm (lambdas/interruption_handler/field_owners.py), so a cdk deploy
    # during or after a move, and its rollback, apply without a conflict (docs/spot-drills.md "The move").
    enabled: bool = True
    """Move gen2-trn2's and gen3-g6e's on-demand replicas back to spot once spot can be had (docs/spot-drills.md
    "The move")."""
    settle_seconds: Annotated[int, Field(ge=0, le=86400)] = 600
    """An on-demand replica serves this long before a move is tried."""
    pending_bound_seconds: Annotated[int, Field(ge=60, le=7200)] = 600
    """The spot replacement must be scheduled (a spot node launched) this long after the move starts; else the move
    is cancelled and backs off."""
    ready_bound_seconds: Annotated[int, Field(ge=60, le=14400)] = 2400
    """The spot replacement must be Ready this long after the move starts; else the move is cancelled and backs off."""
    drain_grace_seconds: Annotated[int, Field(ge=30, le=7200)] = 600
    """After the drain, the streams on the on-demand pod get this long before the minimum goes back."""
    release_bound_seconds: Annotated[int, Field(ge=60, le=14400)] = 1900
    """After the minimum goes back, the HPA may keep the drained pod this long (its scale-down stabilization window:
    1800 s for trn2) before the pod returns to routing."""
    backoff_base_seconds: Annotated[int, Field(ge=60, le=86400)] = 300
    """Failed spot attempts back off min(cap, base * 2^(failures-1)) seconds: the base."""
    backoff_cap_seconds: Annotated[int, Field(ge=60, le=86400)] = 3600
    """The longest back-off between failed spot attempts."""

    @model_validator(mode="after")
    def _ordered(self) -> ReturnToSpotConfig:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise FieldError("backoff_cap_seconds", self.backoff_cap_seconds, f"at least backoff_base_seconds ({self.backoff_base_seconds})")
        if self.ready_bound_seconds < self.pending_bound_seconds:
            raise FieldError("ready_bound_seconds", self.ready_bound_seconds, f"at least pending_bound_seconds ({self.pending_bound_seconds})")
        return self

    def policy(self) -> dict[str, float]:
        """The handler's ``RETURN_TO_SPOT.policy`` (lambdas/interruption_handler/return_to_spot.py Policy)."""
        return {"settle_s": self.settle_seconds, "pending_bound_s": self.pending_bound_seconds,
                "ready_bound_s": self.ready_bound_seconds, "drain_grace_s": self.drain_grace_seconds,
                "release_bound_s": self.release_bound_seconds, "backoff_base_s": self.backoff_base_seconds,
                "backoff_cap_s": self.backoff_cap_seconds}


class InterruptionConfig(StrictModel):
    """The spot-interruption handler that pre-warms replacement capacity (lambdas/interruption_handler)."""

    # Upper bound on each generation's warm spares, whatever the number of interruptions: a
    # zone-wide spot reclaim must not launch a fleet of accelerator nodes.
    warm_spare_cap: Annotated[int, Field(ge=0, le=20)] = 2
    """Upper bound on each generation's warm spares, whatever the number of interruptions (a zone-wide reclaim must not
    launch a fleet)."""
    # An interruption counts as active this long after it was recorded.
    record_ttl_seconds: Annotated[int, Field(ge=300, le=86400)] = 1800
    """How long an interruption counts as active after it was recorded."""
    # Once its instance is gone, an interruption stays active this long, while the replacement loads.
    replacement_grace_seconds: Annotated[int, Field(ge=0, le=7200)] = 900
    """How long an interruption stays active once its instance is gone, while the replacement loads."""
    # How often the reconciler runs (EventBridge schedule).
    reconcile_every_minutes: Annotated[int, Field(ge=1, le=2)] = 1
    """How often the reconciler runs (EventBridge schedule)."""
    # EventBridge retries delivery this often and drops (to the dead-letter queue) events older
    # than this: a spot warning is useless after its two minutes, a rebalance a little later.
    retry_attempts: Annotated[int, Field(ge=0, le=10)] = 4
    """How often EventBridge retries delivering an event to the handler."""
    max_event_age_seconds: Annotated[int, Field(ge=60, le=3600)] = 600
    """Events older than this go to the dead-letter queue instead of the handler."""
    # Reserved concurrency for the handler; 0 (the default): none, it shares the account's pool.
    # Lambda keeps 100 executions unreserved, so reserving any fails in an account whose
    # concurrency quota is 100 or less (new accounts start at 10); opt in where the quota allows.
    reserved_concurrency: Annotated[int, Field(ge=0, le=100)] = 0
    """Reserved concurrency of the handler; 0: none (any reservation fails in accounts whose Lambda concurrency quota
    is 100 or less)."""
    # Which signals take a node's serving pods out of load balancing (docs/spot-drills.md). Draining
    # on a rebalance recommendation trades capacity for safety: it may never become an interruption
    # (routing comes back when the record expires, record_ttl_seconds later, if the node lives).
    drain_on: DrainOn = DrainOn()
    """Per generation, the signals that take a node's serving pods out of load balancing (docs/spot-drills.md)."""
    # Scale-down takes on-demand replicas first, reserved last: the reconciler keeps each serving pod's
    # controller.kubernetes.io/pod-deletion-cost by its node's capacity type (gen2-trn2 and gen3-g6e,
    # whose replicas a ReplicaSet scales; docs/spot-drills.md "Back to spot").
    scale_down_on_demand_first: bool = True
    """Scale-down takes on-demand replicas first, reserved last (each serving pod's pod-deletion-cost by its node's
    capacity type; gen2-trn2 and gen3-g6e)."""
    # On-demand replicas of gen2-trn2 and gen3-g6e move back to spot once spot can be had (on by
    # default; relies on scale_down_on_demand_first: off with it).
    return_to_spot: ReturnToSpotConfig = ReturnToSpotConfig()
    """Back to spot after an on-demand fallback (docs/spot-drills.md, "The move"); off with scale_down_on_demand_first."""


class GenNStackConfig(StrictModel):
    """Everything that shapes the ``GenNStack`` stack."""

    # null account/region: an environment-agnostic stack (deployable to any account/region).
    account: str | None = None
    """12-digit AWS account id to pin the stack to; unset: an environment-agnostic stack deployable anywhere."""
    region: str | None = None
    """AWS region name to pin the stack to; unset: the CLI's region at deploy time."""
    cluster_name: str = "gennstack"
    """EKS cluster name (letters, digits, -), also the karpenter.sh/discovery tag value."""
    tags: dict[str, str] = Field(default_factory=lambda: {"project": "gennstack"})
    """Tags on every resource (keys may not start with aws:)."""
    cluster: ClusterConfig = ClusterConfig()
    network: NetworkConfig = NetworkConfig()
    storage: StorageConfig = StorageConfig()
    generations: GenerationsConfig = GenerationsConfig()
    interruptions: InterruptionConfig = InterruptionConfig()
    # The model servers (gennstack.serving.config; docs/serving.md).
    serving: ServingConfig = ServingConfig()
    # The OpenAI-compatible front door (gennstack.gateway.config; docs/gateway.md).
    gateway: GatewayConfig = GatewayConfig()
    # Prometheus, Alertmanager, Grafana: sizing, alert thresholds, prices (gennstack.observability.config;
    # docs/observability.md).
    monitoring: MonitoringConfig = MonitoringConfig()
    # AWS FIS spot-interruption drills (gennstack.drill.config; docs/spot-drills.md).
    drills: DrillsConfig = DrillsConfig()

    @field_validator("account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        if value is not None and not _ACCOUNT_RE.match(value):
            raise ValueError("must be a 12-digit AWS account id as a string, or null")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and (not _REGION_RE.match(value) or len(value) > MAX_REGION_LENGTH):
            raise ValueError(f"must be an AWS region name such as 'us-east-2' (at most {MAX_REGION_LENGTH} characters), or null")
        return value

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        if not _CLUSTER_NAME_RE.match(value):
            raise ValueError("must start with a letter and hold only letters, digits and '-' (at most 100)")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: dict[str, str]) -> dict[str, str]:
        for key, tag_value in value.items():
            if not 1 <= len(key) <= 128 or key.lower().startswith("aws:"):
                raise ValueError(f"tag key {key!r} must be 1-128 characters and must not start with 'aws:'")
            if len(tag_value) > 256:
                raise ValueError(f"tag {key!r} value must be at most 256 characters")
        return value

    @model_validator(mode="before")
    @classmethod
    def _route_multi_node(cls, data: Any) -> Any:
        return with_multi_node_route(data)

    @model_validator(mode="after")
    def _zones_in_region(self) -> GenNStackConfig:
        zones = self.network.availability_zones
        if zones is not None:
            if self.region is None:
                raise FieldError(
                    "network.availability_zones", list(zones), "null unless region is set (zone names are per region)"
                )
            wrong = [zone for zone in zones if not re.fullmatch(re.escape(self.region) + r"[a-z]", zone)]
            if wrong:
                raise FieldError("network.availability_zones", wrong, f"zone names of region {self.region}, like {self.region}a")
        if not self.generations.enabled():
            raise FieldError("generations", "all disabled", "at least one enabled generation")
        check_fits(self.generations, self.serving)
        check_multi_node_zones(self.serving.multi_node, self.network.az_count)
        if self.serving.multi_node.enabled:
            warm_spare_namespace(self.serving.namespace)
        from gennstack.gateway.config import routing_table

        try:
            routing_table(self.gateway, set(self.generations.enabled()))
        except ValueError as exc:
            raise ConfigError(f"gateway: {exc}") from None
        return self


def with_multi_node_route(data: Any) -> Any:
    """``data`` (a raw config) with the gateway model of ``serving.multi_node`` when it is on: its
    ``served_model_name`` routed to the groups' leaders (gennstack/serving/multinode_gateway.py),
    beside the configured (or default) models, so ``gateway.fallbacks`` and ``aliases`` may name it. A
    model of that name already in ``gateway.models`` is kept as configured. Anything malformed is left
    for the normal validation to report."""
    from gennstack.gateway.config import default_models
    from gennstack.serving.multinode import MultiNodeServing
    from gennstack.serving.multinode_gateway import multi_node_backend

    if not isinstance(data, Mapping):
        return data
    serving = data.get("serving")
    raw = serving.get("multi_node") if isinstance(serving, Mapping) else None
    if not isinstance(raw, Mapping) or raw.get("enabled") is not True:
        return data
    try:
        section = MultiNodeServing.model_validate(dict(raw))
    except ValueError:  # pydantic's ValidationError too
        return data
    gateway = data.get("gateway", {})
    if not isinstance(gateway, Mapping):
        return data
    models = gateway.get("models", {name: backend.model_dump() for name, backend in default_models().items()})
    if not isinstance(models, Mapping) or section.served_model_name in models:
        return data
    models = {**models, section.served_model_name: multi_node_backend(section)}
    return {**data, "gateway": {**gateway, "models": models}}


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config: file {path!r} (from -c config=...) does not exist")
    text = file.read_text(encoding="utf-8")
    try:
        if file.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif file.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config: file {path!r} must end in .json, .yaml or .yml")
    except (json.JSONDecodeError, ImportError) as exc:
        raise ConfigError(f"config: file {path!r} could not be read: {exc}") from None
    except Exception as exc:  # yaml.YAMLError without importing yaml at module level
        if type(exc).__module__.startswith("yaml"):
            raise ConfigError(f"config: file {path!r} is not valid YAML: {exc}") from None
        raise
    if not isinstance(data, dict):
        raise ConfigError(f"config: file {path!r} must hold an object (mapping) at the top level")
    return data


def _format_errors(error: ValidationError, data: Mapping[str, Any]) -> str:
    lines = []
    for item in error.errors(include_url=False):
        loc = [str(part) for part in item["loc"]]
        ctx_error = (item.get("ctx") or {}).get("error")
        if isinstance(ctx_error, ConfigError):  # a message that already names key, value and what is allowed
            lines.append(f"  {ctx_error}")
            continue
        if isinstance(ctx_error, FieldError):
            key = ".".join([*loc, ctx_error.key]) if loc else ctx_error.key
            lines.append(f"  {key}: got {ctx_error.value!r}; allowed: {ctx_error.allowed}")
            continue
        key = ".".join(loc) or "(top level)"
        value = _lookup(data, item["loc"])
        if item["type"] == "extra_forbidden":
            allowed = _allowed_keys(item["loc"][:-1])
            lines.append(f"  {key}: unknown key (value {value!r}); allowed keys here: {allowed}")
        else:
            message = item["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: got {value!r}; {message}")
    return "GenNStack config is invalid:\n" + "\n".join(lines)


def _lookup(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        if isinstance(data, Mapping) and part in data:
            data = data[part]
        elif isinstance(data, (list, tuple)) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return "<missing>"
    return data


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = GenNStackConfig
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return sorted(getattr(model, "model_fields", {}))


def load_config(context: Mapping[str, Any] | None, config_file: str | None = None) -> GenNStackConfig:
    """Build the frozen config from the ``gennstack`` context object and an optional file.

    The file (JSON or YAML) is deep-merged over the context, so it need only hold what it
    changes. Raises :class:`ConfigError` for any bad value.
    """
    if context is not None and not isinstance(context, Mapping):
        raise ConfigError(f"config: context key 'gennstack' must be an object; got {context!r}")
    data: dict[str, Any] = dict(context or {})
    if config_file is not None:
        if not isinstance(config_file, str) or not config_file:
            raise ConfigError(f"config: -c config=PATH must name a file; got {config_file!r}")
        data = _deep_merge(data, _read_file(config_file))
    try:
        return GenNStackConfig.model_validate(frozen(data))
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, data)) from None

