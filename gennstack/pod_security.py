"""Pod Security admission levels of the namespaces GenNStack creates (docs/security.md, "Pod security").

The serving namespace enforces the strictest Pod Security Standard its pods can meet
(kubernetes/pod-security-admission v0.36.0, policy/check_*.go):

- ``restricted`` while no Neuron generation is enabled: every pod of the serving chart then runs
  without capabilities or privilege escalation, with RuntimeDefault seccomp, as a user other than
  root and with emptyDir/configMap volumes only (tests/serving/test_pod_security.py renders them and
  checks each against the restricted checks);
- ``privileged`` while inf2 or trn2 is enabled: their servers and warm spares share the node's
  model cache, a ``hostPath`` volume, which already the ``baseline`` level forbids
  (check_hostPathVolumes.go: "HostPath volumes must be forbidden", level baseline), and no level
  between baseline and privileged exists. Audit and warn stay at ``restricted``, so every pod
  that falls short of it is named in the API server's audit log and in the deploy's output.

``enforce-version`` pins the checks to the cluster's minor: a control-plane upgrade that tightens
a check does not start refusing pods the chart renders today.
"""

from __future__ import annotations

LEVELS = ("privileged", "baseline", "restricted")
LABEL_PREFIX = "pod-security.kubernetes.io/"


def serving_level(*, neuron: bool) -> str:
    """The level the serving namespace enforces: privileged with a Neuron generation (hostPath cache)."""
    return "privileged" if neuron else "restricted"


def namespace_labels(*, enforce: str, kubernetes_version: str) -> dict[str, str]:
    """The Pod Security admission labels of a namespace that enforces ``enforce`` and audits and
    warns at ``restricted``, pinned to ``kubernetes_version`` (a minor, e.g. "1.36")."""
    if enforce not in LEVELS:
        raise ValueError(f"enforce: got {enforce!r}; allowed: {', '.join(LEVELS)}")
    version = f"v{kubernetes_version}"
    labels = {"enforce": enforce, "audit": "restricted", "warn": "restricted"}
    out: dict[str, str] = {}
    for mode, level in labels.items():
        out[f"{LABEL_PREFIX}{mode}"] = level
        out[f"{LABEL_PREFIX}{mode}-version"] = version
    return out
