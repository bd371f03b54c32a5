"""Device plugins and operators from their upstream Helm charts, versions pinned in gennstack.versions."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks

from constructs import Construct
from gennstack_infra.components.cluster import pinned_chart
from gennstack import versions
from gennstack.controller_values import (
    KUBERAY_NAMESPACE, LWS_NAMESPACE, lws_pdb_manifest, lws_values, operator_values, serving_namespace_manifest)

class Operators(Construct):
    """The Neuron and NVIDIA device plugins, the KubeRay operator, metrics-server and KEDA; the LeaderWorkerSet
    controller (LWS v0.10.0) only while serving.multi_node is on.

    Relies on: Karpenter does not mark an accelerator node initialized until its device plugin
    registers ``aws.amazon.com/neuron`` or ``nvidia.com/gpu``; none of these charts calls AWS, so
    none needs a role. KEDA's metrics API server (port 6443, an APIService for
    ``external.metrics.k8s.io``) is reached by the control plane through the cluster security group
    the system node group shares with it.
    """

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, serving_namespace: str,
                 serving_namespace_labels: dict[str, str] | None = None, multi_node: bool = False) -> None:
        super().__init__(scope, construct_id)
        values = operator_values(serving_namespace=serving_namespace)
        # KubeRay watches only the serving namespace and its Role goes there (controller_values.kuberay_values):
        # the namespace exists before the chart (the serving chart's helm install then finds it).
        self.serving_namespace = cluster.add_manifest(
            "ServingNamespace", serving_namespace_manifest(serving_namespace, labels=serving_namespace_labels))
        namespaces = {
            versions.NEURON.name: "kube-system",
            versions.NVIDIA_DEVICE_PLUGIN.name: "kube-system",
            versions.KUBERAY_OPERATOR.name: KUBERAY_NAMESPACE,
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
        self.charts[versions.KUBERAY_OPERATOR.name].node.add_dependency(self.serving_namespace)
        if multi_node:
            # The LeaderWorkerSet controller and its webhooks, only while serving.multi_node is on: its
            # webhook must admit the serving chart's LeaderWorkerSet, so it serves before that arrives.
            self.charts[versions.LWS.name] = pinned_chart(
                self, "LeaderWorkerSet", cluster=cluster, chart=versions.LWS, namespace=LWS_NAMESPACE,
                values=lws_values(), wait=True, timeout=Duration.minutes(10),
            )
            # Two controller replicas, evicted one at a time (its chart ships no PDB); after the chart,
            # which creates the namespace.
            lws_pdb = cluster.add_manifest("LeaderWorkerSetControllerPdb", lws_pdb_manifest())
            lws_pdb.node.add_dependency(self.charts[versions.LWS.name])
