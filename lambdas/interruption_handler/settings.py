"""The function's configuration, read once from its environment and validated.

A bad value raises :class:`ConfigError` naming the variable, the value and what is allowed, so a
misconfigured deployment fails every invocation loudly (and dead-letters) instead of guessing.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from .return_to_spot import Policy

DEFAULT_RECORD_TTL_SECONDS = 1800
DEFAULT_REPLACEMENT_GRACE_SECONDS = 600
DEFAULT_KUBE_TIMEOUT_SECONDS = 5.0

# Kubernetes object names: a namespace is a DNS-1123 label, a Deployment a DNS-1123 subdomain.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# EKS cluster names: 1-100 characters, alphanumerics, hyphens and underscores, starting alphanumeric.
_CLUSTER_NAME = re.compile(r"^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$")
_NODEPOOL = _DNS_SUBDOMAIN
_ACCOUNT_ID = re.compile(r"^[0-9]{12}$")


class ConfigError(ValueError):
    """A configuration value is missing or invalid."""


@dataclass(frozen=True)
class GroupSpare:
    """A generation's warm-spare groups: a LeaderWorkerSet whose ``spec.replicas`` counts groups."""

    namespace: str
    leaderworkerset: str
    baseline: int
    cap: int

    def desired_replicas(self, doomed_groups: int) -> int:
        """``min(cap, baseline + serving groups with a member on an interrupted instance)``."""
        return min(self.cap, self.baseline + max(0, doomed_groups))


@dataclass(frozen=True)
class WarmSpare:
    """One generation's warm-spare Deployment and its bounds (and its warm-spare groups, if any)."""

    generation: str
    namespace: str
    deployment: str
    baseline: int
    cap: int
    groups: GroupSpare | None = None

    def desired_replicas(self, active_interruptions: int) -> int:
        """``min(cap, baseline + active interruptions)``: an absolute count, so repeating it is safe."""
        return min(self.cap, self.baseline + max(0, active_interruptions))


@dataclass(frozen=True)
class Settings:
    cluster_name: str
    cluster_endpoint: str
    cluster_ca_pem: str
    table_name: str
    region: str
    account_id: str  # events from any other account are not ours (events.classify)
    warm_spares: Mapping[str, WarmSpare]  # keyed by Karpenter NodePool name
    record_ttl_seconds: int = DEFAULT_RECORD_TTL_SECONDS
    replacement_grace_seconds: int = DEFAULT_REPLACEMENT_GRACE_SECONDS
    kube_timeout_seconds: float = DEFAULT_KUBE_TIMEOUT_SECONDS
    metrics_namespace: str = "GenNStack"
    # NodePool -> the signals (``events.Signal`` values) that drain its nodes' serving pods.
    drain_on: Mapping[str, Drain] = field(default_factory=lambda: MappingProxyType({}))
    # generation -> its ReplicaSet-managed serving pods, whose pod-deletion-cost the reconciler keeps
    # by capacity type (on-demand first on scale-down; spot_return.py). Empty: none.
    deletion_cost: Mapping[str, CostedPods] = field(default_factory=lambda: MappingProxyType({}))
    # generation -> its ScaledObject, whose minimum a move raises (spot_move.py); empty: off.
    return_to_spot: Mapping[str, MovedGeneration] = field(default_factory=lambda: MappingProxyType({}))
    return_to_spot_policy: Policy = Policy()

    @property
    def generations(self) -> dict[str, WarmSpare]:
        """Warm spares keyed by generation (several NodePools may share one)."""
        return {spare.generation: spare for spare in self.warm_spares.values()}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        cluster_name = _required(env, "CLUSTER_NAME")
        if not _CLUSTER_NAME.match(cluster_name):
            raise ConfigError(f"CLUSTER_NAME={cluster_name!r} is not an EKS cluster name")
        warm_spares = parse_warm_spares(_required(env, "WARM_SPARES"))
        drain_on = parse_drain_on(env.get("DRAIN_ON", "").strip() or "{}", warm_spares)
        for pool, spare in warm_spares.items():
            if spare.groups is not None and (pool not in drain_on or drain_on[pool].groups is None):
                raise ConfigError(
                    f"WARM_SPARES[{pool!r}].groups needs DRAIN_ON[{pool!r}].groups: the groups' pods are how the "
                    "handler tells which serving group an interrupted instance holds"
                )
        return cls(
            cluster_name=cluster_name,
            cluster_endpoint=_endpoint(_required(env, "CLUSTER_ENDPOINT")),
            cluster_ca_pem=_ca_pem(_required(env, "CLUSTER_CA")),
            table_name=_required(env, "TABLE_NAME"),
            region=_required(env, "AWS_REGION"),
            account_id=_account(_required(env, "ACCOUNT_ID")),
            warm_spares=MappingProxyType(warm_spares),
            record_ttl_seconds=_int(env, "RECORD_TTL_SECONDS", DEFAULT_RECORD_TTL_SECONDS, minimum=60),
            replacement_grace_seconds=_int(
                env, "REPLACEMENT_GRACE_SECONDS", DEFAULT_REPLACEMENT_GRACE_SECONDS, minimum=0
            ),
            kube_timeout_seconds=_float(env, "KUBE_TIMEOUT_SECONDS", DEFAULT_KUBE_TIMEOUT_SECONDS),
            metrics_namespace=_required(env, "POWERTOOLS_METRICS_NAMESPACE"),
            drain_on=MappingProxyType(drain_on),
            deletion_cost=MappingProxyType(costed := parse_deletion_cost(env.get("DELETION_COST", "").strip() or "{}", warm_spares)),
            **_return_to_spot(env.get("RETURN_TO_SPOT", "").strip() or "{}", costed),
        )


def parse_warm_spares(raw: str) -> dict[str, WarmSpare]:
    """Parse ``WARM_SPARES``: ``{"<nodepool>": {"generation", "namespace", "deployment", "baseline", "cap"}}``,
    plus ``"groups": {"namespace", "leaderworkerset", "baseline", "cap"}`` where the NodePool also
    runs multi-node replicas with warm-spare groups (a LeaderWorkerSet scaled by groups).

    NodePools that share a generation must agree on its Deployment and bounds, and two generations
    may not share a Deployment: each Deployment's replica count has exactly one formula.
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"WARM_SPARES is not JSON ({exc.msg} at {exc.pos})") from exc
    if not isinstance(data, dict) or not data:
        raise ConfigError("WARM_SPARES must be a non-empty JSON object keyed by NodePool name")
    spares: dict[str, WarmSpare] = {}
    for pool, entry in data.items():
        where = f"WARM_SPARES[{pool!r}]"
        if not _NODEPOOL.match(pool):
            raise ConfigError(f"{where}: {pool!r} is not a Kubernetes object name")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be an object, got {type(entry).__name__}")
        expected = {"generation", "namespace", "deployment", "baseline", "cap"}
        if not expected <= set(entry) <= expected | {"groups"}:
            raise ConfigError(f"{where} keys are {sorted(entry)}; expected exactly {sorted(expected)}, and optionally 'groups'")
        spare = WarmSpare(
            generation=_name(entry["generation"], f"{where}.generation", _DNS_SUBDOMAIN),
            namespace=_name(entry["namespace"], f"{where}.namespace", _DNS_LABEL),
            deployment=_name(entry["deployment"], f"{where}.deployment", _DNS_SUBDOMAIN),
            baseline=_count(entry["baseline"], f"{where}.baseline"),
            cap=_count(entry["cap"], f"{where}.cap"),
            groups=_group_spare(entry["groups"], f"{where}.groups") if "groups" in entry else None,
        )
        if spare.cap < spare.baseline:
            raise ConfigError(f"{where}.cap={spare.cap} is below baseline={spare.baseline}")
        spares[pool] = spare
    by_generation: dict[str, WarmSpare] = {}
    by_deployment: dict[tuple[str, str], str] = {}
    for pool, spare in spares.items():
        first = by_generation.setdefault(spare.generation, spare)
        if first != spare:
            raise ConfigError(
                f"WARM_SPARES[{pool!r}] disagrees with another NodePool of generation {spare.generation!r}: "
                f"{spare} != {first}"
            )
        owner = by_deployment.setdefault((spare.namespace, spare.deployment), spare.generation)
        if owner != spare.generation:
            raise ConfigError(
                f"WARM_SPARES: Deployment {spare.namespace}/{spare.deployment} is shared by generations "
                f"{owner!r} and {spare.generation!r}"
            )
    return spares


def _group_spare(entry: Any, where: str) -> GroupSpare:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object, got {type(entry).__name__}")
    expected = {"namespace", "leaderworkerset", "baseline", "cap"}
    if set(entry) != expected:
        raise ConfigError(f"{where} keys are {sorted(entry)}; expected exactly {sorted(expected)}")
    groups = GroupSpare(
        namespace=_name(entry["namespace"], f"{where}.namespace", _DNS_LABEL),
        leaderworkerset=_name(entry["leaderworkerset"], f"{where}.leaderworkerset", _DNS_LABEL),
        baseline=_count(entry["baseline"], f"{where}.baseline"),
        cap=_count(entry["cap"], f"{where}.cap"),
    )
    if groups.cap < groups.baseline:
        raise ConfigError(f"{where}.cap={groups.cap} is below baseline={groups.baseline}")
    return groups


DRAIN_SIGNALS = frozenset({"rebalance_recommendation", "spot_interruption_warning", "scheduled_change"})
# A label selector of equality terms: key=value[,key=value...] with Kubernetes label keys and values.
_SELECTOR = re.compile(r"^[A-Za-z0-9./_-]+=[A-Za-z0-9._-]{0,63}(,[A-Za-z0-9./_-]+=[A-Za-z0-9._-]{0,63})*$")


@dataclass(frozen=True)
class Drain:
    """When a NodePool's node is doomed, which of its pods leave load balancing, on which signals."""

    signals: frozenset[str]
    pods: str  # label selector of the generation's serving pods
    # Label selector of the pods of multi-node replicas (LeaderWorkerSet groups) on the same
    # NodePool, drained and restored a whole group at a time (drain.py); None: none.
    groups: str | None = None


def parse_drain_on(raw: str, warm_spares: Mapping[str, WarmSpare]) -> dict[str, Drain]:
    """Parse ``DRAIN_ON``: ``{"<nodepool>": {"signals": ["rebalance_recommendation", ...], "pods": "<selector>"}}``,
    plus ``"groups": "<selector>"`` where multi-node replicas (LeaderWorkerSet groups) share the NodePool.

    ``{}`` (or unset) drains nothing. Each NodePool must have a ``WARM_SPARES`` entry (its serving
    namespace comes from it).
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"DRAIN_ON is not JSON ({exc.msg} at {exc.pos})") from exc
    if not isinstance(data, dict):
        raise ConfigError("DRAIN_ON must be a JSON object keyed by NodePool name")
    drain: dict[str, Drain] = {}
    for pool, entry in data.items():
        where = f"DRAIN_ON[{pool!r}]"
        if pool not in warm_spares:
            raise ConfigError(f"{where}: no WARM_SPARES entry for that NodePool")
        if not isinstance(entry, dict) or not {"signals", "pods"} <= set(entry) <= {"signals", "pods", "groups"}:
            raise ConfigError(f"{where} must be an object with exactly the keys ['pods', 'signals'], and optionally 'groups'")
        signals = entry["signals"]
        if not isinstance(signals, list) or any(s not in DRAIN_SIGNALS for s in signals):
            raise ConfigError(f"{where}.signals={signals!r}: must be a list of {sorted(DRAIN_SIGNALS)}")
        if not isinstance(entry["pods"], str) or not _SELECTOR.match(entry["pods"]):
            raise ConfigError(f"{where}.pods={entry['pods']!r}: must be a label selector such as 'app=x,role=server'")
        groups = entry.get("groups")
        if groups is not None and (not isinstance(groups, str) or not _SELECTOR.match(groups)):
            raise ConfigError(f"{where}.groups={groups!r}: must be a label selector such as 'app=x,role=server'")
        drain[pool] = Drain(frozenset(signals), entry["pods"], groups)
    return drain


@dataclass(frozen=True)
class CostedPods:
    """A generation's serving pods owned by a ReplicaSet (a Deployment's), in one namespace."""

    namespace: str
    pods: str  # label selector


def parse_deletion_cost(raw: str, warm_spares: Mapping[str, WarmSpare]) -> dict[str, CostedPods]:
    """Parse ``DELETION_COST``: ``{"<generation>": {"namespace", "pods": "<label selector>"}}``; ``{}``: none.

    Each generation must be one of ``WARM_SPARES``' (its nodes carry ``gennstack.io/generation``)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"DELETION_COST is not JSON ({exc.msg} at {exc.pos})") from exc
    if not isinstance(data, dict):
        raise ConfigError("DELETION_COST must be a JSON object keyed by generation")
    generations = {spare.generation for spare in warm_spares.values()}
    costed: dict[str, CostedPods] = {}
    for generation, entry in data.items():
        where = f"DELETION_COST[{generation!r}]"
        if generation not in generations:
            raise ConfigError(f"{where}: not a generation of WARM_SPARES ({sorted(generations)})")
        if not isinstance(entry, dict) or set(entry) != {"namespace", "pods"}:
            raise ConfigError(f"{where} must be an object with exactly the keys ['namespace', 'pods']")
        if not isinstance(entry["pods"], str) or not _SELECTOR.match(entry["pods"]):
            raise ConfigError(f"{where}.pods={entry['pods']!r}: must be a label selector such as 'app=x,role=server'")
        costed[generation] = CostedPods(_name(entry["namespace"], f"{where}.namespace", _DNS_LABEL), entry["pods"])
    return costed


@dataclass(frozen=True)
class MovedGeneration:
    """A generation whose on-demand replicas return to spot: its ScaledObject and serving pods."""

    namespace: str
    scaled_object: str
    pods: str  # label selector (DELETION_COST's: the move relies on that scale-down order)


def _return_to_spot(raw: str, costed: Mapping[str, CostedPods]) -> dict[str, Any]:
    moved, policy = parse_return_to_spot(raw, costed)
    return {"return_to_spot": MappingProxyType(moved), "return_to_spot_policy": policy}


def parse_return_to_spot(raw: str, costed: Mapping[str, CostedPods]) -> tuple[dict[str, MovedGeneration], Policy]:
    """Parse ``RETURN_TO_SPOT``: ``{"generations": {"<generation>": {"namespace", "scaled_object"}},
    "policy": {<return_to_spot.Policy field>: seconds, ...}}``; ``{}``: off.

    Each generation must be one of ``DELETION_COST``'s: the move's drained pod leaves first on the
    scale-down because of its pod-deletion-cost, which only those pods' ReplicaSets honour."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"RETURN_TO_SPOT is not JSON ({exc.msg} at {exc.pos})") from exc
    if not isinstance(data, dict) or not set(data) <= {"generations", "policy"}:
        raise ConfigError("RETURN_TO_SPOT must be a JSON object with the keys 'generations' and 'policy'")
    generations = data.get("generations") or {}
    if not isinstance(generations, dict):
        raise ConfigError("RETURN_TO_SPOT.generations must be an object keyed by generation")
    moved: dict[str, MovedGeneration] = {}
    for generation, entry in generations.items():
        where = f"RETURN_TO_SPOT.generations[{generation!r}]"
        if generation not in costed:
            raise ConfigError(f"{where}: not a generation of DELETION_COST ({sorted(costed)}): the move needs its "
                              "scale-down order")
        if not isinstance(entry, dict) or set(entry) != {"namespace", "scaled_object"}:
            raise ConfigError(f"{where} must be an object with exactly the keys ['namespace', 'scaled_object']")
        namespace = _name(entry["namespace"], f"{where}.namespace", _DNS_LABEL)
        if namespace != costed[generation].namespace:
            raise ConfigError(f"{where}.namespace={namespace!r} is not DELETION_COST's {costed[generation].namespace!r}")
        moved[generation] = MovedGeneration(namespace, _name(entry["scaled_object"], f"{where}.scaled_object",
                                                             _DNS_SUBDOMAIN), costed[generation].pods)
    bounds = data.get("policy") or {}
    known = {f for f in Policy.__dataclass_fields__ if f != "enabled"}
    if not isinstance(bounds, dict) or not set(bounds) <= known:
        raise ConfigError(f"RETURN_TO_SPOT.policy keys are {sorted(bounds) if isinstance(bounds, dict) else bounds!r}; "
                          f"allowed: {sorted(known)}")
    for key, value in bounds.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"RETURN_TO_SPOT.policy.{key}={value!r} must be a number of seconds")
    try:
        policy = Policy(**bounds)
    except ValueError as exc:
        raise ConfigError(f"RETURN_TO_SPOT.policy: {exc}") from exc
    return moved, policy


def _required(env: Mapping[str, str], key: str) -> str:
    value = env.get(key, "").strip()
    if not value:
        raise ConfigError(f"{key} is required and empty or unset")
    return value


def _account(value: str) -> str:
    if not _ACCOUNT_ID.match(value):
        raise ConfigError(f"ACCOUNT_ID={value!r} is not a 12-digit AWS account id")
    return value


def _endpoint(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"CLUSTER_ENDPOINT={value!r} must be an https URL with a host and no path")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ConfigError(f"CLUSTER_ENDPOINT={value!r} has an invalid port") from exc
    return value.rstrip("/")


def _ca_pem(value: str) -> str:
    try:
        pem = base64.b64decode(value, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ConfigError("CLUSTER_CA must be base64-encoded PEM (EKS certificateAuthority.data)") from exc
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError("CLUSTER_CA decodes to something that holds no PEM certificate")
    return pem


def _int(env: Mapping[str, str], key: str, default: int, *, minimum: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}={raw!r} must be an integer") from exc
    if value < minimum:
        raise ConfigError(f"{key}={value} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}={raw!r} must be a number of seconds") from exc
    if not math.isfinite(value) or not 0 < value <= 60:
        raise ConfigError(f"{key}={raw!r} must be in (0, 60] seconds")
    return value


def _name(value: Any, where: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ConfigError(f"{where}={value!r} is not a Kubernetes object name")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
        raise ConfigError(f"{where}={value!r} must be an integer from 0 to 1000")
    return value
