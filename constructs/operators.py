"""Device plugins and operators from their upstream Helm charts, versions pinned in gennstack.versions."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks

from constructs import Construct  # the library; this folder merges into it (see README.md here)
from constructs.cluster import SYSTEM_NODE_SELECTOR, SYSTEM_TOLERATIONS, pinned_chart
from gennstack import versions
from gennstack.instances import NEURON, NVIDIA_GPU

# Karpenter labels every node with the GPU maker of its instance type; the NVIDIA device plugin
# runs only there (its chart's default affinity wants Node Feature Discovery labels GenNStack does
# not install).
_NVIDIA_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "karpenter.k8s.aws/instance-gpu-manufacturer", "operator": "In", "values": ["nvidia"]}
                ]}
            ]
        }
    }
}


def chart_values() -> dict[str, dict[str, Any]]:
    """Helm values of each operator chart, by chart name. Tests check them; the construct applies them."""
    system = {"nodeSelector": SYSTEM_NODE_SELECTOR, "tolerations": SYSTEM_TOLERATIONS}
    return {
        # Device plugin (DaemonSet on Neuron instance types, tolerating the Neuron taint by
        # default). The Neuron scheduler extension stays off (the chart's default): it exists to
        # hand out contiguous devices when several pods share a node, and a GenNStack Neuron pod
        # asks for every device of its node (gennstack/serving/values.py ``_chips``), so any
        # allocation is contiguous. Its kube-scheduler image (v1.28 in the chart) is far outside
        # the skew kube-scheduler supports against a 1.36 control plane, and no pod names it.
        versions.NEURON.name: {
            "devicePlugin": {"enabled": True, "tolerations": [{"key": NEURON, "operator": "Exists", "effect": "NoSchedule"}]},
            "scheduler": {"enabled": False},
        },
        versions.NVIDIA_DEVICE_PLUGIN.name: {
            "affinity": _NVIDIA_AFFINITY,
            "tolerations": [{"key": NVIDIA_GPU, "operator": "Exists", "effect": "NoSchedule"}],
        },
        versions.KUBERAY_OPERATOR.name: {**system, "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}}},
        versions.METRICS_SERVER.name: {
            **system,
            "replicas": 2,
            "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
        },
        versions.KEDA.name: keda_values(),
    }


def keda_values() -> dict[str, Any]:
    """KEDA's chart values (kedacore/charts keda/values.yaml at v2.20.2): all three of its Deployments
    (operator, metrics API server, admission webhooks) on the system nodes, via the chart's top-level
    ``nodeSelector``/``tolerations``, which each component's own keys default to; its CRDs from the
    chart (``crds.install``). Two operator replicas: one leads, the other takes over if its node goes.
    """
    return {
        "nodeSelector": SYSTEM_NODE_SELECTOR,
        "tolerations": SYSTEM_TOLERATIONS,
        "crds": {"install": True},
        "operator": {"replicaCount": 2},
        "podDisruptionBudget": {"operator": {"maxUnavailable": 1}},
    }


class Operators(Construct):
    """The Neuron and NVIDIA device plugins, the KubeRay operator, metrics-server and KEDA.

    Relies on: Karpenter does not mark an accelerator node initialized until its device plugin
    registers ``aws.amazon.com/neuron`` or ``nvidia.com/gpu``; none of these charts calls AWS, so
    none needs a role. KEDA's metrics API server (port 6443, an APIService for
    ``external.metrics.k8s.io``) is reached by the control plane through the cluster security group
    the system node group shares with it.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster) -> None:
        super().__init__(scope, construct_id)
        values = chart_values()
        namespaces = {
            versions.NEURON.name: "kube-system",
            versions.NVIDIA_DEVICE_PLUGIN.name: "kube-system",
            versions.KUBERAY_OPERATOR.name: "kuberay-system",
            versions.METRICS_SERVER.name: "kube-system",
            versions.KEDA.name: "keda",
        }
        construct_ids = {
            versions.NEURON.name: "Neuron",
            versions.NVIDIA_DEVICE_PLUGIN.name: "NvidiaDevicePlugin",
            versions.KUBERAY_OPERATOR.name: "KubeRayOperator",
            versions.METRICS_SERVER.name: "MetricsServer",
            versions.KEDA.name: "Keda",
        }
        self.charts: dict[str, eks.HelmChart] = {}
        for chart in (versions.NEURON, versions.NVIDIA_DEVICE_PLUGIN, versions.KUBERAY_OPERATOR, versions.METRICS_SERVER,
                      versions.KEDA):
            self.charts[chart.name] = pinned_chart(
                self,
                construct_ids[chart.name],
                cluster=cluster,
                chart=chart,
                namespace=namespaces[chart.name],
                values=values[chart.name],
                # KubeRay's operator (and KEDA, for ScaledObjects) must serve before the serving chart arrives.
                wait=True,
                timeout=Duration.minutes(10),
            )
