"""Deploy and teardown order in the template: what must exist before what, and be deleted after it.

aws-cdk-lib 2.275's ``aws_eks_v2`` makes Kubernetes objects wait only for the cluster and its
admin access entry (``aws-eks-v2/lib/cluster.js``: ``_kubectlReadyBarrier`` depends on the cluster
resource and ``_clusterAdminAccess``; ``KubectlProvider.getKubectlProvider`` adds that barrier),
never for nodes or add-ons, and Helm charts wait 5 minutes by default. These tests follow the
``DependsOn`` and reference paths CloudFormation orders by.
"""

from __future__ import annotations

import json

import pytest

from gennstack_infra.components.ordering import HELM_CHART_TYPE, KUBERNETES_RESOURCE_TYPES
from tests.support import Synth, depends_on


def _ids(synth: Synth, prefix: str, resource_type: str | None = None) -> list[str]:
    return [
        k for k, r in synth.template["Resources"].items()
        if k.startswith(prefix) and (resource_type is None or r["Type"] == resource_type)
    ]


def _one(synth: Synth, prefix: str, resource_type: str | None = None) -> str:
    (logical_id,) = _ids(synth, prefix, resource_type)
    return logical_id


def _kubernetes_objects(synth: Synth) -> dict[str, dict]:
    return {k: r for k, r in synth.template["Resources"].items() if r["Type"] in KUBERNETES_RESOURCE_TYPES}


def _ready(synth: Synth) -> dict[str, str]:
    return {
        "system node group": _one(synth, "EksClusterNodegroupSystemNodes", "AWS::EKS::Nodegroup"),
        **{
            r["Properties"]["AddonName"]: k
            for k, r in synth.resources("AWS::EKS::Addon").items()
        },
    }


@pytest.fixture(params=["default", "variant"])
def any_synth(request: pytest.FixtureRequest, synth: Synth, synth_variant: Synth) -> Synth:
    return synth if request.param == "default" else synth_variant


def test_every_kubernetes_object_waits_for_nodes_and_addons(any_synth: Synth) -> None:
    ready = _ready(any_synth)
    assert set(ready) == {"system node group", "vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent"}
    objects = _kubernetes_objects(any_synth)
    assert len(objects) >= 20
    missing = [
        (obj, name) for obj in objects for name, target in ready.items() if not depends_on(any_synth.template, obj, target)
    ]
    assert missing == []


def test_node_group_after_node_level_addons_and_coredns_after_nodes(synth: Synth) -> None:
    ready = _ready(synth)
    nodes = ready["system node group"]
    for addon in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent"):
        assert depends_on(synth.template, nodes, ready[addon]), addon
    # CoreDNS is a Deployment: without nodes its add-on never becomes ACTIVE.
    assert depends_on(synth.template, ready["coredns"], nodes)


def test_every_chart_installs_after_the_load_balancer_controller(any_synth: Synth) -> None:
    """With its Service webhook (failurePolicy Fail) off this is belt and braces; charts create Services."""
    charts = {k: r for k, r in _kubernetes_objects(any_synth).items() if r["Type"] == HELM_CHART_TYPE}
    controller = next(k for k, r in charts.items() if r["Properties"]["Release"] == "aws-load-balancer-controller")
    later = [k for k in charts if k != controller]
    assert len(later) >= 10
    assert [k for k in later if not depends_on(any_synth.template, k, controller)] == []


def test_load_balancer_controller_webhook_off_and_waits(synth: Synth) -> None:
    (chart,) = [
        r["Properties"] for r in synth.resources(HELM_CHART_TYPE).values()
        if r["Properties"]["Release"] == "aws-load-balancer-controller"
    ]
    values = chart["Values"]
    text = values if isinstance(values, str) else "".join(p if isinstance(p, str) else "T" for p in values["Fn::Join"][1])
    assert json.loads(text)["enableServiceMutatorWebhook"] is False
    assert chart["Wait"] is True and chart["Timeout"] == "600s"


def test_charts_that_others_wait_for_have_explicit_timeouts(synth: Synth) -> None:
    """A chart installed with ``wait`` says how long; helm's default of 5 minutes is nobody's choice."""
    charts = {r["Properties"]["Release"]: r["Properties"] for r in synth.resources(HELM_CHART_TYPE).values()}
    waiting = {name for name, chart in charts.items() if chart.get("Wait")}
    assert {"karpenter", "aws-load-balancer-controller", "kuberay-operator", "gateway-helm"} <= waiting
    # The kubectl handler Lambda has 15 minutes; CDK rejects more (helm-chart.js).
    for name in waiting:
        assert charts[name]["Timeout"] in ("600s",), name
    # Model pods wait for accelerator nodes for many minutes: the serving chart never waits.
    assert not charts["gennstack-serving"].get("Wait")


def test_node_pools_are_created_after_and_deleted_before_karpenter(any_synth: Synth) -> None:
    """NodePool and EC2NodeClass finalizers need Karpenter's controller to terminate nodes.

    Deleted after the controller, they never clear: instances and ENIs stay behind and block
    the VPC's deletion. CloudFormation deletes a resource before what it depends on.
    """
    template = any_synth.template
    controller = _one(any_synth, "KarpenterChart", HELM_CHART_TYPE)
    access_entry = _one(any_synth, "KarpenterNodeAccessEntry")
    manifests = _ids(any_synth, "NodePools", "Custom::AWSCDK-EKS-KubernetesResource")
    assert len(manifests) == 2
    for manifest in manifests:
        assert depends_on(template, manifest, controller)
        assert depends_on(template, manifest, access_entry)
    # The serving chart's pods go before the node pools they run on.
    serving = next(k for k, r in template["Resources"].items() if r["Type"] == HELM_CHART_TYPE and k.startswith("ServingChart"))
    assert all(depends_on(template, serving, manifest) for manifest in manifests)
    # So do the monitoring charts' (the general pool by default), and the EBS CSI driver, which
    # detaches their volumes, outlives the NodePools (Karpenter waits for detachment to terminate a node).
    charts = [k for k, r in template["Resources"].items() if r["Type"] == HELM_CHART_TYPE and k.startswith("Monitoring")]
    ebs_csi = [k for k in charts if k.startswith("MonitoringEbsCsiDriver")]
    monitoring = [k for k in charts if k not in ebs_csi]
    assert len(ebs_csi) == 1 and len(monitoring) >= 2
    assert [k for k in monitoring if not all(depends_on(template, k, manifest) for manifest in manifests)] == []
    assert all(depends_on(template, manifest, ebs_csi[0]) for manifest in manifests)
