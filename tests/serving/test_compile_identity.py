"""The compile Jobs' identity: the code that loads a model holds no credentials.

A compile Job's `compile` container runs the model's code (vLLM's Neuron worker loads and compiles
it). It used to run with the staging account, whose role may overwrite every model and read the
Hugging Face token (issue 35). Now each Neuron generation's compile Jobs have an account of their own
(its role: that generation's model, read; its compile-cache prefix, read and upload;
tests/test_serving_stack.py), and inside the pod only the sync and the upload, the chart's own
scripts, get that account's credentials: no Kubernetes token and no Pod Identity token in `compile`.
"""

from __future__ import annotations

import pytest

from tests import helm
from tests.pod_security import pod_specs
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, STAGING, merged

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return helm.render(CHART, merged(REQUIRED, STAGING), namespace=NAMESPACE)


def _compile_pods(objects: list[dict]) -> dict[str, dict]:
    return {name.rsplit("-compile-", 1)[0]: obj for obj in objects if obj["kind"] == "Job"
            for name in [obj["metadata"]["name"]] if "-compile-" in name}


def test_each_generation_compiles_with_its_own_account(objects) -> None:
    jobs = _compile_pods(objects)
    assert set(jobs) == {"gen1-inf2", "gen2-trn2", "gen3-g6e"}
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    for pool, job in jobs.items():
        spec = job["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == f"gennstack-compile-{pool.split('-')[1]}" in accounts


def test_the_compile_container_gets_no_token(objects) -> None:
    """No automounted API token (the ServiceAccount admission plugin would mount it in every container):
    a projected one, mounted in the upload alone. And the Pod Identity webhook's skip-containers
    annotation, with which it mounts neither its token nor AWS_CONTAINER_* into `compile`
    (aws/amazon-eks-pod-identity-webhook pkg/handler/handler.go getContainersToSkip)."""
    for pool, job in _compile_pods(objects).items():
        template = job["spec"]["template"]
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False, pool
        # g6e's compile streams the weights from S3 as its servers do (the model path vLLM hashes into
        # its cache key must be the same s3:// URL): it keeps its credentials, scoped by its role
        # (tests/test_serving_stack.py test_compile_roles_write_only_their_generations_artifacts).
        skipped = template["metadata"]["annotations"].get("eks.amazonaws.com/skip-containers")
        assert skipped == (None if pool == "gen3-g6e" else "compile"), pool
        (volume,) = [v for v in spec["volumes"] if v["name"] == "kube-api-token"]
        sources = volume["projected"]["sources"]
        assert sources[0]["serviceAccountToken"]["path"] == "token"
        assert sources[1]["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
        assert sources[2]["downwardAPI"]["items"] == [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
        mounts = {c["name"]: [m for m in c.get("volumeMounts", []) if m["name"] == "kube-api-token"]
                  for c in [*spec["initContainers"], *spec["containers"]]}
        assert mounts == {"sync-from-s3": [], "compile": [],
                          "upload": [{"name": "kube-api-token", "mountPath": SA_DIR, "readOnly": True}]}
        (compile_container,) = [c for c in spec["initContainers"] if c["name"] == "compile"]
        assert not [e for e in compile_container["env"] if e["name"].startswith("AWS_CONTAINER")]
        assert "HF_TOKEN_SECRET" not in {e["name"] for c in mounts for e in
                                         next(x for x in [*spec["initContainers"], *spec["containers"]] if x["name"] == c)["env"]}


def test_a_compile_account_may_record_only_its_own_marker_and_open_only_its_own_gate(objects) -> None:
    """RBAC of a compile account: patch on its generation's `<pool>-staged`, and opening that
    generation's gate once the marker is complete (tests/serving/test_staged_gate.py): patch on its
    servers' and warm spares' objects by name (get too on gen1's RayService, which kube_patch.py reads
    first). Nothing else: not the other generation's marker or objects, not the compile Jobs the
    staging account releases."""
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Role"}
    opens = {"gen1-inf2": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"], "resourceNames": ["gen1-inf2-warm-spare"]},
                           {"apiGroups": ["ray.io"], "resources": ["rayservices"], "verbs": ["get", "patch"], "resourceNames": ["gen1-inf2"]}],
             "gen2-trn2": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"],
                            "resourceNames": ["gen2-trn2", "gen2-trn2-warm-spare"]}]}
    for pool in ("gen1-inf2", "gen2-trn2"):
        account = f"gennstack-compile-{pool.split('-')[1]}"
        granted = [b["roleRef"]["name"] for b in bindings if {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE} in b["subjects"]]
        assert granted == [f"{pool}-compile-marker", f"{pool}-compile-open-gate"]
        assert roles[granted[0]]["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"],
                                               "resourceNames": [f"{pool}-staged"]}]
        assert roles[granted[1]]["rules"] == opens[pool]


def test_pod_templates_of_the_compile_jobs_pass_the_pod_security_checks(objects) -> None:
    """The projected token volume is one restricted admits (check_restrictedVolumes.go); the pod falls
    short of restricted only by its Neuron containers' root user (tests/serving/test_pod_security.py)."""
    from tests.pod_security import violations

    for name, spec in pod_specs(objects):
        if "-compile-" in name:
            # g6e's compile runs as the vLLM image's own user: restricted.
            assert violations(spec, "restricted") == (set() if name.startswith("gen3-g6e") else {"runAsNonRoot"}), name
