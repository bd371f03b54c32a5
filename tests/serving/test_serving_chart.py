"""The serving chart, rendered with the real helm and validated object by object.

Core kinds are validated with kubernetes-validate at the cluster's minor (1.36), RayService
against KubeRay's CRD in ../shared/crds (tests.k8s_schema skips locally and fails under CI=true
when the CRDs are missing).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml

from gennstack.config import load_config
from gennstack.serving import NEURON_SDK_VERSION, ServingConfig, compile_cache_prefixes, model_prefixes
from gennstack.storage_layout import compile_cache_prefix
from tests import helm
from tests.k8s_schema import validate
from tests.serving.conftest import CHART, GENERATIONS, NAMESPACE, REQUIRED, STAGING, cdk_values, merged, only

pytestmark = pytest.mark.slow

POOLS = {"inf2": "gen1-inf2", "trn2": "gen2-trn2", "g6e": "gen3-g6e"}


def named(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def pod_specs(obj: dict) -> dict[str, dict]:
    """The pod specs inside a workload, by a readable label."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind in ("Deployment", "Job"):
        return {name: obj["spec"]["template"]["spec"]}
    if kind == "RayService":
        cluster = obj["spec"]["rayClusterConfig"]
        specs = {f"{name}/head": cluster["headGroupSpec"]["template"]["spec"]}
        for group in cluster["workerGroupSpecs"]:
            specs[f"{name}/{group['groupName']}"] = group["template"]["spec"]
        return specs
    return {}


def all_containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def serving_pod(objects: dict, generation: str) -> dict:
    """The pod spec of one serving replica of ``generation``."""
    pool = POOLS[generation]
    if generation == "inf2":
        return objects[("RayService", pool)]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    return objects[("Deployment", pool)]["spec"]["template"]["spec"]


def server_container(spec: dict) -> dict:
    return spec["containers"][0]


# --- rendering and validation ---------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
def test_each_generation_alone_renders_valid_objects(generation) -> None:
    objects = helm.render(CHART, merged(REQUIRED, STAGING, only(generation)), namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    by_name = named(objects)
    workloads = {name for kind, name in by_name if kind in ("Deployment", "RayService")}
    pool = POOLS[generation]
    redis = {f"{pool}-redis"} if generation == "inf2" else set()  # the Ray head's GCS store
    assert workloads == {pool, f"{pool}-warm-spare"} | redis
    jobs = {name for kind, name in by_name if kind == "Job"}
    expected = {f"{pool}-stage", f"{pool}-compile"}  # g6e's compiles vLLM's compile cache
    assert {name.rsplit("-", 1)[0] for name in jobs} == expected


def test_all_generations_render_valid_objects(rendered_all) -> None:
    for obj in rendered_all:
        validate(obj)
    kinds = {o["kind"] for o in rendered_all}
    assert kinds == {"ServiceAccount", "PriorityClass", "Role", "RoleBinding", "ConfigMap", "RayService",
                     "Deployment", "Service", "PodDisruptionBudget", "Job", "Secret", "NetworkPolicy",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ScaledObject"}
    by_name = named(rendered_all)
    # The names the gateway and the spot-interruption handler rely on.
    for pool in ("gen2-trn2", "gen3-g6e"):
        service = by_name[("Service", pool)]
        assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http"}]
    assert ("RayService", "gen1-inf2") in by_name
    for pool in POOLS.values():
        assert ("Deployment", f"{pool}-warm-spare") in by_name


def test_the_values_cdk_builds_render_and_lint_clean() -> None:
    values = cdk_values()
    objects = helm.render(CHART, values, namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} >= {("RayService", "gen1-inf2"), ("Deployment", "gen2-trn2"),
                                                                    ("Deployment", "gen3-g6e")}
    proc = helm.lint(CHART, values)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_values_built_from_config_follow_it() -> None:
    serving = ServingConfig.model_validate({"staging": True, "g6e": {"gpus_per_replica": 4, "warm_spare_replicas": 2}})
    context = {"generations": {"trn2": {"enabled": False}, "g6e": {"model_revision": "abc123"}}}
    objects = named(helm.render(CHART, cdk_values(context, serving), namespace=NAMESPACE))
    assert ("Deployment", "gen2-trn2") not in objects and ("Deployment", "gen2-trn2-warm-spare") not in objects
    g6e = serving_pod(objects, "g6e")
    assert server_container(g6e)["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert objects[("Deployment", "gen3-g6e-warm-spare")]["spec"]["replicas"] == 2
    args = json.loads(env(server_container(g6e))["VLLM_ARGS"])
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--model") + 1] == "s3://gennstack-models-1a2b/openai/gpt-oss-20b/abc123/"
    stage = next(o for (kind, name), o in objects.items() if kind == "Job" and name.startswith("gen3-g6e-stage"))
    assert env(stage["spec"]["template"]["spec"]["containers"][0])["HF_TOKEN_SECRET"].startswith("arn:aws:secretsmanager:")


@pytest.mark.parametrize("values", [merged(REQUIRED), merged(REQUIRED, STAGING)], ids=["serving", "staging"])
def test_helm_lint_strict(values) -> None:
    proc = helm.lint(CHART, values)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- values and schema -----------------------------------------------------------------------


@pytest.mark.parametrize("missing, message", [
    ("aws.region", "aws.region is required"),
    ("buckets.models", "buckets.models is required"),
    ("buckets.compileCache", "buckets.compileCache is required"),
])
def test_required_values_fail_with_a_message(missing, message) -> None:
    group, key = missing.split(".")
    values = merged(REQUIRED, {group: {key: ""}})
    proc = helm.template(CHART, values)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_compile_cache_bucket_is_required_by_every_generation() -> None:
    # g6e's servers restore vLLM's compile cache from it; the Neuron ones their compiled models.
    for generation in ("inf2", "trn2", "g6e"):
        proc = helm.template(CHART, merged(REQUIRED, {"buckets": {"compileCache": ""}}, only(generation)))
        assert proc.returncode != 0 and "buckets.compileCache is required" in proc.stderr, generation


def test_staging_requires_the_token_secret_name() -> None:
    proc = helm.template(CHART, merged(REQUIRED, {"staging": {"enabled": True}}))
    assert proc.returncode != 0
    assert "staging.hfTokenSecret is required" in proc.stderr


@pytest.mark.parametrize("typo, wrong", [
    ({"inf2": {"tensorParalelSize": 16}}, "tensorParalelSize"),
    ({"g6e": {"gpusPerReplika": 1}}, "gpusPerReplika"),
    ({"bucket": {"models": "x"}}, "bucket"),
    ({"staging": {"hfToken": "hf_abc"}}, "hfToken"),
    ({"spot": {"terminationGracePeriod": 100}}, "terminationGracePeriod"),
])
def test_schema_rejects_typos(typo, wrong) -> None:
    proc = helm.template(CHART, merged(REQUIRED, typo))
    assert proc.returncode != 0
    assert f"additional properties '{wrong}' not allowed" in proc.stderr


@pytest.mark.parametrize("bad", [
    {"g6e": {"gpusPerReplica": 3}},
    {"inf2": {"tensorParallelSize": 12}},
    {"trn2": {"tensorParallelSize": 48}},
    {"trn2": {"contextParallelSize": 3}},
    {"trn2": {"saveShardedCheckpoint": "yes"}},
    {"spot": {"terminationGracePeriodSeconds": 150}},
    {"priorityClasses": {"warmSpare": {"value": 10}}},
    {"images": {"vllm": "vllm/vllm-openai:latest"}},
    {"images": {"neuronVllm": "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx"}},
    {"images": {"s5cmd": "docker.io/peak/s5cmd:v2.3.0"}},
    {"sync": {"concurrency": 0}},
    {"g6e": {"tiktokenEncodings": ["p50k_base"]}},
    {"inf2": {"revision": "feature/x"}},
    {"buckets": {"models": "s3://gennstack-models"}},
    {"staging": {"hfTokenSecret": "hf token with spaces"}},
], ids=lambda v: json.dumps(v))
def test_schema_rejects_bad_values(bad) -> None:
    proc = helm.template(CHART, merged(REQUIRED, bad))
    assert proc.returncode != 0, f"{bad} was accepted"


def test_every_value_is_documented_and_the_defaults_pass_the_schema() -> None:
    text = (CHART / "values.yaml").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(text), schema)
    assert helm.undocumented_values(CHART / "values.yaml") == []

def test_neuron_sdk_version_is_mirrored_in_python() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["neuron"]["sdkVersion"] == NEURON_SDK_VERSION
    assert f"-sdk{NEURON_SDK_VERSION}-" in values["images"]["neuronVllm"]


def test_every_image_is_pinned() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for name, image in values["images"].items():
        if name == "pullPolicy":
            continue
        tag = image.rsplit("/", 1)[-1]
        assert ":" in tag and not tag.split("@")[0].endswith(":latest"), image


# --- secrets and roles -----------------------------------------------------------------------

SECRET_LIKE = re.compile(
    r"hf_[A-Za-z0-9]{30,}"  # Hugging Face token
    r"|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}"  # AWS access key ids
    r"|aws_secret_access_key|-----BEGIN [A-Z ]*PRIVATE KEY"
    r"|(?i:\b(?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN)\b\s*[:=])"
)


def test_no_secret_in_values_or_rendered_output(rendered_all) -> None:
    values = cdk_values(serving=ServingConfig(staging=True))
    rendered = helm.template(CHART, values, namespace=NAMESPACE).stdout
    for text in (json.dumps(values), rendered, yaml.safe_dump_all(rendered_all)):
        assert not SECRET_LIKE.search(text), SECRET_LIKE.search(text).group(0)
    # The one Secret is the GCS Redis password, generated in the cluster (never a value passed in).
    secrets = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "Secret"]
    assert [s["metadata"]["name"] for s in secrets] == ["gen1-inf2-redis"]
    assert "password" not in json.dumps(values).lower()
    for obj in rendered_all:
        for label, spec in pod_specs(obj).items():
            for container in all_containers(spec):
                for item in container.get("env", []):
                    if label == "gen1-inf2-redis":  # Redis reads its own generated password
                        assert item["valueFrom"]["secretKeyRef"] == {"name": "gen1-inf2-redis", "key": "password"}
                        continue
                    # No token, password or key is passed in; the only secret reference is by name.
                    assert "secretKeyRef" not in item.get("valueFrom", {}), f"{label}: {item}"
                    # (TIKTOKEN_* name tokenizer encodings, not credentials.)
                    assert not re.search(r"(?i)(?<!tik)token|password|secret_?key", item["name"]) or item["name"] == "HF_TOKEN_SECRET", item
    # The token secret's name reaches only the staging Jobs.
    holders = {label for obj in rendered_all for label, spec in pod_specs(obj).items()
               for c in all_containers(spec) if "HF_TOKEN_SECRET" in env(c)}
    assert holders and all(re.match(r"gen\d-\w+-stage-", label) for label in holders)


def test_serving_pods_use_the_read_only_account_and_staging_the_write_one(rendered_all) -> None:
    accounts = {o["metadata"]["name"] for o in rendered_all if o["kind"] == "ServiceAccount"}
    assert accounts == {"gennstack-serving", "gennstack-staging", "gennstack-compile-inf2", "gennstack-compile-trn2",
                        "gennstack-compile-g6e"}
    for obj in rendered_all:
        for label, spec in pod_specs(obj).items():
            if label == "gen1-inf2-redis":  # talks to no API: no account token at all
                assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
                continue
            compiles = re.match(r"gen\d-(\w+)-compile-", label)
            writes = "gennstack-staging" if obj["kind"] == "Job" else "gennstack-serving"
            assert spec["serviceAccountName"] == (f"gennstack-compile-{compiles[1]}" if compiles else writes), label
    # The serving account's only Kubernetes permission is patching pods (do-not-disrupt release),
    # narrowed to its own pod by the ValidatingAdmissionPolicy (tests/serving/test_serving_availability.py).
    by_name = named(rendered_all)
    role = by_name[("Role", "gennstack-serving-release-do-not-disrupt")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    binding = by_name[("RoleBinding", "gennstack-serving-release-do-not-disrupt")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gennstack-serving", "namespace": NAMESPACE}]
    # The staging account's only Kubernetes permissions: releasing its compile Jobs (test_compile_gate.py),
    # recording what it staged in the staged markers and opening the gates they complete (test_staged_gate.py);
    # a compile account's, recording its artifacts in its own generation's marker and opening its own
    # generation's gate (tests/serving/test_compile_identity.py).
    assert {name for kind, name in by_name if kind in ("Role", "RoleBinding")} == {
        "gennstack-serving-release-do-not-disrupt", "gennstack-serving-release-compile-jobs", "gennstack-serving-staged-markers",
        "gennstack-serving-open-staged-gates", "gen1-inf2-compile-marker", "gen2-trn2-compile-marker",
        "gen3-g6e-compile-marker", "gen1-inf2-compile-open-gate", "gen2-trn2-compile-open-gate", "gen3-g6e-compile-open-gate"}


def test_service_account_names_come_from_values() -> None:
    values = cdk_values(serving_service_account="llm-read", staging_service_account="llm-write",
                        compile_service_account="llm-compile")
    values["staging"]["enabled"] = True
    objects = helm.render(CHART, values, namespace=NAMESPACE)
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"} == {
        "llm-read", "llm-write", "llm-compile-inf2", "llm-compile-trn2", "llm-compile-g6e"}
    for obj in objects:
        for label, spec in pod_specs(obj).items():
            if label != "gen1-inf2-redis":
                compiles = re.match(r"gen\d-(\w+)-compile-", label)
                writes = "llm-write" if obj["kind"] == "Job" else "llm-read"
                assert spec["serviceAccountName"] == (f"llm-compile-{compiles[1]}" if compiles else writes)


# --- accelerators and placement --------------------------------------------------------------

ACCELERATORS = {  # generation: (resource, count, taint)
    "inf2": ("aws.amazon.com/neuron", "12", "aws.amazon.com/neuron"),
    "trn2": ("aws.amazon.com/neuron", "16", "aws.amazon.com/neuron"),
    "g6e": ("nvidia.com/gpu", "1", "nvidia.com/gpu"),
}


@pytest.mark.parametrize("generation", GENERATIONS)
def test_each_generation_requests_its_accelerators_on_its_nodes(rendered_all, generation) -> None:
    objects = named(rendered_all)
    resource, count, taint = ACCELERATORS[generation]
    pool = POOLS[generation]
    spare = objects[("Deployment", f"{pool}-warm-spare")]["spec"]["template"]["spec"]
    for label, spec in (("serving", serving_pod(objects, generation)), ("warm spare", spare)):
        assert spec["nodeSelector"] == {"gennstack.io/generation": generation}, label
        assert spec["tolerations"] == [{"key": taint, "operator": "Equal", "value": "true", "effect": "NoSchedule"}], label
        main = spec["containers"][0]
        assert main["resources"]["requests"][resource] == count, label
        assert main["resources"]["limits"][resource] == count, label
        other = {"aws.amazon.com/neuron", "nvidia.com/gpu"} - {resource}
        assert not other & set(main["resources"]["requests"]), label
    # A warm spare is shaped exactly like one serving replica.
    serving = serving_pod(objects, generation)
    assert spare["containers"][0]["resources"] == serving["containers"][0]["resources"]
    assert spare["containers"][0]["image"] == serving["containers"][0]["image"]


def test_ray_head_stays_off_accelerator_nodes(rendered_all) -> None:
    head = named(rendered_all)[("RayService", "gen1-inf2")]["spec"]["rayClusterConfig"]["headGroupSpec"]
    spec = head["template"]["spec"]
    assert spec["nodeSelector"] == {"gennstack.io/pool": "general", "karpenter.sh/capacity-type": "on-demand"}
    assert "tolerations" not in spec
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert not {"aws.amazon.com/neuron", "nvidia.com/gpu"} & set(spec["containers"][0]["resources"]["requests"])


@pytest.mark.parametrize("generation", ["inf2", "trn2"])
def test_compile_jobs_run_on_demand_or_reserved_on_their_family(rendered_all, generation) -> None:
    """Never spot, but on a capacity reservation as well as on-demand: Karpenter 1.14.1 labels a
    node launched into a reservation `karpenter.sh/capacity-type: reserved` (kubernetes-sigs/karpenter
    v1.14.1 pkg/apis/v1/labels.go CapacityTypeReserved), so an `on-demand` selector alone would skip
    the reservation and, with on_demand_fallback false, never schedule."""
    job = next(o for o in rendered_all if o["kind"] == "Job" and o["metadata"]["name"].startswith(f"{POOLS[generation]}-compile-"))
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gennstack.io/generation": generation}
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "reserved"]}]
    assert job["spec"]["backoffLimit"] == 0
    compile_container = next(c for c in spec["initContainers"] if c["name"] == "compile")
    resource, count, _ = ACCELERATORS[generation]
    assert compile_container["resources"]["requests"][resource] == count
    # The compile runs the same vLLM arguments the serving replicas run.
    serving = server_container(serving_pod(named(rendered_all), generation))
    assert env(compile_container)["VLLM_ARGS"] == env(serving)["VLLM_ARGS"]
    assert env(compile_container)["NEURON_COMPILED_ARTIFACTS"] == env(serving)["NEURON_COMPILED_ARTIFACTS"]


def test_g6es_compile_job_may_run_on_spot(rendered_all) -> None:
    """Its output is vLLM's compile cache, which the servers do without: no capacity-type requirement, so a
    spot-only gen3-g6e (on_demand_fallback false) can run it (found by the upstream review)."""
    job = next(o for o in rendered_all if o["kind"] == "Job" and o["metadata"]["name"].startswith(f"{POOLS['g6e']}-compile-"))
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gennstack.io/generation": "g6e"} and "affinity" not in spec


def test_staging_jobs_run_on_the_general_pool(rendered_all) -> None:
    for job in (o for o in rendered_all if o["kind"] == "Job" and "-stage-" in o["metadata"]["name"]):
        spec = job["spec"]["template"]["spec"]
        assert "nodeSelector" not in spec and "tolerations" not in spec


# --- behaving well on spot -------------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
def test_serving_pods_behave_well_on_spot(rendered_all, generation) -> None:
    objects = named(rendered_all)
    spec = serving_pod(objects, generation)
    main = server_container(spec)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in main, probe
    startup = main["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 900  # a cold load takes minutes
    if generation != "inf2":  # vLLM's /health waits behind a busy event loop: not the 1 s default
        assert startup["timeoutSeconds"] == main["readinessProbe"]["timeoutSeconds"] == 5
    if generation != "inf2":
        assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    grace = spec["terminationGracePeriodSeconds"]
    if generation == "inf2":  # Ray's drain, waiting at most GENNSTACK_DRAIN_WAIT_S
        command = main["lifecycle"]["preStop"]["exec"]["command"]
        assert command[:2] == ["/bin/sh", "-c"] and command[2].endswith("/python3\" /scripts/ray_drain.py")
        pre_stop = int(env(main)["GENNSTACK_DRAIN_WAIT_S"])
    else:
        pre_stop = main["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert 0 < pre_stop < grace < 120  # drained inside the two-minute spot warning
    assert spec["priorityClassName"] == "gennstack-serving"
    zones = [c for c in spec["topologySpreadConstraints"] if c["topologyKey"] == "topology.kubernetes.io/zone"]
    assert zones and zones[0]["maxSkew"] == 1
    template = (objects[("RayService", "gen1-inf2")]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]
                if generation == "inf2" else objects[("Deployment", POOLS[generation])]["spec"]["template"])
    assert template["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "release-do-not-disrupt")
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar, runs beside the server
    assert env(sidecar)["HEALTH_URL"].endswith("/health")
    pdb = objects[("PodDisruptionBudget", POOLS[generation])]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": POOLS[generation],
                                                      "app.kubernetes.io/component": "server"}
    assert template["metadata"]["labels"].items() >= pdb["spec"]["selector"]["matchLabels"].items()


def test_priority_classes_put_serving_above_warm_spares(rendered_all) -> None:
    classes = {o["metadata"]["name"]: o for o in rendered_all if o["kind"] == "PriorityClass"}
    assert classes["gennstack-serving"]["value"] > 0 > classes["gennstack-warm-spare"]["value"]
    assert classes["gennstack-warm-spare"]["preemptionPolicy"] == "Never"
    for pool in POOLS.values():
        spare = named(rendered_all)[("Deployment", f"{pool}-warm-spare")]
        assert spare["spec"]["template"]["spec"]["priorityClassName"] == "gennstack-warm-spare"
        assert spare["spec"]["replicas"] == 0


def test_do_not_disrupt_can_be_kept_for_good() -> None:
    objects = helm.render(CHART, merged(REQUIRED, {"loading": {"releaseDoNotDisruptWhenReady": False}}))
    for obj in objects:
        validate(obj)
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding")]
    for obj in objects:
        for spec in pod_specs(obj).values():
            assert "release-do-not-disrupt" not in {c["name"] for c in spec.get("initContainers", [])}


def test_ray_serve_autoscaling_follows_values(rendered_all) -> None:
    # Staged (gate open): a closed gate empties the worker group (tests/serving/test_staged_gate.py).
    values = merged(REQUIRED, only("inf2"), {"inf2": {"minReplicas": 2, "maxReplicas": 4, "targetOngoingRequests": 8,
                                                      "scaleUpDelaySeconds": 45, "scaleDownDelaySeconds": 900, "staged": True}})
    service = named(helm.render(CHART, values))[("RayService", "gen1-inf2")]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    deployment = serve["applications"][0]["deployments"][0]
    assert deployment["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 4, "target_ongoing_requests": 8,
                                                "upscale_delay_s": 45, "downscale_delay_s": 900}
    assert deployment["ray_actor_options"]["resources"] == {"neuron_cores": 24}
    assert serve["applications"][0]["import_path"] == "gennstack_serve:app"
    assert serve["http_options"]["port"] == 8000 and serve["applications"][0]["route_prefix"] == "/"
    workers = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (workers["minReplicas"], workers["maxReplicas"]) == (2, 4)


# --- S3 keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize("generation", ["inf2", "trn2"])
def test_compile_cache_keys_name_sdk_model_revision_and_layout(generation) -> None:
    context = {"generations": {generation: {"model_revision": "0123abcd"}}}
    serving = ServingConfig()
    values = cdk_values(context, serving)
    objects = named(helm.render(CHART, merged(values, STAGING), namespace=NAMESPACE))
    expected = compile_cache_prefixes(load_config(context), serving)[generation]
    model_id = load_config(context).generations.model_dump()[generation]["model_id"]
    assert expected.startswith(f"neuron-{NEURON_SDK_VERSION}/{model_id}/0123abcd/tp")
    sync = next(c for c in serving_pod(objects, generation)["initContainers"] if c["name"] == "sync-from-s3")
    assert env(sync)["COMPILE_PREFIX"] == expected
    assert env(sync)["MODEL_PREFIX"] == model_prefixes(load_config(context))[generation]
    job = next(o for (kind, name), o in objects.items() if kind == "Job" and name.startswith(f"{POOLS[generation]}-compile-"))
    assert job["metadata"]["annotations"]["gennstack.io/s3-prefix"] == f"s3://gennstack-compile-cache-1a2b/{expected}"


def test_compile_cache_key_changes_with_every_input() -> None:
    def key(serving: dict | None = None, context: dict | None = None) -> str:
        return compile_cache_prefixes(load_config(context or {}), ServingConfig.model_validate(serving or {}))["trn2"]

    base = key()
    assert base == compile_cache_prefix(neuron_sdk=NEURON_SDK_VERSION, model_id="meta-llama/Llama-4-Maverick-17B-128E-Instruct",
                                        revision="main", parallelism="tp64-cp16-vtp16-sharded-seqs16-len8192")
    changed = [
        key(context={"generations": {"trn2": {"model_revision": "v2"}}}),
        key({"trn2": {"context_parallel_size": 8}}),
        key({"trn2": {"vision_tensor_parallel_size": 8}}),
        key({"trn2": {"save_sharded_checkpoint": False}}),
        key({"trn2": {"max_num_seqs": 8}}),
        key({"trn2": {"max_model_len": 4096}}),
    ]
    assert len({base, *changed}) == 7


def test_chart_keys_match_storage_layout_for_custom_values() -> None:
    values = merged(REQUIRED, only("inf2"), {"neuron": {"sdkVersion": "2.99.0"},
                                              "inf2": {"modelId": "acme/llm-70b", "revision": "r1", "maxNumSeqs": 8}})
    spec = serving_pod(named(helm.render(CHART, values)), "inf2")
    sync = next(c for c in spec["initContainers"] if c["name"] == "sync-from-s3")
    assert env(sync)["COMPILE_PREFIX"] == compile_cache_prefix(neuron_sdk="2.99.0", model_id="acme/llm-70b", revision="r1",
                                                               parallelism="tp24-sharded-seqs8-len8192")
    assert env(server_container(spec))["NEURON_COMPILED_ARTIFACTS"] == "/cache/compiled/neuron-2.99.0/acme/llm-70b/r1/tp24-sharded-seqs8-len8192"


def test_vllm_services_are_headless_so_the_gateway_sees_each_replica(rendered_all) -> None:
    """Envoy's health checks and outlier ejection act per host: a ClusterIP would be one host."""
    services = [d for d in rendered_all if d["kind"] == "Service" and d["metadata"]["name"] in ("gen2-trn2", "gen3-g6e")]
    assert {s["metadata"]["name"] for s in services} == {"gen2-trn2", "gen3-g6e"}
    for service in services:
        assert service["spec"]["clusterIP"] == "None"
