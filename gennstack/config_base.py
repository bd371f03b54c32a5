"""The building blocks of GenNStack's typed configuration, shared by every config section.

Sections that live with the code they configure (``gennstack.serving.config``, for example) build
on these; ``gennstack.config`` assembles them into ``GenNStackConfig``. Kept apart from it so those
sections can be imported by ``gennstack.config`` without an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

GENERATION_NAMES: tuple[str, ...] = ("inf2", "trn2", "g6e")


class ConfigError(ValueError):
    """A configuration value is invalid. The message says which key, what value, and what is allowed."""


class StrictModel(BaseModel):
    """Frozen, strict (no type coercion), and unknown keys are errors. Base of every config section.

    A field's meaning is the docstring right under it (``use_attribute_docstrings``: pydantic makes
    it the field's description), which docs/reference/config.md shows beside its type and default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True)


class FieldError(ValueError):
    """A cross-field error that knows its key (relative to the model that raised it).

    Raise it from a ``model_validator(mode="after")``; the message then names the full key path.
    """

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"{key}: got {value!r}; allowed: {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


def frozen(value: Any) -> Any:
    """JSON lists become tuples, recursively, so a frozen, strict config model accepts parsed JSON/YAML."""
    if isinstance(value, Mapping):
        return {key: frozen(item) for key, item in value.items()}
    if isinstance(value, list):
        return tuple(frozen(item) for item in value)
    return value
