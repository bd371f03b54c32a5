"""Deploy order of Kubernetes objects: what every object, and every chart, waits for.

CDK applies Kubernetes objects through custom resources (``Custom::AWSCDK-EKS-*``) handled by
its kubectl Lambda. aws-cdk-lib makes them wait only for the cluster and its admin access entry,
not for nodes or add-ons; the Helm charts then time out waiting for pods that have nowhere to
run, or for DNS. This aspect adds the missing ``DependsOn`` to every such resource in the stack,
including the ones CDK creates itself (service accounts, Pod Identity manifests), and to every
object added later, so no construct has to remember it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jsii
from aws_cdk import CfnResource, IAspect

from constructs import Construct, IConstruct

KUBERNETES_RESOURCE_TYPES = frozenset({
    "Custom::AWSCDK-EKS-KubernetesResource",
    "Custom::AWSCDK-EKS-HelmChart",
    "Custom::AWSCDK-EKS-KubernetesPatch",
    "Custom::AWSCDK-EKS-KubernetesObjectValue",
})
HELM_CHART_TYPE = "Custom::AWSCDK-EKS-HelmChart"


@jsii.implements(IAspect)
class KubernetesDeployOrder:
    """Every Kubernetes object after ``ready``; every Helm chart but ``first_chart`` after ``first_chart``.

    ``ready``: what a pod needs to run (the system node group and the cluster's add-ons).
    ``first_chart``: a chart every other chart installs after (the AWS Load Balancer
    Controller: charts create Services, and a Service webhook that is not serving yet fails
    them). Its own construct, and anything it depends on, is left alone.
    """

    def __init__(self, *, ready: Sequence[Construct], first_chart: Construct) -> None:
        self._ready = list(ready)
        self._first_chart = first_chart

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, CfnResource) or node.cfn_resource_type not in KUBERNETES_RESOURCE_TYPES:
            return
        node.node.add_dependency(*self._ready)
        first = self._first_chart.node.path
        if node.cfn_resource_type == HELM_CHART_TYPE and not node.node.path.startswith(first + "/"):
            node.node.add_dependency(self._first_chart)
