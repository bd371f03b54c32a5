"""The GenNStack CDK app.

``build_app`` is the one place that reads configuration: the ``gennstack`` object from
``cdk.json`` context (also when run as plain ``python app.py``, so both paths synthesize the
same template) and an optional ``-c config=PATH`` file. Tests call it too. ``cdk.json`` runs it
through the repository's ``app.py``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from gennstack.config import ConfigError, GenNStackConfig, load_config
from gennstack.system_capacity import check_system_fit
from gennstack_infra.paths import REPO_ROOT
from gennstack_infra.stacks.gennstack_stack import GenNStack

STACK_NAME = "GenNStack"


def cdk_json_context(path: Path = REPO_ROOT / "cdk.json") -> dict[str, Any]:
    """The ``context`` of cdk.json: feature flags and the ``gennstack`` defaults."""
    return json.loads(path.read_text(encoding="utf-8")).get("context", {})


def build_app(
    *, context: Mapping[str, Any] | None = None, outdir: str | None = None
) -> tuple[App, GenNStack, GenNStackConfig]:
    """Build the app: read and validate config, create the stack, attach cdk-nag.

    ``context`` entries override cdk.json's (the CDK CLI's ``-c`` values override both).
    Raises ``ConfigError`` before any construct exists when the config is invalid.
    """
    app = App(context={**cdk_json_context(), **(context or {})}, outdir=outdir)
    config = load_config(app.node.try_get_context("gennstack"), app.node.try_get_context("config"))
    # Every pod pinned to the system nodes must fit with one of them down (gennstack/system_capacity.py).
    check_system_fit(config)
    env = Environment(account=config.account, region=config.region) if (config.account or config.region) else None
    stack = GenNStack(
        app,
        STACK_NAME,
        config=config,
        env=env,
        description="GenNStack: spot-first multi-model LLM inference on Amazon EKS",
    )
    # cdk-nag's AwsSolutions pack runs at every synth; any unacknowledged finding fails it.
    # Acknowledgments are also written into the template metadata as an audit trail.
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, write_suppressions_to_cloud_formation=True))
    return app, stack, config


def main() -> int:
    try:
        app, _, _ = build_app()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    app.synth()
    return 0
