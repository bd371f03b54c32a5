"""The ``drills`` config section: AWS FIS spot-interruption experiment templates, off by default."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gennstack.config_base import StrictModel

# AWS FIS's aws:ec2:send-spot-instance-interruptions: durationBeforeInterruption is the time to the
# reclaim; longer than 2 minutes and a rebalance recommendation comes first, the interruption warning
# 2 minutes before the reclaim (FIS actions reference). 2 to 15 minutes is the range as we read that
# reference (not re-checked here; see docs/spot-drills.md).
MIN_MINUTES_BEFORE_INTERRUPTION = 2
MAX_MINUTES_BEFORE_INTERRUPTION = 15
MAX_DRILL_NODES = 5


class DrillsConfig(StrictModel):
    """Spot drills (docs/spot-drills.md): one FIS experiment template per generation and node count."""

    # Off by default: the templates can interrupt real serving nodes.
    enabled: bool = False
    """Create AWS FIS spot-interruption experiment templates for every enabled generation (docs/spot-drills.md); off by
    default, since they interrupt real serving nodes."""
    # Templates exist for 1 .. max_nodes nodes per generation (FIS fixes a template's COUNT(n)).
    max_nodes: Annotated[int, Field(ge=1, le=MAX_DRILL_NODES)] = 2
    """Templates exist for interrupting 1 to this many spot nodes at once (`gennstack drill --nodes`)."""
    # durationBeforeInterruption: minutes from the experiment's start to the reclaim. Above 2, EC2
    # sends a rebalance recommendation at the start and the two-minute warning later.
    minutes_before_interruption: Annotated[
        int, Field(ge=MIN_MINUTES_BEFORE_INTERRUPTION, le=MAX_MINUTES_BEFORE_INTERRUPTION)
    ] = 4
    """FIS durationBeforeInterruption: above 2, a rebalance recommendation comes first, the two-minute warning later."""
