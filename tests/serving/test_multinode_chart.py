"""The serving chart's multi-node replicas (templates/multinode-lws.yaml), rendered with the real helm
from the values CDK builds, each object validated (the LeaderWorkerSet against LWS v0.10.0's CRD in
../shared/crds/leaderworkerset.x-k8s.io, the rest against Kubernetes 1.36).

Pinned to LWS v0.10.0 (kubernetes-sigs/lws tag v0.10.0):
* api/leaderworkerset/v1/leaderworkerset_types.go: ExclusiveKeyAnnotationKey
  "leaderworkerset.sigs.k8s.io/exclusive-topology", WorkerIndexLabelKey
  "leaderworkerset.sigs.k8s.io/worker-index" (the leader's is "0", pkg/webhooks/pod_webhook.go),
  RestartPolicyType RecreateGroupOnPodRestart ("will recreate all the pods in the group if any pod
  in the group is recreated or any container restarts").
* The exclusive-topology annotation is read from the LeaderWorkerSet object, never from a pod
  template: pkg/controllers/pod_controller.go ``leaderWorkerSet.Annotations[ExclusiveKeyAnnotationKey]``
  (the workers' StatefulSet waits for the leader's node and gets a nodeSelector on its zone,
  setNodeSelectorForWorkerPods), and both controllers copy ``lws.Annotations[...]`` onto the pod
  templates they build (leaderworkerset_controller.go, pod_controller.go). pkg/webhooks/pod_webhook.go
  SetExclusiveAffinities then gives the leader (in its LeaderPod branch only) a required pod affinity
  to its own group (group-key In [its key]) and a required anti-affinity to every other group
  (group-key Exists, NotIn [its key]), both on the annotation's topology key.
* pkg/utils/pod/pod_utils.go AddLWSVariables: LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX are
  added to every container ``if not exists``: the chart must not set them itself.
"""

from __future__ import annotations

import json

import pytest

from gennstack.config import load_config
from tests import helm
from tests.k8s_schema import validate
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, cdk_values, merged

pytestmark = pytest.mark.slow

ON = {"serving": {"multi_node": {"enabled": True}}}
LWS_ENV = {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    config = load_config(ON)
    rendered = helm.render(CHART, cdk_values(ON, config.serving), namespace=NAMESPACE)
    return {(o["kind"], o["metadata"]["name"]): o for o in rendered}


def test_every_object_validates_against_the_pinned_schemas(objects) -> None:
    for obj in objects.values():
        validate(obj)
    assert ("LeaderWorkerSet", "gen3-g6e-multinode") in objects


def test_off_by_default_renders_nothing_of_it() -> None:
    values = cdk_values()
    assert "multiNode" not in values
    names = {(o["kind"], o["metadata"]["name"]) for o in helm.render(CHART, values, namespace=NAMESPACE)}
    assert not [n for n in names if "multinode" in n[1] or n[0] == "LeaderWorkerSet"]
    names = {o["kind"] for o in helm.render(CHART, REQUIRED, namespace=NAMESPACE)}
    assert "LeaderWorkerSet" not in names


def test_group_is_the_replica_recreated_whole_in_one_zone_on_distinct_nodes(objects) -> None:
    lws = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]
    template = lws["leaderWorkerTemplate"]
    assert lws["replicas"] == 1 and template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    # On the LeaderWorkerSet object, which is where LWS reads it (pkg/controllers/pod_controller.go):
    # on the pod templates alone the workers were never pinned to their leader's zone.
    lws_annotations = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["metadata"]["annotations"]
    assert lws_annotations[EXCLUSIVE_TOPOLOGY] == "topology.kubernetes.io/zone"
    for role in ("leaderTemplate", "workerTemplate"):
        pod = template[role]
        # One place for it: LWS copies the object's value onto the pods it creates.
        assert EXCLUSIVE_TOPOLOGY not in pod["metadata"]["annotations"]
        assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        spec = pod["spec"]
        anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert anti == [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {
            "app.kubernetes.io/name": "gen3-g6e-multinode", "app.kubernetes.io/component": "server"}}}]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                "values": ["g6e.12xlarge"]}]}]
        assert spec["nodeSelector"] == {"gennstack.io/generation": "g6e"}
        container = spec["containers"][0]
        # A whole g6e.12xlarge per pod: its 4 GPUs.
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        # LWS injects its variables only where the container does not set them.
        assert not LWS_ENV & {e["name"] for e in container["env"]}
        assert container["command"][:2] == ["python3", "/scripts/multinode_bootstrap.py"]
    assert template["leaderTemplate"]["spec"]["containers"][0]["command"][2] == "leader"
    assert template["workerTemplate"]["spec"]["containers"][0]["command"][2] == "worker"


def test_leader_starts_vllm_with_tp_in_a_node_and_pp_across_nodes_over_ray(objects) -> None:
    template = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]["leaderWorkerTemplate"]
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    args = json.loads({e["name"]: e.get("value") for e in leader["env"]}["VLLM_ARGS"])
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--tensor-parallel-size"] == "4" and pairs["--pipeline-parallel-size"] == "2"
    assert pairs["--distributed-executor-backend"] == "ray"
    assert pairs["--model"] == "s3://gennstack-models-1a2b/meta-llama/Llama-4-Scout-17B-16E-Instruct/main/"
    assert pairs["--load-format"] == "runai_streamer" and pairs["--served-model-name"] == "llama-4-scout"
    # Every flag is one vLLM 0.29.0 defines (tests/serving/test_multinode_bootstrap.py's table).
    from tests.serving.test_multinode_bootstrap import VLLM_0_29_0_FLAGS

    assert set(pairs) - {"--model"} <= VLLM_0_29_0_FLAGS
    # The cold-start budget is the leader's startup probe: 2400 s.
    probe = leader["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == 2400
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert "VLLM_ARGS" not in {e["name"] for e in worker["env"]} and "startupProbe" not in worker


def test_the_pipeline_keeps_vllms_own_nccl_group(objects) -> None:
    """The image has plain ray, no cupy (assets/images/g6e-vllm-ray/Dockerfile), which is what vLLM 0.29.0
    needs with its defaults (read from the vllm-0.29.0 wheel on PyPI): vllm/envs.py
    ``VLLM_USE_RAY_WRAPPED_PP_COMM`` defaults to "1", so vllm/v1/executor/ray_executor.py registers
    ``RayPPCommunicator`` (vLLM's own pipeline group) as Ray's accelerator context, and
    ``_check_ray_cgraph_installation`` asks for cupy only when ``VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE``
    is "nccl" (default "auto"). Ray 2.60.0 propagates the registered context to every actor
    (ray/experimental/channel/torch_tensor_accelerator_channel.py ``_init_communicator``), so its cupy
    ``_NcclGroup`` is never imported. No container of a group sets either variable."""
    for name in ("gen3-g6e-multinode", "gen3-g6e-multinode-warm-spare"):
        lws = objects.get(("LeaderWorkerSet", name))
        if lws is None:
            continue
        template = lws["spec"]["leaderWorkerTemplate"]
        pods = [template["workerTemplate"]] + ([template["leaderTemplate"]] if "leaderTemplate" in template else [])
        env = {e["name"] for pod in pods for c in pod["spec"]["containers"] for e in c.get("env", [])}
        assert not env & {"VLLM_USE_RAY_WRAPPED_PP_COMM", "VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE"}, name
    assert ("LeaderWorkerSet", "gen3-g6e-multinode") in objects


def test_service_routes_to_routable_leaders_only_and_the_budget_covers_the_groups(objects) -> None:
    service = objects[("Service", "gen3-g6e-multinode-serve")]["spec"]
    assert service["clusterIP"] == "None"
    assert service["selector"] == {"app.kubernetes.io/name": "gen3-g6e-multinode", "app.kubernetes.io/component": "server",
                                   WORKER_INDEX: "0", "gennstack.io/routable": "true"}
    pod_labels = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]["leaderWorkerTemplate"]["leaderTemplate"][
        "metadata"]["labels"]
    assert pod_labels["gennstack.io/routable"] == "true"
    pdb = objects[("PodDisruptionBudget", "gen3-g6e-multinode")]["spec"]
    assert pdb == {"maxUnavailable": 1, "selector": {"matchLabels": {
        "app.kubernetes.io/name": "gen3-g6e-multinode", "app.kubernetes.io/component": "server"}}}


def test_schema_rejects_a_neuron_generation_and_typos() -> None:
    for bad in ({"multiNode": {"generation": "trn2"}}, {"multiNode": {"nodesPerReplica": 1}},
                {"multiNode": {"replica": 2}}):
        result = helm.template(CHART, merged(REQUIRED, bad), namespace=NAMESPACE)
        assert result.returncode != 0 and "multiNode" in result.stderr


def test_the_staging_gate_closes_on_the_groups_pods_too(objects) -> None:
    """The other servers' gate (templates/_staging.tpl schedulingGates, scheduling gate
    gennstack.io/staged): multiNode.staged is `auto` like the generations' (its own stage Job and
    marker: test_multinode_staging.py), so closed under `helm template`; true opens it, false closes
    it on leaders and workers alike."""
    template = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]["leaderWorkerTemplate"]
    assert template["leaderTemplate"]["spec"]["schedulingGates"] == [{"name": "gennstack.io/staged"}]
    config = load_config(ON)
    values = merged(cdk_values(ON, config.serving), {"multiNode": {"staged": True}})
    opened = {(o["kind"], o["metadata"]["name"]): o for o in helm.render(CHART, values, namespace=NAMESPACE)}
    for role in ("leaderTemplate", "workerTemplate"):
        assert "schedulingGates" not in opened[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]["leaderWorkerTemplate"][role]["spec"]
    values = merged(cdk_values(ON, config.serving), {"multiNode": {"staged": False}})
    closed = {(o["kind"], o["metadata"]["name"]): o for o in helm.render(CHART, values, namespace=NAMESPACE)}
    lws = closed[("LeaderWorkerSet", "gen3-g6e-multinode")]
    validate(lws)
    for role in ("leaderTemplate", "workerTemplate"):
        assert lws["spec"]["leaderWorkerTemplate"][role]["spec"]["schedulingGates"] == [{"name": "gennstack.io/staged"}]
