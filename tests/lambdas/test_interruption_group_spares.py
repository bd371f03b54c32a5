"""Warm-spare groups through the interruption handler: the LeaderWorkerSet
``gen3-g6e-multinode-warm-spare`` is scaled through its ``scale`` subresource, counted in groups (one
per serving group with a member on an interrupted instance, however many of its members are), and
reconciled back to its baseline.

The fake Kubernetes API (tests/lambdas/fake_kubernetes.py) serves the LWS v0.10.0 CRD's scale
subresource as the API server does (``subresources.scale`` of ../shared/crds/leaderworkerset.x-k8s.io:
specReplicasPath ``.spec.replicas``, the number of groups per api/leaderworkerset/v1/leaderworkerset_types.go
"replicas is the number of leader-workers groups"; labelSelectorPath ``.status.hpaPodSelector``, the
leaders' selector the controller writes in pkg/controllers/leaderworkerset_controller.go). The groups'
pods are labelled as LWS labels them (tests/lambdas/test_interruption_group_drain.py).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
import yaml

from lambdas.interruption_handler.errors import HandlerError, Reason
from lambdas.interruption_handler.kube import KubeClient, Scale
from lambdas.interruption_handler.settings import ConfigError, GroupSpare, Settings, parse_warm_spares
from tests.lambdas.fake_kubernetes import LWS_SCALE_PATH, Deployment, FakeKubernetes
from tests.lambdas.lambda_support import NAMESPACE, WARM_SPARES, LambdaContext, load_event
from tests.k8s_schema import crd_dir
from tests.lambdas.test_interruption_group_drain import GROUPS, SELECTOR, launch_fleet, metric

SPARES_NAMESPACE = "gennstack-serving-group-spares"
SPARE = "gen3-g6e-multinode-warm-spare"
GROUP_SPARE = {"namespace": SPARES_NAMESPACE, "leaderworkerset": SPARE, "baseline": 0, "cap": 2}


def spares_env(monkeypatch: pytest.MonkeyPatch, *, baseline: int = 0, cap: int = 2) -> None:
    spares = json.loads(json.dumps(WARM_SPARES))
    spares["gen3-g6e-spot"]["groups"] = {**GROUP_SPARE, "baseline": baseline, "cap": cap}
    monkeypatch.setenv("WARM_SPARES", json.dumps(spares))
    monkeypatch.setenv("DRAIN_ON", json.dumps({"gen3-g6e-spot": {"signals": ["spot_interruption_warning"],
                                                                 "pods": SELECTOR, "groups": GROUPS}}))


@pytest.fixture
def fleet(launch: Any, kubernetes: FakeKubernetes) -> dict[str, str]:
    """Two serving groups of two g6e.12xlarge (0 on a, b; 1 on c, d), a gen3-g6e server on e, the
    warm-spare LeaderWorkerSet at 0 groups."""
    instances = launch_fleet(launch, kubernetes)
    kubernetes.leaderworkersets[(SPARES_NAMESPACE, SPARE)] = Deployment(replicas=0)
    return instances


def groups_now(kubernetes: FakeKubernetes) -> int:
    return kubernetes.leaderworkersets[(SPARES_NAMESPACE, SPARE)].replicas


def lws_patches(kubernetes: FakeKubernetes) -> list[Any]:
    return [r for r in kubernetes.patches() if "/leaderworkersets/" in r.path]


def test_the_fake_serves_the_scale_subresource_the_pinned_crd_declares() -> None:
    """What the fake imitates is what the CRD at v0.10.0 declares, read from the CRD itself."""
    crd = yaml.safe_load((crd_dir() / "leaderworkerset.x-k8s.io" / "LeaderWorkerSet.yaml").read_text())
    assert crd["spec"]["group"] == "leaderworkerset.x-k8s.io" and crd["spec"]["names"]["plural"] == "leaderworkersets"
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.hpaPodSelector"}
    replicas = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"]
    # Absent replicas default to 1: the chart renders 0 explicitly.
    assert (replicas["default"], replicas["minimum"], replicas["maximum"]) == (1, 0, 1_000_000)
    assert LWS_SCALE_PATH.format(ns="n", name="x") == KubeClient.scale_path("n", "x", "leaderworkersets")


def test_the_client_gets_and_conditionally_patches_a_leaderworkerset_scale(kube: KubeClient, kubernetes: FakeKubernetes) -> None:
    kubernetes.leaderworkersets[(SPARES_NAMESPACE, SPARE)] = Deployment(replicas=0)
    assert kube.get_scale(SPARES_NAMESPACE, SPARE, "leaderworkersets") == Scale(0, "1")
    assert kube.patch_scale(SPARES_NAMESPACE, SPARE, 2, "1", "leaderworkersets") == Scale(2, "2")
    [patch] = lws_patches(kubernetes)
    assert patch.path == f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{SPARES_NAMESPACE}/leaderworkersets/{SPARE}/scale"
    assert patch.body == {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 2}}
    with pytest.raises(HandlerError) as stale:
        kube.patch_scale(SPARES_NAMESPACE, SPARE, 1, "1", "leaderworkersets")
    assert stale.value.reason is Reason.KUBE_CONFLICT
    # A Deployment of the same name is another object: not found.
    with pytest.raises(HandlerError) as missing:
        kube.get_scale(SPARES_NAMESPACE, SPARE)
    assert missing.value.reason is Reason.KUBE_NOT_FOUND


def test_warning_for_any_member_adds_one_spare_group_per_serving_group(
    handler: Any, lambda_context: LambdaContext, fleet: dict[str, str], kubernetes: FakeKubernetes,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    spares_env(monkeypatch)
    # Group 0's worker: one group doomed, one spare group.
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["b"]), lambda_context)
    [entry] = result["results"]
    assert (entry["spare_groups"], entry["previous_spare_groups"], entry["doomed_groups"]) == (1, 0, 1)
    assert groups_now(kubernetes) == 1
    # The single-node Deployment spare is counted per instance, as before.
    assert kubernetes.replicas(NAMESPACE, "g6e-warm-spare") == 2
    # Group 0's leader too: the same group, still one spare group; no patch sent.
    before = len(lws_patches(kubernetes))
    again = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["a"]), lambda_context)
    assert again["results"][0]["spare_groups"] == 1 and len(lws_patches(kubernetes)) == before
    # The gen3-g6e server's node holds no group: no spare group for it.
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["e"]), lambda_context)
    assert groups_now(kubernetes) == 1
    # Group 1's worker: a second group, a second spare group.
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["c"]), lambda_context)
    assert groups_now(kubernetes) == 2
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [reconciled] = [r for r in tick["results"] if r["outcome"] == "reconciled" and r["generation"] == "g6e"]
    assert reconciled["spare_groups"] == 2 and reconciled["doomed_groups"] == 2
    [spare_metric] = metric(capsys.readouterr().out, "WarmSpareGroups")
    assert spare_metric["WarmSpareGroups"] == [2.0] and spare_metric["generation"] == "g6e"


def test_the_cap_bounds_spare_groups_and_the_reconciler_steps_back_to_baseline(
    handler: Any, lambda_context: LambdaContext, fleet: dict[str, str], kubernetes: FakeKubernetes,
    monkeypatch: pytest.MonkeyPatch, table: Any,
) -> None:
    spares_env(monkeypatch, baseline=0, cap=1)
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["a"]), lambda_context)
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["d"]), lambda_context)
    assert groups_now(kubernetes) == 1  # two groups doomed, capped at one
    # Someone scales the spares by hand: the reconciler puts its count back.
    kubernetes.leaderworkersets[(SPARES_NAMESPACE, SPARE)].replicas = 5
    handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert groups_now(kubernetes) == 1
    # Both records expire: back to the baseline, 0 groups.
    for node in "ad":
        table.update_item(Key={"pk": f"instance#{fleet[node]}"}, UpdateExpression="SET expires_at = :e",
                          ExpressionAttributeValues={":e": int(time.time()) - 1})
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert groups_now(kubernetes) == 0
    assert [r["spare_groups"] for r in tick["results"] if r["outcome"] == "reconciled" and r["generation"] == "g6e"] == [0]


def test_a_group_still_counts_after_its_node_is_gone(
    handler: Any, lambda_context: LambdaContext, fleet: dict[str, str], kubernetes: FakeKubernetes,
    monkeypatch: pytest.MonkeyPatch, table: Any,
) -> None:
    """The record keeps the group keys it found: once the node and the group's pods are gone (LWS
    recreates the group under the same key, from its leader's name), the spare stays while the
    replacement group forms (REPLACEMENT_GRACE_SECONDS)."""
    spares_env(monkeypatch)
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=fleet["b"]), lambda_context)
    assert table.get_item(Key={"pk": f"instance#{fleet['b']}"})["Item"]["groups"] == {"key0"}
    del kubernetes.nodes["ip-b.ec2.internal"]
    for name in ("gen3-g6e-multinode-0", "gen3-g6e-multinode-0-1"):
        del kubernetes.pods[(NAMESPACE, name)]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    handler.lambda_handler(load_event("instance_state_change", instance_id=fleet["b"], fields={"time": now},
                                      detail={"state": "terminated"}), lambda_context)
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert groups_now(kubernetes) == 1
    assert [r["doomed_groups"] for r in tick["results"] if r["outcome"] == "reconciled" and r["generation"] == "g6e"] == [1]
    # Once the grace has passed, the spare group is given back.
    table.update_item(Key={"pk": f"instance#{fleet['b']}"}, UpdateExpression="SET terminated_at = :t, expires_at = :t",
                      ExpressionAttributeValues={":t": int(time.time()) - 3600})
    handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert groups_now(kubernetes) == 0


def test_spare_groups_need_the_groups_selector_and_a_well_formed_entry(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    spares = json.loads(json.dumps(WARM_SPARES))
    spares["gen3-g6e-spot"]["groups"] = GROUP_SPARE
    parsed = parse_warm_spares(json.dumps(spares))
    assert parsed["gen3-g6e-spot"].groups == GroupSpare(SPARES_NAMESPACE, SPARE, 0, 2)
    assert parsed["gen1-inf2-spot"].groups is None
    monkeypatch.setenv("WARM_SPARES", json.dumps(spares))
    with pytest.raises(ConfigError, match=r"WARM_SPARES\['gen3-g6e-spot'\]\.groups needs DRAIN_ON\['gen3-g6e-spot'\]\.groups"):
        Settings.from_env(os.environ)
    for bad, message in (({**GROUP_SPARE, "cap": 1, "baseline": 2}, "cap=1 is below baseline=2"),
                         ({**GROUP_SPARE, "deployment": "x"}, "expected exactly"),
                         ({**GROUP_SPARE, "leaderworkerset": "Not_A_Name"}, "leaderworkerset='Not_A_Name' is not a Kubernetes object name")):
        spares["gen3-g6e-spot"]["groups"] = bad
        with pytest.raises(ConfigError, match=message):
            parse_warm_spares(json.dumps(spares))
