"""Every version GenNStack deploys, pinned in one place.

Synth never asks AWS or a registry what is newest: changing a version here is a reviewed change
that shows in the template snapshot. Re-check managed add-on builds before an upgrade with
``aws eks describe-addon-versions --kubernetes-version <minor> --addon-name <name>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KubernetesRelease:
    """A Kubernetes minor with the kubectl/helm layer of the same minor and its managed add-ons.

    kubectl supports one minor of skew, so the kubectl Lambda layer must match the cluster.
    ``kubectl_layer`` names the layer's PyPI package (pinned in requirements.txt); the cluster
    construct maps it to the layer's class (``gennstack_infra/components/cluster.py``).
    """

    kubernetes: str
    kubectl_layer: str
    addons: dict[str, str] = field(default_factory=dict)
    pod_identity_agent: str = ""


KUBERNETES: dict[str, KubernetesRelease] = {
    # 1.36: the newest minor aws-cdk-lib 2.275 knows (KubernetesVersion.V1_36) and in EKS standard
    # support. Add-on builds seen on EKS 1.36 clusters.
    "1.36": KubernetesRelease(
        kubernetes="1.36",
        kubectl_layer="aws-cdk.lambda-layer-kubectl-v36",
        addons={
            "vpc-cni": "v1.23.2-eksbuild.1",
            "coredns": "v1.14.7-eksbuild.11",
            "kube-proxy": "v1.36.0-eksbuild.45",
        },
        pod_identity_agent="v1.4.0-eksbuild.3",
    ),
}

# EKS-optimized AL2023, pinned to a dated release (awslabs/amazon-eks-ami v20260714 ships 1.36
# standard, NVIDIA and Neuron AMIs): the general and GPU node classes. Never @latest: an unpinned
# AMI update rolls every node.
AL2023_AMI_ALIAS = "al2023@v20260714"

# The Neuron node classes (inf2, trn2) run an older release: its Neuron AMI's driver must accept the
# Neuron runtime of the image (the support matrix's DLC, runtime 2.30.51.0). awslabs/amazon-eks-ami
# CHANGELOG.md: "AMI Release v20260714" ships aws-neuronx-dkms 2.29.0.0, and aws-neuron-sdk
# release-notes/components/runtime.rst (v2.31.0, Neuron Driver 2.29, Known Issues): "Neuron Driver
# 2.29 requires Neuron Runtime Library 2.33 or later ... will cause nrt_init() to fail". v20260625,
# the newest release before it in CHANGELOG.md (tags v20260707/v20260709 have no entry), ships
# 2.28.0.0 in amazon-eks-node-al2023-x86_64-neuron-1.36-v20260625
# (source AMI al2023-ami-minimal-2023.12.20260622.0-kernel-6.18-x86_64, the 1.36 AMIs' kernel 6.18);
# neuron_compat.py in the serving chart holds the driver/runtime rules, and
# tests/serving/test_support_matrix.py the pair. Move it only to a release whose driver that test accepts.
NEURON_AMI_ALIAS = "al2023@v20260625"
# aws-neuronx-dkms of NEURON_AMI_ALIAS's 1.36 Neuron AMI (the CHANGELOG.md table, "Kubernetes 1.36").
NEURON_AMI_DRIVER = "2.28.0.0"


@dataclass(frozen=True)
class Chart:
    """A Helm chart from an HTTP repository (``name`` in ``repository``) or an OCI reference."""

    name: str
    repository: str
    version: str


KARPENTER_CRD = Chart("karpenter-crd", "oci://public.ecr.aws/karpenter/karpenter-crd", "1.14.1")
KARPENTER = Chart("karpenter", "oci://public.ecr.aws/karpenter/karpenter", "1.14.1")
NEURON = Chart("neuron-helm-chart", "oci://public.ecr.aws/neuron/neuron-helm-chart", "1.10.0")
NVIDIA_DEVICE_PLUGIN = Chart("nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.20.1")
# 1.7.0: the release whose CRDs the tests validate RayService/RayCluster manifests against.
KUBERAY_OPERATOR = Chart("kuberay-operator", "https://ray-project.github.io/kuberay-helm/", "1.7.0")
AWS_LOAD_BALANCER_CONTROLLER = Chart("aws-load-balancer-controller", "https://aws.github.io/eks-charts", "3.5.0")
METRICS_SERVER = Chart("metrics-server", "https://kubernetes-sigs.github.io/metrics-server/", "3.14.0")
# The gateway: Envoy AI Gateway v1.1.0 is built and tested against Envoy Gateway v1.8.x (which ships
# Gateway API v1.5.1); Envoy Gateway v1.9 changes the xDS the AI Gateway's extension server patches.
ENVOY_GATEWAY = Chart("gateway-helm", "oci://docker.io/envoyproxy/gateway-helm", "v1.8.3")
AI_GATEWAY_CRDS = Chart("ai-gateway-crds-helm", "oci://docker.io/envoyproxy/ai-gateway-crds-helm", "v1.1.0")
AI_GATEWAY = Chart("ai-gateway-helm", "oci://docker.io/envoyproxy/ai-gateway-helm", "v1.1.0")
# KEDA: scales gen2/gen3 serving Deployments on vLLM's load metrics from Prometheus. 2.20.2: the
# release whose CRDs (../shared/crds/keda.sh) the tests validate ScaledObjects against.
KEDA = Chart("keda", "https://kedacore.github.io/charts", "2.20.2")
# Syncs the gateway's API keys (and Langfuse keys) from Secrets Manager into Kubernetes Secrets.
EXTERNAL_SECRETS = Chart("external-secrets", "https://charts.external-secrets.io", "2.9.0")
# Monitoring. kube-prometheus-stack 88.3.0 (2026-08-11) is the newest release that ships Prometheus
# Operator v0.93.0, the version of the ServiceMonitor/PodMonitor/PrometheusRule CRDs the tests
# validate against (88.4.0 moved to v0.93.1); it brings Prometheus v3.13.2, Grafana 13.1.3 (grafana
# chart 12.10.4), kube-state-metrics v2.19.1 (chart 8.2.0) and node-exporter (chart 4.56.1).
KUBE_PROMETHEUS_STACK = Chart("kube-prometheus-stack", "https://prometheus-community.github.io/helm-charts", "88.3.0")
# NVIDIA's DCGM exporter (image 4.5.3-4.8.2): GPU utilisation and memory per GPU. The NVIDIA device
# plugin chart does not ship it.
DCGM_EXPORTER = Chart("dcgm-exporter", "https://nvidia.github.io/dcgm-exporter/helm-charts", "4.8.2")
# YACE v0.67.0: the interruption handler's CloudWatch metrics and its dead-letter queue depth, as
# Prometheus series, so alerts on them are PrometheusRules like every other alert.
CLOUDWATCH_EXPORTER = Chart(
    "prometheus-yet-another-cloudwatch-exporter", "https://prometheus-community.github.io/helm-charts", "0.47.0")
# The EBS CSI driver (v1.64.0) and its gp3 StorageClass: Prometheus', Alertmanager's and Grafana's volumes.
EBS_CSI_DRIVER = Chart("aws-ebs-csi-driver", "https://kubernetes-sigs.github.io/aws-ebs-csi-driver", "2.64.0")

# LeaderWorkerSet v0.10.0: multi-node serving replicas (serving.multi_node), the release whose CRD
# (../shared/crds/leaderworkerset.x-k8s.io) the tests validate against. Installed only while
# serving.multi_node is enabled, so not in CHARTS (every deploy's charts). Chart and version as
# kubernetes-sigs/lws v0.10.0 site/content/en/docs/installation/_index.md installs it
# (`helm install lws oci://registry.k8s.io/lws/charts/lws --version=0.10.0`); its packaging
# (hack/push-chart.sh) pins the image to the release tag with pullPolicy IfNotPresent.
LWS = Chart("lws", "oci://registry.k8s.io/lws/charts/lws", "0.10.0")

# Redis: the gateway's rate-limit counters (alpine) and gen1-inf2's GCS fault-tolerance store. The
# newest patch of the 7.4 line in docker-library/official-images library/redis at 37079fb
# (2026-08-21: "Tags: 7.4.11, 7.4, 7, ..." and "7.4.11-alpine, 7.4-alpine, ..."); 7.4.2 and 7.4.0,
# pinned before, predate the fix of CVE-2025-49844 (Lua use-after-free, remote code execution by
# any client that may EVAL; fixed in 7.4.6). Staying on 7.4: KubeRay v1.7.0's external-Redis sample
# and Envoy's rate-limit service are what GenNStack runs against. By tag, not digest: no registry is
# reachable where synth runs, so a digest could not be checked here.
REDIS_IMAGE = "docker.io/library/redis:7.4.11"
REDIS_ALPINE_IMAGE = "docker.io/library/redis:7.4.11-alpine"

CHARTS: tuple[Chart, ...] = (
    KARPENTER_CRD,
    KARPENTER,
    NEURON,
    NVIDIA_DEVICE_PLUGIN,
    KUBERAY_OPERATOR,
    AWS_LOAD_BALANCER_CONTROLLER,
    METRICS_SERVER,
    KEDA,
    ENVOY_GATEWAY,
    AI_GATEWAY_CRDS,
    AI_GATEWAY,
    EXTERNAL_SECRETS,
    KUBE_PROMETHEUS_STACK,
    DCGM_EXPORTER,
    CLOUDWATCH_EXPORTER,
    EBS_CSI_DRIVER,
)

# Upstream releases whose CRDs (not charts) GenNStack's manifests are validated against, beside the
# charts above that ship the others' (gennstack/crds.py, `make crds`): Gateway API v1.5.1 (the one
# Envoy Gateway v1.8.x ships), Prometheus Operator v0.93.0 (kube-prometheus-stack 88.3.0's) and the
# Gateway API Inference Extension v1.0.2 (the InferencePool version Envoy AI Gateway v1.1.0 imports).
GATEWAY_API_VERSION = "v1.5.1"
PROMETHEUS_OPERATOR_VERSION = "v0.93.0"
INFERENCE_EXTENSION_VERSION = "v1.0.2"
