"""Pod security of the serving chart's pods and the serving namespace's Pod Security admission level.

The model servers run third-party model code, so every serving pod is treated as one that may be
compromised (issue 35): no capabilities, no privilege escalation, RuntimeDefault seccomp, a user
other than root where the image allows, and a node cache (Neuron's hostPath, which outlives the
pod) that only the chart's own sync writes. The checks are kubernetes/pod-security-admission
v0.36.0's (tests/pod_security.py); the level the namespace enforces is gennstack/pod_security.py's.
"""

from __future__ import annotations

import json

import pytest

from gennstack import pod_security
from tests import helm
from tests.pod_security import containers, pod_specs, violations
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, STAGING, merged, only
from tests.support import Synth

MULTI_NODE = {"multiNode": {"enabled": True}}


def _render(*parts: dict) -> dict[str, dict]:
    return dict(pod_specs(helm.render(CHART, merged(REQUIRED, STAGING, *parts), namespace=NAMESPACE)))


@pytest.fixture(scope="module")
def gpu_only() -> dict[str, dict]:
    """Every pod template of a deploy without Neuron generations: g6e, its multi-node groups, staging."""
    return _render(only("g6e"), MULTI_NODE)


@pytest.fixture(scope="module")
def every_generation() -> dict[str, dict]:
    return _render(only("inf2", "trn2", "g6e"), MULTI_NODE)


def test_without_neuron_every_pod_meets_restricted(gpu_only: dict[str, dict]) -> None:
    """What the namespace enforces without a Neuron generation admits every pod the chart renders:
    the vLLM servers and the stage Job as the image's `vllm` user (UID 2000, vllm-project/vllm PR
    #40275 docker/Dockerfile), the helpers as 65532, all without capabilities."""
    level = pod_security.serving_level(neuron=False)
    assert level == "restricted"
    assert {"gen3-g6e", "gen3-g6e-warm-spare", "gen3-g6e-multinode/leader", "gen3-g6e-multinode/worker"} <= set(gpu_only)
    assert {name: violations(spec, level) for name, spec in gpu_only.items() if violations(spec, level)} == {}


def test_neuron_pods_fall_short_of_baseline_only_by_the_host_cache(every_generation: dict[str, dict]) -> None:
    """With inf2 or trn2 the namespace must be privileged: their servers and warm spares mount the node's
    model cache, a hostPath, which baseline forbids (check_hostPathVolumes.go, level baseline). It is
    the only baseline check any pod fails, and below restricted each falls short only by that volume
    and by running as root (the Neuron DLC), never by a capability, escalation or seccomp."""
    assert pod_security.serving_level(neuron=True) == "privileged"
    baseline = {name: violations(spec, "baseline") for name, spec in every_generation.items()}
    assert {name for name, failed in baseline.items() if failed} == {
        "gen2-trn2", "gen1-inf2-warm-spare", "gen2-trn2-warm-spare", "gen1-inf2/inf2"}
    assert set().union(*baseline.values()) == {"hostPathVolumes"}
    short = set().union(*(violations(spec, "restricted") for spec in every_generation.values()))
    assert short == {"hostPathVolumes", "restrictedVolumes", "runAsNonRoot"}


def test_every_container_drops_all_capabilities_and_escalation(every_generation: dict[str, dict]) -> None:
    """Whatever the namespace enforces: device access comes from the device plugins' allocation (the
    kubelet adds /dev/neuron* or the NVIDIA runtime the GPUs), which needs no capability."""
    for name, spec in every_generation.items():
        assert (spec.get("securityContext") or {}).get("seccompProfile") == {"type": "RuntimeDefault"}, name
        for c in containers(spec):
            sc = c.get("securityContext") or {}
            assert sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities") == {"drop": ["ALL"]}, (name, c["name"])
            assert not sc.get("privileged"), (name, c["name"])


def test_only_the_sync_writes_the_nodes_model_cache(every_generation: dict[str, dict]) -> None:
    """The Neuron node's cache outlives its pods: a server (the model's code, or a Ray worker's tasks)
    mounts it read-only, so it cannot leave tampered weights or compiled artifacts for the next pod;
    sync-from-s3, the chart's own script, alone writes it, before any model code starts. The compile
    Job, which runs the model's code to compile it, copies into a cache of its own (an emptyDir)."""
    writers: dict[str, set[str]] = {}
    for name, spec in every_generation.items():
        host = {v["name"] for v in spec.get("volumes") or () if "hostPath" in v}
        for c in containers(spec):
            if any(m["name"] in host and not m.get("readOnly") for m in c.get("volumeMounts") or ()):
                writers.setdefault(name, set()).add(c["name"])
    assert writers == {name: {"sync-from-s3"} for name in ("gen2-trn2", "gen1-inf2-warm-spare", "gen2-trn2-warm-spare", "gen1-inf2/inf2")}
    compile_jobs = [name for name in every_generation if "-compile-" in name]
    assert len(compile_jobs) == 3  # inf2, trn2, and g6e's vLLM compile cache
    for name in compile_jobs:
        assert not [v for v in every_generation[name]["volumes"] if "hostPath" in v], name


def test_vllm_user_has_a_writable_home(gpu_only: dict[str, dict]) -> None:
    """vLLM, HF, Triton, torch inductor and FlashInfer keep caches under $HOME; torch's cache paths call
    getpass.getuser(), which reads USER before the passwd entry. The server's HOME is an emptyDir."""
    for name in ("gen3-g6e", "gen3-g6e-multinode/leader", "gen3-g6e-multinode/worker"):
        spec = gpu_only[name]
        (server,) = spec["containers"]
        assert server["securityContext"]["runAsUser"] == 2000
        env = {e["name"]: e.get("value") for e in server["env"]}
        assert (env["HOME"], env["USER"]) == ("/home/vllm", "vllm")
        (home,) = [m for m in server["volumeMounts"] if m["mountPath"] == "/home/vllm"]
        assert {"name": home["name"], "emptyDir": {}} in spec["volumes"]


def test_namespace_labels_pin_the_level_and_version() -> None:
    labels = pod_security.namespace_labels(enforce="restricted", kubernetes_version="1.36")
    assert labels == {f"pod-security.kubernetes.io/{mode}{suffix}": value
                      for mode in ("enforce", "audit", "warn")
                      for suffix, value in (("", "restricted"), ("-version", "v1.36"))}
    with pytest.raises(ValueError, match="enforce: got 'strict'; allowed: privileged, baseline, restricted"):
        pod_security.namespace_labels(enforce="strict", kubernetes_version="1.36")


def test_the_stack_labels_the_serving_namespace(synth: Synth) -> None:
    """The default deploy has Neuron generations, so the namespace enforces privileged and audits and
    warns at restricted; the labels sit on the Namespace the stack creates before any chart."""
    resources = synth.template["Resources"]
    (namespace,) = [k for k in resources if k.startswith("EksClustermanifestServingNamespace")]
    (manifest,) = json.loads(resources[namespace]["Properties"]["Manifest"])
    labels = {k: v for k, v in manifest["metadata"]["labels"].items() if k.startswith("pod-security.kubernetes.io/")}
    assert labels == pod_security.namespace_labels(enforce="privileged", kubernetes_version="1.36")
