"""``gennstack preflight``: check an AWS account and region for a first deploy, read-only.

Reads the config the synth reads: cdk.json's ``context.gennstack`` (``--cdk-json``), deep-merged
with ``--config PATH`` exactly like ``npx cdk synth -c config=PATH``. The region is ``--region``,
else the config's ``region``, else your AWS profile's/environment's. Prints one row per finding
(PASS / WARN / FAIL, with a fix); exits 1 on any FAIL, 2 when the config is invalid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, TextIO

from botocore.exceptions import BotoCoreError

from gennstack.cli_config import command_config, resolve_region
from gennstack.preflight.aws import ClientFactory, session_clients
from gennstack.preflight.checks import Context, run_preflight
from gennstack.preflight.report import as_json, exit_code, table
from gennstack.preflight.results import FAIL, Result


def _progress(stream: TextIO) -> Callable[[str], None]:
    interactive = stream.isatty()

    def show(message: str) -> None:
        stream.write(f"\r\x1b[K{message}" if interactive else f"{message}\n")
        stream.flush()

    return show


def run(
    args: argparse.Namespace,
    *,
    make_session: Callable[..., Any] | None = None,
    make_clients: Callable[[Any, str | None], ClientFactory] = session_clients,
    now: datetime | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """The command. Tests pass ``make_clients`` returning Stubber-wrapped clients and a fixed ``now``."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    config = command_config(args, command="preflight", err=err)
    if config is None:
        return 2
    if make_session is None:
        import boto3

        make_session = boto3.Session
    try:
        session = make_session(profile_name=args.profile) if args.profile else make_session()
        session_region = session.region_name
    except BotoCoreError as exc:  # ProfileNotFound and friends: say what, no traceback
        results = [Result("credentials", FAIL, f"cannot use AWS profile {args.profile!r}: {exc}",
                          "`aws configure list-profiles` shows the profiles; `aws configure sso` adds one")]
        region, source, account = args.region or config.region, "--region" if args.region else "config", None
    else:
        region, source = resolve_region(args.region, config, session_region)
        ctx = Context(config=config, region=region, region_source=source, clients=make_clients(session, region),
                      now=now or datetime.now(timezone.utc))
        results = run_preflight(ctx, _progress(err))
        account = ctx.account
        if err.isatty():
            err.write("\r\x1b[K")
    render = as_json if args.json else table
    print(render(results, account=account, region=region, region_source=source), file=out)
    return exit_code(results)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="check an AWS account and region for a first deploy (read-only API calls)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="PATH", help="config file deep-merged over cdk.json, as `-c config=PATH`")
    parser.add_argument("--cdk-json", default="cdk.json", metavar="PATH", help="cdk.json to read (default: %(default)s)")
    parser.add_argument("--region", help="region to check (default: the config's region, else your profile's)")
    parser.add_argument("--profile", help="AWS profile to use (default: the environment's credentials)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.set_defaults(func=run)
