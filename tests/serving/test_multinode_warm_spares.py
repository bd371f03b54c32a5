"""Warm-spare groups of the multi-node replicas (templates/multinode-warm-spare.yaml), rendered with the
real helm from the values CDK builds and validated (the LeaderWorkerSet against LWS v0.10.0's CRD in
../shared/crds/leaderworkerset.x-k8s.io, the rest against Kubernetes 1.36), and what the interruption
handler is allowed to do with them.

Pinned to LWS v0.10.0 (kubernetes-sigs/lws tag v0.10.0):
* pkg/webhooks/pod_webhook.go: every leader gets the label ``leaderworkerset.sigs.k8s.io/group-key``
  (set when not found, before and whether or not the exclusive-topology annotation is there), and
  SetExclusiveAffinities gives a serving member the anti-affinity ``group-key Exists, NotIn [own]`` on
  the zone with no ``namespaces`` (so: its own namespace only, core/v1 PodAffinityTerm). A spare group
  in the serving namespace would match it; in its own namespace it does not.
* api/leaderworkerset/v1/leaderworkerset_types.go: ``spec.replicas`` "is the number of leader-workers
  groups", default 1 (so 0 must be rendered), and ``+kubebuilder:subresource:scale`` (RBAC
  ``leaderworkersets/scale``).
"""

from __future__ import annotations

import pytest

from gennstack.config import load_config
from gennstack.config_base import ConfigError
from gennstack.serving.multinode import warm_spare_group_name, warm_spare_namespace
from gennstack.serving.spare_placement import spare_anti_affinity
from gennstack_infra.components.interruption_handler import KUBERNETES_GROUP, group_spare_rbac_manifests, group_spares, warm_spares
from tests import helm
from tests.k8s_schema import validate
from tests.serving.conftest import CHART, NAMESPACE, cdk_values

pytestmark = pytest.mark.slow

ON = {"serving": {"multi_node": {"enabled": True, "warm_spare_replicas": 1}}}
SPARE = "gen3-g6e-multinode-warm-spare"
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    config = load_config(ON)
    return helm.render(CHART, cdk_values(ON, config.serving), namespace=NAMESPACE)


def by_name(rendered: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in rendered}


def test_spare_groups_validate_and_live_in_their_own_namespace(rendered) -> None:
    objects = by_name(rendered)
    for obj in rendered:
        validate(obj)
    spare = objects[("LeaderWorkerSet", SPARE)]
    namespace = warm_spare_namespace(NAMESPACE)
    assert spare["metadata"]["namespace"] == namespace == objects[("Namespace", namespace)]["metadata"]["name"]
    assert objects[("Namespace", namespace)]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert SPARE == warm_spare_group_name("gen3-g6e")
    # The serving groups stay in the release's namespace (helm's default: no metadata.namespace).
    assert "namespace" not in objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["metadata"]


def test_a_spare_group_is_shaped_like_a_serving_group_at_the_spare_priority(rendered) -> None:
    objects = by_name(rendered)
    spare = objects[("LeaderWorkerSet", SPARE)]["spec"]
    serving = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]
    assert spare["replicas"] == 1
    # Zone exclusivity among the spares, on the LeaderWorkerSet object where LWS v0.10.0 reads it
    # (pkg/controllers/pod_controller.go): a spare group's workers follow its leader's zone.
    assert objects[("LeaderWorkerSet", SPARE)]["metadata"]["annotations"] == {
        "leaderworkerset.sigs.k8s.io/exclusive-topology": "topology.kubernetes.io/zone"}
    assert spare["leaderWorkerTemplate"]["size"] == serving["leaderWorkerTemplate"]["size"] == 2
    assert spare["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    for role in ("leaderTemplate", "workerTemplate"):
        pod, member = spare["leaderWorkerTemplate"][role], serving["leaderWorkerTemplate"][role]
        [idle] = pod["spec"]["containers"]
        [served] = member["spec"]["containers"]
        # The same node shape: what a serving member requests, a spare member holds.
        assert idle["resources"] == served["resources"]
        assert idle["command"] == ["sleep", "infinity"] and idle["image"] == served["image"]
        assert pod["spec"]["priorityClassName"] == "gennstack-warm-spare"
        assert member["spec"]["priorityClassName"] == "gennstack-serving"
        assert pod["spec"]["nodeSelector"] == member["spec"]["nodeSelector"]
        assert pod["spec"]["tolerations"] == member["spec"]["tolerations"]
        assert pod["spec"]["affinity"]["nodeAffinity"] == member["spec"]["affinity"]["nodeAffinity"]
        # One spare member a node; zone exclusivity among the spares (their namespace).
        [term] = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": "gen3-g6e-multinode",
                                                        "app.kubernetes.io/component": "warm-spare"}
        assert "leaderworkerset.sigs.k8s.io/exclusive-topology" not in pod["metadata"].get("annotations", {})
        # Not a serving pod: never in the Service, never drained, no do-not-disrupt.
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "warm-spare"
        assert "gennstack.io/routable" not in pod["metadata"]["labels"]
        assert "karpenter.sh/do-not-disrupt" not in pod["metadata"].get("annotations", {})
        # The multi-node model's staging gate, as its serving groups (helm template: closed).
        assert pod["spec"]["schedulingGates"] == member["spec"]["schedulingGates"] == [{"name": "gennstack.io/staged"}]
        assert pod["metadata"]["labels"]["gennstack.io/staged"] == "false"
        assert pod["spec"]["automountServiceAccountToken"] is False and "serviceAccountName" not in pod["spec"]


def test_spare_groups_keep_out_of_the_serving_groups_zones_across_namespaces(rendered) -> None:
    """The spare groups' members carry the warm spares' zone anti-affinity to the serving groups
    (gennstack/serving/spare_placement.py), naming the serving namespace: without it the term would
    see only the spares' own namespace (core/v1 PodAffinityTerm; Karpenter v1.14.1
    scheduling/topology.go buildNamespaceList: no namespaces and no selector is the pod's own), and
    the spares would sit beside the groups a zone-wide reclaim takes with them."""
    objects = by_name(rendered)
    serving = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]["leaderWorkerTemplate"]
    spare = objects[("LeaderWorkerSet", SPARE)]["spec"]["leaderWorkerTemplate"]
    expected = spare_anti_affinity({"app.kubernetes.io/name": "gen3-g6e-multinode", "app.kubernetes.io/component": "server"},
                                   namespaces=[NAMESPACE])
    [term] = expected["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["namespaces"] == [NAMESPACE] != [objects[("LeaderWorkerSet", SPARE)]["metadata"]["namespace"]]
    for role in ("leaderTemplate", "workerTemplate"):
        preferred = spare[role]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred == [term]
        # It selects the serving members (leaders and workers), never a spare member.
        selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert selector.items() <= serving[role]["metadata"]["labels"].items()
        assert not selector.items() <= spare[role]["metadata"]["labels"].items()


def test_zero_spare_groups_is_rendered_not_left_to_the_crd_default() -> None:
    on = {"serving": {"multi_node": {"enabled": True}}}
    objects = by_name(helm.render(CHART, cdk_values(on, load_config(on).serving), namespace=NAMESPACE))
    assert objects[("LeaderWorkerSet", SPARE)]["spec"]["replicas"] == 0


def test_spare_groups_are_bounded_by_the_zones_and_the_namespace_length() -> None:
    with pytest.raises(ConfigError, match=r"serving.multi_node.warm_spare_replicas: got 4; allowed: at most network.az_count \(3\)"):
        load_config({"serving": {"multi_node": {"enabled": True, "warm_spare_replicas": 4}}})
    with pytest.raises(ConfigError, match="serving.namespace: got 'n{55}'; allowed: at most 50 characters"):
        load_config({"serving": {"namespace": "n" * 55, "multi_node": {"enabled": True}}})


def test_the_handler_scales_the_spare_groups_and_nothing_else() -> None:
    config = load_config(ON)
    [g6e] = [s for s in warm_spares(config, namespace=NAMESPACE, baselines={"g6e": 0}).values() if s["generation"] == "g6e"]
    groups = g6e["groups"]
    assert groups == {"namespace": warm_spare_namespace(NAMESPACE), "leaderworkerset": SPARE, "baseline": 1, "cap": 2}
    assert all("groups" not in s for s in warm_spares(config, namespace=NAMESPACE, baselines={}).values() if s["generation"] != "g6e")
    role, binding = group_spare_rbac_manifests(groups)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == groups["namespace"]
    assert role["rules"] == [{"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets/scale"],
                              "resourceNames": [SPARE], "verbs": ["get", "patch"]}]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": KUBERNETES_GROUP}]
    for obj in (role, binding):
        validate(obj)
    # The cap never exceeds the zones (one spare group a zone among spares).
    capped = load_config({**ON, "interruptions": {"warm_spare_cap": 5}})
    assert group_spares(capped, namespace=NAMESPACE)["cap"] == 3


def test_no_spare_group_scaling_without_drain_routing_or_multi_node() -> None:
    assert group_spares(load_config({}), namespace=NAMESPACE) is None
    no_drain = load_config({**ON, "interruptions": {"drain_on": {"g6e": []}}})
    assert group_spares(no_drain, namespace=NAMESPACE) is None
    assert all("groups" not in s for s in warm_spares(no_drain, namespace=NAMESPACE, baselines={}).values())
