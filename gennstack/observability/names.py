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
# Label every ServiceMonitor/PodMonitor/PrometheusRule of GenNStack carries. Prometheus selects every
# such object in the cluster (gennstack.observability.values), the upstream charts' own included.
MONITORING_LABEL = {"gennstack.dev/monitoring": "true"}

# The gateway's client id as a metric label. The AI Gateway's external processor copies request
# headers into metric attributes (its `metricsRequestHeaderAttributes` flag, "header:attribute",
# cmd/extproc/mainlib/main.go at envoyproxy/ai-gateway v1.1.0); the gateway's API-key check forwards
# the client id in gennstack.gateway.values.CLIENT_HEADER, mapped to this attribute. OpenTelemetry's
# Prometheus exporter writes the attribute's dots as underscores: the label is CLIENT_LABEL.
CLIENT_ATTRIBUTE = "gennstack.client_id"
CLIENT_LABEL = "gennstack_client_id"
# The label every GenNStack scrape target of a model server gets: the generation's pool name
# (gen1-inf2, gen2-trn2, gen3-g6e), from the pods' app.kubernetes.io/name.
GENERATION_LABEL = "generation"
# The CloudWatch namespace of the interruption handler's metrics (POWERTOOLS_METRICS_NAMESPACE of its
# function; tests/observability/test_construct.py holds the two equal).
INTERRUPTION_METRICS_NAMESPACE = "GenNStack"
# Its POWERTOOLS_SERVICE_NAME: Powertools adds it to every metric as the dimension "service", so a
# CloudWatch query of the handler's metrics (gennstack cost --live) names it.
INTERRUPTION_SERVICE_NAME = "interruption-handler"
