"""docs/reference/config.md is the typed config, generated: every key a user can set, with its type,
default, allowed values and meaning, and a description for every field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from gennstack.config import GenNStackConfig
from gennstack.config_base import StrictModel
from gennstack.config_reference import _walk, markdown, missing_descriptions
from tests.support import ROOT

PAGE = ROOT / "docs" / "reference" / "config.md"


def test_the_page_is_the_generators_output() -> None:
    assert PAGE.read_text(encoding="utf-8") == markdown(), (
        "docs/reference/config.md is stale: make config-reference "
        "(.venv/bin/gennstack config reference --output docs/reference/config.md)"
    )


def test_every_field_has_a_description() -> None:
    assert missing_descriptions() == [], "write a docstring under each of these fields"


def _schema_keys() -> set[str]:
    """Every settable key, from pydantic's JSON schema of the config (not from the generator's walk)."""
    schema = GenNStackConfig.model_json_schema()
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[1]]
        for option in node.get("anyOf", ()):
            if option.get("type") != "null":
                return resolve(option)
        return node

    keys: set[str] = set()

    def walk(node: dict[str, Any], path: str) -> None:
        node = resolve(node)
        if "properties" in node:
            for name, child in node["properties"].items():
                walk(child, f"{path}.{name}" if path else name)
            return
        keys.add(path)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            inner = resolve(extra)
            if inner.get("type") == "array" and "properties" in resolve(inner.get("items", {})):
                walk(inner["items"], f"{path}.<name>[]")
            elif "properties" in inner:
                walk(inner, f"{path}.<name>")
        elif node.get("type") == "array" and "properties" in resolve(node.get("items", {})):
            walk(node["items"], f"{path}[]")

    walk(schema, "")
    return keys


def test_every_key_of_the_config_schema_has_a_row() -> None:
    page = PAGE.read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip().strip("`") for line in page.splitlines() if line.startswith("| `")}
    keys = _schema_keys()
    assert len(keys) > 150, len(keys)
    assert keys - rows == set(), "keys of GenNStackConfig missing from docs/reference/config.md"
    assert rows - keys == set(), "rows of docs/reference/config.md that are no config key"


def test_a_row_shows_type_default_bounds_choices_and_meaning() -> None:
    class Inner(StrictModel):
        """A section."""

        size: Annotated[int, Field(ge=2, le=6)] = 3
        """How many."""
        mode: Literal["a", "b"] = "a"
        """Which one."""
        undocumented: str | None = None

    class Outer(StrictModel):
        """The top."""

        inner: Inner = Inner()
        """Not a row: a section."""

    top, inner = list(_walk(Outer, "", Outer()))
    assert top.keys == ()
    size, mode, undocumented = inner.keys
    assert (size.path, size.type, size.default, size.allowed, size.description) == ("inner.size", "integer", "`3`", "2 to 6", "How many.")
    assert (mode.type, mode.default, mode.allowed) == ("string", '`"a"`', "one of `a`, `b`")
    assert (undocumented.default, undocumented.description) == ("unset", "")


def test_the_command_writes_the_page(tmp_path, capsys) -> None:
    from gennstack.cli import main

    out = tmp_path / "config.md"
    assert main(["config", "reference", "--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == markdown()
    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out.endswith(markdown())


def test_the_readme_and_docs_link_the_reference() -> None:
    assert "docs/reference/config.md" in (ROOT / "README.md").read_text(encoding="utf-8")
