"""Where the CDK app finds the files it deploys: ``cdk.json``, ``assets/`` (charts, images) and ``lambdas/``.

They sit in the repository beside this package, which is installed from it in editable mode
(``pip install -e .``, as ``make setup`` does), so these paths hold from any working directory.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "assets"
LAMBDAS = REPO_ROOT / "lambdas"
BUILD = REPO_ROOT / "build"
