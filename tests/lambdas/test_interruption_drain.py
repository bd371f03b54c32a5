"""Drain routing end to end: the handler takes a doomed node's serving pods out of load balancing.

Real-shaped events, moto for EC2 and DynamoDB, the local Kubernetes API (tests/lambdas/fake_kubernetes.py)
holding nodes shaped as Karpenter registers them (``spec.providerID = aws:///<zone>/<instance-id>``,
aws/karpenter-provider-aws v1.14.1 ``pkg/cloudprovider/cloudprovider.go``) and serving pods labelled
as the serving chart labels them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from lambdas.interruption_handler.errors import InvocationFailed
from lambdas.interruption_handler.settings import ConfigError, Settings, parse_drain_on, parse_warm_spares
from tests.lambdas.fake_kubernetes import FakeKubernetes
from tests.lambdas.lambda_support import NAMESPACE, WARM_SPARES, LambdaContext, load_event

Launch = Callable[..., str]
SERVER = {"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "server"}
SELECTOR = "app.kubernetes.io/name=gen3-g6e,app.kubernetes.io/component=server"
ROUTABLE = "gennstack.io/routable"


def drain_env(monkeypatch: pytest.MonkeyPatch, signals: list[str]) -> None:
    monkeypatch.setenv("DRAIN_ON", json.dumps({"gen3-g6e-spot": {"signals": signals, "pods": SELECTOR}}))


@pytest.fixture
def doomed(launch: Launch, kubernetes: FakeKubernetes) -> str:
    """A g6e spot node with two serving pods, a warm-spare pod; another node with one serving pod."""
    instance_id = launch("gen3-g6e-spot", instance_type="g6e.xlarge")
    kubernetes.add_node("ip-10-0-1-1.ec2.internal", pool="gen3-g6e-spot", instance_id=instance_id)
    kubernetes.add_node("ip-10-0-2-2.ec2.internal", pool="gen3-g6e-spot", instance_id="i-0bbbbbbbbbbbbbbbb")
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-a", node="ip-10-0-1-1.ec2.internal", labels={**SERVER, ROUTABLE: "true", "pod-template-hash": "5c4b"})
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-b", node="ip-10-0-1-1.ec2.internal", labels={**SERVER, ROUTABLE: "true"})
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-warm-spare-x", node="ip-10-0-1-1.ec2.internal",
                       labels={"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "warm-spare"})
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node="ip-10-0-2-2.ec2.internal", labels={**SERVER, ROUTABLE: "true"})
    return instance_id


def routable(kubernetes: FakeKubernetes) -> dict[str, str | None]:
    return {name: pod["metadata"]["labels"].get(ROUTABLE) for (_, name), pod in sorted(kubernetes.pods.items())}


def test_warning_drains_exactly_the_doomed_nodes_serving_pods(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    [entry] = result["results"]
    assert entry["node"] == "ip-10-0-1-1.ec2.internal"
    assert entry["drained_pods"] == ["gen3-g6e-a", "gen3-g6e-b"]
    assert routable(kubernetes) == {"gen3-g6e-a": "false", "gen3-g6e-b": "false", "gen3-g6e-c": "true", "gen3-g6e-warm-spare-x": None}
    # exactly one field per pod: a merge patch of that one label, nothing else
    patches = kubernetes.pod_patches()
    assert [p.path for p in patches] == [f"/api/v1/namespaces/{NAMESPACE}/pods/gen3-g6e-a", f"/api/v1/namespaces/{NAMESPACE}/pods/gen3-g6e-b"]
    assert all(p.body == {"metadata": {"labels": {ROUTABLE: "false"}}} for p in patches)
    assert all(p.headers["content-type"] == "application/merge-patch+json" for p in patches)
    assert kubernetes.pod_labels(NAMESPACE, "gen3-g6e-a")["pod-template-hash"] == "5c4b"
    # the lists: nodes of the pool by label; the generation's serving pods, all nodes (one list: the
    # guard needs the other nodes' pods too), split by spec.nodeName in the handler; after the patches,
    # the same list again (a concurrent drain may have taken the other serving pods meanwhile)
    lists = [urlsplit(r.path) for r in kubernetes.requests if r.method == "GET" and r.path.startswith("/api/v1/")]
    assert [(u.path, parse_qs(u.query)) for u in lists] == [
        ("/api/v1/nodes", {"labelSelector": ["karpenter.sh/nodepool=gen3-g6e-spot"]}),
        (f"/api/v1/namespaces/{NAMESPACE}/pods", {"labelSelector": [SELECTOR]}),
        (f"/api/v1/namespaces/{NAMESPACE}/pods", {"labelSelector": [SELECTOR]}),
    ]
    out = capsys.readouterr().out
    assert '"DrainLatency"' in out and '"DrainedPods"' in out


def test_redelivery_changes_nothing(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    event = load_event("spot_interruption_warning", instance_id=doomed)
    handler.lambda_handler(event, lambda_context)
    again = handler.lambda_handler(event, lambda_context)
    assert again["results"][0]["outcome"] == "duplicate" and again["results"][0]["drained_pods"] == []
    assert len(kubernetes.pod_patches()) == 2


def test_a_signal_not_configured_does_not_drain_and_a_later_one_does(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    first = handler.lambda_handler(load_event("rebalance_recommendation", instance_id=doomed), lambda_context)
    assert "drained_pods" not in first["results"][0] and kubernetes.pod_patches() == []
    second = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    # the record is a duplicate (the rebalance wrote it), the drain still happens
    assert second["results"][0]["outcome"] == "duplicate"
    assert second["results"][0]["drained_pods"] == ["gen3-g6e-a", "gen3-g6e-b"]


def test_rebalance_drains_when_configured(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    drain_env(monkeypatch, ["rebalance_recommendation", "spot_interruption_warning"])
    result = handler.lambda_handler(load_event("rebalance_recommendation", instance_id=doomed), lambda_context)
    assert result["results"][0]["drained_pods"] == ["gen3-g6e-a", "gen3-g6e-b"]


def test_no_drain_on_means_no_pod_calls(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes
) -> None:
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    assert not [r for r in kubernetes.requests if r.path.startswith("/api/v1/")]


def test_node_without_serving_pods_or_not_registered(
    handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    empty = launch("gen3-g6e-spot", instance_type="g6e.xlarge")
    kubernetes.add_node("ip-10-0-3-3.ec2.internal", pool="gen3-g6e-spot", instance_id=empty)
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=empty), lambda_context)
    assert (result["results"][0]["node"], result["results"][0]["drained_pods"]) == ("ip-10-0-3-3.ec2.internal", [])
    unregistered = launch("gen3-g6e-spot", instance_type="g6e.xlarge")
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=unregistered), lambda_context)
    assert "node" not in result["results"][0] and result["results"][0]["drained_pods"] == []
    assert kubernetes.pod_patches() == []


def test_pod_deleted_between_list_and_patch_is_skipped(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])

    def delete_a(fake: FakeKubernetes, seen: Any) -> None:
        fake.pods.pop((NAMESPACE, "gen3-g6e-a"))

    # faults are consumed one per request: nodes list, pods list, then the first patch deletes the pod first
    kubernetes.faults.extend([lambda f, s: None, lambda f, s: None, delete_a])
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    assert result["results"][0]["drained_pods"] == ["gen3-g6e-b"]


@pytest.mark.parametrize(("fault", "reason"), [(403, "kube_forbidden"), (401, "kube_unauthorized"), ("not-json", "kube_bad_response")])
def test_api_errors_are_classified_and_retried_by_lambda(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
    fault: Any, reason: str,
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    kubernetes.faults.append(fault)  # the first request: the node list
    with pytest.raises(InvocationFailed) as caught:
        handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    assert caught.value.reasons == [reason]
    [failure] = caught.value.failures
    assert failure.context["instance_id"] == doomed and failure.context["namespace"] == NAMESPACE
    # the warm spare still converged, and Lambda's retry drains
    assert kubernetes.replicas(NAMESPACE, "g6e-warm-spare") == 2
    retry = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    assert retry["results"][0]["drained_pods"] == ["gen3-g6e-a", "gen3-g6e-b"]


def test_reconcile_redrains_and_restores_when_the_record_expires(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch, table: Any
) -> None:
    drain_env(monkeypatch, ["rebalance_recommendation"])
    handler.lambda_handler(load_event("rebalance_recommendation", instance_id=doomed), lambda_context)
    # a new serving pod lands on the doomed (not cordoned: only a rebalance) node after the drain
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-d", node="ip-10-0-1-1.ec2.internal", labels={**SERVER, ROUTABLE: "true"})
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert (routing["drained_pods"], routing.get("restored_pods")) == (["gen3-g6e-d"], [])
    # the rebalance never became an interruption: once its record expires, routing comes back
    table.update_item(Key={"pk": f"instance#{doomed}"}, UpdateExpression="SET expires_at = :e",
                      ExpressionAttributeValues={":e": int(time.time()) - 1})
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routing["restored_pods"] == ["gen3-g6e-a", "gen3-g6e-b", "gen3-g6e-d"]
    assert set(routable(kubernetes).values()) == {"true", None}
    patches_before = len(kubernetes.pod_patches())
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert not [r for r in tick["results"] if r["outcome"] == "routing"] and len(kubernetes.pod_patches()) == patches_before


def test_drain_on_settings_are_validated() -> None:
    spares = parse_warm_spares(json.dumps(WARM_SPARES))
    assert parse_drain_on("{}", spares) == {}
    good = parse_drain_on(json.dumps({"gen3-g6e-spot": {"signals": ["spot_interruption_warning"], "pods": SELECTOR}}), spares)
    assert good["gen3-g6e-spot"].signals == {"spot_interruption_warning"}
    for raw, message in [
        ("[", "DRAIN_ON is not JSON"),
        ('{"nope": {"signals": [], "pods": "a=b"}}', "no WARM_SPARES entry"),
        ('{"gen3-g6e-spot": {"signals": ["soon"], "pods": "a=b"}}', "signals=['soon']"),
        ('{"gen3-g6e-spot": {"signals": [], "pods": "a in (b)"}}', "must be a label selector"),
        ('{"gen3-g6e-spot": ["spot_interruption_warning"]}', "exactly the keys"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
            parse_drain_on(raw, spares)


def test_settings_read_drain_on(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    assert Settings.from_env(os.environ).drain_on == {}
    drain_env(monkeypatch, ["scheduled_change"])
    assert Settings.from_env(os.environ).drain_on["gen3-g6e-spot"].pods == SELECTOR


def test_reconcile_adopts_serving_pods_without_the_label(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods created before the chart labelled them (an upgrade) would be skipped by the Service: the
    reconciler labels them routable, except on a doomed node, where they are drained."""
    drain_env(monkeypatch, ["spot_interruption_warning"])
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-old", node="ip-10-0-2-2.ec2.internal", labels=SERVER)
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-old-doomed", node="ip-10-0-1-1.ec2.internal", labels=SERVER)
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-pending", node="", labels=SERVER)
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routing["restored_pods"] == ["gen3-g6e-old", "gen3-g6e-old-doomed", "gen3-g6e-pending"]
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    assert routable(kubernetes)["gen3-g6e-old-doomed"] == "false"
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert not [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routable(kubernetes)["gen3-g6e-old-doomed"] == "false" and routable(kubernetes)["gen3-g6e-old"] == "true"


def test_reconcile_does_not_restore_a_drain_made_after_it_read_the_records(
    handler: Any, lambda_context: LambdaContext, doomed: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warning handled between the reconcile's read of the records and its pod listing: the pods on
    that node are already drained, and the reconcile, reading the records again before it restores
    anything, leaves them drained (restoring them would route new requests to a node about to go)."""
    from lambdas.interruption_handler import interruptions

    drain_env(monkeypatch, ["spot_interruption_warning"])
    handler.lambda_handler(load_event("spot_interruption_warning", instance_id=doomed), lambda_context)
    assert routable(kubernetes)["gen3-g6e-a"] == "false"
    real, calls = interruptions.load_records, []

    def stale_then_real(table: Any) -> list[dict[str, Any]]:
        calls.append(1)
        return [] if len(calls) <= 2 else real(table)  # the reconcile's reads before the drain pass see no record

    monkeypatch.setattr(interruptions, "load_records", stale_then_real)
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert len(calls) >= 3  # the two stale reads, the re-read before restoring, then the warm spares' own
    assert not [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routable(kubernetes) == {"gen3-g6e-a": "false", "gen3-g6e-b": "false", "gen3-g6e-c": "true", "gen3-g6e-warm-spare-x": None}


# --- the last replica stays: a drain never empties a generation's Service -----------------------

DOOMED_NODE, OTHER_NODE = "ip-10-0-1-1.ec2.internal", "ip-10-0-2-2.ec2.internal"


@pytest.fixture
def only(launch: Launch, kubernetes: FakeKubernetes) -> str:
    """A g6e spot node with the generation's only serving pod; another node of the pool with none."""
    instance_id = launch("gen3-g6e-spot", instance_type="g6e.xlarge")
    kubernetes.add_node(DOOMED_NODE, pool="gen3-g6e-spot", instance_id=instance_id)
    kubernetes.add_node(OTHER_NODE, pool="gen3-g6e-spot", instance_id="i-0bbbbbbbbbbbbbbbb")
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-a", node=DOOMED_NODE, labels={**SERVER, ROUTABLE: "true"})
    return instance_id


@pytest.mark.parametrize(("signal", "signals"), [
    ("spot_interruption_warning", ["rebalance_recommendation", "spot_interruption_warning"]),
    ("rebalance_recommendation", ["rebalance_recommendation", "spot_interruption_warning"]),
])
def test_the_only_serving_replica_is_kept(
    handler: Any, lambda_context: LambdaContext, only: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], signal: str, signals: list[str],
) -> None:
    """Upstream, draining the last replica would not move its requests anywhere, it would drop them:
    the EndpointSlice controller (kubernetes v1.36 ``staging/src/k8s.io/endpointslice/utils.go``
    ``podToEndpoint``: ``ready := service.Spec.PublishNotReadyAddresses || (serving && !terminating)``,
    ``serving`` = the pod's ``Ready`` condition is ``True``, ``terminating`` = a ``deletionTimestamp``;
    k8s.io/api v0.36 ``discovery/v1/types.go`` ``EndpointConditions.Ready``) leaves no ready endpoint,
    and CoreDNS v1.14.7 (``plugin/kubernetes/object/endpoint.go`` keeps only ready endpoints;
    ``plugin/kubernetes/kubernetes.go`` ``findServices`` starts from ``errNoItems``, cleared only by an
    address added) answers the headless name NXDOMAIN. So the handler leaves the pod routable and says so."""
    drain_env(monkeypatch, signals)
    result = handler.lambda_handler(load_event(signal, instance_id=only), lambda_context)
    [entry] = result["results"]
    assert (entry["node"], entry["drained_pods"], entry["kept_pods"]) == (DOOMED_NODE, [], ["gen3-g6e-a"])
    assert kubernetes.pod_patches() == [] and routable(kubernetes) == {"gen3-g6e-a": "true"}
    out = capsys.readouterr().out
    [kept] = [json.loads(line) for line in out.splitlines() if '"KeptPods"' in line]
    assert kept["KeptPods"] == [1.0] and kept["generation"] == "g6e"
    assert '"DrainedPods"' not in out
    # the warm spare is still pre-warmed: the replacement is what lets the reconciler drain later
    assert kubernetes.replicas(NAMESPACE, "g6e-warm-spare") == 2


def _not_ready(kubernetes: FakeKubernetes) -> None:  # a replacement whose model is still loading
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "true"}, ready=False)


def _deleting(kubernetes: FakeKubernetes) -> None:  # a routable pod being deleted (still Ready while it drains)
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "true"})
    kubernetes.pods[(NAMESPACE, "gen3-g6e-c")]["metadata"]["deletionTimestamp"] = "2026-11-30T17:00:00Z"


def _drained(kubernetes: FakeKubernetes) -> None:  # Ready but drained (its node's rebalance)
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "false"})


def _no_conditions(kubernetes: FakeKubernetes) -> None:  # just created: no conditions reported yet
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "true"})
    kubernetes.pods[(NAMESPACE, "gen3-g6e-c")]["status"] = {"phase": "Pending"}


def _warm_spare(kubernetes: FakeKubernetes) -> None:  # Ready, but not a serving pod (not the selector)
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-warm-spare-x", node=OTHER_NODE,
                       labels={"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "warm-spare", ROUTABLE: "true"})


def _second_on_the_node(kubernetes: FakeKubernetes) -> None:  # two replicas, both on the doomed node
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-b", node=DOOMED_NODE, labels={**SERVER, ROUTABLE: "true"})


@pytest.mark.parametrize("other", [_not_ready, _deleting, _drained, _no_conditions, _warm_spare, _second_on_the_node],
                         ids=lambda f: f.__name__.strip("_"))
def test_pods_out_of_the_dns_answer_do_not_count_as_serving(
    handler: Any, lambda_context: LambdaContext, only: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
    other: Callable[[FakeKubernetes], None],
) -> None:
    """Only a pod the Service's DNS answer holds, and will keep holding, counts: routable, ``Ready``
    ``"True"``, no ``deletionTimestamp`` (the EndpointSlice rule pinned above), not on the node
    being drained. Every doomed pod is kept; nothing is patched."""
    drain_env(monkeypatch, ["spot_interruption_warning"])
    other(kubernetes)
    before = routable(kubernetes)
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=only), lambda_context)
    [entry] = result["results"]
    doomed = sorted(name for (_, name), pod in kubernetes.pods.items() if pod["spec"]["nodeName"] == DOOMED_NODE)
    assert (entry["drained_pods"], entry["kept_pods"]) == ([], doomed)
    assert kubernetes.pod_patches() == [] and routable(kubernetes) == before


def test_a_ready_replica_on_another_node_lets_the_drain_happen(
    handler: Any, lambda_context: LambdaContext, only: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    drain_env(monkeypatch, ["spot_interruption_warning"])
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "true"})
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=only), lambda_context)
    [entry] = result["results"]
    assert (entry["drained_pods"], entry["kept_pods"]) == (["gen3-g6e-a"], [])
    assert routable(kubernetes) == {"gen3-g6e-a": "false", "gen3-g6e-c": "true"}
    assert '"KeptPods"' not in capsys.readouterr().out


def test_the_reconciler_drains_kept_pods_once_another_replica_is_ready(
    handler: Any, lambda_context: LambdaContext, only: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    drain_env(monkeypatch, ["rebalance_recommendation", "spot_interruption_warning"])
    handler.lambda_handler(load_event("rebalance_recommendation", instance_id=only), lambda_context)
    assert routable(kubernetes)["gen3-g6e-a"] == "true"
    capsys.readouterr()
    # every minute while kept: reported (log and KeptPods), nothing patched
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert (routing["drained_pods"], routing["restored_pods"], routing["kept_pods"]) == ([], [], ["gen3-g6e-a"])
    assert '"KeptPods"' in capsys.readouterr().out and kubernetes.pod_patches() == []
    # the warm spare's replacement lands and loads: not Ready yet, still kept
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "true"}, ready=False)
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert routing["kept_pods"] == ["gen3-g6e-a"] and kubernetes.pod_patches() == []
    # Ready: the next run drains the doomed pod
    kubernetes.set_ready(NAMESPACE, "gen3-g6e-c", True)
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert (routing["drained_pods"], routing["kept_pods"]) == (["gen3-g6e-a"], [])
    assert routable(kubernetes) == {"gen3-g6e-a": "false", "gen3-g6e-c": "true"}
    # and then it is quiet
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    assert not [r for r in tick["results"] if r["outcome"] == "routing"]


def _two_doomed_nodes(handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """DOOMED_NODE and OTHER_NODE both with an active rebalance record that drains their pool (no pods yet)."""
    drain_env(monkeypatch, ["rebalance_recommendation"])
    first, second = (launch("gen3-g6e-spot", instance_type="g6e.xlarge") for _ in range(2))
    kubernetes.add_node(DOOMED_NODE, pool="gen3-g6e-spot", instance_id=first)
    kubernetes.add_node(OTHER_NODE, pool="gen3-g6e-spot", instance_id=second)
    for instance_id in (first, second):
        handler.lambda_handler(load_event("rebalance_recommendation", instance_id=instance_id), lambda_context)


def test_pods_on_every_doomed_node_are_kept_when_no_other_serves(
    handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two doomed nodes (rebalances: not cordoned, so the replicas land there after the signals), no
    replica elsewhere: a pod on the other doomed node is no survivor, so the reconciler keeps both. A
    Ready replica on a third node lets it drain both."""
    _two_doomed_nodes(handler, lambda_context, launch, kubernetes, monkeypatch)
    kubernetes.add_node("ip-10-0-3-3.ec2.internal", pool="gen3-g6e-spot", instance_id="i-0cccccccccccccccc")
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-a", node=DOOMED_NODE, labels={**SERVER, ROUTABLE: "true"})
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-b", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "true"})
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert (routing["drained_pods"], routing["kept_pods"]) == ([], ["gen3-g6e-a", "gen3-g6e-b"])
    assert kubernetes.pod_patches() == []
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node="ip-10-0-3-3.ec2.internal", labels={**SERVER, ROUTABLE: "true"})
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert (routing["drained_pods"], routing["kept_pods"]) == (["gen3-g6e-a", "gen3-g6e-b"], [])
    assert routable(kubernetes) == {"gen3-g6e-a": "false", "gen3-g6e-b": "false", "gen3-g6e-c": "true"}


def test_a_drain_that_raced_another_away_from_the_last_replica_is_undone(
    handler: Any, lambda_context: LambdaContext, only: str, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two invocations at once (FIS warns every target together; the function has no reserved
    concurrency by default) can each see the other's pod serving and together drain the last ones.
    After its patches the handler lists the pods again: with none serving, it puts its own back."""
    drain_env(monkeypatch, ["spot_interruption_warning"])
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-c", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "true"})

    def other_invocation_drains_c(fake: FakeKubernetes, seen: Any) -> None:
        assert seen.method == "PATCH" and seen.path.endswith("/pods/gen3-g6e-a")
        fake.pod_labels(NAMESPACE, "gen3-g6e-c")[ROUTABLE] = "false"

    kubernetes.faults.extend([None, None, other_invocation_drains_c])  # nodes, pods, then the PATCH of a
    result = handler.lambda_handler(load_event("spot_interruption_warning", instance_id=only), lambda_context)
    [entry] = result["results"]
    assert (entry["drained_pods"], entry["kept_pods"]) == ([], ["gen3-g6e-a"])
    assert routable(kubernetes) == {"gen3-g6e-a": "true", "gen3-g6e-c": "false"}
    assert [p.body["metadata"]["labels"][ROUTABLE] for p in kubernetes.pod_patches()] == ["false", "true"]


def test_the_reconciler_puts_back_the_last_replicas_two_racing_drains_left_out(
    handler: Any, lambda_context: LambdaContext, launch: Launch, kubernetes: FakeKubernetes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The state two racing drains can leave: both doomed nodes' pods drained, no other replica. The
    next reconcile sets them routable again (kept), so the model is out for at most a minute."""
    _two_doomed_nodes(handler, lambda_context, launch, kubernetes, monkeypatch)
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-a", node=DOOMED_NODE, labels={**SERVER, ROUTABLE: "false"})
    kubernetes.add_pod(NAMESPACE, "gen3-g6e-b", node=OTHER_NODE, labels={**SERVER, ROUTABLE: "false"})
    tick = handler.lambda_handler(load_event("scheduled_event"), lambda_context)
    [routing] = [r for r in tick["results"] if r["outcome"] == "routing"]
    assert (routing["drained_pods"], routing["kept_pods"]) == ([], ["gen3-g6e-a", "gen3-g6e-b"])
    assert routable(kubernetes) == {"gen3-g6e-a": "true", "gen3-g6e-b": "true"}
