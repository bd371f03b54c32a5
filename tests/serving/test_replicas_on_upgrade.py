"""An upgrade keeps the replica count the HPA chose (helm's ``lookup`` against a fake API server).

helm v4.2.3 (the kubectl layer's binary; see test_compile_gate.py for the pinned files) renders
``lookup`` from the live cluster on install/upgrade and an empty map under ``helm template``. It
applies upgrades with server-side apply: a field its manager set before and now omits is removed,
and Deployment's ``spec.replicas`` then defaults to 1, cutting every replica but one (and their
streams) until the HPA scales back. The chart therefore leaves ``replicas`` out on a fresh install
and renders the live count on every upgrade.
"""

from __future__ import annotations

import yaml

from tests import helm
from tests.serving.conftest import CHART, NAMESPACE
from tests.serving.fake_kube_api import FakeKubeApi
from tests.serving.test_compile_gate import VALUES, kube  # noqa: F401  (the fake API fixture)


def _deployments(api: FakeKubeApi) -> dict[str, dict]:
    proc = helm.run("template", helm.RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server",
                    "--disable-openapi-validation", "--kubeconfig", str(api.kubeconfig), values=VALUES)
    assert proc.returncode == 0, proc.stderr
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "Deployment"}


def test_a_fresh_install_leaves_replicas_to_the_hpa(kube) -> None:  # noqa: F811
    servers = {name: d for name, d in _deployments(kube).items() if name in ("gen2-trn2", "gen3-g6e")}
    assert servers and all("replicas" not in d["spec"] for d in servers.values())


def test_an_upgrade_renders_the_live_replica_count(kube) -> None:  # noqa: F811
    first = _deployments(kube)
    live = {**first["gen3-g6e"], "spec": {**first["gen3-g6e"]["spec"], "replicas": 5}}
    live["metadata"] = {**live["metadata"], "namespace": NAMESPACE, "annotations": {
        "meta.helm.sh/release-name": helm.RELEASE, "meta.helm.sh/release-namespace": NAMESPACE}}
    kube.deployments[(NAMESPACE, "gen3-g6e")] = live
    upgraded = _deployments(kube)
    assert upgraded["gen3-g6e"]["spec"]["replicas"] == 5
    assert "replicas" not in upgraded.get("gen2-trn2", {}).get("spec", {})  # nothing live for trn2
    looked_up = {r.path for r in kube.requests if r.method == "GET" and "/deployments/" in r.path}
    assert f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gen3-g6e" in looked_up
