"""Who may connect to whom: the NetworkPolicies of GenNStack's namespaces (``cluster.network_policies``).

Each namespace GenNStack's charts or stack own is default-deny, then allows only the flows the
system needs (docs/security.md, "Network policies"):

* the serving namespace and the warm-spare groups' namespace: the serving chart
  (templates/networkpolicies.yaml), with the peers below as its ``networkPolicy`` values
  (:func:`serving_values`);
* the gateway's namespace: the gateway chart (its rate-limit Redis, the stream-resume relay, and the
  bench Job, whose chart allows its own egress); the chart also isolates the routing Gateway's proxies
  in Envoy Gateway's namespace (only the relay and Prometheus reach them);
* ``monitoring``: :func:`monitoring_policies`, manifests the stack applies beside kube-prometheus-stack.

The peers' labels are the upstream controllers' own, at the pinned versions:

* Envoy Gateway v1.8.3's proxy pods (``internal/infrastructure/kubernetes/proxy/resource.go``
  EnvoyAppLabel: ``app.kubernetes.io/name: envoy``, ``app.kubernetes.io/component: proxy``,
  ``app.kubernetes.io/managed-by: envoy-gateway``; the rate-limit pods are ``envoy-ratelimit``);
* Prometheus Operator v0.93.0's Prometheus and Alertmanager pods (``pkg/prometheus/server/operator.go``
  and ``pkg/alertmanager/operator.go`` makeSelectorLabels: ``app.kubernetes.io/name: prometheus`` or
  ``alertmanager``, ``app.kubernetes.io/managed-by: prometheus-operator``);
* kube-prometheus-stack 88.3.0's operator pod (``templates/prometheus-operator/_prometheus-operator.tpl``:
  ``app: kube-prometheus-stack-operator``, the chart's name, which GenNStack does not override), whose admission webhook listens on 10250
  (``prometheusOperator.tls.internalPort``) for the API server;
* the KubeRay chart v1.7.0's operator pod (``helm-chart/kuberay-operator/templates/deployment.yaml``:
  ``app.kubernetes.io/name: kuberay-operator``);
* CoreDNS of the EKS add-on (``k8s-app: kube-dns``, the ``kube-dns`` Service's selector).

Namespaces are matched by ``kubernetes.io/metadata.name``, the label Kubernetes sets on every namespace.
Plain data and functions: no CDK.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from gennstack.controller_values import KUBERAY_NAMESPACE
from gennstack.gateway.names import ENVOY_GATEWAY_NAMESPACE
from gennstack.observability.names import MONITORING_NAMESPACE

KEDA_NAMESPACE = "keda"
PROXY_POD_LABELS = {"app.kubernetes.io/name": "envoy", "app.kubernetes.io/component": "proxy", "app.kubernetes.io/managed-by": "envoy-gateway"}
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator"}
ALERTMANAGER_POD_LABELS = {"app.kubernetes.io/name": "alertmanager", "app.kubernetes.io/managed-by": "prometheus-operator"}
KPS_OPERATOR_POD_LABELS = {"app": "kube-prometheus-stack-operator"}
KPS_OPERATOR_WEBHOOK_PORT = 10250
KUBERAY_OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
DNS_PEER = {"namespace": "kube-system", "podLabels": {"k8s-app": "kube-dns"}}
# The EKS Pod Identity agent (hostNetwork, port 80): "169.254.170.23 for IPv4 and [fd00:ec2::23] for
# IPv6" (awsdocs/amazon-eks-user-guide latest/ug/manage-access/aws-access/service-accounts.adoc).
POD_IDENTITY_AGENT_CIDRS = ("169.254.170.23/32", "fd00:ec2::23/128")
# The `kubernetes` Service's ClusterIP when the chart cannot look it up: EKS assigns service
# addresses "from either the 10.100.0.0/16 or 172.20.0.0/16 CIDR blocks" unless told otherwise
# (latest/ug/clusters/create-cluster.adoc), and the API server's Service takes the first.
API_SERVER_FALLBACK_CIDRS = ("172.20.0.1/32", "10.100.0.1/32")
# The service ranges EKS picks from (the same page); left out of the egress to S3, with the VPC.
SERVICE_CIDRS = ("172.20.0.0/16", "10.100.0.0/16")
# S3 on 443 from everywhere outside the VPC: NetworkPolicy cannot name S3 by DNS (serving chart values).
S3_CIDRS = ("0.0.0.0/0",)


def _peer(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"namespace": namespace, "podLabels": dict(labels)}


def serving_values(*, enabled: bool, vpc_cidr: str) -> dict[str, Any]:
    """The serving chart's ``networkPolicy`` values: the peers its policies name, and the VPC's CIDR
    (egress to S3 on 443 leaves it out)."""
    ipaddress.IPv4Network(vpc_cidr)  # config validated it; a token or typo here fails loudly
    return {
        "enabled": enabled,
        "vpcCidr": vpc_cidr,
        "s3Cidrs": list(S3_CIDRS),
        "apiServerCidrs": list(API_SERVER_FALLBACK_CIDRS),
        "serviceCidrs": list(SERVICE_CIDRS),
        "podIdentityAgentCidrs": list(POD_IDENTITY_AGENT_CIDRS),
        "dns": dict(DNS_PEER),
        "gateway": _peer(ENVOY_GATEWAY_NAMESPACE, PROXY_POD_LABELS),
        "prometheus": _peer(MONITORING_NAMESPACE, PROMETHEUS_POD_LABELS),
        "kuberay": _peer(KUBERAY_NAMESPACE, KUBERAY_OPERATOR_POD_LABELS),
    }


def _policy(name: str, spec: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": MONITORING_NAMESPACE, "labels": dict(labels)}, "spec": spec}


def monitoring_policies(*, vpc_cidr: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """The monitoring namespace's NetworkPolicies: nothing comes in from outside the namespace but
    KEDA's queries to Prometheus (9090) and the API server's calls to the Prometheus Operator's
    admission webhook (10250, from the control plane's network interfaces in the VPC). Inside it
    everything stays open (Prometheus scrapes the exporters, Grafana reads Prometheus and
    Alertmanager, Prometheus sends alerts). Egress stays open: Prometheus scrapes every node and
    pod, the Grafana sidecars and Prometheus' discovery call the API server, Alertmanager calls SNS.
    A compromised model server or the bench Job therefore reaches neither Prometheus' query API nor
    Alertmanager's (silences). ``kubectl port-forward`` reaches the pods through the kubelet inside
    their network namespace, which NetworkPolicy does not filter."""
    ipaddress.IPv4Network(vpc_cidr)
    return [
        _policy("gennstack-monitoring-default-deny", {"podSelector": {}, "policyTypes": ["Ingress"]}, labels),
        _policy("gennstack-monitoring-same-namespace", {
            "podSelector": {}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
        }, labels),
        _policy("gennstack-monitoring-keda-to-prometheus", {
            "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABELS)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": KEDA_NAMESPACE}}}],
                         "ports": [{"protocol": "TCP", "port": 9090}]}],
        }, labels),
        _policy("gennstack-monitoring-operator-webhook", {
            "podSelector": {"matchLabels": dict(KPS_OPERATOR_POD_LABELS)}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": vpc_cidr}}],
                         "ports": [{"protocol": "TCP", "port": KPS_OPERATOR_WEBHOOK_PORT}]}],
        }, labels),
    ]
