"""Helm values of the upstream controller charts GenNStack installs: Karpenter, the AWS Load Balancer
Controller, and the operators (Neuron and NVIDIA device plugins, KubeRay, metrics-server, KEDA).

Plain functions: the constructs in ``gennstack_infra.components`` install the charts with them, and
the system-capacity check (``gennstack/system_capacity.py``, run by ``gennstack summary``) reads the
replicas and requests from the same values, without loading CDK. Each value's upstream reason is
beside it; ``tests/test_cluster.py`` and ``tests/autoscaling`` check them against the charts.
"""

from __future__ import annotations

from typing import Any

from gennstack import versions
from gennstack.instances import NEURON, NVIDIA_GPU
from gennstack.system_nodes import SYSTEM_NODE_SELECTOR, SYSTEM_TOLERATIONS

KARPENTER_NAMESPACE = "kube-system"
KARPENTER_SERVICE_ACCOUNT = "karpenter"
LBC_NAMESPACE = "kube-system"
LBC_SERVICE_ACCOUNT = "aws-load-balancer-controller"
KUBERAY_NAMESPACE = "kuberay-system"


def karpenter_values(*, cluster_name: str, queue_name: str, region: str) -> dict:
    """Helm values for the Karpenter chart: two replicas with a PDB, on the system nodes only.

    ``AWS_REGION`` is set: without it Karpenter v1.14.1 asks IMDS for the region
    (``pkg/operator/operator.go``: ``imds.NewFromConfig(cfg).GetRegion`` when ``cfg.Region`` is
    empty, and exits if that fails), and IMDS is out of a pod's reach on nodes with hop limit 1.
    """
    return {
        "settings": {"clusterName": cluster_name, "interruptionQueue": queue_name},
        "serviceAccount": {"create": False, "name": KARPENTER_SERVICE_ACCOUNT},
        "replicas": 2,
        "podDisruptionBudget": {"name": "karpenter", "maxUnavailable": 1},
        "nodeSelector": SYSTEM_NODE_SELECTOR,
        "tolerations": SYSTEM_TOLERATIONS,
        "controller": {
            "env": [{"name": "AWS_REGION", "value": region}],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        },
    }


def load_balancer_controller_values(*, cluster_name: str, region: str, vpc_id: str) -> dict:
    """Helm values for the v3.5.0 chart (kubernetes-sigs/aws-load-balancer-controller ``helm/.../values.yaml``).

    ``enableServiceMutatorWebhook`` defaults to true there, with ``failurePolicy: Fail`` on every
    Service CREATE (``templates/webhook.yaml``, ``mservice.elbv2.k8s.aws``): while the controller's
    pods are not serving, every chart that creates a Service fails. It only makes the controller
    the default for Services of type LoadBalancer; the gateway's Service names
    ``loadBalancerClass: service.k8s.aws/nlb`` itself, so the webhook is off. The other webhooks
    act only on objects or namespaces that opt in by label (none here) or on the controller's
    own kinds (TargetGroupBinding, IngressClassParams, Ingress), which GenNStack does not create.
    """
    return {
        "clusterName": cluster_name,
        "region": region,
        "vpcId": vpc_id,
        "serviceAccount": {"create": False, "name": LBC_SERVICE_ACCOUNT},
        "replicaCount": 2,
        "nodeSelector": SYSTEM_NODE_SELECTOR,
        "tolerations": SYSTEM_TOLERATIONS,
        "enableServiceMutatorWebhook": False,
    }

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


def operator_values(*, serving_namespace: str) -> dict[str, dict[str, Any]]:
    """Helm values of each operator chart, by chart name. Tests check them; the construct applies them.
    ``serving_namespace``: where gen1's RayService lives, the one namespace KubeRay watches."""
    system = {"nodeSelector": SYSTEM_NODE_SELECTOR, "tolerations": SYSTEM_TOLERATIONS}
    return {
        # Device plugin (DaemonSet on Neuron instance types, tolerating the Neuron taint by
        # default). The Neuron scheduler extension stays off (the chart's default): it exists to
        # hand out contiguous devices when several pods share a node, and a GenNStack Neuron pod
        # asks for every device of its node (gennstack/serving/values.py ``_chips``), so any
        # allocation is contiguous. Its kube-scheduler image (v1.28 in the chart) is far outside
        # the skew kube-scheduler supports against a 1.36 control plane, and no pod names it.
        #
        # The Neuron node problem detector stays off (the chart's default is on): the chart puts it
        # in `neuron-healthcheck-system` (npd.namespaceOverride), a namespace it does not create, so
        # with it on this release, installed with `wait`, fails and the stack rolls back. Turning it
        # on needs that namespace first, its IAM (CloudWatch metrics, and with npd.nodeRecovery the
        # Auto Scaling health calls) and its signals on the dashboards; GenNStack installs the device
        # plugin only (README).
        versions.NEURON.name: {
            "devicePlugin": {"enabled": True, "tolerations": [{"key": NEURON, "operator": "Exists", "effect": "NoSchedule"}]},
            "scheduler": {"enabled": False},
            "npd": {"enabled": False},
        },
        versions.NVIDIA_DEVICE_PLUGIN.name: {
            "affinity": _NVIDIA_AFFINITY,
            "tolerations": [{"key": NVIDIA_GPU, "operator": "Exists", "effect": "NoSchedule"}],
        },
        versions.KUBERAY_OPERATOR.name: kuberay_values(serving_namespace),
        versions.METRICS_SERVER.name: {
            **system,
            "replicas": 2,
            "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
        },
        versions.KEDA.name: keda_values(),
    }


def kuberay_values(serving_namespace: str) -> dict[str, Any]:
    """The KubeRay operator's chart values (ray-project/kuberay v1.7.0 helm-chart/kuberay-operator/
    values.yaml): on the system nodes, and watching only ``serving_namespace``. ``singleNamespaceInstall``
    makes the chart write Roles instead of its ClusterRole, which would let the operator create, read and
    delete Secrets, Pods and Services in every namespace: a Role with those rules in each ``watchNamespace``
    (templates/multiple_namespaces_role.yaml, with ``crNamespacedRbacEnable``, true by default) and
    ``--watch-namespace`` on the operator (templates/deployment.yaml). That namespace must exist before the
    chart installs (its Role goes there): gennstack_infra/components/operators.py creates it first."""
    return {
        "nodeSelector": SYSTEM_NODE_SELECTOR,
        "tolerations": SYSTEM_TOLERATIONS,
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
        "singleNamespaceInstall": True,
        "watchNamespace": [serving_namespace],
    }


def serving_namespace_manifest(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The serving namespace, created before the KubeRay chart writes its Role into it, with its Pod
    Security admission ``labels`` (gennstack/pod_security.py namespace_labels)."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


# The LWS controller's pods (kubernetes-sigs/lws v0.10.0 charts/lws/templates/manager/deployment.yaml:
# `control-plane: controller-manager` and lws.selectorLabels, name `lws` and instance the release,
# which pinned_chart names after the chart).
LWS_NAMESPACE = "lws-system"
LWS_CONTROLLER_LABELS = {"control-plane": "controller-manager", "app.kubernetes.io/name": "lws",
                         "app.kubernetes.io/instance": versions.LWS.name}
LWS_REPLICAS = 2


def lws_values() -> dict[str, Any]:
    """The LWS controller's chart values (kubernetes-sigs/lws v0.10.0 charts/lws/values.yaml: top-level
    ``replicaCount``, ``nodeSelector``, ``tolerations``, ``affinity`` and ``resources`` of its one
    controller-manager Deployment): on the system nodes, requesting 100m / 512Mi instead of the chart's
    1 CPU / 1Gi, which a 2-vCPU system node cannot spare (gennstack/system_capacity.py counts it while
    serving.multi_node is on). Its webhook certificates come from its own cert controller
    (``enableCertManager`` false, the default).

    Two replicas on two nodes (``LWS_REPLICAS``; with ``lws_pdb_manifest``): the chart's webhooks
    (templates/webhook/webhook.yaml) are ``failurePolicy: Fail`` on every LWS pod's CREATE (mpod.kb.io)
    and on its CREATE and UPDATE (vpod.kb.io, objectSelector ``leaderworkerset.sigs.k8s.io/name``
    Exists), so with the chart's one replica down (its node drained or replaced) no group pod can be
    created and every patch of one (the drain label, a gate removal) is refused. The chart has no value
    that scopes them. The webhook server runs in every replica, leader election only picks who
    reconciles (charts/lws/templates/manager/configmap.yaml ``leaderElect: true``), and each replica runs
    the internal cert rotator (pkg/cert/cert.go, no RequireLeaderElection) on the one Secret.
    """
    return {
        "replicaCount": LWS_REPLICAS,
        "nodeSelector": SYSTEM_NODE_SELECTOR,
        "tolerations": SYSTEM_TOLERATIONS,
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": dict(LWS_CONTROLLER_LABELS)}},
        ]}},
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
        "enableCertManager": False,
    }


def lws_pdb_manifest() -> dict[str, Any]:
    """A PodDisruptionBudget for the LWS controller, which its v0.10.0 chart does not ship (no PDB under
    charts/lws/templates): a drain of the system nodes evicts one replica at a time, so one keeps
    serving the webhooks."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "lws-controller-manager", "namespace": LWS_NAMESPACE},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(LWS_CONTROLLER_LABELS)}},
    }


def keda_values() -> dict[str, Any]:
    """KEDA's chart values (kedacore/charts keda/values.yaml at v2.20.2): all three of its Deployments
    (operator, metrics API server, admission webhooks) on the system nodes, via the chart's top-level
    ``nodeSelector``/``tolerations``, which each component's own keys default to; its CRDs from the
    chart (``crds.install``). Two operator replicas: one leads, the other takes over if its node goes.
    No RBAC for custom scale targets (``rbac.enabledCustomScaledRefKinds``): by default the chart
    grants the operator ``get`` on every resource of every API group (Secrets included) and ``patch``
    on every ``*/scale`` (``rbac.scaledRefKinds`` ``*``/``*``, templates/manager/clusterrole.yaml),
    while GenNStack scales only Deployments, whose rules the chart always writes. Secrets only in its
    own namespace (``permissions.<operator|metricServer>.restrict.secret``): by default the operator's
    ClusterRole lists and watches every Secret in the cluster, for TriggerAuthentications, which
    GenNStack's ScaledObjects do not use (their Prometheus needs no credentials); restricted, both
    processes get ``KEDA_RESTRICT_SECRET_ACCESS`` and the list/watch moves into a Role in KEDA's
    namespace, beside its certificates (templates/manager/clusterrole.yaml, minimal-rbac.yaml).
    """
    return {
        "nodeSelector": SYSTEM_NODE_SELECTOR,
        "tolerations": SYSTEM_TOLERATIONS,
        "crds": {"install": True},
        "operator": {"replicaCount": 2},
        "podDisruptionBudget": {"operator": {"maxUnavailable": 1}},
        "rbac": {"enabledCustomScaledRefKinds": False},
        "permissions": {"operator": {"restrict": {"secret": True}}, "metricServer": {"restrict": {"secret": True}}},
    }
