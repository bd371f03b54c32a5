"""The README stays true: its diagram and summary come from the code."""

from __future__ import annotations

import re

from gennstack.diagram import readme_block
from gennstack.summary import summarize
from tests.support import ROOT, Synth

README = (ROOT / "README.md").read_text(encoding="utf-8")
# The Get started page, where the `make synth` excerpt went when the README became a landing page.
GET_STARTED = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
# The configuration reference (generated; tests/test_config_reference.py checks it is the models').
CONFIG_REFERENCE = (ROOT / "docs" / "reference" / "config.md").read_text(encoding="utf-8")


def test_readme_diagram_matches_the_template(synth: Synth) -> None:
    assert readme_block(synth.template) in README, (
        "README diagram is stale: make synth && .venv/bin/gennstack diagram --update-readme README.md"
    )


def test_readme_summary_excerpt_matches_make_synth(synth: Synth) -> None:
    excerpt = re.search(r"```text\n(Cloud assembly cdk.out.*?)\n  \.\.\.\n```", GET_STARTED, re.DOTALL)
    assert excerpt, "docs/index.md lost its `make synth` output excerpt"
    actual = summarize(synth.outdir).replace(str(synth.outdir), "cdk.out")
    for line in excerpt.group(1).splitlines():
        assert line in actual.splitlines(), f"docs/index.md shows {line!r}, make synth prints:\n{actual}"


def test_every_config_key_is_documented() -> None:
    from gennstack.config import GenNStackConfig, GenerationConfig, NetworkConfig, StorageConfig

    for prefix, model in (("", GenNStackConfig), ("network.", NetworkConfig), ("storage.", StorageConfig)):
        for name in model.model_fields:
            if name in ("network", "storage", "generations"):
                continue
            assert f"`{prefix}{name}`" in CONFIG_REFERENCE, f"{prefix}{name} is not in docs/reference/config.md"
    for name in GenerationConfig.model_fields:
        assert f"generations.inf2.{name}" in CONFIG_REFERENCE, f"generations.<name>.{name} is not in docs/reference/config.md"
    from gennstack.gateway.config import LoadBalancerConfig, TlsConfig

    for prefix, model in (("gateway.load_balancer.", LoadBalancerConfig), ("gateway.tls.", TlsConfig)):
        for name in model.model_fields:
            assert f"`{prefix}{name}`" in CONFIG_REFERENCE, f"{prefix}{name} is not in docs/reference/config.md"


def test_diagram_command_updates_a_readme(synth: Synth, tmp_path, capsys) -> None:
    from gennstack.cli import main

    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- diagram:start -->\nold\n<!-- diagram:end -->\ntail\n")
    assert main(["diagram", "--cdk-out", str(synth.outdir), "--update-readme", str(readme)]) == 0
    assert readme_block(synth.template) in readme.read_text() and readme.read_text().endswith("tail\n")
    assert main(["diagram", "--cdk-out", str(synth.outdir), "--update-readme", str(readme)]) == 0
    assert "already up to date" in capsys.readouterr().out
    readme.write_text("no markers\n")
    assert main(["diagram", "--cdk-out", str(synth.outdir), "--update-readme", str(readme)]) == 1
    assert main(["diagram", "--cdk-out", str(synth.outdir), "--stack", "Nope"]) == 1
    assert "no stack 'Nope'" in capsys.readouterr().out


def test_memory_tables_are_the_capacity_model_of_the_default_config() -> None:
    """docs/serving.md shows gennstack.serving.capacity's numbers for the defaults (the README links to it, once)."""
    from gennstack.config import load_config
    from gennstack.serving.capacity import markdown_table
    from gennstack.serving.fit import plans

    config = load_config({})
    block = "<!-- capacity:start -->\n" + markdown_table(plans(config.generations, config.serving)) + "\n<!-- capacity:end -->"
    assert block in (ROOT / "docs" / "serving.md").read_text(encoding="utf-8"), (
        "memory table is stale: regenerate it from gennstack.serving.capacity.markdown_table")
    assert "<!-- capacity:start -->" not in README


def test_readme_local_drill_report_is_the_commands_output_and_says_what_the_drill_test_asserts() -> None:
    """The block between the local-drill markers is `gennstack drill --local`'s comparison.md at the default
    schedule (same text around the numbers), and its rows obey what tests/gateway/test_gateway_drill_e2e.py
    asserts of every run: drain on loses nothing and the doomed replica takes nothing after leaving
    rotation; drain off breaks the streams it held and loses nothing else."""
    from gennstack.drill.local import LocalDrillSettings, RunResult, comparison_markdown

    block = README.split("<!-- local-drill:start -->\n", 1)[1].split("\n<!-- local-drill:end -->", 1)[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines() if line.startswith(("| on ", "| off "))]
    assert [row[0] for row in cells] == ["on", "off"]

    def run(row: list[str]) -> RunResult:
        completed, started = (int(n) for n in row[5].split(" of "))
        number = lambda text: None if text == "n/a" else float(text.removesuffix(" s"))  # noqa: E731
        return RunResult(drain=row[0] == "on", requests_lost=int(row[1]), broken_streams=int(row[2]), failures_by_class={},
                         baseline_tok_s=None, seconds_below_50pct=number(row[7]), time_to_recover_95_s=number(row[8]),
                         doomed_new_requests_after_warning=int(row[3]),
                         doomed_new_requests_after_out_of_rotation=None if row[4] == "n/a" else int(row[4]),
                         doomed_streams_started=started, doomed_streams_completed=completed,
                         survivors_streams_completed=0,  # not a column of the table (comparison.json has it)
                         label_to_out_of_rotation_s=number(row[6]))

    on, off = (run(row) for row in cells)
    assert comparison_markdown(LocalDrillSettings(), [on, off]).strip() == block.strip()
    settings = LocalDrillSettings()
    assert (on.requests_lost, on.broken_streams, on.doomed_new_requests_after_out_of_rotation, on.seconds_below_50pct) == (0, 0, 0, 0)
    assert on.doomed_streams_completed == on.doomed_streams_started > 0
    assert 0 < on.label_to_out_of_rotation_s <= settings.dns_ttl_s + 1
    assert 1 <= off.broken_streams == off.requests_lost <= settings.concurrency
    assert off.doomed_new_requests_after_warning > 3 * on.doomed_new_requests_after_warning
    assert off.time_to_recover_95_s is not None and off.time_to_recover_95_s <= 3
