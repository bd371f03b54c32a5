"""Names of the monitoring stack that several parts of GenNStack refer to.

The kube-prometheus-stack release, its namespace and the Prometheus Service it creates are fixed,
not configurable: KEDA's Prometheus scaler, Grafana's data source and the alert rules all address
them, so they are defined once here.
"""

from __future__ import annotations

MONITORING_NAMESPACE = "monitoring"
# kube-prometheus-stack's release name; the chart's fullnameOverride is the same, so its objects are
# named "<KPS_FULLNAME>-prometheus", "<KPS_FULLNAME>-alertmanager", ...
KPS_RELEASE = "kube-prometheus-stack"
KPS_FULLNAME = "gennstack-monitoring"
# The Prometheus Service of kube-prometheus-stack (templates/prometheus/service.yaml: "<fullname>-prometheus", port 9090).
PROMETHEUS_URL = f"http://{KPS_FULLNAME}-prometheus.{MONITORING_NAMESPACE}.svc.cluster.local:9090"
# Label every ServiceMonitor/PodMonitor/PrometheusRule of GenNStack carries, and that Prometheus selects on.
MONITORING_LABEL = {"gennstack.dev/monitoring": "true"}
