"""The preflight's output: a table for people, JSON for machines, and the exit code."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from gennstack.preflight.results import FAIL, PASS, STATUSES, WARN, Result


def exit_code(results: list[Result]) -> int:
    return 1 if any(row.status == FAIL for row in results) else 0


def counts(results: list[Result]) -> dict[str, int]:
    counted = Counter(row.status for row in results)
    return {status: counted.get(status, 0) for status in STATUSES}


def _verdict(results: list[Result]) -> str:
    tally = counts(results)
    head = f"{tally[PASS]} PASS, {tally[WARN]} WARN, {tally[FAIL]} FAIL"
    if tally[FAIL]:
        return f"{head}: fix each FAIL, then run `gennstack preflight` again before `make deploy`."
    if tally[WARN]:
        return f"{head}: ready for `make deploy`; read the WARN rows first."
    return f"{head}: ready for `make deploy`."


def table(results: list[Result], *, account: str | None, region: str | None, region_source: str) -> str:
    width = max([len("CHECK"), *(len(row.id) for row in results)])
    lines = [
        f"GenNStack preflight: account {account or '?'}, region {region or '?'} (from {region_source})",
        f"{'STATUS':<6}  {'CHECK':<{width}}  RESULT",
    ]
    for row in results:
        lines.append(f"{row.status:<6}  {row.id:<{width}}  {row.summary}")
        if row.status != PASS:
            lines.append(f"{'':<6}  {'':<{width}}  fix: {row.fix}")
    lines.append(_verdict(results))
    return "\n".join(lines)


def as_json(results: list[Result], *, account: str | None, region: str | None, region_source: str) -> str:
    document: dict[str, Any] = {
        "account": account,
        "region": region,
        "region_source": region_source,
        "results": [row.as_dict() for row in results],
        "counts": counts(results),
        "exit_code": exit_code(results),
    }
    return json.dumps(document, indent=2)
