"""The result files: ``result.json`` (settings and summaries), ``requests.csv`` (every request)."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

from gennstack import __version__
from gennstack.bench.config import BenchConfig
from gennstack.bench.runner import LevelRun

SCHEMA = "gennstack-bench/1"
RESULT_FILE = "result.json"
REQUESTS_FILE = "requests.csv"
REPORT_FILE = "report.html"

CSV_COLUMNS = (
    "concurrency", "index", "worker", "warmup", "status", "error_class", "http_status",
    "send_s", "ttft_s", "itl_s", "e2e_s", "output_tokens", "token_source", "chunks",
    "mean_chunk_gap_s", "max_chunk_gap_s", "user_output_tokens_per_s", "prompt_tokens",
    "prompt_tokens_requested", "max_tokens", "finish_reason", "error_detail",
    "conversation", "turn", "prefix", "upstream",
)
OPEN_LOOP_COLUMNS = ("due_s",)  # only in a file with an open-loop level, so a closed-loop run's file stays as it was


def redact_command(argv: list[str]) -> list[str]:
    """The command line as run, with the value of ``--api-key`` replaced."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
        elif arg == "--api-key":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(arg)
    return out


def build_result(config: BenchConfig, levels: list[dict], *, command: list[str], started_at: datetime, layout=None) -> dict:
    """The result file's content. ``layout`` (a :class:`gennstack.cost.tokens.BenchLayout`) is written only when
    given, so files without it (and those written before it existed) load the same way."""
    result = {
        "schema": SCHEMA,
        "tool": {"name": "gennstack bench", "version": __version__},
        "command": redact_command(command),
        "started_at": started_at.astimezone(timezone.utc).isoformat(timespec="seconds"),
        "endpoint": config.chat_url,
        "model": config.model,
        "settings": config.to_dict(),
        "levels": levels,
    }
    if layout is not None:
        result["layout"] = layout.to_dict()
    return result


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def write_requests_csv(runs: list[LevelRun], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        open_loop = any(run.rate is not None for run in runs)
        writer.writerow(CSV_COLUMNS + (OPEN_LOOP_COLUMNS if open_loop else ()))
        for run in runs:
            for r in run.records:
                gaps = r.chunk_gaps
                writer.writerow([
                    run.concurrency, r.index, r.worker, int(r.warmup), r.status, r.error_class or "",
                    r.http_status or "", _fmt(r.t_send), _fmt(r.ttft), _fmt(r.itl), _fmt(r.e2e),
                    r.output_tokens, r.token_source, r.n_chunks,
                    _fmt(sum(gaps) / len(gaps) if gaps else None), _fmt(max(gaps) if gaps else None),
                    _fmt(r.user_tokens_per_s), r.prompt_tokens, r.prompt_tokens_requested, r.max_tokens,
                    r.finish_reason or "", r.error_detail.replace("\n", " "),
                    "" if r.conversation is None else r.conversation, "" if r.turn is None else r.turn,
                    "" if r.prefix is None else r.prefix, r.upstream or "",
                    *((_fmt(r.t_due),) if open_loop else ()),
                ])


def write_result(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


class ResultFileError(ValueError):
    pass


def load_result(path: str | Path) -> dict:
    """Read a ``result.json`` (or a run directory holding one) and check its schema."""
    p = Path(path)
    if p.is_dir():
        p = p / RESULT_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ResultFileError(f"{p}: cannot read a result file: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultFileError(f"{p}: not a gennstack bench result (expected schema {SCHEMA!r})")
    data.setdefault("_path", str(p))
    return data
