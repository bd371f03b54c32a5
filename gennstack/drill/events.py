"""A drill's events file, ``drill-events.jsonl``: one JSON object a line with ``time`` (ISO 8601
UTC) and ``event``, the format ``gennstack bench --events`` reads (gennstack/bench/timeline.py).
Written by ``gennstack drill`` (AWS and ``--local``) and, in a local drill, by the mock servers too."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

EVENTS_FILE = "drill-events.jsonl"


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class EventLog:
    """Drill events, appended to ``path`` and printed with their UTC time on ``out`` (if any)."""

    path: Path
    out: TextIO | None
    now: Callable[[], datetime] = utc_now
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, event: str, text: str, *, at: datetime | None = None, **fields: Any) -> dict[str, Any]:
        """Record ``event`` now, or at ``at`` (a time read elsewhere, such as a log line's)."""
        stamp = (at or self.now()).astimezone(timezone.utc)
        record = {"time": stamp.isoformat().replace("+00:00", "Z"), "event": event, **fields}
        self.events.append(record)
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record, sort_keys=True) + "\n")
        if self.out is not None:
            print(f"{stamp:%H:%M:%S}Z  {text}", file=self.out, flush=True)
        return record

    def say(self, text: str) -> None:
        """Print a line with the current time, without an event."""
        if self.out is not None:
            print(f"{self.now().astimezone(timezone.utc):%H:%M:%S}Z  {text}", file=self.out, flush=True)
