"""The accelerator generations section of the config (``generations.<inf2|trn2|g6e>``): the model each
serves and the capacity it may use.

Its own module, beside ``gennstack.config``, so that the checks spanning it and the serving section
(``gennstack.serving.fit``, ``gennstack.serving.scaling``) can read its types without importing the
whole config: the dependency runs config -> fit -> generations, never back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from gennstack.config_base import GENERATION_NAMES, FieldError, StrictModel
from gennstack.instances import INSTANCE_TYPES, family

_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{17}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class GenerationConfig(StrictModel):
    """One accelerator generation: the model it serves and the capacity it may use.

    The compute and serving layers read these; the foundation validates them so a typo
    fails now, not at deploy time.
    """

    enabled: bool = True
    """Whether this generation is deployed; at least one generation must stay enabled."""
    model_id: str
    """Hugging Face repo id of the model it serves, one whose shape gennstack/serving/capacity.py knows (memory is
    computed from it)."""
    model_revision: str = "main"
    """Commit, tag or branch of model_id; pin a commit for production (`gennstack summary` warns about a branch or tag,
    staging fails when one moves)."""
    instance_types: tuple[str, ...]
    """Instance types of the generation's family that gennstack/instances.py knows, for its NodePools."""
    # Karpenter NodePool limit; each node is one of instance_types.
    max_nodes: Annotated[int, Field(ge=0, le=100)] = 4
    """Node limit of each of the generation's NodePools (spot, on-demand, reserved); their CPU, memory and accelerator
    limits are this times the largest type."""
    # Spot first; on-demand only as a lower-weight fallback NodePool when true.
    on_demand_fallback: bool = True
    """Whether an on-demand NodePool (lower weight) backs up the spot one."""
    # On-Demand Capacity Reservations or Capacity Blocks for ML (cr-...) of instance_types that
    # this generation uses before spot: a third NodePool (capacity type "reserved"). trn2 is in
    # many regions only to be had this way.
    capacity_reservation_ids: tuple[str, ...] = ()
    """On-Demand Capacity Reservation or Capacity Block ids (cr- and 17 hex digits) of instance_types: a
    <pool>-reserved NodePool used before spot."""

    @field_validator("model_id")
    @classmethod
    def _model_id(cls, value: str) -> str:
        if not _HF_REPO_RE.match(value):
            raise ValueError("must be a Hugging Face repository id such as 'openai/gpt-oss-20b'")
        return value

    @field_validator("model_revision")
    @classmethod
    def _revision(cls, value: str) -> str:
        if not _REVISION_RE.match(value):
            raise ValueError("must be a commit hash, tag or branch name without '/' (letters, digits, '._-'); it is part of S3 keys")
        return value

    @field_validator("capacity_reservation_ids")
    @classmethod
    def _reservations(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for reservation in value:
            if not _RESERVATION_RE.match(reservation):
                raise ValueError(f"{reservation!r} is not a capacity reservation id such as 'cr-0123456789abcdef0'")
        if len(set(value)) != len(value):
            raise ValueError("lists a reservation more than once")
        return value

    @field_validator("instance_types")
    @classmethod
    def _not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must list at least one instance type")
        return value


# The instance families each generation may use, and its defaults.
FAMILIES: dict[str, str] = {"inf2": "inf2", "trn2": "trn2", "g6e": "g6e"}
_GENERATION_DEFAULTS: dict[str, dict[str, Any]] = {
    "inf2": {
        "model_id": "meta-llama/Meta-Llama-3-70B-Instruct",
        "instance_types": ("inf2.48xlarge",),
        "max_nodes": 4,
    },
    "trn2": {
        "model_id": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
        "instance_types": ("trn2.48xlarge",),
        "max_nodes": 2,
    },
    "g6e": {
        "model_id": "openai/gpt-oss-20b",
        # One L40S holds a full GPT-OSS 20B replica: offer every size with room for it, so
        # price-capacity-optimized spot allocation has choices (4-GPU sizes run 4 replicas).
        "instance_types": ("g6e.xlarge", "g6e.2xlarge", "g6e.4xlarge", "g6e.8xlarge", "g6e.12xlarge"),
        "max_nodes": 8,
    },
}


class GenerationsConfig(StrictModel):
    """The three generations, by the instance family they run on."""

    inf2: GenerationConfig = GenerationConfig(**_GENERATION_DEFAULTS["inf2"])
    trn2: GenerationConfig = GenerationConfig(**_GENERATION_DEFAULTS["trn2"])
    g6e: GenerationConfig = GenerationConfig(**_GENERATION_DEFAULTS["g6e"])

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        # A partial generation object ({"enabled": false}) keeps that generation's defaults.
        if isinstance(data, Mapping):
            unknown = [key for key in data if key not in _GENERATION_DEFAULTS]
            if unknown:
                raise FieldError(unknown[0], data[unknown[0]], f"a generation name, one of {list(GENERATION_NAMES)}")
            return {
                name: {**_GENERATION_DEFAULTS[name], **value} if isinstance(value, Mapping) else value
                for name, value in data.items()
            }
        return data

    @model_validator(mode="after")
    def _families(self) -> GenerationsConfig:
        for name in GENERATION_NAMES:
            generation: GenerationConfig = getattr(self, name)
            allowed = sorted(t for t in INSTANCE_TYPES if family(t) == FAMILIES[name])
            for instance_type in generation.instance_types:
                if instance_type not in allowed:
                    raise FieldError(f"{name}.instance_types", instance_type, f"one of {allowed}")
            if len(set(generation.instance_types)) != len(generation.instance_types):
                raise FieldError(f"{name}.instance_types", list(generation.instance_types), "each type at most once")
        return self

    def enabled(self) -> dict[str, GenerationConfig]:
        """The enabled generations, by name, in their fixed order."""
        return {name: gen for name in GENERATION_NAMES if (gen := getattr(self, name)).enabled}


# The accelerator NodePools' weights (gennstack_infra/components/node_pools.py renders them;
# `gennstack simulate` launches by them). Karpenter prefers higher weights (1-100): capacity
# reservations first (paid for whether used or not), then spot, on-demand only when neither can be had.
RESERVED_WEIGHT, SPOT_WEIGHT, ON_DEMAND_WEIGHT = 100, 50, 10
