"""``gennstack preflight``: will a first deploy of this config succeed in this AWS account and region?

It reads the same configuration the synth reads (``cdk.json``'s ``gennstack`` context, deep-merged
with an optional ``--config`` file) and asks AWS, with read-only API calls only, what a deploy
depends on: credentials and region, the CDK bootstrap, EC2 vCPU quotas, zones and instance
offerings, the pinned EKS add-on builds, Lambda concurrency, cluster admin roles, spot prices and
capacity reservations. Each check is one function in :mod:`gennstack.preflight.checks` that returns
rows of PASS / WARN / FAIL with a fix; the command exits 1 on any FAIL.

Modules: ``results`` (the row type), ``aws`` (clients, retries, error classification, the IAM
actions used), ``capacity`` (vCPUs the config can launch, EC2 quota codes), ``zones`` (zone choice
and suggestions), ``checks`` (the checks and the runner), ``report`` (table and JSON), ``cli``.
"""

from __future__ import annotations

from gennstack.preflight.checks import CHECKS, Context, run_preflight
from gennstack.preflight.results import FAIL, PASS, WARN, Result

__all__ = ["CHECKS", "Context", "FAIL", "PASS", "WARN", "Result", "run_preflight"]
