"""The README stays true: its diagram and summary come from the code."""

from __future__ import annotations

import re

from gennstack.diagram import readme_block
from gennstack.summary import summarize
from tests.support import ROOT, Synth

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_diagram_matches_the_template(synth: Synth) -> None:
    assert readme_block(synth.template) in README, (
        "README diagram is stale: make synth && .venv/bin/gennstack diagram --update-readme README.md"
    )


def test_readme_summary_excerpt_matches_make_synth(synth: Synth) -> None:
    excerpt = re.search(r"```text\n(Cloud assembly cdk.out.*?)\n  \.\.\.\n```", README, re.DOTALL)
    assert excerpt, "README lost its `make synth` output excerpt"
    actual = summarize(synth.outdir).replace(str(synth.outdir), "cdk.out")
    for line in excerpt.group(1).splitlines():
        assert line in actual.splitlines(), f"README shows {line!r}, make synth prints:\n{actual}"


def test_readme_test_command_is_what_ci_runs() -> None:
    assert "make test" in README
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == "make test"


def test_every_config_key_is_documented() -> None:
    from gennstack.config import GenNStackConfig, GenerationConfig, NetworkConfig, StorageConfig

    for prefix, model in (("", GenNStackConfig), ("network.", NetworkConfig), ("storage.", StorageConfig)):
        for name in model.model_fields:
            if name in ("network", "storage", "generations"):
                continue
            assert f"{prefix}{name}" in README or f"`{name}`" in README, f"{prefix}{name} is not in the README"
    for name in GenerationConfig.model_fields:
        assert name in README, f"generations.<name>.{name} is not in the README"
    from gennstack.gateway.config import LoadBalancerConfig, TlsConfig

    for prefix, model in (("gateway.load_balancer.", LoadBalancerConfig), ("gateway.tls.", TlsConfig)):
        for name in model.model_fields:
            assert f"{prefix}{name}" in README or f"`{name}`" in README, f"{prefix}{name} is not in the README"


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
    """README.md and docs/serving.md show gennstack.serving.capacity's numbers for the defaults."""
    from gennstack.config import load_config
    from gennstack.serving.capacity import markdown_table
    from gennstack.serving.fit import plans

    config = load_config({})
    block = "<!-- capacity:start -->\n" + markdown_table(plans(config.generations, config.serving)) + "\n<!-- capacity:end -->"
    for doc in (README, (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")):
        assert block in doc, "memory table is stale: regenerate it from gennstack.serving.capacity.markdown_table"
