"""The config and region the read-only AWS commands (``preflight``, ``cost``, ``drill``) work on.

They read the config the synth reads: cdk.json's ``context.gennstack`` (``--cdk-json``), deep-merged
with ``--config PATH`` exactly like ``npx cdk synth -c config=PATH``; the region is ``--region``, else
the config's ``region``, else the AWS profile's/environment's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from gennstack.config import ConfigError, GenNStackConfig, load_config

__all__ = ["command_config", "read_config", "resolve_region"]


def read_config(cdk_json: Path, config_file: str | None) -> GenNStackConfig:
    """The config ``app.py`` builds: cdk.json's ``gennstack`` context plus the ``config`` file, if any."""
    if not cdk_json.is_file():
        raise ConfigError(f"config: {cdk_json} not found (run in the repository root, or pass --cdk-json PATH)")
    try:
        context = json.loads(cdk_json.read_text(encoding="utf-8")).get("context", {})
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(f"config: {cdk_json} is not a cdk.json object: {exc}") from None
    return load_config(context.get("gennstack"), config_file if config_file is not None else context.get("config"))


def command_config(args: argparse.Namespace, *, command: str, err: TextIO) -> GenNStackConfig | None:
    """:func:`read_config` for a command's ``--cdk-json`` and ``--config``; on a bad config, one line
    ``gennstack <command>: <what is wrong>`` on ``err`` and None (the command then exits 2)."""
    try:
        return read_config(Path(args.cdk_json), args.config)
    except ConfigError as exc:
        print(f"gennstack {command}: {exc}", file=err)
        return None


def resolve_region(cli_region: str | None, config: GenNStackConfig, session_region: str | None) -> tuple[str | None, str]:
    """--region wins, then the config's ``region`` (what the stack is pinned to), then the session's."""
    if cli_region:
        return cli_region, "--region"
    if config.region:
        return config.region, "config"
    return session_region, "your AWS profile/environment"
