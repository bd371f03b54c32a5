"""The "What it costs" blocks: the README's is `gennstack cost --markdown --brief`, docs/cost.md's `--markdown`: they cannot drift."""

from __future__ import annotations

import io
import re

from gennstack.cli import build_parser
from tests.support import ROOT


def test_readme_cost_block_is_generated_from_the_code() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- cost:start -->\n(.*?)\n<!-- cost:end -->", readme, re.DOTALL)
    assert block, "README lost its <!-- cost:start --> ... <!-- cost:end --> block"
    assert block.group(1) == _generated("--brief"), (
        "README cost block is stale: replace it with `.venv/bin/gennstack cost --markdown --brief`")
    # the seed design's baseline is stated as the number to beat
    assert "**$4.48-$6.48 per million output tokens**" in block.group(1)


def test_docs_cost_block_is_the_full_output() -> None:
    docs = (ROOT / "docs" / "cost.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- cost-detail:start -->\n(.*?)\n<!-- cost-detail:end -->", docs, re.DOTALL)
    assert block, "docs/cost.md lost its <!-- cost-detail:start --> ... <!-- cost-detail:end --> block"
    assert block.group(1) == _generated(), "docs/cost.md's block is stale: `.venv/bin/gennstack cost --markdown`"
    brief = _generated("--brief")
    # the brief form is the full one summed by part: its total is the same line
    assert [line for line in block.group(1).splitlines() if line.startswith("| **total**")] == \
        [line for line in brief.splitlines() if line.startswith("| **total**")]


def _generated(*flags: str) -> str:
    args = build_parser().parse_args(["cost", "--markdown", *flags, "--cdk-json", str(ROOT / "cdk.json")])
    out = io.StringIO()
    assert args.func(args, stdout=out) == 0
    return out.getvalue().rstrip("\n")
