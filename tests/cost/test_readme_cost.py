"""README's "What it costs" block is `gennstack cost --markdown` of the default config: it cannot drift."""

from __future__ import annotations

import io
import re

from gennstack.cli import build_parser
from tests.support import ROOT


def test_readme_cost_block_is_generated_from_the_code() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- cost:start -->\n(.*?)\n<!-- cost:end -->", readme, re.DOTALL)
    assert block, "README lost its <!-- cost:start --> ... <!-- cost:end --> block"
    args = build_parser().parse_args(["cost", "--markdown", "--cdk-json", str(ROOT / "cdk.json")])
    out = io.StringIO()
    assert args.func(args, stdout=out) == 0
    assert block.group(1) == out.getvalue().rstrip("\n"), (
        "README cost block is stale: replace it with `.venv/bin/gennstack cost --markdown`")
    # the seed design's baseline is stated as the number to beat
    assert "**$4.48-$6.48 per million output tokens**" in block.group(1)
