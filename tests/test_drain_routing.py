"""Drain routing's cluster side: the handler's DRAIN_ON, its RBAC and admission policy, and the serving
chart's Services selecting only routable pods (rendered with the real helm, validated at Kubernetes 1.36).

The handler's behaviour against a Kubernetes API is tests/lambdas/test_interruption_drain.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gennstack_infra.components.interruption_handler import DRAIN_GROUP, drain_on, drain_rbac_manifests
from gennstack.config import load_config
from tests import helm
from tests.k8s_schema import validate
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED
from tests.serving.test_serving_availability import admit
from tests.support import ROOT, Synth

ROUTABLE = "gennstack.io/routable"
HANDLER = {"userInfo": {"username": "arn:aws:sts::123456789012:assumed-role/InterruptionHandlerRole/fn",
                        "groups": ["gennstack:warm-spare-scalers", DRAIN_GROUP, "system:authenticated"]},
           "namespace": NAMESPACE}
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "gen3-g6e-5c4b-abcde", "namespace": NAMESPACE,
                    "labels": {"app.kubernetes.io/name": "gen3-g6e", "app.kubernetes.io/component": "server", ROUTABLE: "true"},
                    "annotations": {"checksum/scripts": "abc"}},
       "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.29.0"}]}}


def test_drain_on_follows_config_per_enabled_generation() -> None:
    assert drain_on(load_config({})) == {
        "gen2-trn2": {"signals": ["spot_interruption_warning"], "pods": "app.kubernetes.io/name=gen2-trn2,app.kubernetes.io/component=server"},
        "gen3-g6e": {"signals": ["rebalance_recommendation", "spot_interruption_warning"],
                     "pods": "app.kubernetes.io/name=gen3-g6e,app.kubernetes.io/component=server"},
    }
    off = load_config({"interruptions": {"drain_on": {"g6e": [], "trn2": []}}})
    assert drain_on(off) == {}
    assert drain_on(load_config({"generations": {"trn2": {"enabled": False}}})).keys() == {"gen3-g6e"}


@pytest.mark.parametrize(("drain", "message"), [
    ({"inf2": ["warning"]}, "interruptions.drain_on.inf2: got ['warning']; allowed: [] (KubeRay owns gen1-inf2-serve-svc"),
    ({"g6e": ["soon"]}, "interruptions.drain_on.g6e.0: got 'soon'"),
    ({"g6e": ["warning", "warning"]}, "interruptions.drain_on.g6e: got ['warning', 'warning']; allowed: each signal at most once"),
    ({"p5": []}, "interruptions.drain_on.p5: unknown key"),
])
def test_bad_drain_on_names_key_and_value(drain: dict[str, Any], message: str) -> None:
    from gennstack.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config({"interruptions": {"drain_on": drain}})
    assert message in str(caught.value), str(caught.value)


def test_function_gets_drain_on_and_rbac_only_when_something_drains(synth: Synth, tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.support import synthesize

    def env_and_groups(s: Synth) -> tuple[dict[str, Any], list[str], list[str]]:
        (function,) = [f for k, f in s.resources("AWS::Lambda::Function").items() if k.startswith("InterruptionHandlerFunction")]
        (entry,) = [e for e in s.resources("AWS::EKS::AccessEntry").values()
                    if e["Properties"]["PrincipalArn"] == {"Fn::GetAtt": [function["Properties"]["Role"]["Fn::GetAtt"][0], "Arn"]}]
        (rbac,) = [m for k, m in s.resources("Custom::AWSCDK-EKS-KubernetesResource").items() if k.startswith("InterruptionHandlerRbac")]
        kinds = [o["kind"] for o in json.loads(rbac["Properties"]["Manifest"])]
        return json.loads(function["Properties"]["Environment"]["Variables"]["DRAIN_ON"]), entry["Properties"]["KubernetesGroups"], kinds

    drains, groups, kinds = env_and_groups(synth)
    assert drains == drain_on(load_config({}))
    assert DRAIN_GROUP in groups and "ValidatingAdmissionPolicy" in kinds
    # Without drains the group stays for the scale-down order (pod-deletion-cost, on by default)...
    costs_only = synthesize(tmp_path_factory.mktemp("cdk-no-drain"), {"interruptions": {"drain_on": {"g6e": [], "trn2": []}}})
    drains, groups, kinds = env_and_groups(costs_only)
    assert drains == {} and DRAIN_GROUP in groups and "ValidatingAdmissionPolicy" in kinds
    # ...and goes with it.
    off = synthesize(tmp_path_factory.mktemp("cdk-neither"), {"interruptions": {"drain_on": {"g6e": [], "trn2": []},
                                                                             "scale_down_on_demand_first": False}})
    drains, groups, kinds = env_and_groups(off)
    assert drains == {} and DRAIN_GROUP not in groups and kinds == ["Role", "RoleBinding"]


def test_rbac_is_list_nodes_and_list_patch_pods_in_the_namespace() -> None:
    manifests = drain_rbac_manifests(namespace=NAMESPACE)
    for manifest in manifests:
        validate(manifest)
    by_kind = {m["kind"]: m for m in manifests}
    assert by_kind["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    assert by_kind["Role"]["metadata"]["namespace"] == NAMESPACE
    assert by_kind["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]
    for binding in (by_kind["ClusterRoleBinding"], by_kind["RoleBinding"]):
        assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DRAIN_GROUP}]
    vap_binding = by_kind["ValidatingAdmissionPolicyBinding"]["spec"]
    assert vap_binding["validationActions"] == ["Deny"]
    assert vap_binding["matchResources"]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    assert vap_binding["policyName"] == by_kind["ValidatingAdmissionPolicy"]["metadata"]["name"]


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    return next(m for m in drain_rbac_manifests(namespace=NAMESPACE) if m["kind"] == "ValidatingAdmissionPolicy")


def labelled(value: str | None) -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    if value is None:
        pod["metadata"]["labels"].pop(ROUTABLE)
    else:
        pod["metadata"]["labels"][ROUTABLE] = value
    return pod


def test_policy_lets_the_handler_flip_the_routing_label(policy: dict[str, Any]) -> None:
    assert admit(policy, HANDLER, labelled("true"), labelled("false")) == []
    assert admit(policy, HANDLER, labelled("false"), labelled("true")) == []
    assert admit(policy, HANDLER, labelled(None), labelled("false")) == []


@pytest.mark.parametrize("change, message", [
    (lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/name": "gen2-trn2"}), "may change only"),
    (lambda p: p["metadata"]["labels"].pop("app.kubernetes.io/component"), "may change only"),
    (lambda p: p["metadata"]["labels"].update({"other": "x"}), "may change only"),
    (lambda p: p["spec"]["containers"][0].update({"image": "attacker/image:1"}), "may change only"),
    (lambda p: p["metadata"]["annotations"].update({"karpenter.sh/do-not-disrupt": "false"}), "may change only"),
    (lambda p: p["metadata"].update({"finalizers": ["x/y"]}), "may change only"),
    (lambda p: p["metadata"]["labels"].update({ROUTABLE: "maybe"}), "may only be set to"),
    (lambda p: p["metadata"]["labels"].pop(ROUTABLE), "may only be set to"),
], ids=["other-label", "label-removed", "label-added", "spec", "annotation", "finalizers", "bad-value", "routing-removed"])
def test_policy_denies_the_handler_anything_else(policy: dict[str, Any], change: Any, message: str) -> None:
    new = copy.deepcopy(POD)
    change(new)
    failures = admit(policy, HANDLER, POD, new)
    assert len(failures) == 1 and message in failures[0], failures


def test_policy_leaves_other_users_alone(policy: dict[str, Any]) -> None:
    other = {"userInfo": {"username": "system:serviceaccount:kube-system:karpenter", "groups": ["system:serviceaccounts"]}}
    assert admit(policy, other, POD, {**POD, "spec": {}}) == []
    assert admit(policy, {"userInfo": {"username": "x"}}, POD, {**POD, "spec": {}}) == []


@pytest.fixture(scope="module")
def rendered() -> dict[tuple[str, str], dict[str, Any]]:
    objects = helm.render(CHART, REQUIRED, namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gen2-trn2", "gen3-g6e"])
def test_services_select_only_routable_pods_and_deployments_do_not(rendered: dict, name: str) -> None:
    service = rendered[("Service", name)]["spec"]
    deployment = rendered[("Deployment", name)]["spec"]
    assert service["selector"][ROUTABLE] == "true"
    # the handler's guard counts a pod as in the DNS answer only when Ready: true while the Service does
    # not publish not-ready addresses (k8s.io/endpointslice podToEndpoint: ready = publishNotReady || ...)
    assert "publishNotReadyAddresses" not in service
    pod_labels = deployment["template"]["metadata"]["labels"]
    assert pod_labels[ROUTABLE] == "true" and pod_labels.items() >= service["selector"].items()
    # the ReplicaSet keeps owning a drained pod: its selector never names the routing label
    assert ROUTABLE not in deployment["selector"]["matchLabels"]
    drained = {**pod_labels, ROUTABLE: "false"}
    assert drained.items() >= deployment["selector"]["matchLabels"].items()
    assert not drained.items() >= service["selector"].items()
    # the handler's selector (gennstack_infra/components/interruption_handler.py) finds exactly these pods
    handler_selector = dict(term.split("=") for term in drain_on(load_config({}))[name]["pods"].split(","))
    assert pod_labels.items() >= handler_selector.items()
    # and nothing else in the chart: no other pod template carries all of it
    others = [k for k, o in rendered.items() if k != ("Deployment", name) and o["kind"] in ("Deployment", "Job", "StatefulSet")
              and (o["spec"].get("template", {}).get("metadata", {}).get("labels", {})).items() >= handler_selector.items()]
    assert others == []


# --- upstream behaviour drain routing relies on, pinned to the versions GenNStack deploys -----------


def test_karpenter_contract_is_the_pinned_version() -> None:
    """aws/karpenter-provider-aws v1.14.1: ``pkg/cloudprovider/cloudprovider.go`` sets a NodeClaim's
    ``status.providerID = fmt.Sprintf("aws:///%s/%s", i.Zone, i.ID)`` (the Node's ``spec.providerID``), and
    ``pkg/utils/utils.go`` ``GetTags`` tags every instance ``karpenter.sh/nodepool`` and
    ``eks:eks-cluster-name``. The handler's node lookup and the drill targets depend on both; a new
    Karpenter version must be re-read before this passes."""
    from gennstack import versions
    from lambdas.interruption_handler.drain import instance_of

    assert versions.KARPENTER.version == "1.14.1"
    assert instance_of({"spec": {"providerID": "aws:///us-east-2a/i-0123456789abcdef0"}}) == "i-0123456789abcdef0"
    assert instance_of({"spec": {"providerID": "kind://docker/x/y"}}) is None


def test_envoy_gateway_contract_is_the_pinned_version() -> None:
    """envoyproxy/gateway v1.8.3 ``internal/xds/translator/cluster.go``: a Backend resolved by hostname
    becomes a STRICT_DNS cluster with ``DnsRefreshRate`` 30 s (unless a BackendTrafficPolicy's
    ``dns.dnsRefreshRate`` replaces it: the chart's does, test_gateway_chart.py) and ``RespectDnsTtl`` true, and every
    cluster sets ``IgnoreHealthOnHostRemoval: true`` (a host gone from DNS leaves at once, health checks
    passing or not). docs/spot-drills.md's timeline rests on these; a new Envoy Gateway must be re-read."""
    from gennstack import versions

    assert versions.ENVOY_GATEWAY.version == "v1.8.3"
    doc = (ROOT / "docs" / "spot-drills.md").read_text(encoding="utf-8")
    for claim in ("STRICT_DNS", "`dns_refresh_rate` 30 s", "`respect_dns_ttl: true`", "`ignore_health_on_host_removal: true`", "v1.8.3"):
        assert claim in doc, claim


def test_coredns_contract_is_the_pinned_version() -> None:
    """coredns v1.14.7 (the EKS add-on build GenNStack pins): ``plugin/kubernetes/object/endpoint.go``
    keeps an EndpointSlice endpoint only when ``endpointsliceReady(Conditions.Ready)``, and
    ``plugin/kubernetes/kubernetes.go`` ``findServices`` starts from ``errNoItems`` and clears it only
    when it adds an address of a headless Service: no ready endpoint, NXDOMAIN. That is why the
    handler never drains a generation's last serving pod (lambdas/interruption_handler/drain.py,
    tests/lambdas/test_interruption_drain.py); a new CoreDNS must be re-read before this passes."""
    from gennstack import versions

    assert versions.KUBERNETES["1.36"].addons["coredns"].startswith("v1.14.7-")
    doc = (ROOT / "docs" / "spot-drills.md").read_text(encoding="utf-8")
    for claim in ("NXDOMAIN", "plugin/kubernetes/kubernetes.go", "strict_dns_cluster.cc", "`KeptPods`"):
        assert claim in doc, claim


def test_kuberay_owns_the_inf2_service_selector() -> None:
    """ray-project/kuberay v1.7.0 ``ray-operator/controllers/ray/common/service.go`` builds the serve
    Service's selector itself (``ray.io/serve``); GenNStack therefore refuses drain_on for inf2."""
    from gennstack import versions

    assert versions.KUBERAY_OPERATOR.version == "1.7.0"


@pytest.mark.slow
def test_the_local_drill_serves_the_charts_service_and_pods(rendered: dict) -> None:
    """gennstack drill --local and tests/lambdas/test_drain_routing_e2e.py stand in for the cluster with
    gennstack.drill.local's Service and pods: the same selector, pod labels and name as the charts."""
    from gennstack.drill.local import ROUTABLE_LABEL, replica_pods, service_for
    from gennstack.gateway.config import GatewayConfig, routing_table
    from gennstack.gateway.values import gateway_chart_values
    from lambdas.interruption_handler.drain import ROUTABLE_LABEL as HANDLER_LABEL

    gateway = GatewayConfig()
    assert ROUTABLE_LABEL == HANDLER_LABEL == ROUTABLE
    drained = {m: b for m, b in gateway.models.items() if ("Service", b.service) in rendered}  # not KubeRay's gen1-inf2
    assert sorted(b.service for b in drained.values()) == ["gen2-trn2", "gen3-g6e"]
    for model, backend in drained.items():
        service = service_for(model, gateway)
        chart_service = rendered[("Service", backend.service)]
        assert chart_service["spec"]["clusterIP"] == "None"
        assert service.selector == chart_service["spec"]["selector"]
        pod_labels = rendered[("Deployment", backend.service)]["spec"]["template"]["metadata"]["labels"]
        [pod] = replica_pods(model, [type("Replica", (), {"host": "127.0.0.2"})()], gateway)
        assert pod["metadata"]["labels"].items() <= pod_labels.items()
        assert pod["metadata"]["labels"].items() >= service.selector.items()
        values = gateway_chart_values(gateway, routing_table(gateway), region="us-east-1", api_keys_secret_name="k")
        hosts = {b["name"]: b["host"] for b in values["backends"]}
        assert service.hostname == hosts[model] == f"{chart_service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
