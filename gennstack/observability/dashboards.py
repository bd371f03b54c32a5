"""GenNStack's Grafana dashboards, built here and kept as JSON in assets/dashboards/.

The JSON files are what Grafana loads (the construct puts each into a ConfigMap that
kube-prometheus-stack's dashboard sidecar picks up); this module is how they are written, so
every panel's query is reviewable Python. After changing a panel:
``.venv/bin/python -m gennstack.observability.dashboards`` rewrites the files, and
tests/observability/test_dashboards.py fails while the files and this module disagree.

Grafana template variables used in queries: ``$__rate_interval`` and ``$__range`` (Grafana's
built-ins), ``$model`` on the gen1 dashboard (a query variable over the gateway's models, starting on gen1's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gennstack.observability import names
from gennstack.observability.rules import BATCH_SLOTS_RECORD, CONTIGUOUS_KV, PRICE_RECORD, START_PHASE_RECORD
from gennstack.observability.values import YACE_DELAY_SECONDS, YACE_REFRESH_SECONDS
from gennstack.serving.config import Inf2Serving

DASHBOARD_DIR = Path(__file__).resolve().parent.parent.parent / "assets" / "dashboards"
# kube-prometheus-stack provisions its Prometheus data source with this uid
# (values.yaml grafana.sidecar.datasources.uid).
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
# Grafana's dashboard JSON model version the files are written in; Grafana migrates older
# versions on load, so this is the oldest that has every field used here.
SCHEMA_VERSION = 41
RATE = "$__rate_interval"

Query = tuple[str, str]  # (PromQL, legend)


def _panel(title: str, unit: str, queries: list[Query], *, kind: str = "timeseries",
           description: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(queries)
        ],
    }


def _dashboard(uid: str, title: str, panels: list[dict[str, Any]], *,
               variables: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    laid_out = []
    for index, panel in enumerate(panels):
        laid_out.append({"id": index + 1, "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
                         **panel})
    return {
        "uid": uid,
        "title": title,
        "tags": ["gennstack"],
        "timezone": "utc",
        "editable": False,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": []},
        "templating": {"list": variables or []},
        "panels": laid_out,
    }


def _quantiles(metric: str, selector: str, by: str = "") -> list[Query]:
    group = f"le, {by}" if by else "le"
    return [
        (f"histogram_quantile({q}, sum by ({group}) (rate({metric}{{{selector}}}[{RATE}])))",
         f"p{round(q * 100)}" + (f" {{{{{by}}}}}" if by else ""))
        for q in (0.5, 0.95, 0.99)
    ]


def _serving_pods(pool: str) -> str:
    return (
        'sum(kube_pod_status_ready{condition="true"} * on (namespace, pod) group_left () '
        f'kube_pod_labels{{label_app_kubernetes_io_name="{pool}", label_app_kubernetes_io_component="server"}})'
    )


def _nodes(generation: str) -> list[Query]:
    return [(f'count by (label_karpenter_sh_capacity_type) (kube_node_labels{{label_gennstack_io_generation="{generation}"}})',
             "{{label_karpenter_sh_capacity_type}} nodes")]


# What a serving pod's Ready condition means: its readiness probe. vLLM's /health on the Deployments
# (templates/vllm-servers.yaml, _multinode.tpl); on gen1-inf2's Ray workers the pod's Ray Serve proxy
# (/-/healthz, templates/inf2-rayservice.yaml), which answers before the pod's vLLM replica has loaded.
READY_MEANS = "ready (the server answered /health: the model loaded)"
GEN1_READY_MEANS = "ready (the pod's Ray Serve proxy answers; its vLLM replica may still be loading)"


SERVED_MEANS = ("and served: its first successful request, from its own vLLM's request counter (to within a scrape "
                "and a minute)")
GEN1_SERVED_MEANS = "no served phase: the Ray worker's vLLM listens on loopback and is not scraped"


def _start_phases_panel(pool: str, ready_means: str = READY_MEANS, served_means: str = SERVED_MEANS) -> dict[str, Any]:
    """Each serving pod's start (rules.START_PHASE_RECORD): when it was scheduled, initialized, Ready and
    served its first request."""
    return _panel("Serving pod start by phase (s after the pod was created)", "s", [
        (f'max by (pod, phase) ({START_PHASE_RECORD}{{label_app_kubernetes_io_name="{pool}"}})', "{{pod}} {{phase}}"),
    ], description="From the pod's conditions (kube-state-metrics): scheduled (a node bound, its launch included), "
                   "initialized (image pulled and init containers done: on Neuron the weights and artifacts synced, "
                   f"on g6e the tiktoken files and vLLM's compile cache), {ready_means}; {served_means}.")


def _replicas(pool: str) -> list[Query]:
    return [(_serving_pods(pool), "ready serving pods"),
            (f'sum(kube_deployment_status_replicas_available{{deployment="{pool}-warm-spare"}})', "warm spares")]


def _kv_cache_panel(generation: str, sel: str) -> dict[str, Any]:
    """KV-cache use per pod. On Neuron (rules.CONTIGUOUS_KV) vLLM's kv_cache_usage_perc counts blocks of
    max_model_len tokens out of ceil(max_model_len / 32) x max_num_seqs and never passes
    1 / ceil(max_model_len / 32) (the reasoning beside CONTIGUOUS_KV): the panel shows sequences running
    over max_num_seqs (the recorded rules.BATCH_SLOTS_RECORD), the slots of NxD Inference's contiguous cache."""
    if generation in CONTIGUOUS_KV:
        return _panel("KV-cache slots in use", "percentunit", [
            (f"max by (pod) (vllm:num_requests_running{{{sel}}}) / scalar(max({BATCH_SLOTS_RECORD}{{{sel}}}))", "{{pod}}"),
        ], description="Sequences running / max_num_seqs: on Neuron every sequence holds a max_model_len slot of the "
                       "contiguous KV cache, and vLLM's own KV-cache gauge (blocks of max_model_len tokens, prefix caching "
                       "off) stays near 0.")
    return _panel("KV-cache use", "percentunit", [
        (f"max by (pod) (vllm:kv_cache_usage_perc{{{sel}}})", "{{pod}}"),
    ])


def _cache_panel(generation: str, sel: str) -> dict[str, Any]:
    """Preemptions, with the prefix-cache hit ratio where vLLM caches prefixes.

    The serving chart runs the Neuron generations with ``--no-enable-prefix-caching``
    (templates/_helpers.tpl gennstack-serving.vllmArgs): their prefix-cache counters never move and a
    hit ratio would be 0/0, a panel without data. g6e keeps vLLM's default (prefix caching on)."""
    preemptions = (f"sum(rate(vllm:num_preemptions_total{{{sel}}}[{RATE}]))", "preemptions/s")
    if generation in ("inf2", "trn2"):
        return _panel("Preemptions", "none", [preemptions],
                      description="Prefix caching is off on Neuron (the chart's --no-enable-prefix-caching): no hit ratio.")
    return _panel("Prefix-cache hit ratio and preemptions", "percentunit", [
        (f"sum(rate(vllm:prefix_cache_hits_total{{{sel}}}[{RATE}])) / sum(rate(vllm:prefix_cache_queries_total{{{sel}}}[{RATE}]))",
         "hit ratio"),
        preemptions,
    ])


def _routing_panels(sel: str) -> list[dict[str, Any]]:
    """Prefix-aware routing (docs/gateway.md): each replica's share of the requests the gateway sent,
    next to its prefix-cache hit rate. Per pod from vLLM's own counters (the gateway's Envoy exports
    no per-host series: its per-host stats are only on the admin's /clusters): requests finished
    (vllm:request_success_total) and prompt tokens looked up / found in the prefix cache
    (vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total, vLLM v1 counters in tokens).
    "busiest / mean" is the number the bounded load keeps near hash_balance_factor / 100."""
    share = (f"sum by (pod) (rate(vllm:request_success_total{{{sel}}}[{RATE}])) / scalar(sum(rate(vllm:request_success_total{{{sel}}}[{RATE}])))")
    return [
        _panel("Request share per replica (routing)", "percentunit", [
            (share, "{{pod}}"),
            (f"max({share}) * count({share})", "busiest / mean"),
        ], description="Each pod's share of the finished requests; with prefix routing a conversation stays on one pod, "
                       "and the bounded load (gateway.routing.hash_balance_factor) keeps the busiest near 1.25 x the mean."),
        _panel("Prefix-cache hit rate per replica", "percentunit", [
            (f"sum by (pod) (rate(vllm:prefix_cache_hits_total{{{sel}}}[{RATE}])) / "
             f"sum by (pod) (rate(vllm:prefix_cache_queries_total{{{sel}}}[{RATE}]))", "{{pod}}"),
        ], description="Prompt tokens found in the pod's prefix cache / prompt tokens looked up."),
    ]


def vllm_dashboard(generation: str, pool: str, accelerator: list[dict[str, Any]]) -> dict[str, Any]:
    """gen2-trn2 / gen3-g6e: vLLM's own latency, throughput and queue metrics, by the generation label."""
    sel = f'{names.GENERATION_LABEL}="{pool}"'
    itl = f"vllm:inter_token_latency_seconds_bucket{{{sel}}}"
    panels = [
        _panel("Time to first token", "s", _quantiles("vllm:time_to_first_token_seconds_bucket", sel)),
        _panel("Inter-token latency", "s", _quantiles("vllm:inter_token_latency_seconds_bucket", sel)),
        _panel("Per-user output tokens/s", "none", [
            (f"1 / histogram_quantile(0.5, sum by (le) (rate({itl}[{RATE}])))", "median user"),
            (f"1 / histogram_quantile(0.9, sum by (le) (rate({itl}[{RATE}])))", "slowest 10 % of tokens"),
        ], description="1 / inter-token latency: what one streaming user sees."),
        _panel("Aggregate tokens/s", "none", [
            (f"sum(rate(vllm:generation_tokens_total{{{sel}}}[{RATE}]))", "output"),
            (f"sum(rate(vllm:prompt_tokens_total{{{sel}}}[{RATE}]))", "prompt"),
        ]),
        _panel("Requests running and waiting", "none", [
            (f"sum(vllm:num_requests_running{{{sel}}})", "running"),
            (f"sum(vllm:num_requests_waiting{{{sel}}})", "waiting (queue)"),
        ]),
        _kv_cache_panel(generation, sel),
        # side by side (the 7th and 8th panels: one row)
        *(_routing_panels(sel) if generation == "g6e" else []),
        _cache_panel(generation, sel),
        _panel("End-to-end request latency", "s", _quantiles("vllm:e2e_request_latency_seconds_bucket", sel)),
        _panel("HTTP responses by status", "reqps", [
            (f'sum by (status) (rate(http_requests_total{{{sel}, handler=~"/v1/.*"}}[{RATE}]))', "{{status}}"),
        ]),
        _panel("Finished requests by reason", "reqps", [
            (f"sum by (finished_reason) (rate(vllm:request_success_total{{{sel}}}[{RATE}]))", "{{finished_reason}}"),
        ], description="vLLM FinishReason: stop (the model ended), length (max_tokens or the context), abort (the client left), error, repetition."),
        _panel("Replicas", "none", _replicas(pool)),
        _panel("Nodes, spot vs on-demand", "none", _nodes(generation)),
        *accelerator,
        _start_phases_panel(pool),
    ]
    return _dashboard(f"gennstack-{pool}", f"GenNStack / {pool}", panels)


def _ready_groups(pool: str) -> str:
    """A multi-node model's ready groups: leaders whose ``vllm`` container is Ready (the workers run no
    vLLM; a leader is Ready only with every pipeline stage up), the same count as its no-ready-replica rule."""
    return (
        'sum(kube_pod_container_status_ready{container="vllm"} * on (namespace, pod) group_left () '
        f'kube_pod_labels{{label_app_kubernetes_io_name="{pool}", label_app_kubernetes_io_component="server"}})'
    )


def multi_node_dashboard(pool: str) -> dict[str, Any]:
    """serving.multi_node's groups (LeaderWorkerSet ``pool``): the gen3 dashboard's vLLM panels on the
    leaders' series (generation=<pool>), with a group counted once: ready groups, and the member pods
    (two per group) beside them."""
    dashboard = vllm_dashboard("g6e", pool, _gpu_panels(pool))
    for panel in dashboard["panels"]:
        if panel["title"] == "Replicas":
            panel["title"] = "Replicas (groups)"
            panel["description"] = "A group is one replica: Ready when its leader's vLLM is (every member up)."
            panel["targets"] = [
                {"refId": "A", "datasource": DATASOURCE, "expr": _ready_groups(pool), "legendFormat": "ready groups"},
                {"refId": "B", "datasource": DATASOURCE, "expr": _serving_pods(pool), "legendFormat": "ready member pods"},
            ]
    return dashboard


# The multi-node model's dashboard lives apart (assets/dashboards/multinode/): applied only while
# serving.multi_node is on (gennstack.observability.manifests.dashboard_config_maps).
MULTI_NODE_DIR = DASHBOARD_DIR / "multinode"


def multi_node_dashboards() -> dict[str, dict[str, Any]]:
    """File name (under MULTI_NODE_DIR) -> dashboard, per multi-node pool."""
    return {"gennstack-gen3-g6e-multinode.json": multi_node_dashboard("gen3-g6e-multinode")}


def _neuron_panels(generation: str) -> list[dict[str, Any]]:
    on_gen = f'on (node) group_left () kube_node_labels{{label_gennstack_io_generation="{generation}"}}'
    return [
        _panel("NeuronCore utilisation", "percentunit", [
            (f"avg(neuroncore_utilization_ratio * {on_gen})", "average"),
            (f"max(neuroncore_utilization_ratio * {on_gen})", "busiest core"),
        ]),
        _panel("Neuron device memory used", "bytes", [
            (f"sum by (node, memory_location) (neuron_runtime_memory_used_bytes * {on_gen})", "{{node}} {{memory_location}}"),
        ]),
    ]


def _pool_nodes(pool: str) -> str:
    """The nodes running a serving pod of ``pool``, as ``Hostname`` (the label the DCGM exporter puts its
    node's name in: NODE_NAME from spec.nodeName, NVIDIA/dcgm-exporter 4.5.3-4.8.2
    internal/pkg/hostname/hostname.go and deployment/templates/daemonset.yaml). gen3-g6e's servers and
    the multi-node groups share the g6e NodePools, so a node label cannot tell them apart; the pods do
    (kube_pod_info's ``node``)."""
    return ('label_replace(max by (node) (kube_pod_info * on (namespace, pod) group_left () '
            f'kube_pod_labels{{label_app_kubernetes_io_name="{pool}", label_app_kubernetes_io_component="server"}}), '
            '"Hostname", "$1", "node", "(.+)")')


def _gpu_panels(pool: str) -> list[dict[str, Any]]:
    """GPU use on the nodes of ``pool``'s serving pods only (not every NVIDIA node of the cluster)."""
    nodes = _pool_nodes(pool)
    return [
        _panel("GPU utilisation", "percent", [(f"avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL and on (Hostname) {nodes})",
                                               "{{Hostname}}")]),
        _panel("GPU memory used", "percentunit", [
            ("(sum by (Hostname) (DCGM_FI_DEV_FB_USED) / sum by (Hostname) (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE))"
             f" and on (Hostname) {nodes}", "{{Hostname}}"),
        ]),
    ]


def gen1_dashboard() -> dict[str, Any]:
    """gen1-inf2 runs vLLM behind Ray Serve; its vLLM binds to the pod's loopback, so latency comes
    from Ray Serve's HTTP metrics and from the gateway (by model), not from vLLM."""
    pool = "gen1-inf2"
    sel = f'{names.GENERATION_LABEL}="{pool}"'
    model = 'gen_ai_response_model=~"$model"'
    # The gateway's metrics carry every generation's models: the variable starts on gen1's (the
    # default serving.inf2.served_model_name, what its vLLM answers as). Grafana selects the first
    # model listed when a renamed one is not among the options.
    gen1_model = Inf2Serving().served_model_name
    variables = [{
        "name": "model", "label": "Model (gateway)", "type": "query", "datasource": DATASOURCE,
        "query": {"query": "label_values(gen_ai_server_request_duration_seconds_count, gen_ai_response_model)",
                  "refId": "model"},
        "refresh": 2, "includeAll": True, "multi": True,
        "current": {"selected": True, "text": [gen1_model], "value": [gen1_model]},
    }]
    panels = [
        _panel("Time to first token (gateway, $model)", "s",
               _quantiles("gen_ai_server_time_to_first_token_seconds_bucket", model)),
        _panel("Time per output token (gateway, $model)", "s",
               _quantiles("gen_ai_server_time_per_output_token_seconds_bucket", model)),
        _panel("Per-user output tokens/s (gateway, $model)", "none", [
            (f"1 / histogram_quantile(0.5, sum by (le) (rate(gen_ai_server_time_per_output_token_seconds_bucket{{{model}}}[{RATE}])))",
             "median user"),
            (f"1 / histogram_quantile(0.9, sum by (le) (rate(gen_ai_server_time_per_output_token_seconds_bucket{{{model}}}[{RATE}])))",
             "slowest 10 % of requests"),
        ]),
        _panel("Aggregate output tokens/s (gateway, $model)", "none", [
            (f'sum(rate(gen_ai_client_token_usage_sum{{{model}, gen_ai_token_type="output"}}[{RATE}]))', "output"),
        ]),
        _panel("Ray Serve HTTP latency", "ms", _quantiles("ray_serve_http_request_latency_ms_bucket", sel)),
        _panel("Ray Serve requests and errors", "reqps", [
            (f"sum(rate(ray_serve_num_http_requests_total{{{sel}}}[{RATE}]))", "requests"),
            (f"sum(rate(ray_serve_num_http_error_requests_total{{{sel}}}[{RATE}]))", "errors"),
        ]),
        _panel("Requests in flight at the replicas (queue depth)", "none", [
            (f"sum(ray_serve_replica_processing_queries{{{sel}}})", "processing"),
        ]),
        _panel("Ray Serve healthy replicas", "none", [
            (f"sum(ray_serve_deployment_replica_healthy{{{sel}}})", "healthy"),
        ]),
        _panel("Replicas", "none", _replicas(pool)),
        _panel("Nodes, spot vs on-demand", "none", _nodes("inf2")),
        *_neuron_panels("inf2"),
        _start_phases_panel(pool, GEN1_READY_MEANS, GEN1_SERVED_MEANS),
    ]
    return _dashboard("gennstack-gen1-inf2", "GenNStack / gen1-inf2", panels, variables=variables)


def gateway_dashboard() -> dict[str, Any]:
    client = names.CLIENT_LABEL
    count = "gen_ai_server_request_duration_seconds_count"
    panels = [
        _panel("Requests/s by model", "reqps", [
            (f"sum by (gen_ai_request_model) (rate({count}[{RATE}]))", "{{gen_ai_request_model}}")]),
        _panel("Requests/s by client", "reqps", [
            (f"sum by ({client}) (rate({count}[{RATE}]))", f"{{{{{client}}}}}")]),
        _panel("Tokens/s by model", "none", [
            (f"sum by (gen_ai_request_model, gen_ai_token_type) (rate(gen_ai_client_token_usage_sum[{RATE}]))",
             "{{gen_ai_request_model}} {{gen_ai_token_type}}")]),
        _panel("Tokens/s by client", "none", [
            (f"sum by ({client}, gen_ai_token_type) (rate(gen_ai_client_token_usage_sum[{RATE}]))",
             f"{{{{{client}}}}} {{{{gen_ai_token_type}}}}")]),
        _panel("Responses by class (Envoy)", "reqps", [
            (f"sum by (gateway, envoy_response_code_class) (rate(envoy_http_downstream_rq_xx[{RATE}]))",
             "{{gateway}} {{envoy_response_code_class}}xx")],
               description="Per Gateway: the public one answers clients; with stream resume on, the routing one "
                           "answers the relay (first attempts and continuations)."),
        _panel("Failed requests by model and client (AI Gateway)", "reqps", [
            (f'sum by (gen_ai_request_model, {client}) (rate({count}{{error_type!=""}}[{RATE}]))',
             f"{{{{gen_ai_request_model}}}} {{{{{client}}}}}")]),
        _panel("Rate-limited requests", "reqps", [
            (f"sum by (envoy_cluster_name) (rate(envoy_cluster_ratelimit_over_limit[{RATE}]))", "{{envoy_cluster_name}}")]),
        _panel("Failovers: retries and outlier ejections", "none", [
            (f"sum by (envoy_cluster_name) (rate(envoy_cluster_upstream_rq_retry[{RATE}]))", "retries/s {{envoy_cluster_name}}"),
            (f"sum by (envoy_cluster_name) (increase(envoy_cluster_outlier_detection_ejections_enforced_total[{RATE}]))",
             "ejections {{envoy_cluster_name}}"),
        ], description="Envoy moves a request to the next priority's backends through retries once a priority's "
                       "hosts are ejected or failing (docs/gateway.md)."),
        _panel("Stream resume: broken streams resumed, refused, failed", "none", [
            (f"sum by (model) (rate(gennstack_resume_attempts_total[{RATE}]))", "attempted {{model}}"),
            (f"sum by (model) (rate(gennstack_resume_succeeded_total[{RATE}]))", "succeeded {{model}}"),
            (f"sum by (model, reason) (rate(gennstack_resume_refused_total[{RATE}]))", "refused {{model}} {{reason}}"),
            (f"sum by (model, reason) (rate(gennstack_resume_failed_total[{RATE}]))", "failed {{model}} {{reason}}"),
        ], description="Per second, from the relay (docs/gateway.md, \"Stream resume\"): continuations sent, broken "
                       "streams resumed to their end, requests relayed without resume (refused: a field that "
                       "cannot be replayed exactly, resume off for the model) and broken streams that ended "
                       "with an error event (failed), by reason."),
        _panel("Stream resume: tokens replayed/s and streams in flight", "none", [
            (f"sum by (model) (rate(gennstack_resume_replayed_tokens_total[{RATE}]))", "replayed tokens/s {{model}}"),
            ("sum(gennstack_resume_streams_in_flight)", "streams in flight"),
        ], description="Prompt plus generated token IDs sent again by continuations (the cost of resuming: "
                       "prefill on the new server), and client requests the relays hold now."),
        _panel("Time to first token by model", "s",
               _quantiles("gen_ai_server_time_to_first_token_seconds_bucket", "", by="gen_ai_request_model")[1:2]),
        _panel("Request duration by model", "s",
               _quantiles("gen_ai_server_request_duration_seconds_bucket", "", by="gen_ai_request_model")[1:2]),
    ]
    return _dashboard("gennstack-gateway", "GenNStack / gateway", panels)


# The handler's CloudWatch metrics arrive through YACE in 5-minute buckets, one per refresh
# (gennstack.observability.values.cloudwatch_exporter_config): each point is that bucket's total.
YACE_BUCKET = (f"Each point is the total of one {YACE_REFRESH_SECONDS // 60}-minute CloudWatch bucket, asked for with the "
               f"window ending {YACE_DELAY_SECONDS // 60} minutes before the refresh so CloudWatch has its last datapoints "
               f"(YACE fetches one bucket per {YACE_REFRESH_SECONDS // 60}-minute refresh).")


def spot_dashboard() -> dict[str, Any]:
    panels = [
        _panel("Interruptions by signal, per 5 minutes (interruption handler)", "none", [
            ("sum by (dimension_generation, dimension_signal) (aws_gennstack_interruptions_sum)",
             "{{dimension_generation}} {{dimension_signal}}")], description=YACE_BUCKET),
        _panel("Interruption messages by type (Karpenter)", "none", [
            (f"sum by (message_type) (increase(karpenter_interruption_received_messages_total[{RATE}]))", "{{message_type}}")]),
        _panel("Warm spares: running and target", "none", [
            ('sum by (deployment) (kube_deployment_status_replicas_available{deployment=~".+-warm-spare"})', "{{deployment}} available"),
            ("max by (dimension_generation) (aws_gennstack_warm_spare_replicas_maximum)", "{{dimension_generation}} target"),
        ]),
        _panel("Node churn (Karpenter)", "none", [
            (f"sum by (nodepool) (increase(karpenter_nodes_created_total[{RATE}]))", "created {{nodepool}}"),
            (f"sum by (nodepool) (increase(karpenter_nodes_terminated_total[{RATE}]))", "terminated {{nodepool}}"),
        ]),
        _panel("Disruptions by reason (Karpenter)", "none", [
            (f"sum by (reason, nodepool) (increase(karpenter_nodeclaims_disrupted_total[{RATE}]))", "{{reason}} {{nodepool}}")]),
        _panel("Warning to replacement ready", "ms", [
            ("max by (dimension_generation) (aws_gennstack_prewarm_latency_average)", "{{dimension_generation}} spare raised"),
        ], description="From the interruption warning to the warm spare's scale-up (the handler's PrewarmLatency)."),
        _panel("Drain routing: serving pods drained, restored, kept (per 5 minutes)", "none", [
            ("sum by (dimension_generation) (aws_gennstack_drained_pods_sum)", "{{dimension_generation}} drained"),
            ("sum by (dimension_generation) (aws_gennstack_restored_pods_sum)", "{{dimension_generation}} restored"),
            ("max by (dimension_generation) (aws_gennstack_kept_pods_maximum)", "{{dimension_generation}} kept (last replicas)"),
        ], description="Pods taken out of routing on a doomed node, given back when a rebalance did not become an "
                       "interruption, and kept in routing because they were a generation's last serving replicas "
                       "(docs/spot-drills.md)."),
        _panel("Drain latency (signal to pods out of routing)", "ms", [
            ("max by (dimension_generation) (aws_gennstack_drain_latency_maximum)", "{{dimension_generation}}"),
        ], description="From the EC2 event's time to the last pod patched (the handler's DrainLatency); Envoy drops "
                       "the pods at the next DNS refresh after that."),
        _panel("Serving replicas by capacity type", "none", [
            ("max by (dimension_generation, dimension_capacity_type) (aws_gennstack_serving_replicas_maximum)",
             "{{dimension_generation}} {{dimension_capacity_type}}"),
        ], description="The Deployment generations' serving pods by their node's karpenter.sh/capacity-type, counted "
                       "by the reconciler each minute (the handler's ServingReplicas); scale-down takes the "
                       "on-demand ones first (pod-deletion-cost, docs/spot-drills.md)."),
        _panel("Return to spot: moves (per 5 minutes)", "none", [
            ("sum by (dimension_generation, dimension_outcome, dimension_cause) (aws_gennstack_spot_moves_sum)",
             "{{dimension_generation}} {{dimension_outcome}} {{dimension_cause}}"),
        ], description="On-demand replicas the reconciler moved back to spot: started (the ScaledObject minimum "
                       "raised by one), completed (the on-demand pod gone), cancelled by cause (on_demand: the "
                       "replacement landed on on-demand; unscheduled, not_ready: past their bounds) and restored "
                       "(kept: the HPA kept the pod; below_minimum) (docs/spot-drills.md)."),
        _panel("Pod startup p90 and p99 (Karpenter)", "s", [
            # A Summary: its own p90 and p99 (client_golang's default 10-minute window), no buckets.
            ('max(karpenter_pods_startup_duration_seconds{quantile="0.9"})', "p90"),
            ('max(karpenter_pods_startup_duration_seconds{quantile="0.99"})', "p99")]),
        _panel("Interruption handler errors (per 5 minutes) and dead letters", "none", [
            ("sum(aws_gennstack_errors_sum)", "handler errors"),
            ("max(aws_sqs_approximate_number_of_messages_visible_maximum)", "dead letters"),
        ]),
    ]
    return _dashboard("gennstack-spot", "GenNStack / spot", panels)


def cost_dashboard() -> dict[str, Any]:
    by = "label_node_kubernetes_io_instance_type, label_karpenter_sh_capacity_type"
    nodes = f'sum by ({by}) (kube_node_labels{{label_karpenter_sh_capacity_type!=""}})'
    priced = f"(kube_node_labels * on ({by}) group_left () {PRICE_RECORD})"
    legend = "{{label_node_kubernetes_io_instance_type}} {{label_karpenter_sh_capacity_type}}"
    panels = [
        _panel("Nodes by instance and capacity type", "none", [(nodes, legend)]),
        _panel("Node-hours in the time range", "none", [
            (f"sum by ({by}) (sum_over_time({nodes}[$__range:1m])) / 60", legend)], kind="table"),
        _panel("USD per hour", "currencyUSD", [(f"sum by ({by}) {priced}", legend)],
               description="Prices from monitoring.hourly_prices in GenNStack's config (recorded as "
                           f"{PRICE_RECORD}); instance types without a price are left out."),
        _panel("USD in the time range", "currencyUSD", [
            (f"sum by ({by}) (sum_over_time((sum by ({by}) {priced})[$__range:1m])) / 60", legend)], kind="table"),
    ]
    return _dashboard("gennstack-cost", "GenNStack / cost", panels)


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard."""
    return {
        "gennstack-gen1-inf2.json": gen1_dashboard(),
        "gennstack-gen2-trn2.json": vllm_dashboard("trn2", "gen2-trn2", _neuron_panels("trn2")),
        "gennstack-gen3-g6e.json": vllm_dashboard("g6e", "gen3-g6e", _gpu_panels("gen3-g6e")),
        "gennstack-gateway.json": gateway_dashboard(),
        "gennstack-spot.json": spot_dashboard(),
        "gennstack-cost.json": cost_dashboard(),
    }


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"


def write(directory: Path = DASHBOARD_DIR) -> list[Path]:
    written = []
    for folder, files in ((directory, dashboards()), (directory / MULTI_NODE_DIR.name, multi_node_dashboards())):
        folder.mkdir(parents=True, exist_ok=True)
        for name, dashboard in files.items():
            path = folder / name
            path.write_text(render(dashboard), encoding="utf-8")
            written.append(path)
    return written


if __name__ == "__main__":
    for path in write():
        print(path)
