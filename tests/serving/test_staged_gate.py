"""The staged gate: a generation's servers and warm spares request no accelerator node until its
weights (and, Neuron, its compiled artifacts) are staged, recorded in its ``<pool>-staged`` ConfigMap.

- Rendered objects (the real helm, every object validated against Kubernetes 1.36's schemas and the
  pinned CRDs): with the gate closed, the servers' and spares' pod templates carry the scheduling
  gate ``gennstack.io/staged`` and gen1-inf2's Ray worker group has no worker; the staging and
  compile Jobs are never gated; the marker ConfigMaps and a patch-only Role on exactly them.
- helm's ``lookup`` against a Kubernetes API on 127.0.0.1 (tests/serving/fake_kube_api.py), with
  the real helm binary: what a deploy renders for each state of the marker.
- stage.py and ``s3sync.py push`` as real processes (moto S3 + Secrets Manager with Pod Identity, a
  fake Hub, the fake Kubernetes API enforcing the chart's own Roles): they record what they staged,
  and the next render opens the gate.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from gennstack.config import ConfigError, load_config
from gennstack.serving import ServingConfig
from gennstack.serving.values import STAGED_MARKERS, serving_values
from gennstack.summary import staged_gate_line
from tests import helm
from tests.k8s_schema import validate
from tests.serving.aws_fakes import pod_env
from tests.serving.conftest import (
    BUCKETS, CHART, COMPILE_TOKENS, COMPILE_USERS, GENERATIONS, NAMESPACE, REQUIRED, STAGING, STAGING_TOKEN, STAGING_USER,
    cdk_values, merged, only, serve_kube_api,
)
from tests.serving.containers import COMMIT, HUB_FILES, env_with_prefixes, run, workload
from tests.serving.fake_hub import FakeHub

pytestmark = pytest.mark.slow

VALUES = merged(REQUIRED, STAGING, BUCKETS)
GATE = {"name": "gennstack.io/staged"}
ROLE = "gennstack-serving-staged-markers"
SERVERS = {"inf2": "gen1-inf2", "trn2": "gen2-trn2", "g6e": "gen3-g6e"}  # Deployment / RayService names


def gates(values: dict) -> dict[str, dict]:
    return {name: {"staged": mode} for name, mode in values.items()}


def pod_specs(objects: list[dict]) -> dict[str, dict]:
    """Every pod template's spec by its owner: `gen2-trn2`, `gen1-inf2-warm-spare`, `gen1-inf2/head`,
    `gen1-inf2/inf2` (the Ray worker group), `gen1-inf2-stage` (Jobs, less their hash)."""
    out = {}
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            out[name] = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Job":
            out[name.rpartition("-")[0]] = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            out[f"{name}/head"] = cluster["headGroupSpec"]["template"]["spec"]
            for group in cluster["workerGroupSpecs"]:
                out[f"{name}/{group['groupName']}"] = group["template"]["spec"]
    return out


def gated(objects: list[dict]) -> set[str]:
    """The pod templates that carry the staged gate."""
    return {name for name, spec in pod_specs(objects).items() if GATE in spec.get("schedulingGates", [])}


def labelled(objects: list[dict]) -> set[str]:
    """The pod templates labelled `gennstack.io/staged: "false"` (what the alert rule reads)."""
    out = set()
    for obj in objects:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            templates = {name: obj["spec"]["template"]}
        elif obj["kind"] == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            templates = {f"{name}/head": cluster["headGroupSpec"]["template"],
                         **{f"{name}/{g['groupName']}": g["template"] for g in cluster["workerGroupSpecs"]}}
        else:
            continue
        out |= {n for n, t in templates.items() if t["metadata"].get("labels", {}).get("gennstack.io/staged") == "false"}
    return out


def closed_set(gens: tuple[str, ...]) -> set[str]:
    out = set()
    for gen in gens:
        pool = SERVERS[gen]
        out |= {f"{pool}-warm-spare", f"{pool}/inf2" if gen == "inf2" else pool}
    return out


def worker_group(objects: list[dict]) -> dict:
    [ray] = [o for o in objects if o["kind"] == "RayService"]
    [group] = ray["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return group


def kind(objects: list[dict], k: str, name: str) -> dict | None:
    return next((o for o in objects if o["kind"] == k and o["metadata"]["name"] == name), None)


# --- the rendered gate ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", False])
def test_a_closed_gate_schedules_no_accelerator_pod(mode) -> None:
    """Kubernetes 1.36 (kubernetes-validate's v1.36.0 schema of PodSpec.schedulingGates): "If
    schedulingGates is not empty, the pod will stay in the SchedulingGated state and the scheduler will
    not attempt to schedule the pod." Karpenter v1.14.1 provisions only for pods the scheduler marked
    Unschedulable (pkg/utils/pod/scheduling.go IsProvisionable requires FailedToSchedule, a PodScheduled
    condition with reason `Unschedulable`; a gated pod's reason is `SchedulingGated`), the only check
    its provisioner (pkg/controllers/provisioning/controller.go, scheduling/scheduler.go) makes. So a
    gated pod is created and no node starts for it. A replica count of 0 alone would not hold: KEDA
    v2.20.2 scales a target below minReplicaCount back up to it (pkg/scaling/executor/
    scale_scaledobjects.go RequestScale, "ScaleTarget replicas count to correct value"), and the
    interruption handler's reconciler sets the spares' count every minute. The ScaledObjects are not
    paused (KEDA's `autoscaling.keda.sh/paused-replicas: "0"` would scale a live generation whose
    revision changed to 0 at once; gated, its rollout stops after one pod: maxUnavailable 1, maxSurge
    0). Gated pods, and gen1's Ray head (gen1 has no worker pod then), carry the label
    `gennstack.io/staged: "false"`, which kube-state-metrics exports for the no-ready-replica alert.
    `helm template` has no cluster (helm v4.2.3 pkg/engine/funcs.go: its `lookup` placeholder returns
    an empty map), so `auto` renders closed there.

    gen1-inf2: the Ray worker group has no worker and the autoscaler may add none (replicas,
    minReplicas, maxReplicas 0). KubeRay v1.7.0 (ray-operator/controllers/ray/utils/util.go
    GenerateHashWithoutReplicasAndWorkersToDelete) leaves those three and every template's
    schedulingGates out of the RayCluster hash, so the worker template carries
    `gennstack.io/staged: "false"`: opening the gate changes the hash and KubeRay prepares a new
    cluster (rayservice_controller.go shouldPrepareNewCluster, NewCluster strategy); without it the
    RayService would keep its workerless cluster."""
    objects = helm.render(CHART, merged(VALUES, gates(dict.fromkeys(GENERATIONS, mode))), namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    assert gated(objects) == closed_set(GENERATIONS)
    group = worker_group(objects)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (0, 0, 0)
    assert group["template"]["metadata"]["annotations"]["gennstack.io/staged"] == "false"
    assert all("annotations" not in o["metadata"] for o in objects if o["kind"] == "ScaledObject")
    assert labelled(objects) == closed_set(GENERATIONS) - {"gen1-inf2/inf2"} | {"gen1-inf2/head"}
    specs = pod_specs(objects)
    # Never gated: the Jobs that stage and compile (compile Jobs need their accelerator node), the
    # Ray head and its Redis (general pool, CPU).
    for name in ("gen1-inf2-stage", "gen1-inf2-compile", "gen2-trn2-stage", "gen2-trn2-compile", "gen3-g6e-stage",
                 "gen1-inf2/head", "gen1-inf2-redis"):
        assert "schedulingGates" not in specs[name], name
    assert "nvidia.com/gpu" not in json.dumps(specs["gen1-inf2/head"]) and "aws.amazon.com/neuron" not in json.dumps(specs["gen1-inf2/head"])


def test_an_open_gate_renders_the_servers_as_before() -> None:
    objects = helm.render(CHART, merged(VALUES, gates(dict.fromkeys(GENERATIONS, True))), namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    assert gated(objects) == set() and labelled(objects) == set()
    group = worker_group(objects)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 2)
    assert "gennstack.io/staged" not in group["template"]["metadata"]["annotations"]
    assert all("annotations" not in o["metadata"] for o in objects if o["kind"] == "ScaledObject")
    # Open is what the chart rendered before the gate existed: a staged deployment that upgrades sees no change.
    default = helm.render(CHART, merged(REQUIRED, gates(dict.fromkeys(GENERATIONS, True))), namespace=NAMESPACE)
    assert not [o for o in default if "gennstack.io/staged" in json.dumps(o) and o["kind"] != "ConfigMap"]


def test_the_gate_is_per_generation() -> None:
    objects = helm.render(CHART, merged(VALUES, gates({"inf2": False, "trn2": True, "g6e": "auto"})), namespace=NAMESPACE)
    assert gated(objects) == closed_set(("inf2", "g6e"))
    assert labelled(objects) == {"gen1-inf2/head", "gen1-inf2-warm-spare", "gen3-g6e", "gen3-g6e-warm-spare"}


def test_a_bad_gate_value_is_refused() -> None:
    proc = helm.template(CHART, merged(VALUES, gates({"g6e": "yes"})))
    assert proc.returncode != 0 and "at '/g6e/staged': value must be one of 'auto', true, false" in proc.stderr


def test_the_markers_and_a_patch_only_role_on_exactly_them() -> None:
    """RBAC cannot scope `create` by resourceNames (rbac/v1 PolicyRule.resourceNames; the object's name
    is not known at authorization time), so the chart creates the ConfigMaps and the staging
    ServiceAccount may only patch them (a JSON merge patch needs nothing else: no get, no list)."""
    objects = helm.render(CHART, VALUES, namespace=NAMESPACE)
    markers = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-staged")]
    assert [m["metadata"]["name"] for m in markers] == [STAGED_MARKERS[g] for g in GENERATIONS]
    for marker in markers:
        # No data: helm never owns a key, so no upgrade (three-way or server-side apply) removes what
        # the Jobs recorded; kept on uninstall (helm v4.2.3 pkg/kube/client.go skips deleting objects
        # annotated helm.sh/resource-policy: keep, pkg/action/resource_policy.go filterManifestsToKeep).
        assert "data" not in marker and "binaryData" not in marker
        assert marker["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    role = kind(objects, "Role", ROLE)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"],
                              "resourceNames": [STAGED_MARKERS[g] for g in GENERATIONS]}]
    binding = kind(objects, "RoleBinding", ROLE)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gennstack-staging", "namespace": NAMESPACE}]
    # Every Job that records (stage, compile upload) names its marker and mounts the account token
    # (a compile Job's upload alone in its pod: tests/serving/test_compile_identity.py).
    specs = pod_specs(objects)
    for gen, pool in SERVERS.items():
        stage = specs[f"{pool}-stage"]
        assert stage["automountServiceAccountToken"] is True
        assert {"name": "STAGED_CONFIGMAP", "value": STAGED_MARKERS[gen]} in stage["containers"][0]["env"]
        if gen != "g6e":
            compile_spec = specs[f"{pool}-compile"]
            [upload] = compile_spec["containers"]
            assert compile_spec["automountServiceAccountToken"] is False
            assert {"name": "kube-api-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "readOnly": True} in upload["volumeMounts"]
            assert {"name": "STAGED_CONFIGMAP", "value": STAGED_MARKERS[gen]} in upload["env"]


def test_markers_follow_the_enabled_generations_and_the_role_needs_staging() -> None:
    g6e = helm.render(CHART, merged(VALUES, only("g6e")), namespace=NAMESPACE)
    assert [o["metadata"]["name"] for o in g6e if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-staged")] == ["gen3-g6e-staged"]
    assert kind(g6e, "Role", ROLE)["rules"][0]["resourceNames"] == ["gen3-g6e-staged"]
    # Staging off: the markers stay (they gate the servers), the Jobs and the Role that lets them record do not.
    off = helm.render(CHART, REQUIRED, namespace=NAMESPACE)
    assert kind(off, "ConfigMap", "gen2-trn2-staged") is not None
    assert kind(off, "Role", ROLE) is None and kind(off, "RoleBinding", ROLE) is None


# --- the typed values ------------------------------------------------------------------------------


def test_serving_values_default_to_auto_and_check_the_gate() -> None:
    values = cdk_values()
    assert {g: values[g]["staged"] for g in GENERATIONS} == {"inf2": "auto", "trn2": "auto", "g6e": "auto"}
    forced = serving_values(load_config({}), ServingConfig(), models_bucket="m", compile_cache_bucket="c", region="us-east-1",
                            hf_token_secret="s", staged={"trn2": True, "g6e": False})
    assert (forced["inf2"]["staged"], forced["trn2"]["staged"], forced["g6e"]["staged"]) == ("auto", True, False)
    for staged, message in (({"trn2": 1}, "serving_values: staged.trn2: got 1; allowed: 'auto', True or False"),
                            ({"trn2": "yes"}, "serving_values: staged.trn2: got 'yes'; allowed: 'auto', True or False"),
                            ({"gen2": True}, "serving_values: staged: got generation 'gen2'; allowed: one of ['inf2', 'trn2', 'g6e', 'multi_node']")):
        with pytest.raises(ConfigError) as info:
            serving_values(load_config({}), ServingConfig(), models_bucket="m", compile_cache_bucket="c", region="us-east-1",
                           hf_token_secret="s", staged=staged)
        assert str(info.value) == message
    # The CDK's values render, closed under helm template.
    assert gated(helm.render(CHART, values, namespace=NAMESPACE)) == closed_set(GENERATIONS)


def test_summary_says_what_the_servers_wait_for_and_what_opens_the_gate() -> None:
    """The Jobs open the gate (test_the_job_that_completes_a_marker_opens_its_gate_...): the summary
    no longer sends the user to a deploy that CloudFormation would not run (no property changed)."""
    inf2 = staged_gate_line("inf2", {"model_id": "meta-llama/Meta-Llama-3-70B-Instruct", "model_revision": "abc"}, staging=False)
    assert inf2 == ("Staged gate: no inf2 node until ConfigMap gen1-inf2-staged records meta-llama/Meta-Llama-3-70B-Instruct/abc/ "
                    "and its compiled artifacts (servers and warm spares wait, scheduling-gated); the stage and compile Jobs "
                    "record it, the compile Job opens the gate, no deploy needed; staging off: deploy with serving.staging: true")
    trn2 = staged_gate_line("trn2", {"model_id": "m", "model_revision": "r"}, staging=True)
    assert trn2.endswith("staging on: the gate opens when they finish, then turn staging off (a compile Job still running "
                         "then is kept until it ends)")
    g6e = staged_gate_line("g6e", {"model_id": "openai/gpt-oss-20b", "model_revision": "main"}, staging=True)
    assert "ConfigMap gen3-g6e-staged records openai/gpt-oss-20b/main/ (" in g6e
    assert "the stage Job records it and opens the gate, no deploy needed" in g6e
    assert g6e.endswith("staging on: the gate opens when they finish, then turn staging off")
    assert "deploy again" not in inf2 + trn2 + g6e and "then again" not in inf2 + trn2 + g6e


# --- helm's lookup: what a deploy renders for each state of the marker ---------------------------------


def key(kind_: str, prefix: str) -> str:
    """files/kube_patch.py staged_key and the chart's gennstack-serving.stagedKey, written out once more."""
    return f"{kind_}-{hashlib.sha256(prefix.encode()).hexdigest()[:16]}"


def prefixes(api) -> dict[str, dict[str, str]]:
    """The model and compile-cache prefixes the chart renders, from the containers' env."""
    out: dict[str, dict[str, str]] = {}
    for gen, pool in SERVERS.items():
        env = {e["name"]: e["value"] for e in workload(containers(api.rendered), f"{pool}-stage", "stage")["env"] if "value" in e}
        out[gen] = {"model": env["MODEL_PREFIX"]}
        if gen != "g6e":
            upload = workload(containers(api.rendered), f"{pool}-compile", "upload")
            out[gen]["compiled"] = {e["name"]: e["value"] for e in upload["env"] if "value" in e}["COMPILE_PREFIX"]
    return out


def containers(objects: list[dict]) -> dict:
    out = {}
    for obj in objects:
        for spec in pod_specs([obj]).values():
            owner = obj["metadata"]["name"]
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                out[(owner, c["name"])] = c
    return out


def render_live(api, values: dict = VALUES) -> list[dict]:
    """What `cdk deploy` (helm upgrade) applies: the chart rendered with `lookup` reading the fake cluster."""
    proc = helm.run("template", helm.RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server",
                    "--disable-openapi-validation", "--kubeconfig", str(api.kubeconfig), values=values)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def record(api, gen: str, **data: str) -> None:
    api.configmaps[(NAMESPACE, STAGED_MARKERS[gen])].setdefault("data", {}).update(data)


def test_lookup_opens_a_generation_once_its_marker_holds_what_it_renders(kube_api) -> None:
    keys = prefixes(kube_api)
    assert gated(render_live(kube_api)) == closed_set(GENERATIONS)  # a first deploy: empty markers
    # g6e needs its weights only.
    record(kube_api, "g6e", **{key("model", keys["g6e"]["model"]): keys["g6e"]["model"]})
    # trn2's weights without its compiled artifacts: still closed.
    record(kube_api, "trn2", **{key("model", keys["trn2"]["model"]): keys["trn2"]["model"]})
    # inf2: artifacts of another Neuron release (another prefix) do not count.
    other = keys["inf2"]["compiled"].replace("neuron-2.28.0/", "neuron-2.27.0/")
    record(kube_api, "inf2", **{key("model", keys["inf2"]["model"]): keys["inf2"]["model"], key("compiled", other): other})
    rendered = render_live(kube_api)
    assert gated(rendered) == closed_set(("inf2", "trn2"))
    record(kube_api, "trn2", **{key("compiled", keys["trn2"]["compiled"]): keys["trn2"]["compiled"]})
    record(kube_api, "inf2", **{key("compiled", keys["inf2"]["compiled"]): keys["inf2"]["compiled"]})
    rendered = render_live(kube_api)
    assert gated(rendered) == set()
    group = worker_group(rendered)
    assert (group["replicas"], group["maxReplicas"]) == (1, 2) and "gennstack.io/staged" not in group["template"]["metadata"]["annotations"]
    # Another revision is another prefix: closed again until it is staged, while the old keys stay recorded.
    moved = render_live(kube_api, merged(VALUES, {"g6e": {"revision": "0123abc"}}))
    assert gated(moved) == closed_set(("g6e",))
    # A forced value wins over the marker.
    assert gated(render_live(kube_api, merged(VALUES, gates({"trn2": False})))) == closed_set(("trn2",))
    # (helm also reads every object it would create, for its ownership check.)
    looked_up = {r.path for r in kube_api.requests if r.method == "GET" and "/configmaps/" in r.path}
    assert looked_up >= {f"/api/v1/namespaces/{NAMESPACE}/configmaps/{STAGED_MARKERS[g]}" for g in GENERATIONS}


# --- the Jobs record what they staged (real processes) ----------------------------------------------------


@pytest.fixture
def hub():
    fake = FakeHub("openai/gpt-oss-20b", HUB_FILES, commit=COMMIT, refs={"main": COMMIT}, token="hf_test")
    yield fake
    fake.stop()


def live_compile_jobs(api) -> None:
    """The compile Jobs as helm created them (suspended), so the inf2 stage Job can release its own."""
    for obj in api.rendered:
        if obj["kind"] == "Job" and "-compile-" in obj["metadata"]["name"]:
            job = json.loads(json.dumps(obj))
            job["metadata"]["namespace"] = NAMESPACE
            job["metadata"]["annotations"].update({"meta.helm.sh/release-name": helm.RELEASE, "meta.helm.sh/release-namespace": NAMESPACE})
            api.jobs[(NAMESPACE, obj["metadata"]["name"])] = job


def mount_gates(api, root: Path) -> None:
    """The gates ConfigMap as the kubelet mounts it at /gates (chart_env moves /gates under ``root``): a file a key."""
    gates_dir = root / "gates"
    gates_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (kind(api.rendered, "ConfigMap", "gennstack-serving-staged-gates") or {}).get("data", {}).items():
        (gates_dir / name).write_text(text)


def stage(api, moto, agent, hub, root: Path, pool: str, prefix: str, **overrides: str):
    container = workload(containers(api.rendered), f"{pool}-stage", "stage")
    mount_gates(api, root)
    # The compile Job this stage Job releases (every generation has one), as `helm install` left it: suspended.
    job = next((e["value"] for e in container["env"] if e["name"] == "COMPILE_JOB"), None)
    if job and (NAMESPACE, job) not in api.jobs:
        (rendered_job,) = [o for o in api.rendered if o["kind"] == "Job" and o["metadata"]["name"] == job]
        live_job = json.loads(json.dumps(rendered_job))  # with the ownership helm checks (fake_kube_api.install)
        live_job["metadata"].update(namespace=NAMESPACE, resourceVersion="1")
        live_job["metadata"].setdefault("annotations", {}).update(
            {"meta.helm.sh/release-name": "gennstack", "meta.helm.sh/release-namespace": NAMESPACE})
        api.jobs[(NAMESPACE, job)] = live_job
    # No tiktoken encodings: the fake Hub's stand-ins cannot have the pinned digests (test_pod_identity.py).
    env = pod_env(root / "home", agent, AWS_ENDPOINT_URL=moto.endpoint, HF_ENDPOINT=hub.endpoint,
                  **env_with_prefixes(container, root, MODEL_PREFIX=prefix, TIKTOKEN_ENCODINGS="", **api.env, **overrides))
    Path(env["HF_HOME"]).mkdir(parents=True, exist_ok=True)
    return run(container, env, root)


def upload(api, moto, agent, root: Path, pool: str, prefix: str, *, skip: bool = False):
    """The compile Job's upload, with its generation's compile account (gennstack-compile-<gen>)."""
    container = workload(containers(api.rendered), f"{pool}-compile", "upload")
    mount_gates(api, root)
    env = pod_env(root / "home", agent, AWS_ENDPOINT_URL_S3=moto.endpoint,
                  **env_with_prefixes(container, root, COMPILE_PREFIX=prefix, **api.compile_env[pool.split("-")[1]]))
    (root / "work").mkdir(parents=True, exist_ok=True)
    if skip:  # the compile Job's sync found the artifacts complete in S3 already
        (root / "work" / "skip").touch()
    else:
        compiled = Path(env["COMPILED_DIR"])
        compiled.mkdir(parents=True, exist_ok=True)
        (compiled / "model.neff").write_bytes(b"n" * 100)
        (root / "work" / "compiled").touch()
    return run(container, env, root)


def test_the_stage_job_and_the_compile_upload_record_what_they_staged_and_the_next_deploy_opens(
        live, moto, agent, hub, hf_secret, tmp_path) -> None:
    kube_api = live  # (the gated workloads exist, as in a cluster: the Jobs open their gates too)
    live_compile_jobs(kube_api)
    keys = prefixes(kube_api)
    # g6e: the stage Job alone opens it.
    proc = stage(kube_api, moto, agent, hub, tmp_path / "g6e", "gen3-g6e", keys["g6e"]["model"])
    assert proc.returncode == 0, proc.stderr
    marker_path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/gen3-g6e-staged"
    [patch] = [p for p in kube_api.patches() if p.path == marker_path]
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.headers["authorization"].startswith("Bearer eyJ")
    assert patch.body == {"data": {key("model", keys["g6e"]["model"]): keys["g6e"]["model"]}}
    assert f"recorded model {keys['g6e']['model']} in ConfigMap {NAMESPACE}/gen3-g6e-staged" in proc.stdout
    # inf2: the stage Job releases its compile Job and records the weights; closed until the upload records the artifacts.
    # (The fake Hub serves one repository; the key prefix, which the marker records, is inf2's.)
    proc = stage(kube_api, moto, agent, hub, tmp_path / "inf2", "gen1-inf2", keys["inf2"]["model"], MODEL_ID="openai/gpt-oss-20b")
    assert proc.returncode == 0, proc.stderr
    assert "released compile Job" in proc.stdout
    assert gated(render_live(kube_api)) == closed_set(("inf2", "trn2"))
    proc = upload(kube_api, moto, agent, tmp_path / "inf2-upload", "gen1-inf2", keys["inf2"]["compiled"])
    assert proc.returncode == 0, proc.stderr
    assert moto.client("s3").head_object(Bucket="compile-cache", Key=keys["inf2"]["compiled"] + ".gennstack-complete")
    # trn2: artifacts already in S3 (the compile Job skipped): the upload still records them.
    kube_api.configmaps[(NAMESPACE, "gen2-trn2-staged")]["data"] = {key("model", keys["trn2"]["model"]): keys["trn2"]["model"]}
    proc = upload(kube_api, moto, agent, tmp_path / "trn2-upload", "gen2-trn2", keys["trn2"]["compiled"], skip=True)
    assert proc.returncode == 0, proc.stderr
    assert "already compiled: nothing to upload" in proc.stdout
    # Merged key by key: each marker holds both of its keys.
    assert kube_api.configmaps[(NAMESPACE, "gen1-inf2-staged")]["data"] == {
        key("model", keys["inf2"]["model"]): keys["inf2"]["model"], key("compiled", keys["inf2"]["compiled"]): keys["inf2"]["compiled"]}
    assert len(kube_api.configmaps[(NAMESPACE, "gen2-trn2-staged")]["data"]) == 2
    assert gated(render_live(kube_api)) == set()


@pytest.mark.parametrize("case", ["another-namespace", "no-marker"])
def test_a_refused_record_fails_the_job_and_names_the_role(kube_api, moto, agent, hub, hf_secret, tmp_path, case) -> None:
    """The Role lets the staging account patch only the rendered markers in the release's namespace;
    a merge patch never creates the ConfigMap (404). Either way the Job fails with the API server's reason."""
    keys = prefixes(kube_api)
    if case == "another-namespace":
        (Path(kube_api.env["SERVICE_ACCOUNT_DIR"]) / "namespace").write_text("default")
    else:
        del kube_api.configmaps[(NAMESPACE, "gen3-g6e-staged")]
    # The record alone: with its compile Job to release, the release in another namespace is refused
    # first (test_compile_gate.py covers refused releases).
    proc = stage(kube_api, moto, agent, hub, tmp_path, "gen3-g6e", keys["g6e"]["model"], COMPILE_JOB="")
    assert proc.returncode != 0
    namespace = "default" if case == "another-namespace" else NAMESPACE
    path = f"/api/v1/namespaces/{namespace}/configmaps/gen3-g6e-staged"
    status = 403 if case == "another-namespace" else 404
    assert f"could not record {keys['g6e']['model']} in ConfigMap gen3-g6e-staged: PATCH {path} answered HTTP {status}: " in proc.stderr
    if status == 403:
        assert (f'configmaps "gen3-g6e-staged" is forbidden: User "{STAGING_USER}" cannot patch resource "configmaps" in API '
                f'group "" in the namespace "default"') in proc.stderr
    assert f"Role {ROLE}" in proc.stderr
    assert len(kube_api.patches()) == 1  # refused is final, not retried


def test_the_staging_account_can_read_no_marker(kube_api) -> None:
    """The Role grants patch only: the fake API (RBAC evaluated as Kubernetes does) refuses a GET."""
    import ssl
    import urllib.error
    import urllib.request

    account = Path(kube_api.env["SERVICE_ACCOUNT_DIR"])
    context = ssl.create_default_context(cafile=str(account / "ca.crt"))
    request = urllib.request.Request(f"https://127.0.0.1:{kube_api.port}/api/v1/namespaces/{NAMESPACE}/configmaps/gen3-g6e-staged",
                                     headers={"Authorization": f"Bearer {(account / 'token').read_text().strip()}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, context=context, timeout=10)
    assert info.value.code == 403


def test_notes_name_the_generations_that_wait_for_staging() -> None:
    proc = helm.run("install", helm.RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                    values=merged(REQUIRED, gates({"trn2": True})))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout[proc.stdout.index("NOTES:"):]
    assert "gen1-inf2: waiting for staging. Its servers and warm spares are scheduling-gated (no inf2 node)" in notes
    assert ("until ConfigMap gen1-inf2-staged records meta-llama/Meta-Llama-3-70B-Instruct/main/ and "
            "neuron-2.28.0/meta-llama/Meta-Llama-3-70B-Instruct/main/tp24-sharded-seqs20-len8192/,") in notes
    assert ("until ConfigMap gen3-g6e-staged records openai/gpt-oss-20b/main/,\n    which the stage Job (staging.enabled) writes; "
            "the stage Job then opens the gate itself (no upgrade needed).") in notes
    assert "which the stage and compile Jobs (staging.enabled) write; the compile Job then opens the gate itself" in notes
    assert "gen2-trn2: waiting" not in notes  # open
    assert "next upgrade" not in notes
    forced = helm.run("install", helm.RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                      values=merged(REQUIRED, gates({"g6e": False})))
    assert "g6e.staged is forced false: only an upgrade with it auto or true opens the gate." in forced.stdout


# --- the Jobs that complete a marker open its gate (no deploy needed) ----------------------------------

LIVE_VALUES = merged(VALUES, {"multiNode": {"enabled": True}})
SCOUT_PREFIX = "meta-llama/Llama-4-Scout-17B-16E-Instruct/main/"
GATES_ROLE = "gennstack-serving-open-staged-gates"
SPARES = f"{NAMESPACE}-group-spares"
# What each generation's gate closes: (kind, namespace, name).
TARGETS = {
    "gen1-inf2": [("RayService", NAMESPACE, "gen1-inf2"), ("Deployment", NAMESPACE, "gen1-inf2-warm-spare")],
    "gen2-trn2": [("Deployment", NAMESPACE, "gen2-trn2"), ("Deployment", NAMESPACE, "gen2-trn2-warm-spare")],
    "gen3-g6e": [("Deployment", NAMESPACE, "gen3-g6e"), ("Deployment", NAMESPACE, "gen3-g6e-warm-spare")],
    "gen3-g6e-multinode": [("LeaderWorkerSet", NAMESPACE, "gen3-g6e-multinode"),
                           ("LeaderWorkerSet", SPARES, "gen3-g6e-multinode-warm-spare")],
}
STORES = {"Deployment": "deployments", "RayService": "rayservices", "LeaderWorkerSet": "leaderworkersets"}


@pytest.fixture
def live(tmp_path):
    """The fake API as a first install (staging on, every generation and the multi-node model) left it:
    the markers empty, every gate closed, the gated workloads stored as rendered."""
    yield from serve_kube_api(tmp_path, LIVE_VALUES, workloads=True)


def live_object(api, kind_: str, namespace: str, name: str) -> dict:
    return getattr(api, STORES[kind_])[(namespace, name)]


def rendered_object(objects: list[dict], kind_: str, namespace: str, name: str) -> dict:
    [obj] = [o for o in objects if o["kind"] == kind_ and o["metadata"]["name"] == name
             and o["metadata"].get("namespace", NAMESPACE) == namespace]
    return obj


def opened_paths(api, *tokens: str) -> set[str]:
    """The objects the Jobs' accounts (staging, compile; or only those of ``tokens``) patched, other
    than the markers and the compile Jobs."""
    tokens = tokens or (STAGING_TOKEN, *COMPILE_TOKENS.values())
    return {p.path for p in api.patches() if "/configmaps/" not in p.path and "/jobs/" not in p.path
            and p.headers["authorization"] in {f"Bearer {t}" for t in tokens}}


def target_path(kind_: str, namespace: str, name: str) -> str:
    base = {"Deployment": "/apis/apps/v1", "RayService": "/apis/ray.io/v1", "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1"}
    return f"{base[kind_]}/namespaces/{namespace}/{STORES[kind_]}/{name}"


def compile_gate_roles(objects: list[dict]) -> dict[str, list[dict]]:
    """compile account -> the rules of the `<pool>-compile-open-gate` Role bound to it (and to nobody else)."""
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Role"}
    out = {}
    for b in objects:
        if b["kind"] == "RoleBinding" and b["metadata"]["name"].endswith("-compile-open-gate"):
            [subject] = b["subjects"]
            assert b["roleRef"]["name"] == b["metadata"]["name"] and subject["namespace"] == NAMESPACE
            out[subject["name"]] = roles[b["roleRef"]["name"]]["rules"]
    return out


def test_the_chart_tells_the_jobs_what_each_auto_gate_closes_and_lets_them_change_only_that() -> None:
    """The gate file (ConfigMap gennstack-serving-staged-gates, mounted at /gates in the stage Jobs and
    the compile Jobs' upload) lists, per `auto` gate, the marker keys it needs and the objects it
    closes; the staging account's Role per namespace allows exactly those (and each compile account's,
    its own generation's): patch on the Deployments and
    LeaderWorkerSets by name, get and patch on the RayService by name (rbac/v1 PolicyRule: resourceNames
    scope get and patch; an empty list would mean every name, so none is rendered). A forced gate has no
    entry: a deploy sets it, no Job may open it."""
    objects = helm.render(CHART, LIVE_VALUES, namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    files = {k.removesuffix(".json"): json.loads(v) for k, v in kind(objects, "ConfigMap", "gennstack-serving-staged-gates")["data"].items()}
    assert {pool: [(t["kind"], t["namespace"], t["name"]) for t in g["targets"]] for pool, g in files.items()} == TARGETS
    assert files["gen1-inf2"]["targets"][0] == {"kind": "RayService", "namespace": NAMESPACE, "name": "gen1-inf2", "group": "inf2",
                                                     "replicas": 1, "minReplicas": 1, "maxReplicas": 2}
    keys = {pool: sorted(g["requires"].values()) for pool, g in files.items()}
    assert keys["gen3-g6e"] == ["openai/gpt-oss-20b/main/"] and keys["gen3-g6e-multinode"] == [SCOUT_PREFIX]
    assert keys["gen1-inf2"] == ["meta-llama/Meta-Llama-3-70B-Instruct/main/",
                                 "neuron-2.28.0/meta-llama/Meta-Llama-3-70B-Instruct/main/tp24-sharded-seqs20-len8192/"]
    for pool, gate in files.items():
        assert all(gate["requires"][k] == p and k == key(k.split("-")[0], p) for k, p in gate["requires"].items()), pool
    roles = {o["metadata"].get("namespace", NAMESPACE): o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == GATES_ROLE}
    assert roles[NAMESPACE]["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"],
         "resourceNames": ["gen1-inf2-warm-spare", "gen2-trn2", "gen2-trn2-warm-spare", "gen3-g6e", "gen3-g6e-warm-spare"]},
        {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"], "verbs": ["patch"],
         "resourceNames": ["gen3-g6e-multinode"]},
        {"apiGroups": ["ray.io"], "resources": ["rayservices"], "verbs": ["get", "patch"], "resourceNames": ["gen1-inf2"]}]
    assert roles[SPARES]["rules"] == [{"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"],
                                       "verbs": ["patch"], "resourceNames": ["gen3-g6e-multinode-warm-spare"]}]
    bindings = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"] == GATES_ROLE]
    assert [b["subjects"] for b in bindings] == [[{"kind": "ServiceAccount", "name": "gennstack-staging", "namespace": NAMESPACE}]] * 2
    # A Neuron generation's compile upload runs as its own account (tests/serving/test_compile_identity.py):
    # a Role of its own lets it open its own generation's gate, nothing of another.
    assert compile_gate_roles(objects) == {
        "gennstack-compile-inf2": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"], "resourceNames": ["gen1-inf2-warm-spare"]},
            {"apiGroups": ["ray.io"], "resources": ["rayservices"], "verbs": ["get", "patch"], "resourceNames": ["gen1-inf2"]}],
        "gennstack-compile-trn2": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"], "resourceNames": ["gen2-trn2", "gen2-trn2-warm-spare"]}],
        # g6e's compile Job (vLLM's compile cache) records into its marker too; its gate needs only the model.
        "gennstack-compile-g6e": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"], "resourceNames": ["gen3-g6e", "gen3-g6e-warm-spare"]}]}
    # Every recording container reads its own generation's file from the mounted ConfigMap.
    for (owner, name), container in containers(objects).items():
        if name in ("stage", "upload"):
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["STAGED_GATE"] == f"/gates/{env['STAGED_CONFIGMAP'].removesuffix('-staged')}.json", owner
            assert {"name": "gates", "mountPath": "/gates", "readOnly": True} in container["volumeMounts"], owner
    # Forced gates: no entry, and no rule for what they close; all forced: no Role at all.
    forced = helm.render(CHART, merged(LIVE_VALUES, gates({"trn2": True, "g6e": False})), namespace=NAMESPACE)
    assert sorted(kind(forced, "ConfigMap", "gennstack-serving-staged-gates")["data"]) == ["gen1-inf2.json", "gen3-g6e-multinode.json"]
    assert kind(forced, "Role", GATES_ROLE)["rules"][0]["resourceNames"] == ["gen1-inf2-warm-spare"]
    assert list(compile_gate_roles(forced)) == ["gennstack-compile-inf2"]
    none = helm.render(CHART, merged(VALUES, gates(dict.fromkeys(GENERATIONS, True))), namespace=NAMESPACE)
    assert kind(none, "Role", GATES_ROLE) is None and "data" not in kind(none, "ConfigMap", "gennstack-serving-staged-gates")
    assert compile_gate_roles(none) == {}
    # Staging off: nothing to open from, no Role.
    off = helm.render(CHART, merged(REQUIRED, {"multiNode": {"enabled": True}}), namespace=NAMESPACE)
    assert kind(off, "Role", GATES_ROLE) is None and kind(off, "ConfigMap", "gennstack-serving-staged-gates") is None
    assert compile_gate_roles(off) == {}


def test_the_job_that_completes_a_marker_opens_its_gate_and_the_next_deploy_keeps_it_open(
        live, moto, agent, hub, hf_secret, tmp_path) -> None:
    """No deploy needed: CloudFormation sends the HelmChart custom resource an Update (the handler's
    `helm upgrade`, aws-cdk-lib 2.275.0 custom-resource-handlers/dist/aws-eks-v2/kubectl-handler/helm/
    __init__.py) only when its properties change, and aws-eks-v2/lib/helm-chart.js makes them all
    deterministic (ClusterName, Release, ChartAssetURL, Values, ...): a "deploy again" with the same
    config runs no helm and so never read the marker. Here the Job that records the last key a gate
    needs opens it (real stage.py and `s3sync.py push` processes, the chart's Roles enforced):
    what it patches is exactly what a deploy renders with the gate open, so the next `helm upgrade`
    (which reads the same marker with lookup) changes nothing and closes nothing."""
    live_compile_jobs(live)
    keys = prefixes(live)
    closed = {t: json.loads(json.dumps(live_object(live, *t))) for ts in TARGETS.values() for t in ts}
    # g6e: its stage Job records the weights and opens gen3-g6e and its spare, nothing else.
    proc = stage(live, moto, agent, hub, tmp_path / "g6e", "gen3-g6e", keys["g6e"]["model"])
    assert proc.returncode == 0, proc.stderr
    assert "opened the gate of gen3-g6e: Deployment gennstack-serving/gen3-g6e, Deployment gennstack-serving/gen3-g6e-warm-spare" in proc.stdout
    assert opened_paths(live) == {target_path(*t) for t in TARGETS["gen3-g6e"]}
    # The multi-node model: its own stage Job, its own marker, its LeaderWorkerSets (the spares' in their namespace).
    proc = stage(live, moto, agent, hub, tmp_path / "multi", "gen3-g6e-multinode", SCOUT_PREFIX, MODEL_ID="openai/gpt-oss-20b")
    assert proc.returncode == 0, proc.stderr
    assert opened_paths(live) == {target_path(*t) for t in TARGETS["gen3-g6e"] + TARGETS["gen3-g6e-multinode"]}
    # inf2: the weights alone leave it closed, and the Job says what is missing.
    proc = stage(live, moto, agent, hub, tmp_path / "inf2", "gen1-inf2", keys["inf2"]["model"], MODEL_ID="openai/gpt-oss-20b")
    assert proc.returncode == 0, proc.stderr
    assert f"gate of gen1-inf2 stays closed: ConfigMap gen1-inf2-staged does not record {keys['inf2']['compiled']} yet" in proc.stdout
    assert live_object(live, "RayService", NAMESPACE, "gen1-inf2") == closed[("RayService", NAMESPACE, "gen1-inf2")]
    # ... its compile Job's upload completes the marker and opens it; another writer changed the RayService
    # between the upload's read and its patch once: 409, read again, patched.
    live.races[target_path("RayService", NAMESPACE, "gen1-inf2")] = 1
    proc = upload(live, moto, agent, tmp_path / "inf2-upload", "gen1-inf2", keys["inf2"]["compiled"])
    assert proc.returncode == 0, proc.stderr
    assert "Operation cannot be fulfilled on rayservices.ray.io \"gen1-inf2\"" in proc.stdout and "reading it again" in proc.stdout
    ray_patches = [p for p in live.patches() if p.path == target_path("RayService", NAMESPACE, "gen1-inf2")]
    assert [p.body["metadata"]["resourceVersion"] for p in ray_patches] == ["1", "2"]
    # (with its own generation's compile account, within <pool>-compile-open-gate)
    assert opened_paths(live, COMPILE_TOKENS["inf2"]) == {target_path(*t) for t in TARGETS["gen1-inf2"]}
    # trn2: artifacts already in S3 (the compile skipped): the upload completes the marker and opens it.
    live.configmaps[(NAMESPACE, "gen2-trn2-staged")]["data"] = {key("model", keys["trn2"]["model"]): keys["trn2"]["model"]}
    proc = upload(live, moto, agent, tmp_path / "trn2-upload", "gen2-trn2", keys["trn2"]["compiled"], skip=True)
    assert proc.returncode == 0, proc.stderr
    assert opened_paths(live, COMPILE_TOKENS["trn2"]) == {target_path(*t) for t in TARGETS["gen2-trn2"]}
    assert opened_paths(live) == {target_path(*t) for ts in TARGETS.values() for t in ts}
    # The objects' templates, never a pod: a LeaderWorkerSet's workers are created only once its leader is
    # scheduled (its exclusive-topology annotation, on the object, which the patch leaves alone: LWS v0.10.0
    # pkg/controllers/pod_controller.go), from the patched workerTemplate, so they come ungated too.
    assert not [p for p in live.patches() if "/pods/" in p.path]
    for target in TARGETS["gen3-g6e-multinode"]:
        lws = live_object(live, *target)
        assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == "topology.kubernetes.io/zone"
        for role in ("leaderTemplate", "workerTemplate"):
            assert "schedulingGates" not in lws["spec"]["leaderWorkerTemplate"][role]["spec"], (target, role)
    # The next deploy renders every gate open, and exactly the objects the Jobs left: nothing to apply.
    rendered = render_live(live, LIVE_VALUES)
    assert gated(rendered) == set() and labelled(rendered) == set()
    for ts in TARGETS.values():
        for target in ts:
            got, want = live_object(live, *target), rendered_object(rendered, *target)
            assert got["spec"] == want["spec"], target
            assert got["spec"] != closed[target]["spec"], target
            assert "gennstack.io/staged" not in json.dumps(got["spec"]), target
    group = worker_group([live_object(live, "RayService", NAMESPACE, "gen1-inf2") | {"kind": "RayService"}])
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 2)
    # Run again (a Job's retry, or a later revision's Job finding the gate open): no change, no error.
    before = {t: live_object(live, *t)["spec"] for ts in TARGETS.values() for t in ts}
    proc = upload(live, moto, agent, tmp_path / "inf2-again", "gen1-inf2", keys["inf2"]["compiled"], skip=True)
    assert proc.returncode == 0, proc.stderr
    assert {t: live_object(live, *t)["spec"] for ts in TARGETS.values() for t in ts} == before


def test_a_forced_gate_is_left_to_the_deploy(live, moto, agent, hub, hf_secret, tmp_path) -> None:
    """`g6e.staged: false` holds the gate closed whatever the marker says: the chart renders no gate
    file for it, so the stage Job records the weights and patches nothing else."""
    forced = merged(LIVE_VALUES, gates({"g6e": False}))
    live.rendered = helm.render(CHART, forced, namespace=NAMESPACE)
    keys = prefixes(live)
    root = tmp_path / "g6e"
    proc = stage(live, moto, agent, hub, root, "gen3-g6e", keys["g6e"]["model"])
    assert proc.returncode == 0, proc.stderr
    assert "/gates/gen3-g6e.json): its staged value is forced, a deploy sets it" in proc.stdout
    assert opened_paths(live) == set()
    assert gated(render_live(live, forced)) >= closed_set(("g6e",))


def test_a_refused_opening_fails_the_job_and_names_the_role(live, moto, agent, hub, hf_secret, tmp_path) -> None:
    """Without the Role (or with one that does not name the object) the API answers 403 and the Job
    fails with its reason and what to do; the marker is recorded, so a deploy that runs helm opens it."""
    live.roles = [r for r in live.roles if r["metadata"]["name"] != GATES_ROLE]
    keys = prefixes(live)
    proc = stage(live, moto, agent, hub, tmp_path, "gen3-g6e", keys["g6e"]["model"])
    assert proc.returncode != 0
    path = target_path("Deployment", NAMESPACE, "gen3-g6e")
    assert (f"could not open the gate of gen3-g6e on Deployment {NAMESPACE}/gen3-g6e: PATCH {path} answered HTTP 403: "
            f'deployments.apps "gen3-g6e" is forbidden: User "{STAGING_USER}" cannot patch resource "deployments"') in proc.stderr
    assert f"(Role {GATES_ROLE} in {NAMESPACE})" in proc.stderr
    assert live.configmaps[(NAMESPACE, "gen3-g6e-staged")]["data"] == {key("model", keys["g6e"]["model"]): keys["g6e"]["model"]}


def test_a_compile_account_opens_only_its_own_generations_gate(live, moto, agent, tmp_path) -> None:
    """A compile upload runs as its generation's compile account, whose model code ran in the same pod:
    without its `<pool>-compile-open-gate` Role the upload fails naming it (the marker is recorded), and
    that Role lets it change nothing of another generation (the fake API evaluates RBAC as Kubernetes does)."""
    import ssl
    import urllib.error
    import urllib.request

    keys = prefixes(live)
    live.configmaps[(NAMESPACE, "gen1-inf2-staged")]["data"] = {key("model", keys["inf2"]["model"]): keys["inf2"]["model"]}
    live.roles = [r for r in live.roles if r["metadata"]["name"] != "gen1-inf2-compile-open-gate"]
    proc = upload(live, moto, agent, tmp_path / "inf2-upload", "gen1-inf2", keys["inf2"]["compiled"], skip=True)
    assert proc.returncode != 0
    path = target_path("RayService", NAMESPACE, "gen1-inf2")
    assert (f"could not open the gate of gen1-inf2 on RayService {NAMESPACE}/gen1-inf2: GET {path} answered HTTP 403: "
            f'rayservices.ray.io "gen1-inf2" is forbidden: User "{COMPILE_USERS["inf2"]}" cannot get resource "rayservices"') in proc.stderr
    assert f"(Role gen1-inf2-compile-open-gate in {NAMESPACE})" in proc.stderr
    assert key("compiled", keys["inf2"]["compiled"]) in live.configmaps[(NAMESPACE, "gen1-inf2-staged")]["data"]
    # trn2's account, with its own Role: its generation's objects only.
    account = Path(live.compile_env["trn2"]["SERVICE_ACCOUNT_DIR"])
    context = ssl.create_default_context(cafile=str(account / "ca.crt"))
    for target in [*TARGETS["gen1-inf2"], *TARGETS["gen3-g6e"], *TARGETS["gen3-g6e-multinode"], *TARGETS["gen2-trn2"]]:
        request = urllib.request.Request(f"https://127.0.0.1:{live.port}{target_path(*target)}", method="PATCH", data=b"{}",
                                         headers={"Authorization": f"Bearer {COMPILE_TOKENS['trn2']}",
                                                  "Content-Type": "application/merge-patch+json"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert status == (200 if target in TARGETS["gen2-trn2"] else 403), target


# --- turning staging off while a compile runs ---------------------------------------------------------


def compile_jobs(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "Job" and "-compile-" in o["metadata"]["name"]}


@pytest.mark.parametrize("state, kept", [
    ({"spec": {"suspend": False}, "status": {"active": 1}}, True),  # released, compiling
    ({"spec": {"suspend": False}, "status": {"active": 1, "conditions": [{"type": "Complete", "status": "False"}]}}, True),
    ({"spec": {"suspend": False}, "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}, False),
    ({"spec": {"suspend": False}, "status": {"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}}, False),
    ({"spec": {"suspend": True}, "status": {}}, False),  # never released: no pod, nothing to lose
])
def test_turning_staging_off_keeps_a_running_compile_until_it_ends(kube_api, state, kept) -> None:
    """helm deletes what a release no longer renders (the Job, and with it its pod: batch/v1 Job
    deletion propagates to its pods), so turning staging off mid-compile would throw away an
    on-demand accelerator node's hour. With staging off the chart reads the live compile Job of the
    name it renders (helm's lookup): released and without a Complete or Failed condition (batch/v1
    JobStatus.conditions), it stays in the manifest exactly as staging on rendered it (no change to
    apply), and so do the gates ConfigMap and its compile account's Roles, which its upload needs to
    record and open the gate (<pool>-compile-marker, <pool>-compile-open-gate). The stage Jobs, the
    staging account's Roles and a finished, failed or never-released compile Job are dropped."""
    live_compile_jobs(kube_api)
    on = compile_jobs(kube_api.rendered)
    [inf2] = [n for n in on if n.startswith("gen1-inf2-compile-")]
    job = kube_api.jobs[(NAMESPACE, inf2)]
    job["spec"].update(state["spec"])
    job["status"] = state["status"]
    off_values = merged(REQUIRED, BUCKETS)
    rendered = render_live(kube_api, off_values)
    for obj in rendered:
        validate(obj)
    assert not [o for o in rendered if o["kind"] == "Job" and "-stage-" in o["metadata"]["name"]]
    assert kind(rendered, "Role", "gennstack-serving-release-compile-jobs") is None
    assert kind(rendered, "Role", ROLE) is None and kind(rendered, "Role", GATES_ROLE) is None
    if not kept:
        assert compile_jobs(rendered) == {}
        assert not [o for o in rendered if o["kind"] in ("Role", "RoleBinding") and "-compile-" in o["metadata"]["name"]]
        assert kind(rendered, "ConfigMap", "gennstack-serving-staged-gates") is None
        return
    got = compile_jobs(rendered)
    assert list(got) == [inf2]
    want = json.loads(json.dumps(on[inf2]))
    want["spec"]["suspend"] = False  # what staging on renders for a released compile (compileSuspend)
    assert got[inf2] == want
    assert kind(rendered, "Role", "gen1-inf2-compile-marker")["rules"][0]["resourceNames"] == ["gen1-inf2-staged"]
    assert kind(rendered, "RoleBinding", "gen1-inf2-compile-marker")["subjects"][0]["name"] == "gennstack-compile-inf2"
    assert list(compile_gate_roles(rendered)) == ["gennstack-compile-inf2"]
    assert kind(rendered, "Role", "gen2-trn2-compile-marker") is None
    assert "gen1-inf2.json" in kind(rendered, "ConfigMap", "gennstack-serving-staged-gates")["data"]
    notes = helm.run("install", helm.RELEASE, str(CHART), "--dry-run=server", "--disable-openapi-validation", "--namespace", NAMESPACE,
                     "--kubeconfig", str(kube_api.kubeconfig), values=off_values)
    assert notes.returncode == 0, notes.stderr
    assert (f"Staging is off, but compile Job {inf2} is still running: it is kept until it ends, then records its "
            "artifacts and opens gen1-inf2's gate.") in notes.stdout
