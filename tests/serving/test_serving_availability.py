"""Availability of the serving chart: gen1-inf2's Ray head off spot with GCS fault tolerance and its
Redis, draining on SIGTERM within the two-minute spot warning, the do-not-disrupt release limited to
the pod's own annotation, and script checksums per workload. Rendered with the real helm; every
object validated against its schema (KubeRay v1.7.0's RayService CRD with its CEL rules, Kubernetes
1.36 for the rest)."""

from __future__ import annotations

import base64
import copy
import json
import shutil
from pathlib import Path

import celpy
import pytest
import yaml

from tests import helm
from tests.k8s_schema import KUBERNETES_FUNCTIONS, validate
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, merged, only

pytestmark = pytest.mark.slow

ON_DEMAND_GENERAL = {"gennstack.io/pool": "general", "karpenter.sh/capacity-type": "on-demand"}


def named(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    rendered = helm.render(CHART, REQUIRED, namespace=NAMESPACE)
    for obj in rendered:
        validate(obj)
    return named(rendered)


def cluster(objects: dict) -> dict:
    return objects[("RayService", "gen1-inf2")]["spec"]["rayClusterConfig"]


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return labels.items() >= selector.items()


# --- the Ray head and its GCS store --------------------------------------------------------------


def test_ray_head_runs_on_demand_and_is_never_disrupted(objects) -> None:
    """Spot reclaims and Karpenter consolidation would take the head, and with it the Serve
    controller and the autoscaler; the system nodes (2 vCPU, 8 GiB) cannot hold its 2 CPU / 8 GiB."""
    head = cluster(objects)["headGroupSpec"]["template"]
    assert head["spec"]["nodeSelector"] == ON_DEMAND_GENERAL
    assert head["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"


def test_gcs_fault_tolerance_follows_kuberay_1_7_0(objects) -> None:
    """KubeRay v1.7.0 ray-operator/controllers/ray/utils/validation.go (ValidateRayClusterSpec,
    validateGcsFaultToleranceBackend) rejects, with gcsFaultToleranceOptions set: a `redis-password`
    or `redis-username` rayStartParam, REDIS_PASSWORD / RAY_REDIS_ADDRESS / REDIS_USERNAME on the head
    container, the ray.io/ft-enabled and ray.io/external-storage-namespace annotations, and `storage`
    with the (default) redis backend. ray-operator/controllers/ray/common/pod.go configureRedisFT then
    sets RAY_REDIS_ADDRESS from redisAddress and REDIS_PASSWORD from redisPassword (valueFrom kept) on
    the head and uses the RayCluster's UID as the storage namespace, so each new cluster of an upgrade
    starts clean."""
    rayservice = objects[("RayService", "gen1-inf2")]
    options = cluster(objects)["gcsFaultToleranceOptions"]
    assert options.get("backend", "redis") == "redis" and "storage" not in options
    assert "externalStorageNamespace" not in options
    head = cluster(objects)["headGroupSpec"]
    assert not {"redis-password", "redis-username"} & set(head["rayStartParams"])
    assert not {"REDIS_PASSWORD", "RAY_REDIS_ADDRESS", "REDIS_USERNAME"} & set(env(head["template"]["spec"]["containers"][0]))
    for metadata in (rayservice["metadata"], head["template"]["metadata"]):
        assert not {"ray.io/ft-enabled", "ray.io/external-storage-namespace"} & set(metadata.get("annotations", {}))
    # The address is the chart's Redis Service; the password the Secret that Redis itself reads.
    host, port = options["redisAddress"].rsplit(":", 1)
    service = objects[("Service", "gen1-inf2-redis")]
    assert host == f"gen1-inf2-redis.{NAMESPACE}.svc" and int(port) == service["spec"]["ports"][0]["port"] == 6379
    ref = options["redisPassword"]["valueFrom"]["secretKeyRef"]
    secret = objects[("Secret", ref["name"])]
    password = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert len(password) == 40 and password.isalnum()
    redis = objects[("Deployment", "gen1-inf2-redis")]["spec"]["template"]["spec"]["containers"][0]
    assert redis["env"] == [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": ref}}]
    assert password not in json.dumps(redis)


def test_gcs_fault_tolerance_without_it_would_break_the_crd_rules(objects) -> None:
    """The RayService CRD (KubeRay v1.7.0) types gcsFaultToleranceOptions strictly: a misspelt field
    or a backend other than redis/rocksdb fails validation, so the test above checks a real spec."""
    bad = copy.deepcopy(objects[("RayService", "gen1-inf2")])
    bad["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["backend"] = "memcached"
    with pytest.raises(AssertionError, match="backend"):
        validate(bad)
    bad = copy.deepcopy(objects[("RayService", "gen1-inf2")])
    bad["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["redisPasword"] = {"value": "x"}
    with pytest.raises(AssertionError, match="redisPasword"):
        validate(bad)


def test_redis_survives_the_head_apart_from_it_on_demand(objects) -> None:
    deployment = objects[("Deployment", "gen1-inf2-redis")]
    template = deployment["spec"]["template"]
    spec = template["spec"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert spec["nodeSelector"] == ON_DEMAND_GENERAL
    assert template["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert spec["priorityClassName"] == "gennstack-serving"
    redis = spec["containers"][0]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert redis["image"] == values["images"]["redis"] and not redis["image"].endswith(":latest")
    assert "--appendonly yes" in redis["args"][0] and "requirepass" in redis["args"][0]
    # Redis's own ceiling (Redis "mb" = MiB) is 3/4 of the pod's limit: it refuses writes before the OOM killer.
    assert "--maxmemory 768mb --maxmemory-policy noeviction" in redis["args"][0]
    assert redis["securityContext"]["readOnlyRootFilesystem"] is True
    assert redis["resources"]["limits"]["memory"] == values["inf2"]["redisResources"]["memory"]
    # A different pod from the head: the head's pod template selects nothing of Redis's.
    head_labels = cluster(objects)["headGroupSpec"]["template"]["metadata"]["labels"]
    assert not labels_match(deployment["spec"]["selector"]["matchLabels"], head_labels)


def test_only_the_ray_head_reaches_redis(objects) -> None:
    """KubeRay v1.7.0 raycluster_controller.go buildRedisCleanupJob builds its Job from the head's
    pod (buildHeadPod keeps the template's labels), so the head's labels admit both."""
    policy = objects[("NetworkPolicy", "gen1-inf2-redis")]["spec"]
    redis_labels = objects[("Deployment", "gen1-inf2-redis")]["spec"]["template"]["metadata"]["labels"]
    assert labels_match(policy["podSelector"]["matchLabels"], redis_labels)
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    [source] = rule["from"]
    allowed = source["podSelector"]["matchLabels"]
    assert labels_match(allowed, cluster(objects)["headGroupSpec"]["template"]["metadata"]["labels"])
    workers = cluster(objects)["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
    others = [workers] + [o["spec"]["template"]["metadata"]["labels"] for (kind, name), o in objects.items()
                          if kind == "Deployment" and name != "gen1-inf2-redis"]
    assert not any(labels_match(allowed, labels) for labels in others)


def test_no_redis_without_inf2() -> None:
    rendered = helm.render(CHART, merged(REQUIRED, only("trn2", "g6e")), namespace=NAMESPACE)
    assert not [o for o in rendered if "redis" in o["metadata"]["name"]]


# --- draining inside the two-minute spot warning -----------------------------------------------


def vllm_args(objects: dict, name: str) -> list[str]:
    container = objects[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
    return json.loads(env(container)["VLLM_ARGS"])


@pytest.mark.parametrize("grace, pre_stop", [(100, 15), (60, 20), (115, 0)])
def test_each_server_drains_inside_its_grace_period(grace, pre_stop) -> None:
    """g6e's vLLM 0.29.0 drains on SIGTERM for --shutdown-timeout seconds; trn2's vLLM 0.13.0
    cannot, so its preStop keeps it serving in-flight requests for the grace period less 10 s.
    inf2's preStop drains its Ray node (files/ray_drain.py, tests/serving/test_ray_drain.py) with
    the deadline Serve's graceful stop takes, and waits at most the grace period less 10 s. Either
    way the pod is gone before SIGKILL, and the grace period is under 120 s."""
    values = merged(REQUIRED, {"spot": {"terminationGracePeriodSeconds": grace, "preStopSleepSeconds": pre_stop}})
    objects = named(helm.render(CHART, values, namespace=NAMESPACE))
    g6e = objects[("Deployment", "gen3-g6e")]["spec"]["template"]["spec"]
    args = vllm_args(objects, "gen3-g6e")
    timeout = int(args[args.index("--shutdown-timeout") + 1])
    assert g6e["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == pre_stop
    assert pre_stop + timeout + 10 == g6e["terminationGracePeriodSeconds"] == grace < 120
    trn2 = objects[("Deployment", "gen2-trn2")]["spec"]["template"]["spec"]
    assert trn2["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == grace - 10
    assert trn2["terminationGracePeriodSeconds"] == grace
    service = objects[("RayService", "gen1-inf2")]["spec"]
    inf2 = service["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    worker = inf2["containers"][0]
    assert worker["lifecycle"]["preStop"]["exec"]["command"][2].endswith(" /scripts/ray_drain.py")
    deployment = yaml.safe_load(service["serveConfigV2"])["applications"][0]["deployments"][0]
    # The drain's deadline is Serve's graceful stop: Serve stops the replica at once
    # (deadline - graceful_shutdown_timeout_s is now), and it has that long to finish its requests.
    assert int(env(worker)["GENNSTACK_DRAIN_DEADLINE_S"]) == deployment["graceful_shutdown_timeout_s"] == grace - pre_stop
    assert int(env(worker)["GENNSTACK_DRAIN_WAIT_S"]) == grace - 10
    assert inf2["terminationGracePeriodSeconds"] == grace


def test_a_grace_period_too_short_to_drain_fails_with_the_key() -> None:
    values = merged(REQUIRED, {"spot": {"terminationGracePeriodSeconds": 20, "preStopSleepSeconds": 15}})
    proc = helm.template(CHART, values)
    assert proc.returncode != 0
    assert "spot.terminationGracePeriodSeconds: got 20; allowed: at least spot.preStopSleepSeconds (15) + 10 + 1" in proc.stderr


def test_ray_serve_drains_a_replica_before_stopping_it(objects) -> None:
    """Ray 2.60.0 ray/serve/_private/replica.py _perform_graceful_shutdown: when Serve stops a
    replica (scale-in, redeploy, replacement) it waits for in-flight requests, polling every
    graceful_shutdown_wait_loop_s, then calls the replica's __del__ (which stops vLLM's process
    group), and the controller kills it after graceful_shutdown_timeout_s."""
    serve = yaml.safe_load(objects[("RayService", "gen1-inf2")]["spec"]["serveConfigV2"])
    deployment = serve["applications"][0]["deployments"][0]
    assert deployment["graceful_shutdown_wait_loop_s"] == 2
    assert deployment["graceful_shutdown_timeout_s"] == 100 - 15


# --- the do-not-disrupt release touches only its own pod --------------------------------------

POD = {"metadata": {"name": "gen3-g6e-7d9f8c-abcde", "namespace": NAMESPACE,
                    "labels": {"app.kubernetes.io/name": "gen3-g6e"},
                    "annotations": {"karpenter.sh/do-not-disrupt": "true", "checksum/scripts": "abc"}},
       "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.29.0"}]}}
SERVING_USER = f"system:serviceaccount:{NAMESPACE}:gennstack-serving"


def request(pod_name: str | None, user: str = SERVING_USER) -> dict:
    extra = {"authentication.kubernetes.io/pod-name": [pod_name], "authentication.kubernetes.io/pod-uid": ["u1"]}
    return {"userInfo": {"username": user, **({"extra": extra} if pod_name else {})}, "namespace": NAMESPACE}


def released(pod: dict) -> dict:
    new = copy.deepcopy(pod)
    del new["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"]
    return new


def admit(policy: dict, req: dict, old: dict, new: dict) -> list[str]:
    """The messages of the policy's failing validations, evaluated with cel-python as the API
    server evaluates a ValidatingAdmissionPolicy (matchConditions gate; variables first)."""
    environment = celpy.Environment()

    def evaluate(expression: str, activation: dict):
        result = environment.program(environment.compile(expression), functions=KUBERNETES_FUNCTIONS).evaluate(activation)
        assert not isinstance(result, Exception), f"{expression}: {result}"
        return result

    activation = {"request": celpy.json_to_cel(req), "object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
    if not all(bool(evaluate(c["expression"], activation)) for c in policy["spec"]["matchConditions"]):
        return []
    variables = {}
    for variable in policy["spec"]["variables"]:
        variables[variable["name"]] = evaluate(variable["expression"], {**activation, "variables": celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()})})
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in variables.items()})
    return [v["message"] for v in policy["spec"]["validations"] if not bool(evaluate(v["expression"], activation))]


@pytest.fixture(scope="module")
def policy(objects) -> dict:
    name = f"{NAMESPACE}-serving-own-pod-only"
    binding = objects[("ValidatingAdmissionPolicyBinding", name)]["spec"]
    assert binding["policyName"] == name and binding["validationActions"] == ["Deny"]
    assert binding["matchResources"]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NAMESPACE}
    return objects[("ValidatingAdmissionPolicy", name)]


def test_sidecar_may_remove_its_own_pods_annotation(policy) -> None:
    assert admit(policy, request(POD["metadata"]["name"]), POD, released(POD)) == []


def test_sidecar_may_not_touch_another_pod(policy) -> None:
    assert admit(policy, request("gen2-trn2-5c4b-xyz12"), POD, released(POD)) == [
        "gennstack-serving may patch only the pod its token is bound to"]
    assert admit(policy, request(None), POD, released(POD)) == [
        "gennstack-serving may patch only the pod its token is bound to"]


@pytest.mark.parametrize("change, message", [
    (lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/name": "gen1-inf2"}), "may change only"),
    (lambda p: p["spec"]["containers"][0].update({"image": "attacker/image:1"}), "may change only"),
    (lambda p: p["metadata"].update({"finalizers": ["x/y"]}), "may change only"),
    (lambda p: p["metadata"]["annotations"].update({"karpenter.sh/do-not-disrupt": "false"}), "may only remove"),
    (lambda p: p["metadata"]["annotations"].pop("checksum/scripts"), "may only remove"),
    (lambda p: p["metadata"]["annotations"].update({"other": "x"}), "may only remove"),
], ids=["labels", "spec", "finalizers", "annotation-changed", "other-annotation-removed", "annotation-added"])
def test_sidecar_may_change_nothing_else(policy, change, message) -> None:
    new = copy.deepcopy(POD)
    change(new)
    failures = admit(policy, request(POD["metadata"]["name"]), POD, new)
    assert len(failures) == 1 and message in failures[0]


def test_policy_leaves_other_users_alone(policy) -> None:
    other = request(None, user="system:serviceaccount:kube-system:karpenter")
    assert admit(policy, other, POD, {**POD, "spec": {}}) == []


# --- checksums: a script change restarts only the pods that run it ---------------------------


def checksums(chart: Path) -> dict[str, str | None]:
    objects = helm.render(chart, REQUIRED, namespace=NAMESPACE)
    out: dict[str, str | None] = {}
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            out[name] = obj["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/scripts")
        if obj["kind"] == "RayService":
            c = obj["spec"]["rayClusterConfig"]
            out[f"{name}/head"] = c["headGroupSpec"]["template"]["metadata"]["annotations"]["checksum/scripts"]
            out[f"{name}/workers"] = c["workerGroupSpecs"][0]["template"]["metadata"]["annotations"]["checksum/scripts"]
    return out


@pytest.mark.parametrize("script, restarted", [
    ("gennstack_serve.py", {"gen1-inf2/head", "gen1-inf2/workers"}),
    ("ray_drain.py", {"gen1-inf2/workers"}),
    ("vllm_serve.py", {"gen1-inf2/head", "gen1-inf2/workers", "gen2-trn2", "gen3-g6e"}),
    # Neuron pods sync weights and compiled artifacts; g6e syncs its tiktoken encodings.
    ("s3sync.py", {"gen1-inf2/workers", "gen2-trn2", "gen3-g6e", "gen1-inf2-warm-spare", "gen2-trn2-warm-spare"}),
    # The Neuron sync containers' driver/runtime check.
    ("neuron_compat.py", {"gen1-inf2/workers", "gen2-trn2", "gen1-inf2-warm-spare", "gen2-trn2-warm-spare"}),
    ("release_do_not_disrupt.py", {"gen1-inf2/workers", "gen2-trn2", "gen3-g6e"}),
    ("stage.py", set()),
])
def test_changing_a_script_restarts_only_its_workloads(tmp_path, script, restarted) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("__pycache__"))
    before = checksums(chart)
    with (chart / "files" / script).open("a") as file:
        file.write("\n# changed\n")
    after = checksums(chart)
    assert {name for name in before if before[name] != after[name]} == restarted


@pytest.mark.parametrize("cpu, threads", [("160", "160"), ("2.5", "2"), ("1500m", "1"), ("500m", "1")])
def test_openmp_threads_are_the_worker_pods_whole_cpus(cpu, threads) -> None:
    values = merged(REQUIRED, only("inf2"), {"inf2": {"resources": {"cpu": cpu, "memory": "640Gi"}}})
    service = named(helm.render(CHART, values))[("RayService", "gen1-inf2")]
    worker = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert env(worker)["GENNSTACK_OMP_NUM_THREADS"] == threads


@pytest.mark.parametrize("memory, ceiling", [("1Gi", "768mb"), ("512Mi", "384mb"), ("4Gi", "3072mb")])
def test_redis_memory_ceiling_follows_its_limit(memory, ceiling) -> None:
    values = merged(REQUIRED, only("inf2"), {"inf2": {"redisResources": {"cpu": "250m", "memory": memory}}})
    redis = named(helm.render(CHART, values))[("Deployment", "gen1-inf2-redis")]["spec"]["template"]["spec"]["containers"][0]
    assert f"--maxmemory {ceiling} " in redis["args"][0]


# --- room for a KubeRay upgrade's second RayCluster ----------------------------------------------


def test_gen1_upgrades_by_a_new_cluster_beside_the_active_one(objects) -> None:
    """KubeRay v1.7.0 ray-operator/controllers/ray/rayservice_controller.go: with upgradeStrategy
    NewCluster (isZeroDowntimeUpgradeEnabled; also its default) a changed rayClusterConfig makes a
    pending RayCluster (shouldPrepareNewCluster) beside the active one, and the Serve Service moves
    to it only once all its Serve applications are RUNNING (getAndCheckServeStatus); with None the
    active cluster is neither replaced nor updated (shouldUpdateCluster: only appended worker
    groups update in place). check_nodes_admit makes room for both clusters."""
    assert objects[("RayService", "gen1-inf2")]["spec"]["upgradeStrategy"] == {"type": "NewCluster"}


def test_gen1_max_nodes_must_admit_the_pending_cluster_too() -> None:
    """During that upgrade the active cluster keeps up to max_replicas replicas and the pending one
    needs min_replicas of its own (one inf2.48xlarge each) before it takes traffic: two nodes for
    the default 1-2 replicas leave the pending cluster's worker unschedulable and the upgrade stuck."""
    from gennstack.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config({"generations": {"inf2": {"max_nodes": 2}}})
    message = str(info.value)
    assert ("serving.inf2.max_replicas: got 2; allowed: at most what generations.inf2.max_nodes (2) admits: in the "
            "worst case 2 replicas of the active RayCluster and the 1 a KubeRay upgrade's pending RayCluster starts "
            "beside it (NewCluster) sit on nodes with 576 cpu in all, over the NodePool's limit of 384; "
            "raise generations.inf2.max_nodes or lower max_replicas or min_replicas") in message
    # three nodes hold both; a fixed two-replica gen1 needs four
    assert load_config({"generations": {"inf2": {"max_nodes": 3}}}).generations.inf2.max_nodes == 3
    with pytest.raises(ConfigError, match="with 768 cpu in all, over the NodePool's limit of 576"):
        load_config({"generations": {"inf2": {"max_nodes": 3}}, "serving": {"inf2": {"min_replicas": 2}}})
    # a Deployment (trn2, g6e) rolls within its own pods: no second fleet
    assert load_config({"generations": {"trn2": {"max_nodes": 2}}}).generations.trn2.max_nodes == 2
