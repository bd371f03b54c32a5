"""The on-demand system node group's label and taint, and what every system pod sets to land there.

Plain data, read by the cluster construct (which labels and taints the node group), by every
chart's values that put pods there, and by the system-capacity check (``gennstack summary``).
Every system workload tolerates the taint; model pods never do, so they can only land on
Karpenter's accelerator nodes.
"""

from __future__ import annotations

SYSTEM_LABEL = {"gennstack.io/pool": "system"}
SYSTEM_TAINT_KEY = "CriticalAddonsOnly"
SYSTEM_TOLERATIONS = [{"key": SYSTEM_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
SYSTEM_NODE_SELECTOR = dict(SYSTEM_LABEL)
