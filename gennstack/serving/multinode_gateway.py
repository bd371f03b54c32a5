"""The gateway's route to the multi-node model (``serving.multi_node``): one model entry whose backend is
the groups' leaders.

The serving chart (templates/multinode-lws.yaml) puts the LeaderWorkerSet ``<pool>-multinode`` behind
the headless Service ``<pool>-multinode-serve``, which selects leaders only (LWS v0.10.0's label
``leaderworkerset.sigs.k8s.io/worker-index: "0"``) that are routable: one host per group, i.e. per
replica (the workers run a Ray worker and no HTTP server). The gateway resolves it by DNS like
gen3-g6e's headless Service, so its health checks, outlier ejection and prefix hashing act per group.
"""

from __future__ import annotations

from typing import Any

from gennstack.serving.multinode import MultiNodeServing

__all__ = ["multi_node_backend", "multi_node_pool"]

# The serving chart's pool of each generation (its gennstack-serving.gen helper).
_POOLS = {"inf2": "gen1-inf2", "trn2": "gen2-trn2", "g6e": "gen3-g6e"}
# The leaders' port (the leader's containerPort `http` and the Service's port).
PORT = 8000


def multi_node_pool(section: MultiNodeServing) -> str:
    """The LeaderWorkerSet's name: ``<generation's pool>-multinode``."""
    return f"{_POOLS[section.generation]}-multinode"


def multi_node_backend(section: MultiNodeServing) -> dict[str, Any]:
    """``gateway.models.<served_model_name>`` for the groups: the leaders' Service on port 8000."""
    return {"generation": section.generation, "service": f"{multi_node_pool(section)}-serve", "port": PORT}
