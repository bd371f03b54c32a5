"""The configuration reference (docs/reference/config.md), generated from the typed config.

Every key a user can set is a field of :class:`gennstack.config.GenNStackConfig` or of a model it
nests; this module walks them and writes, per key, its type, default, allowed values (``Literal``
choices and the ``Field`` bounds ``ge``/``le``/``gt``/``lt``/``min_length``/``max_length``) and the
field's description (the attribute docstring under the field, which ``StrictModel`` turns into
``Field.description``). Defaults are read from the default configuration itself, so each
generation's row shows that generation's default. ``gennstack config reference`` prints or writes
the page; tests/test_config_reference.py fails when the page and the models disagree or a field
has no description.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

__all__ = ["Key", "Section", "sections", "markdown", "missing_descriptions", "register"]

_UNSET = object()


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    allowed: str
    description: str


@dataclass(frozen=True)
class Section:
    path: str  # "" for the top level
    doc: str
    keys: tuple[Key, ...]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _strip(annotation: Any) -> tuple[Any, list[Any]]:
    """Annotated[X, ...] -> (X, metadata); Optional[X] -> X (unset is shown as the default)."""
    metadata: list[Any] = []
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *extra = typing.get_args(annotation)
            for item in extra:
                metadata += item.metadata if isinstance(item, FieldInfo) else [item]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation, metadata
            annotation = args[0]
        else:
            return annotation, metadata


_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _bounds(metadata: list[Any]) -> str:
    low = high = None
    parts = []
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = f"{item.ge}"
        elif isinstance(item, annotated_types.Gt):
            low = f"more than {item.gt}"
        elif isinstance(item, annotated_types.Le):
            high = f"{item.le}"
        elif isinstance(item, annotated_types.Lt):
            high = f"less than {item.lt}"
        elif isinstance(item, annotated_types.MinLen):
            parts.append(f"at least {item.min_length} long")
        elif isinstance(item, annotated_types.MaxLen):
            parts.append(f"at most {item.max_length} long")
        elif getattr(item, "pattern", None):
            parts.append(f"matching `{item.pattern}`")
    if low is not None and high is not None and not low.startswith("more") and not high.startswith("less"):
        parts.insert(0, f"{low} to {high}")
    else:
        parts[:0] = [f">= {low}" if low and not low.startswith("more") else low, f"<= {high}" if high and not high.startswith("less") else high]
    return ", ".join(p for p in parts if p)


def _type(annotation: Any, field_metadata: list[Any] | None = None) -> tuple[str, str]:
    """(type in words, allowed values in words) of an annotation (and the field's own constraints)."""
    annotation, metadata = _strip(annotation)
    allowed = _bounds([*(field_metadata or []), *metadata])
    origin = typing.get_origin(annotation)
    if origin is Literal:
        values = typing.get_args(annotation)
        kind = _NAMES.get(type(values[0]), "value")
        choices = ", ".join(f"`{json.dumps(v)}`" if not isinstance(v, str) else f"`{v}`" for v in values)
        return kind, ", ".join(p for p in (f"one of {choices}", allowed) if p)
    if origin is tuple:
        args = typing.get_args(annotation)
        item, item_allowed = _type(args[0])
        words = f"list of {item}" + (f" ({item_allowed})" if item_allowed else "")
        return words, allowed
    if origin is dict:
        key, value = typing.get_args(annotation)
        key_type, key_allowed = _type(key)
        value_type, value_allowed = _type(value)
        words = f"map of {key_type}" + (f" ({key_allowed})" if key_allowed else "") + f" to {value_type}"
        return words + (f" ({value_allowed})" if value_allowed else ""), allowed
    model = _model_of(annotation)
    if model is not None:
        return f"{model.__name__} (keys below)", allowed
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation))), allowed


def _dumpable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _dumpable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_dumpable(v) for v in value]
    return value


def _default(value: Any, annotation: Any) -> str:
    if value is _UNSET:
        return "required"
    if value is None:
        return "unset"
    inner, _ = _strip(annotation)
    if typing.get_origin(inner) is dict and value:
        _, value_type = typing.get_args(inner)
        if _model_of(_strip(value_type)[0]) is not None or typing.get_origin(_strip(value_type)[0]) is tuple:
            return ", ".join(f"`{k}`" for k in value) + " (keys)"
    return f"`{json.dumps(_dumpable(value), separators=(', ', ': '))}`"


def _field_default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return _UNSET if field.is_required() else field.default


def _nested(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """A nested model to document below: ('', M) for M, ('.<name>', M) for a map, ('[]', M) for a list."""
    annotation, _ = _strip(annotation)
    model = _model_of(annotation)
    if model is not None:
        return "", model
    origin = typing.get_origin(annotation)
    if origin is dict:
        value, _ = _strip(typing.get_args(annotation)[1])
        if typing.get_origin(value) is tuple:
            value, _ = _strip(typing.get_args(value)[0])
            return (".<name>[]", value) if _model_of(value) else None
        return (".<name>", value) if _model_of(value) else None
    if origin is tuple:
        item, _ = _strip(typing.get_args(annotation)[0])
        return ("[]", item) if _model_of(item) else None
    return None


def _walk(model: type[BaseModel], path: str, instance: Any) -> Iterator[Section]:
    keys = []
    below = []
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        value = getattr(instance, name) if instance is not None else _field_default(field)
        nested = _nested(field.annotation)
        if nested is not None and nested[0] == "":
            below.append((nested[1], key, None if value is _UNSET else value))
            continue
        kind, allowed = _type(field.annotation, field.metadata)
        description = " ".join((field.description or "").split()).replace("``", "`")
        keys.append(Key(key, kind, _default(value, field.annotation), allowed, description))
        if nested is not None:
            below.append((nested[1], key + nested[0], None))
    doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split()).replace("``", "`")  # RST code to Markdown
    yield Section(path, doc, tuple(keys))
    for sub, key, value in below:
        yield from _walk(sub, key, value)


def sections() -> list[Section]:
    """Every key of the config, section by section, with the default configuration's values."""
    from gennstack.config import GenNStackConfig, load_config

    return list(_walk(GenNStackConfig, "", load_config({})))


def missing_descriptions() -> list[str]:
    return [key.path for section in sections() for key in section.keys if not key.description]


def _cell(text: str) -> str:
    """A table cell: pipes escaped, and outside code spans < and > as entities (a bare <pool> would be
    read as an HTML tag and vanish from the rendered page)."""
    parts = text.split("`")
    parts[::2] = [part.replace("<", "&lt;").replace(">", "&gt;") for part in parts[::2]]
    return "`".join(parts).replace("|", "\\|") or " "


HEADER = """# Configuration reference

<!-- Generated by `gennstack config reference --output docs/reference/config.md` (`make config-reference`)
from the pydantic models in gennstack/config.py and the sections it nests; tests/test_config_reference.py
fails when this page and the models disagree. Edit the field descriptions in the code, not this page. -->

Every key you can set. They go in the `gennstack` object of `cdk.json`'s `context`, or in a YAML or
JSON file named with `-c config=FILE.yaml` (`npx cdk synth GenNStack -c config=prod.yaml`), which is
deep-merged over it; `gennstack preflight` and `gennstack cost` read the same with `--config FILE`.
A key given nowhere takes the default below. Lists are YAML/JSON lists; `<name>` is a key you
choose (a model or alias name, for example); `[]` marks the fields of each item of a list.
Any bad value stops the synth with a message that names the key, the value and what is allowed:

```text
GenNStack config is invalid:
  network.nat_gateways: got 4; allowed: at most az_count (3)
  generations.g6e.instance_types: got 'p5.48xlarge'; allowed: instance types of the g6e family, such as 'g6e.xlarge'
```

Write "never" as `0`, not `null`: CDK context silently drops `null` values. Besides the bounds
listed here, some keys are checked against others (the serving layout must fit the accelerator's
memory, `network.nat_gateways` at most `network.az_count`, ...); the description says so.
"""


def markdown() -> str:
    out = [HEADER]
    for section in sections():
        title = f"`{section.path}`" if section.path else "Top level"
        out += [f"## {title}", ""]
        if section.doc:
            out += [_cell(section.doc).replace("\\|", "|"), ""]
        if not section.keys:
            continue
        out += ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        for key in section.keys:
            out.append("| " + " | ".join(_cell(c) for c in (f"`{key.path}`", key.type, key.default, key.allowed, key.description)) + " |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def run(args: argparse.Namespace) -> int:
    missing = missing_descriptions()
    if missing:
        print("gennstack config reference: these fields have no description: " + ", ".join(missing), file=sys.stderr)
        return 1
    text = markdown()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="the configuration's reference page")
    sub = parser.add_subparsers(dest="config_command", metavar="{reference}", required=True)
    reference = sub.add_parser("reference", help="every config key with its type, default, allowed values and meaning",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    reference.add_argument("--output", metavar="PATH", help="write the page there (docs/reference/config.md) instead of stdout")
    reference.set_defaults(func=run)
