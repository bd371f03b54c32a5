"""The resume relay's whole configuration (``ResumeConfig``), read from one JSON file.

``models`` is keyed by the served model name the upstream chunks carry in ``model`` (the concrete model,
never an alias: a continuation goes to the same model, whose token IDs it replays). A model not listed is
relayed but never resumed (counted as refused, reason ``model_unknown``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from gennstack.config_base import ConfigError, FieldError, StrictModel


class ModelResume(StrictModel):
    """One served model: whether its streams are resumed, and how its output is parsed."""

    # resume this model's broken streams (False: relayed, never resumed; counted as refused, reason model_off)
    resume: bool = True
    # GPT-OSS: the output is Harmony; a chat continuation is parsed with openai-harmony's StreamableParser
    harmony: bool = False
    # why resume is off for this model (shown in docs/summary); only with resume false
    reason_off: str | None = None

    @model_validator(mode="after")
    def _reason_only_when_off(self) -> ModelResume:
        if self.resume and self.reason_off is not None:
            raise FieldError("reason_off", self.reason_off, "null while resume is true (a reason is for resume false)")
        return self


class ResumeConfig(StrictModel):
    """The relay's configuration: the models it resumes and the bounds on every resume."""

    models: dict[str, ModelResume] = Field(default_factory=dict)
    # upstream attempts per client request after the first (each break spends one)
    max_attempts: int = Field(default=3, ge=0, le=100)
    # the longest replay: prompt IDs + generated IDs a continuation may send
    max_replay_tokens: int = Field(default=32768, ge=1)
    # a client request is not resumed once this many seconds have passed since it arrived
    deadline_s: float = Field(default=900.0, gt=0)
    # an upstream stream silent this long between chunks counts as broken (before its first chunk: deadline_s)
    upstream_idle_timeout_s: float = Field(default=30.0, gt=0)

    def model(self, name: str) -> ModelResume | None:
        """The served model's settings, or None where it is not listed."""
        return self.models.get(name)

    @classmethod
    def from_data(cls, data: Any, source: str = "resume config") -> ResumeConfig:
        """Validate parsed JSON; a ConfigError names the bad key, the value and what is allowed."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the top level must be a JSON object, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                key = ".".join(str(part) for part in error["loc"]) or "(top level)"
                value = error.get("input")
                problems.append(f"{key}: {error['msg']} (got {value!r})")
            raise ConfigError(f"{source}: " + "; ".join(problems)) from None

    @classmethod
    def load(cls, path: str | Path) -> ResumeConfig:
        """Read and validate the JSON file at ``path``; ConfigError with the file name on any problem."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the resume config: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        return cls.from_data(data, source=str(path))

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

