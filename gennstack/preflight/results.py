"""One row of the preflight report."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PASS = "PASS"
WARN = "WARN"
FAIL = "FAIL"
STATUSES = (PASS, WARN, FAIL)


@dataclass(frozen=True)
class Result:
    """What one check found: ``id`` names the check (``quota.trn.spot``), ``fix`` says what to do."""

    id: str
    status: str
    summary: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}; got {self.status!r}")
        if self.status != PASS and not self.fix:
            raise ValueError(f"{self.id}: a {self.status} row needs a fix")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
