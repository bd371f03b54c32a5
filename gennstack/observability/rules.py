"""GenNStack's alerts and recording rules, as Prometheus rule groups and one PrometheusRule.

The thresholds come from ``monitoring.alerts``; the expressions use only metrics listed in
:mod:`gennstack.observability.metrics` (tests parse every expression with promtool and run
``promtool test rules`` with cases that fire and cases that must not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gennstack.observability import names
from gennstack.observability.config import MonitoringConfig

# The model servers' pool names (the serving chart's app.kubernetes.io/name) by generation.
POOLS = {"inf2": "gen1-inf2", "trn2": "gen2-trn2", "g6e": "gen3-g6e"}
# kube-state-metrics writes extended resource names with '.' and '/' as '_'.
ACCELERATOR_RESOURCES = ("aws_amazon_com_neuron", "nvidia_com_gpu")
PRICE_RECORD = "gennstack:node_hourly_price_usd"
# The Neuron generations: vLLM there runs with prefix caching off (the serving chart's
# --no-enable-prefix-caching), and vllm-neuron then sets block_size to max_model_len
# (vllm-project/vllm-neuron a5ef7c8, vllm_neuron/platform.py: "Neuron requires block_size =
# max_model_len when blockwise KV cache is disabled"), while the chart spells out
# --num-gpu-blocks-override ceil(max_model_len / 32) x max_num_seqs (NxD Inference's block count).
# Every sequence then takes one block of that pool, so vLLM 0.13.0's vllm:kv_cache_usage_perc
# (vllm/v1/core/block_pool.py get_usage: 1 - free / (num_gpu_blocks - 1)) never passes
# 1 / ceil(max_model_len / 32): 0.4 % at gen2-trn2's 8192 tokens. The real KV cache is NxD
# Inference's contiguous one, a max_model_len slot per sequence (gennstack/serving/capacity.py), so it
# is full when max_num_seqs sequences run: running / max_num_seqs is its use.
CONTIGUOUS_KV = ("inf2", "trn2")
# max_num_seqs of each Neuron generation as a series, for the alert and the gen2-trn2 dashboard.
BATCH_SLOTS_RECORD = "gennstack:vllm_max_num_seqs"
RULE_NAME = "gennstack"
# Days before the gateway's certificate expires that GenNStackGatewayCertificateExpiring fires.
CERTIFICATE_WARNING_DAYS = 30


def always_serving(serving: Any, generations: list[str]) -> list[str]:
    """The enabled generations configured to keep at least one replica (``min_replicas``): only they
    get a no-ready-replica alert. The serving config refuses ``min_replicas: 0`` today
    (docs/autoscaling.md), so this is every enabled generation until scale-to-zero exists."""
    return [g for g in generations if getattr(serving, g).min_replicas > 0]


def batch_sizes(serving: Any, generations: list[str]) -> dict[str, int]:
    """Each enabled generation's ``max_num_seqs`` (serving config), for ``rule_groups``."""
    return {g: getattr(serving, g).max_num_seqs for g in generations}


def _ready_replicas(namespace: str, pool: str) -> str:
    return (
        f'sum(kube_pod_status_ready{{namespace="{namespace}", condition="true"}}'
        f' * on (namespace, pod) group_left ()'
        f' kube_pod_labels{{namespace="{namespace}", label_app_kubernetes_io_name="{pool}",'
        f' label_app_kubernetes_io_component="server"}})'
    )


def _ready_groups(namespace: str, pool: str) -> str:
    """Ready groups of a multi-node model (the serving chart's LeaderWorkerSet ``pool``): its leaders whose
    ``vllm`` container is Ready. Only the leader runs vLLM (the workers' container is ``ray-worker``,
    without a probe, Ready as soon as it runs), and its readiness (vLLM's /health) needs every pipeline
    stage: a group counts once, and only whole."""
    return (
        f'sum(kube_pod_container_status_ready{{namespace="{namespace}", container="vllm"}}'
        f' * on (namespace, pod) group_left ()'
        f' kube_pod_labels{{namespace="{namespace}", label_app_kubernetes_io_name="{pool}",'
        f' label_app_kubernetes_io_component="server"}})'
    )


def _waiting_for_staging(namespace: str, pool: str) -> str:
    """Pods of ``pool`` labelled by the serving chart's closed staged gate (gennstack.io/staged: "false"
    on servers, warm spares and gen1's Ray head: templates/_staging.tpl stagedLabel)."""
    return (f'count(kube_pod_labels{{namespace="{namespace}", label_app_kubernetes_io_name="{pool}",'
            f' label_gennstack_io_staged="false"}}) > 0')


def kv_cache_use_expr(comparison: str = "") -> str:
    """KV-cache use per (generation, pod), ``comparison`` applied to each side: vLLM's gauge on GPU, and
    on the Neuron generations (``CONTIGUOUS_KV``) sequences running over ``BATCH_SLOTS_RECORD``."""
    label = names.GENERATION_LABEL
    neuron = "|".join(POOLS[g] for g in CONTIGUOUS_KV)
    return (f'max by ({label}, pod) (vllm:kv_cache_usage_perc{{{label}!~"{neuron}"}}){comparison}'
            f' or max by ({label}, pod) (vllm:num_requests_running{{{label}=~"{neuron}"}})'
            f" / on ({label}) group_left () max by ({label}) ({BATCH_SLOTS_RECORD}){comparison}")


# The serving pods' start, phase by phase, as the control plane and the kubelet record it in the pod's
# status: kube-state-metrics v2.19.1 (kube-prometheus-stack 88.3.0's) exports each condition's
# lastTransitionTime as Unix seconds (internal/store/pod.go: kube_pod_status_scheduled_time from
# PodScheduled, kube_pod_status_initialized_time from Initialized, kube_pod_status_ready_time from
# Ready, each only while the condition is True; kube_pod_created from metadata.creationTimestamp). On
# these pods Initialized means every init container finished: the image pulled and, on Neuron, the
# weights and compiled artifacts synced (sync-from-s3); Ready means the server answered /health with
# the model loaded. The record is each phase's seconds after the pod was created, per pod.
START_PHASE_RECORD = "gennstack:serving_pod_start_phase_seconds"
START_PHASES = (("scheduled", "kube_pod_status_scheduled_time"), ("initialized", "kube_pod_status_initialized_time"),
                ("ready", "kube_pod_status_ready_time"))
# The last phase, "served": the pod's first successful request, as its own server counts it. vLLM's
# vllm:request_success_total (vllm/v1/metrics/loggers.py at v0.29.0 and v0.13.0, labels finished_reason,
# model_name, engine; the PodMonitors add namespace and pod) is 0 until the engine finishes a request.
# FIRST_SERVED_RECORD keeps the time of the first evaluation at which the pod's sum was above 0: the
# rule carries its own earliest value of the last FIRST_SERVED_CARRY (a range selector skips the stale
# markers a rule writes when it returns nothing for a moment, prometheus v3.13.2 rules/group.go, and a
# failed scrape writes for its target's series, scrape/scrape.go: a kube-state-metrics restart or a
# Prometheus outage shorter than the carry moves nothing), so a later restart of the counter never moves
# it; a carried value older than the pod's creation is another pod's of the same name (a StatefulSet's,
# LeaderWorkerSet leaders) and is dropped; it is kept while kube-state-metrics listed the pod in the last
# 10 minutes. Resolution: the scrape interval plus the 1-minute evaluation. gen1-inf2 has none: its vLLM
# listens on loopback inside the Ray worker and is not scraped (gennstack/observability/manifests.py).
FIRST_SERVED_RECORD = "gennstack:serving_pod_first_served_time"
FIRST_SERVED_CARRY = "1h"
SERVED_PHASE = "served"


def start_phase_rules(serving_namespace: str) -> list[dict[str, Any]]:
    """``START_PHASE_RECORD`` for each phase of ``START_PHASES`` and for ``SERVED_PHASE`` (from
    ``FIRST_SERVED_RECORD``), for the serving namespace's server pods (labelled with their pool,
    ``label_app_kubernetes_io_name``, from kube_pod_labels)."""
    ns = f'namespace="{serving_namespace}"'
    # on the uid too: a StatefulSet's pod recreated under its name (LeaderWorkerSet leaders) is listed twice
    # while the old one's samples are within the lookback, which a match on (namespace, pod) refuses
    servers = (" * on (namespace, pod, uid) group_left (label_app_kubernetes_io_name) "
               f'kube_pod_labels{{{ns}, label_app_kubernetes_io_component="server"}}')
    phases = [{"record": START_PHASE_RECORD, "labels": {"phase": phase},
               "expr": f"({metric}{{{ns}}} - on (namespace, pod, uid) kube_pod_created{{{ns}}}){servers}"}
              for phase, metric in START_PHASES]
    created = f"max by (namespace, pod) (last_over_time(kube_pod_created{{{ns}}}[10m]))"
    first_served = {"record": FIRST_SERVED_RECORD,
                    "expr": (f"((min_over_time({FIRST_SERVED_RECORD}{{{ns}}}[{FIRST_SERVED_CARRY}]) >= on (namespace, pod) {created})"
                             f" or timestamp(sum by (namespace, pod) (vllm:request_success_total{{{ns}}}) > 0))"
                             f" and on (namespace, pod) {created}")}
    served = {"record": START_PHASE_RECORD, "labels": {"phase": SERVED_PHASE},
              "expr": f"({FIRST_SERVED_RECORD}{{{ns}}} - on (namespace, pod) group_right () kube_pod_created{{{ns}}}){servers}"}
    return [*phases, first_served, served]


def batch_slot_rules(generations: list[str], max_num_seqs: Mapping[str, int]) -> list[dict[str, Any]]:
    """``BATCH_SLOTS_RECORD`` for each enabled Neuron generation: its ``max_num_seqs`` (serving config)."""
    return [{"record": BATCH_SLOTS_RECORD, "expr": f"vector({max_num_seqs[g]})",
             "labels": {names.GENERATION_LABEL: POOLS[g]}}
            for g in generations if g in CONTIGUOUS_KV]


def alert_rules(config: MonitoringConfig, *, generations: list[str], serving_namespace: str,
                multi_node_pool: str | None = None) -> list[dict[str, Any]]:
    """The alerting rules, for the enabled ``generations`` (names as in config: inf2, trn2, g6e) and,
    when serving.multi_node is on, its groups (``multi_node_pool``, the LeaderWorkerSet's name)."""
    alerts = config.alerts
    rules: list[dict[str, Any]] = []
    for generation in generations:
        pool = POOLS[generation]
        rules.append({
            "alert": "GenNStackNoReadyReplica",
            # "or vector(0)": no serving pod at all is no ready replica too. Not while the generation
            # waits to be staged (its gate closed: docs/serving.md "The staged gate"): hours of
            # staging after the first deploy are the documented order, not an outage to page on.
            "expr": (f"({_ready_replicas(serving_namespace, pool)} or vector(0)) == 0"
                     f" unless on () ({_waiting_for_staging(serving_namespace, pool)})"),
            "for": "10m",
            "labels": {"severity": "critical", names.GENERATION_LABEL: pool},
            "annotations": {
                "summary": f"{pool} has no ready replica",
                "description": f"No serving pod of {pool} in {serving_namespace} has been Ready for 10 minutes: "
                               "the gateway fails over to another generation or returns errors for its model. "
                               "(Quiet while the generation's staged gate is closed.)",
            },
        })
    if multi_node_pool is not None:
        pool = multi_node_pool
        rules.append({
            "alert": "GenNStackNoReadyReplica",
            "expr": (f"({_ready_groups(serving_namespace, pool)} or vector(0)) == 0"
                     f" unless on () ({_waiting_for_staging(serving_namespace, pool)})"),
            "for": "10m",
            "labels": {"severity": "critical", names.GENERATION_LABEL: pool},
            "annotations": {
                "summary": f"{pool} has no ready replica (group)",
                "description": f"No group of {pool} in {serving_namespace} has had a Ready leader for 10 minutes "
                               "(a group is one replica: its leader's vLLM is Ready only with every member up): "
                               "the gateway fails over or returns errors for its model. (Quiet while its staged "
                               "gate is closed.)",
            },
        })
    slo = alerts.ttft_p95_slo_seconds
    rules += [
        {
            "alert": "GenNStackTimeToFirstTokenOverSLO",
            "expr": (
                "histogram_quantile(0.95, sum by (le, gen_ai_request_model) "
                f"(rate(gen_ai_server_time_to_first_token_seconds_bucket[5m]))) > {slo:g}"
            ),
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Time to first token p95 of {{ $labels.gen_ai_request_model }} is over the SLO",
                "description": f"p95 time to first token at the gateway has been above {slo:g} s for 10 minutes "
                               "(now {{ $value | humanizeDuration }}).",
            },
        },
        {
            "alert": "GenNStackHighErrorRate",
            "expr": (
                'sum by (gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_count{error_type!=""}[5m]))'
                " / sum by (gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_count[5m]))"
                f" > {alerts.error_rate:g}"
            ),
            "for": "5m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "Errors on {{ $labels.gen_ai_request_model }} above "
                           f"{alerts.error_rate * 100:g} %",
                "description": "{{ $value | humanizePercentage }} of the gateway's requests for this model failed "
                               "over the last 5 minutes.",
            },
        },
        {
            "alert": "GenNStackKVCacheFull",
            "expr": kv_cache_use_expr(f" >= {alerts.kv_cache_full:g}"),
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "vLLM KV cache of {{ $labels.pod }} is full",
                "description": "KV-cache use (on Neuron: sequences running / max_num_seqs, each holding a "
                               "max_model_len slot of the contiguous cache) has been at or above "
                               f"{alerts.kv_cache_full * 100:g} % for 5 minutes: requests queue (on GPU they also "
                               "get preempted). Add replicas (on GPU, or lower max_num_seqs).",
            },
        },
        {
            # A pod held by a scheduling gate (a generation whose staged marker is not yet written,
            # docs/serving.md "The staged gate") is Pending by design and asks for no node: the
            # scheduler sets its PodScheduled condition to reason SchedulingGated, which
            # kube-state-metrics v2.19.1 exports as kube_pod_status_reason{reason="SchedulingGated"}
            # (internal/store/pod.go podStatusReasons, getPodStatusReasonValue reads condition reasons).
            "alert": "GenNStackAcceleratorPodPending",
            "expr": (
                '(max by (namespace, pod) (kube_pod_status_phase{phase="Pending"}) == 1)'
                " and on (namespace, pod) "
                f'(max by (namespace, pod) (kube_pod_container_resource_requests{{resource=~"{"|".join(ACCELERATOR_RESOURCES)}"}}) > 0)'
                " unless on (namespace, pod) "
                '(max by (namespace, pod) (kube_pod_status_reason{reason="SchedulingGated"}) == 1)'
            ),
            "for": f"{alerts.pending_pod_minutes}m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Accelerator pod {{ $labels.namespace }}/{{ $labels.pod }} is Pending",
                "description": f"Pending for over {alerts.pending_pod_minutes} minutes: no capacity (spot, quota, "
                               "NodePool limits) or a scheduling constraint nothing satisfies; see Karpenter's events.",
            },
        },
        {
            # A broken stream the relay could not resume ends with an OpenAI-style error event: the client
            # saw an error mid-answer (no server of the model left, attempts or the deadline spent, a replay
            # too long). Any in 10 minutes warns; the reason label says which (docs/gateway.md).
            "alert": "GenNStackStreamResumeFailing",
            "expr": "sum by (model, reason) (increase(gennstack_resume_failed_total[10m])) > 0",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Broken {{ $labels.model }} streams could not be resumed ({{ $labels.reason }})",
                "description": "{{ $value }} client streams of {{ $labels.model }} ended with an error event in 10 "
                               "minutes because the relay could not continue them (reason {{ $labels.reason }}); "
                               "see the gateway dashboard's stream resume panels and docs/gateway.md.",
            },
        },
        {
            # Envoy Gateway v1.8.3 refuses an expired (or not yet valid) listener certificate
            # (internal/gatewayapi/tls.go) and leaves the listener out: port 443 stops answering at the
            # next configuration change. The chart re-issues the certificate only when it is upgraded
            # within 180 days of expiry (docs/gateway.md), so warn well before.
            "alert": "GenNStackGatewayCertificateExpiring",
            "expr": f"min(envoy_server_days_until_first_cert_expiring) < {CERTIFICATE_WARNING_DAYS}",
            "for": "1h",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "The gateway's TLS certificate expires in {{ $value }} days",
                "description": "Envoy drops the HTTPS listener once its certificate expires. Deploy a gateway "
                               "change (adding a name to gateway.tls.hostnames will do) to re-issue it from the "
                               "same CA (docs/gateway.md).",
            },
        },
        {
            # YACE v0.67.0 runs the dead-letter depth as a static job, one GetMetricStatistics call per
            # refresh (pkg/job/static.go), and drops the metric without a trace when the call fails
            # (pkg/clients/cloudwatch/client.go GetMetricStatistics returns nil). The depth itself
            # cannot be the guard: SQS publishes a queue's metrics only while it is active, up to six
            # hours after its last API call, so an idle, empty dead-letter queue has no series at all.
            # The exporter's own count of that call is there on every refresh (its counter carries
            # api_name only once called): absent, YACE is down, unscraped or not running the job.
            "alert": "GenNStackCloudWatchExporterAbsent",
            "expr": 'absent(yace_cloudwatch_requests_total{api_name="GetMetricStatistics"})',
            "for": "15m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "The CloudWatch exporter (YACE) reports no CloudWatch requests",
                "description": "YACE is not running, not scraped, or not querying CloudWatch: the dead-letter alert and "
                               "the spot dashboard's handler panels are blind. Check the exporter's pod and logs.",
            },
        },
        {
            # An AccessDenied (or throttling) answer counts here (yace_cloudwatch_request_errors,
            # pkg/promutil/prometheus.go) and nowhere else: the series it was for just never appears.
            "alert": "GenNStackCloudWatchExporterErrors",
            "expr": "sum(increase(yace_cloudwatch_request_errors[15m])) > 0",
            "for": "15m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "CloudWatch refuses the exporter's requests",
                "description": "YACE's CloudWatch calls fail ({{ $value }} in 15 minutes): the series they fetch are "
                               "missing, the dead-letter alert among them. Its logs name the API and the error.",
            },
        },
        {
            "alert": "GenNStackInterruptionDeadLetters",
            "expr": "max(aws_sqs_approximate_number_of_messages_visible_maximum) > 0",
            "for": "1m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "The interruption handler's dead-letter queue holds messages",
                "description": "An interruption event or reconcile run failed after all retries: warm spares may "
                               "not have been raised. Read the handler's logs, then redrive or purge the queue.",
            },
        },
    ]
    return rules


def price_rules(config: MonitoringConfig) -> list[dict[str, Any]]:
    """One constant series per configured price, labelled like kube_node_labels so the cost dashboard can join."""
    rules = []
    for instance_type, prices in sorted(config.hourly_prices.items()):
        for capacity_type, price in sorted(prices.items()):
            rules.append({"record": PRICE_RECORD, "expr": f"vector({price:g})", "labels": {
                "label_node_kubernetes_io_instance_type": instance_type,
                "label_karpenter_sh_capacity_type": capacity_type,
            }})
    return rules


def rule_groups(config: MonitoringConfig, *, generations: list[str], serving_namespace: str,
                multi_node_pool: str | None = None, max_num_seqs: Mapping[str, int]) -> list[dict[str, Any]]:
    """The rule groups as a Prometheus rule file (and a PrometheusRule's spec) holds them.
    ``max_num_seqs``: each enabled generation's (serving config), by generation name."""
    groups = [{"name": "gennstack.alerts", "rules": alert_rules(config, generations=generations,
                                                               serving_namespace=serving_namespace,
                                                               multi_node_pool=multi_node_pool)}]
    slots = batch_slot_rules(generations, max_num_seqs)
    if slots:
        # Every minute, as the prices: constants the alert and the gen2-trn2 dashboard divide by.
        groups.append({"name": "gennstack.batch", "interval": "1m", "rules": slots})
    # Every minute: a start lasts minutes, and the panel reads the last value of each pod's phases.
    groups.append({"name": "gennstack.start", "interval": "1m", "rules": start_phase_rules(serving_namespace)})
    prices = price_rules(config)
    if prices:
        # Evaluated every minute: an interval as long as the 5-minute lookback would leave the
        # cost dashboard's series stale (gaps) between evaluations.
        groups.append({"name": "gennstack.prices", "interval": "1m", "rules": prices})
    return groups


def prometheus_rule(config: MonitoringConfig, *, generations: list[str], serving_namespace: str,
                    multi_node_pool: str | None = None, max_num_seqs: Mapping[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RULE_NAME, "namespace": names.MONITORING_NAMESPACE, "labels": dict(names.MONITORING_LABEL)},
        "spec": {"groups": rule_groups(config, generations=generations, serving_namespace=serving_namespace,
                                       multi_node_pool=multi_node_pool, max_num_seqs=max_num_seqs)},
    }
