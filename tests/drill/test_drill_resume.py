"""The local drill's resume cases (gennstack/drill/resume_drill.py): what drain routing cannot save, through real
Envoy, with the resume relay off and on; and the README block that is their output."""

from __future__ import annotations

import re
from pathlib import Path

from gennstack.drill.resume_drill import CASES, ResumeDrillSettings, ResumeRow, resume_markdown, run_case

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
SMALL = ResumeDrillSettings(streams=6, max_tokens=120)  # 1.2 s answers


def _check(row: ResumeRow) -> None:
    assert row.on_victim > 0, row  # the lost replica held streams
    if row.resume:
        assert row.broken == 0 and row.resumed == row.on_victim, row
        assert row.identical == row.on_victim, row  # 100 % of the resumed greedy answers equal the uninterrupted one
    else:
        assert row.broken == row.on_victim and row.resumed == 0, row


def test_sigkill_without_warning_breaks_streams_only_with_resume_off() -> None:
    for resume in (False, True):
        _check(run_case(CASES[0], resume=resume, settings=SMALL))


def test_answers_longer_than_the_grace_break_only_with_resume_off() -> None:
    for resume in (False, True):
        _check(run_case(CASES[1], resume=resume, settings=SMALL))


def test_readme_resume_block_is_the_commands_output_and_meets_the_targets() -> None:
    """The block between the resume-drill markers is `gennstack drill --local --cases resume`'s resume.md at the
    default settings, and its rows obey what the tests above assert of every run."""
    block = README.split("<!-- resume-drill:start -->\n", 1)[1].split("\n<!-- resume-drill:end -->", 1)[0]
    rows = []
    for line in block.splitlines():
        match = re.match(r"^\| (.+?) \| (on|off) \| (\d+) of (\d+) \| (\d+) \| (\d+) \| (n/a|(\d+) of \d+ \(\d+ %\)) \|$", line)
        if match:
            case, resume, victim, streams, broken, resumed, _, identical = match.groups()
            rows.append(ResumeRow(case=case, resume=resume == "on", streams=int(streams), on_victim=int(victim),
                                  broken=int(broken), resumed=int(resumed),
                                  identical=None if identical is None else int(identical), completed_on_victim=0))
    assert [(r.case, r.resume) for r in rows] == [(case, resume) for case in CASES for resume in (False, True)]
    assert resume_markdown(ResumeDrillSettings(), rows).strip() == block.strip()
    for row in rows:
        _check(row)
