"""Server-side apply's field ownership for the fake Kubernetes API, computed by the upstream library.

tests/field_ownership/main.go runs one apply or update with sigs.k8s.io/structured-merge-diff (the
library the API server's field manager calls), built here from Debian's
golang-k8s-sigs-structured-merge-diff-dev (4.1.2) with Debian's Go: both in .ci/run's packages. What
the API server does around the library for an update (k8s.io/apimachinery v0.36.3
``pkg/util/managedfields/internal/fieldmanager.go``): the managedFields sent in the request are used
when they are there and differ from the live ones (``decodeLiveOrNew``), else the live ones.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "field_ownership"
SMD = Path("/usr/share/gocode/src/sigs.k8s.io/structured-merge-diff")  # Debian's path (module .../v4)
GOPATH_DEBIAN = Path("/usr/share/gocode")


class Conflict(Exception):
    def __init__(self, conflicts: list[str]) -> None:
        super().__init__("; ".join(conflicts))
        self.conflicts = conflicts


def build(workdir: Path) -> Path:
    """The harness binary, or skip (fail under CI=true) when Go or the library is missing."""
    go = shutil.which("go")
    if go is None or not SMD.is_dir():
        reason = "needs Go and Debian's golang-k8s-sigs-structured-merge-diff-dev (apt-get install golang-go ...)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    gopath = workdir / "gopath"
    link = gopath / "src/sigs.k8s.io/structured-merge-diff/v4"  # GOPATH mode: the import path has /v4
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(SMD)
    binary = workdir / "field_ownership"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": f"{gopath}:{GOPATH_DEBIAN}", "GOCACHE": str(workdir / "cache"),
           "GOFLAGS": "", "GOENV": "off"}
    subprocess.run([go, "build", "-o", str(binary), "."], cwd=SOURCE, env=env, check=True, capture_output=True,
                   timeout=300)
    return binary


class FieldManager:
    def __init__(self, binary: Path, api_version: str) -> None:
        self.binary, self.api_version = binary, api_version

    def _run(self, **request: Any) -> dict[str, Any]:
        request["apiVersion"] = self.api_version
        done = subprocess.run([str(self.binary)], input=json.dumps(request), capture_output=True, text=True,
                              timeout=60, check=False)
        if done.returncode != 0:
            raise AssertionError(f"field_ownership: {done.stderr.strip()}")
        return json.loads(done.stdout)

    def apply(self, live: dict[str, Any] | None, config: dict[str, Any], *, manager: str,
              force: bool = False) -> dict[str, Any]:
        """The object after ``manager``'s server-side apply of ``config``, its managedFields set;
        :class:`Conflict` when another manager owns a field it would change."""
        managed = ((live or {}).get("metadata") or {}).get("managedFields") or []
        answer = self._run(op="apply", manager=manager, force=force, live=_bare(live) if live else None,
                           object=_bare(config), managedFields=managed)
        if answer.get("conflicts"):
            raise Conflict(answer["conflicts"])
        result = answer["object"]
        result.setdefault("metadata", {})["managedFields"] = answer["managedFields"]
        return result

    def update(self, live: dict[str, Any], new: dict[str, Any], *, manager: str) -> list[dict[str, Any]]:
        """The managedFields after an update (a patch, not an apply) by ``manager`` took ``live`` to ``new``."""
        sent = (new.get("metadata") or {}).get("managedFields")
        managed = sent if sent and sent != (live.get("metadata") or {}).get("managedFields") else \
            (live.get("metadata") or {}).get("managedFields") or []
        return self._run(op="update", manager=manager, live=_bare(live), object=_bare(new),
                         managedFields=managed)["managedFields"]


def _bare(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    (out.get("metadata") or {}).pop("managedFields", None)
    return out
