"""Claims of the docs pages written when the README became a landing page (issue 33): the messages
docs/troubleshooting.md quotes are the programs' own."""

from __future__ import annotations

import re

import pytest

from gennstack.config import ConfigError, load_config
from gennstack.deploy_warnings import NO_ADMIN
from tests.support import ROOT

TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")


def _quoted(page: str) -> list[list[str]]:
    return [block.splitlines() for block in re.findall(r"```text\n(.*?)\n```", page, re.DOTALL)]


def test_every_message_it_quotes_is_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each line of each ``text`` block is what the config check, `gennstack preflight` (the test
    suite's fresh account in us-east-1, as docs/deploy.md's sample) or `gennstack summary` prints."""
    from tests.test_preflight import fresh_output

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    _, preflight, _ = fresh_output()
    with pytest.raises(ConfigError) as invalid:
        load_config({"network": {"nat_gateways": 4}})
    printed = preflight.splitlines() + str(invalid.value).splitlines()
    blocks = _quoted(TROUBLESHOOTING)
    assert len(blocks) >= 6
    for block in blocks:
        for line in block:
            if line.startswith("WARNING: "):  # gennstack summary's line, cut after its first sentence
                assert NO_ADMIN.startswith(line.removeprefix("WARNING: ")), line
            else:
                assert line in printed, f"docs/troubleshooting.md quotes {line!r}, which nothing prints"


def test_each_failure_says_what_to_do_and_links_the_details() -> None:
    sections = TROUBLESHOOTING.split("\n## ")[1:]
    assert len(sections) >= 8
    for section in sections:
        assert "](" in section, f"section {section.splitlines()[0]!r} links nowhere"


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc slugify) and GitHub give a heading: lower case,
    punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def test_the_readmes_links_into_the_site_resolve() -> None:
    """mkdocs build --strict checks the pages' links; the README is outside docs/, so this checks its own."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", readme)
    assert len(links) >= 20
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), path
        if anchor:
            headings = [_slug(line.lstrip("#").replace("`", "")) for line in page.read_text(encoding="utf-8").splitlines()
                        if line.startswith("#")]
            assert anchor in headings, f"README links {path}#{anchor}; its headings: {headings}"
    assert _slug("Multi-node replicas: Llama 4 Scout on two g6e.12xlarge") == "multi-node-replicas-llama-4-scout-on-two-g6e12xlarge"


def test_no_heading_follows_a_table_row_without_a_blank_line() -> None:
    """Python-Markdown (MkDocs) keeps such a line in the table, as one more row: the site loses the
    heading and its anchor (docs/spot-drills.md's "Where warm spares go" did), while GitHub's GFM ends
    the table there and shows it, so neither view reveals it to the other's reader."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        found += [f"{page.relative_to(ROOT)}:{i + 2}: {nxt}" for i, (line, nxt) in enumerate(zip(lines, lines[1:]))
                  if line.startswith("|") and nxt.startswith("#")]
    assert not found, found
