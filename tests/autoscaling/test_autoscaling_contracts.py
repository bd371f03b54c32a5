"""What the autoscaling relies on from KEDA's chart, vLLM's metrics and the chart's ScaledObjects.

Each pinned set below was read from the upstream source at the version GenNStack deploys; the test
holds GenNStack's use to it, so a version bump that changes them fails here first.
"""

from __future__ import annotations

import re

import pytest

from gennstack.controller_values import keda_values
from gennstack.controller_values import operator_values
from gennstack import versions
from gennstack.config import ConfigError, load_config
from gennstack.observability.names import PROMETHEUS_URL
from gennstack.serving.scaling import LOAD_GAUGES
from tests import helm
from tests.k8s_schema import validate
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, cdk_values, merged, only

# kedacore/charts v2.20.2, keda/values.yaml: the keys keda_values() sets. The top-level nodeSelector
# and tolerations are each Deployment's default (templates/manager/deployment.yaml,
# metrics-server/deployment.yaml, webhooks/deployment.yaml: `.Values.<component>.nodeSelector |
# default .Values.nodeSelector`); podDisruptionBudget.operator renders
# templates/manager/poddisruptionbudget.yaml; rbac.enabledCustomScaledRefKinds (default true) guards
# the ClusterRole rules templates/manager/clusterrole.yaml writes from rbac.scaledRefKinds;
# permissions.operator.restrict.secret and permissions.metricServer.restrict.secret (default false) set
# KEDA_RESTRICT_SECRET_ACCESS on the operator and the metrics API server (manager/deployment.yaml,
# metrics-server/deployment.yaml) and drop the ClusterRole's Secret list/watch for a Role in KEDA's
# namespace (manager/clusterrole.yaml, manager/minimal-rbac.yaml).
KEDA_2_20_2_VALUES = {
    "nodeSelector": dict, "tolerations": list, "crds": {"install": bool},
    "operator": {"replicaCount": int}, "podDisruptionBudget": {"operator": {"maxUnavailable": int}},
    "rbac": {"enabledCustomScaledRefKinds": bool},
    "permissions": {"operator": {"restrict": {"secret": bool}}, "metricServer": {"restrict": {"secret": bool}}},
}
# vllm/v1/metrics/loggers.py (PrometheusStatLogger): gauge names and their label names, identical in
# v0.29.0 (images.vllm, g6e) and v0.13.0 (the Neuron 2.28.0 DLC's vLLM, trn2/inf2): labelnames =
# ["model_name", "engine"], model_name = vllm_config.model_config.served_model_name.
VLLM_GAUGES = {"vllm:num_requests_running": ("model_name", "engine"), "vllm:num_requests_waiting": ("model_name", "engine")}
# kedacore/keda v2.20.2, pkg/scalers/prometheus_scaler.go prometheusMetadata: the trigger metadata keys.
KEDA_2_20_2_PROMETHEUS_METADATA = {
    "serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace", "customHeaders",
    "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner",
}


def _shape(value, shape) -> bool:
    if isinstance(shape, dict):
        return isinstance(value, dict) and set(value) <= set(shape) and all(_shape(v, shape[k]) for k, v in value.items())
    return isinstance(value, shape)


def test_keda_chart_is_pinned_to_the_crds_the_tests_use() -> None:
    assert (versions.KEDA.name, versions.KEDA.repository, versions.KEDA.version) == (
        "keda", "https://kedacore.github.io/charts", "2.20.2")
    assert versions.KEDA in versions.CHARTS


def test_keda_values_use_only_chart_keys_and_run_on_system_nodes() -> None:
    values = keda_values()
    assert _shape(values, KEDA_2_20_2_VALUES), values
    assert operator_values(serving_namespace="gennstack-serving")["keda"] == values
    assert values["nodeSelector"] == {"gennstack.io/pool": "system"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    assert values["crds"] == {"install": True}


def test_keda_gets_no_wildcard_rbac_for_custom_scale_targets(scaled_objects) -> None:
    """kedacore/charts v2.20.2: values.yaml defaults ``rbac.scaledRefKinds`` to one entry, apiGroup "*"
    kind "*" ("If left empty, RBAC for `apiGroups: *` and `resources: *, */scale` will be created"), and
    templates/manager/clusterrole.yaml turns each entry into ``<kind>/scale`` get/list/patch/update/watch
    plus ``<kind>`` get, only ``if .Values.rbac.enabledCustomScaledRefKinds``; its ``deployments/scale``
    and ``deployments`` rules come unconditionally. Rendered with these values the operator's ClusterRole
    had no wildcard rule (measured once with helm 4.2.3 against the chart at tag v2.20.2; the chart is not
    fetched in tests). Every ScaledObject of the serving chart targets a Deployment, so nothing needs more."""
    assert keda_values()["rbac"] == {"enabledCustomScaledRefKinds": False}
    assert {o["spec"]["scaleTargetRef"]["kind"] for o in scaled_objects.values()} == {"Deployment"}
    assert {o["spec"]["scaleTargetRef"]["apiVersion"] for o in scaled_objects.values()} == {"apps/v1"}


def test_keda_reads_secrets_only_in_its_namespace_as_no_trigger_needs_one(scaled_objects) -> None:
    """With ``permissions.*.restrict.secret`` the operator and metrics API server read Secrets only in
    KEDA's namespace (rendered once against the chart at v2.20.2: no Secret rule left in any ClusterRole,
    ``KEDA_RESTRICT_SECRET_ACCESS=true`` on both). A trigger could only need one through an
    ``authenticationRef`` (TriggerAuthentication); none of the serving chart's has one."""
    assert keda_values()["permissions"] == {"operator": {"restrict": {"secret": True}}, "metricServer": {"restrict": {"secret": True}}}
    triggers = [t for o in scaled_objects.values() for t in o["spec"]["triggers"]]
    assert triggers and not [t for t in triggers if "authenticationRef" in t]
    assert not [t for t in triggers if set(t["metadata"]) & {"customHeaders", "awsRegion", "identityOwner"}]


@pytest.fixture(scope="module")
def scaled_objects() -> dict[str, dict]:
    objects = helm.render(CHART, cdk_values(), namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ScaledObject"}


@pytest.mark.slow
def test_scaled_objects_target_the_servers_and_query_vllm_gauges(scaled_objects) -> None:
    assert set(scaled_objects) == {"gen2-trn2", "gen3-g6e"}
    served = {"gen2-trn2": "llama-4-maverick", "gen3-g6e": "gpt-oss-20b"}
    for name, obj in scaled_objects.items():
        spec = obj["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        metadata = trigger["metadata"]
        assert set(metadata) <= KEDA_2_20_2_PROMETHEUS_METADATA
        assert metadata["serverAddress"] == PROMETHEUS_URL
        assert metadata["ignoreNullValues"] == "false"  # no series is an error (fallback), never 0
        selectors = re.findall(r"(vllm:[a-z_]+)\{([^}]*)\}", metadata["query"])
        assert [metric for metric, _ in selectors] == list(LOAD_GAUGES)
        for metric, selector in selectors:
            assert metric in VLLM_GAUGES
            # model_name is vLLM's own label; namespace is Prometheus Operator's target label.
            assert selector == f'namespace="{NAMESPACE}",model_name="{served[name]}"'
        # No cooldownPeriod: KEDA uses it only for scaling to zero (minReplicaCount 0), which is refused.
        assert "cooldownPeriod" not in spec and spec["minReplicaCount"] >= 1


@pytest.mark.slow
def test_scaled_deployments_leave_replicas_to_the_hpa() -> None:
    objects = helm.render(CHART, REQUIRED, namespace=NAMESPACE)
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    assert "replicas" not in deployments["gen2-trn2"]["spec"] and "replicas" not in deployments["gen3-g6e"]["spec"]
    fixed = helm.render(CHART, merged(REQUIRED, {"autoscaling": {"enabled": False}, "g6e": {"minReplicas": 3}}), namespace=NAMESPACE)
    assert not [o for o in fixed if o["kind"] == "ScaledObject"]
    assert {o["metadata"]["name"]: o["spec"].get("replicas") for o in fixed if o["kind"] == "Deployment"}["gen3-g6e"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("values, message", [
    ({"g6e": {"minReplicas": 4, "maxReplicas": 3}}, "g6e.maxReplicas: got 3; allowed: at least g6e.minReplicas (4)"),
    ({"trn2": {"targetOngoingRequests": 17}}, "trn2.targetOngoingRequests: got 17; allowed: at most trn2.maxNumSeqs (16)"),
    ({"g6e": {"minReplicas": 0}}, "minimum"),
    ({"g6e": {"replicas": 2}}, "replicas"),
])
def test_chart_refuses_bad_scaling_values(values, message) -> None:
    with pytest.raises(AssertionError, match=re.escape(message)):
        helm.render(CHART, merged(REQUIRED, only("trn2", "g6e"), values), namespace=NAMESPACE)


@pytest.mark.parametrize("serving, expected", [
    ({"g6e": {"replicas": 3}},
     "serving.g6e.replicas: got 3; allowed: no longer a key: use min_replicas and max_replicas"),
    ({"trn2": {"min_replicas": 0}}, "serving.trn2.min_replicas: got 0; must be at least 1: scale-to-zero is not offered"),
    ({"inf2": {"min_replicas": 0}}, "serving.inf2.min_replicas: got 0; must be at least 1"),
    ({"g6e": {"min_replicas": 3, "max_replicas": 2}}, "serving.g6e.max_replicas: got 2; allowed: at least min_replicas (3)"),
    ({"g6e": {"target_ongoing_requests": 65}}, "serving.g6e.target_ongoing_requests: got 65; allowed: at most max_num_seqs (64)"),
    ({"trn2": {"max_replicas": 3}}, "serving.trn2.max_replicas: got 3; allowed: at most what generations.trn2.max_nodes (2) "
     "admits: in the worst case 3 replicas sit on nodes with 576 cpu in all, over the NodePool's limit of 384"),
    ({"g6e": {"scale_down_delay_seconds": 3601}}, "serving.g6e.scale_down_delay_seconds: got 3601; Input should be less than or equal to 3600"),
])
def test_config_errors_name_the_key(serving, expected) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config({"serving": serving})


def test_target_follows_the_batch_unless_set() -> None:
    serving = load_config({}).serving
    assert (serving.inf2.target_ongoing_requests, serving.trn2.target_ongoing_requests, serving.g6e.target_ongoing_requests) == (16, 12, 51)
    assert load_config({"serving": {"g6e": {"max_num_seqs": 10}}}).serving.g6e.target_ongoing_requests == 8
    assert load_config({"serving": {"g6e": {"target_ongoing_requests": 64}}}).serving.g6e.target_ongoing_requests == 64
    # A bigger fleet needs the NodePool to admit it, node for node.
    bigger = load_config({"generations": {"trn2": {"max_nodes": 4}}, "serving": {"trn2": {"max_replicas": 4}}})
    assert bigger.serving.trn2.max_replicas == 4


@pytest.mark.parametrize("types, per_replica, replicas, expected", [
    # Default g6e types: 5 full one-GPU g6e.8xlarge (32 vCPU, 256 GiB) and a g6e.12xlarge for the last.
    (("g6e.xlarge", "g6e.2xlarge", "g6e.4xlarge", "g6e.8xlarge", "g6e.12xlarge"), 1, 6,
     {"vcpu": 5 * 32 + 48, "memory_gib": 5 * 256 + 384, "accelerators": 5 + 4}),
    # One 8-GPU type: 6 replicas fit the node launched for the first.
    (("g6e.48xlarge",), 1, 6, {"vcpu": 192, "memory_gib": 1536, "accelerators": 8}),
    (("g6e.48xlarge",), 1, 9, {"vcpu": 384, "memory_gib": 3072, "accelerators": 16}),
    (("g6e.12xlarge",), 2, 3, {"vcpu": 96, "memory_gib": 768, "accelerators": 8}),
    # Neuron: a replica is a node.
    (("trn2.48xlarge",), 16, 2, {"vcpu": 384, "memory_gib": 4096, "accelerators": 32}),
])
def test_worst_case_usage(types, per_replica, replicas, expected) -> None:
    from gennstack.serving.scaling import worst_case_usage

    assert worst_case_usage(types, per_replica, replicas) == expected


def test_default_node_limits_admit_up_to_eleven_g6e_replicas() -> None:
    load_config({"serving": {"g6e": {"max_replicas": 11}}})
    with pytest.raises(ConfigError, match=r"serving\.g6e\.max_replicas: got 12; .* 400 cpu in all, over the NodePool's limit of 384"):
        load_config({"serving": {"g6e": {"max_replicas": 12}}})
    # A single 8-GPU type packs: one node admits 8.
    load_config({"generations": {"g6e": {"instance_types": ["g6e.48xlarge"], "max_nodes": 1}}, "serving": {"g6e": {"max_replicas": 8}}})
