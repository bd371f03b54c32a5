"""Validate rendered Kubernetes objects the way `kubectl apply` (strict field validation) would.

Custom resources are checked against the upstream CRD schemas in ``../shared/crds`` (or
``$GENNSTACK_CRD_DIR``); built-in kinds against Kubernetes' own schemas through the
``kubernetes-validate`` library. Unknown fields are errors, as with ``kubectl --validate=strict``.

CRDs' ``x-kubernetes-validations`` (CEL rules) are evaluated with ``cel-python`` after the
schema's defaults are applied, as the API server does; Kubernetes' string-library extensions the
CRDs use (``find``, ``split``, ``lowerAscii``) are provided here. Transition rules (those reading
``oldSelf``) need a previous object and are not evaluated; a rule that cannot be evaluated is an
error, never a silent pass.
"""

from __future__ import annotations

import copy
import os
from functools import cache
from pathlib import Path
from typing import Any

import re
from collections.abc import Callable

import celpy
import jsonschema
import pytest
import yaml
from celpy import celtypes

from tests.support import ROOT

CRD_DIR_ENV = "GENNSTACK_CRD_DIR"
KUBERNETES_VERSION = "1.36"
# API groups served by Kubernetes itself; every other group comes from a CRD.
BUILTIN_GROUPS = {
    "", "apps", "batch", "policy", "autoscaling", "rbac.authorization.k8s.io", "networking.k8s.io",
    "scheduling.k8s.io", "storage.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io",
    "coordination.k8s.io", "node.k8s.io", "discovery.k8s.io", "certificates.k8s.io", "apiregistration.k8s.io",
}


def crd_dir() -> Path:
    """Where the CRD schemas are; skips (locally) or fails (under CI=true) when they are missing."""
    path = Path(os.environ.get(CRD_DIR_ENV) or ROOT.parent / "shared" / "crds")
    if not path.is_dir() and not os.environ.get(CRD_DIR_ENV) and (ROOT / "build" / "crds").is_dir():
        path = ROOT / "build" / "crds"  # where `make crds` puts them
    if not path.is_dir():
        message = (
            f"CRD schemas not found at {path}: run `make crds` (fetches the pinned upstream CRDs into build/crds), "
            f"or set {CRD_DIR_ENV} to a folder of upstream CRDs laid out as <group>/<Kind>.yaml "
            "(GenNStack's developers have them in ../shared/crds)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@cache
def _crd_openapi(directory: str, group: str, version: str, kind: str) -> dict[str, Any]:
    file = Path(directory) / group / f"{kind}.yaml"
    if not file.is_file():
        raise AssertionError(f"no CRD schema for {kind}.{group} at {file}")
    crd = yaml.safe_load(file.read_text(encoding="utf-8"))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            return served["schema"]["openAPIV3Schema"]
    raise AssertionError(f"{kind}.{group} CRD serves no version {version!r}")


@cache
def _crd_schema(directory: str, group: str, version: str, kind: str) -> dict[str, Any]:
    return _strict(_crd_openapi(directory, group, version, kind))


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI v3 (Kubernetes flavour) -> JSON Schema that rejects unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        if (
            node.get("type") in ("object", ["object", "null"])
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for key in ("properties", "patternProperties"):
            for child in node.get(key, {}).values():
                walk(child)
        for key in ("items", "additionalProperties", "not"):
            walk(node.get(key))
        for key in ("allOf", "anyOf", "oneOf"):
            for child in node.get(key, []):
                walk(child)

    walk(schema)
    # metadata is validated by the API server's ObjectMeta rules, not the CRD schema.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return schema


def validate(obj: dict[str, Any]) -> None:
    """Raise AssertionError naming the object and the failing path when ``obj`` is invalid."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    name = obj.get("metadata", {}).get("name", "<no name>")
    label = f"{kind}/{name} ({api_version})"
    assert api_version and kind, f"{label}: apiVersion and kind are required"
    assert obj.get("metadata", {}).get("name"), f"{label}: metadata.name is required"
    group, _, version = api_version.rpartition("/")
    if group not in BUILTIN_GROUPS:
        schema = _crd_schema(str(crd_dir()), group, version, kind)
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            details = "\n".join(f"  {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:10])
            raise AssertionError(f"{label} does not validate against its CRD schema:\n{details}")
        openapi = _crd_openapi(str(crd_dir()), group, version, kind)
        failures = cel_failures(openapi, _defaulted(openapi, copy.deepcopy(obj)))
        if failures:
            raise AssertionError(f"{label} breaks its CRD's validation rules:\n" + "\n".join(f"  {f}" for f in failures))
        return
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{label}: {exc.message} at {'.'.join(map(str, exc.path))}") from None


# --- CEL (x-kubernetes-validations) --------------------------------------------------------------


def _find(value: celtypes.StringType, pattern: celtypes.StringType) -> celtypes.StringType:
    match = re.search(str(pattern), str(value))
    return celtypes.StringType(match.group(0) if match else "")


def _split(value: celtypes.StringType, separator: celtypes.StringType) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(part) for part in str(value).split(str(separator))])


def _lower_ascii(value: celtypes.StringType) -> celtypes.StringType:
    return celtypes.StringType(str(value).lower())


# Kubernetes' CEL library functions the CRDs use beyond standard CEL.
KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {"find": _find, "split": _split, "lowerAscii": _lower_ascii}
_CEL = celpy.Environment()


@cache
def _program(rule: str) -> Any:
    return _CEL.program(_CEL.compile(rule), functions=KUBERNETES_FUNCTIONS)


def _defaulted(schema: dict[str, Any], value: Any) -> Any:
    """Apply the schema's ``default``s the way the API server does before validating."""
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = _defaulted(child, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                if key not in (schema.get("properties") or {}):
                    value[key] = _defaulted(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_defaulted(schema["items"], item) for item in value]
    return value


def cel_failures(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Every ``x-kubernetes-validations`` rule on ``value``'s path that does not hold (oldSelf rules aside)."""
    failures: list[str] = []
    for validation in schema.get("x-kubernetes-validations", []):
        rule = validation["rule"]
        if "oldSelf" in rule:
            continue
        result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, Exception):
            failures.append(f"{path or '(root)'}: rule {rule!r} could not be evaluated: {result}")
        elif not bool(result):
            failures.append(f"{path or '(root)'}: {validation.get('message') or rule} (rule {rule!r})")
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for key, child in properties.items():
            if key in value:
                failures += cel_failures(child, value[key], f"{path}.{key}" if path else key)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                if key not in properties:
                    failures += cel_failures(extra, item, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            failures += cel_failures(schema["items"], item, f"{path}[{index}]")
    return failures
