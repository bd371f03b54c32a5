"""The multi-node model is staged like a generation (issue 25): a stage Job of its own, a marker of its
own (``gen3-g6e-multinode-staged``), and its group pods (leaders and workers) gated until the marker
records the prefix they stream from.

- Rendered with the real helm, every object validated (Kubernetes 1.36, the LWS v0.10.0 CRD).
- helm's ``lookup`` against the fake Kubernetes API (tests/serving/fake_kube_api.py, the chart's own
  Roles enforced), with the real helm binary: what a deploy renders before and after staging.
- stage.py as a real process against moto (S3, Secrets Manager, Pod Identity) and a fake Hub serving
  the Scout repository: it copies the weights and records them in the multi-node marker, and the next
  render opens the groups' gate. No compile Job: the model runs on GPUs (g6e), as gen3-g6e's does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gennstack.config import load_config
from gennstack.serving.values import MULTI_NODE_STAGED_MARKER, STAGED_MARKERS, serving_values
from tests import helm
from tests.k8s_schema import validate
from tests.serving.aws_fakes import pod_env
from tests.serving.conftest import BUCKETS, CHART, NAMESPACE, REQUIRED, STAGING, merged, serve_kube_api
from tests.serving.containers import COMMIT, HUB_FILES, env_with_prefixes, run, workload
from tests.serving.fake_hub import FakeHub
from tests.serving.test_staged_gate import ROLE, containers, render_live

pytestmark = pytest.mark.slow

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
PREFIX = f"{SCOUT}/main/"
MULTI = {"multiNode": {"enabled": True}}
VALUES = merged(REQUIRED, STAGING, BUCKETS, MULTI)
GATE = {"name": "gennstack.io/staged"}
ROLES = ("leaderTemplate", "workerTemplate")


def by_name(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def group_gates(objects: list[dict]) -> dict[str, bool]:
    """Whether the leader's and the worker's pod templates carry the staged gate (and its label)."""
    [lws] = [o for o in objects if o["kind"] == "LeaderWorkerSet" and o["metadata"]["name"] == "gen3-g6e-multinode"]
    out = {}
    for role in ROLES:
        template = lws["spec"]["leaderWorkerTemplate"][role]
        gate = GATE in template["spec"].get("schedulingGates", [])
        assert gate == (template["metadata"]["labels"].get("gennstack.io/staged") == "false"), role
        out[role] = gate
    return out


def key(prefix: str) -> str:
    """files/kube_patch.py staged_key and the chart's gennstack-serving.stagedKey, written out once more."""
    return f"model-{hashlib.sha256(prefix.encode()).hexdigest()[:16]}"


def test_a_stage_job_and_a_marker_of_its_own_and_the_role_may_patch_it() -> None:
    objects = helm.render(CHART, VALUES, namespace=NAMESPACE)
    for obj in objects:
        validate(obj)
    named = by_name(objects)
    marker = named[("ConfigMap", MULTI_NODE_STAGED_MARKER)]
    assert "data" not in marker and marker["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert named[("Role", ROLE)]["rules"][0]["resourceNames"] == [*STAGED_MARKERS.values(), MULTI_NODE_STAGED_MARKER]
    [job] = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("gen3-g6e-multinode-stage-")]
    spec = job["spec"]["template"]["spec"]
    [stage] = spec["containers"]
    env = {e["name"]: e["value"] for e in stage["env"]}
    assert (env["MODEL_ID"], env["MODEL_REVISION"], env["MODEL_PREFIX"], env["STAGED_CONFIGMAP"]) == (
        SCOUT, "main", PREFIX, MULTI_NODE_STAGED_MARKER)
    # Weights only: no compile Job to release, no tiktoken (Llama's tokenizer is in the repository).
    assert "COMPILE_JOB" not in env and "TIKTOKEN_ENCODINGS" not in env
    assert stage["command"] == ["python3", "/scripts/stage.py"] and spec["automountServiceAccountToken"] is True
    assert "schedulingGates" not in spec  # the Job that opens the gate is never held by it
    assert job["metadata"]["annotations"]["gennstack.io/s3-prefix"] == f"s3://models/{PREFIX}"
    assert not [o for o in objects if o["kind"] == "Job" and "multinode-compile" in o["metadata"]["name"]]
    # The leaders stream from exactly the prefix the Job stages.
    [lws] = [o for o in objects if o["kind"] == "LeaderWorkerSet" and o["metadata"]["name"] == "gen3-g6e-multinode"]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    args = json.loads({e["name"]: e.get("value") for e in leader["env"]}["VLLM_ARGS"])
    assert args[args.index("--model") + 1] == f"s3://models/{PREFIX}"


def test_off_or_staging_off_renders_no_multinode_job_and_the_marker_needs_the_model_on() -> None:
    assert not [o for o in helm.render(CHART, merged(REQUIRED, STAGING), namespace=NAMESPACE) if "multinode" in o["metadata"]["name"]]
    no_staging = by_name(helm.render(CHART, merged(REQUIRED, MULTI), namespace=NAMESPACE))
    assert ("ConfigMap", MULTI_NODE_STAGED_MARKER) in no_staging  # it still gates the groups
    assert not [n for n in no_staging if n[0] == "Job"] and ("Role", ROLE) not in no_staging


def test_the_typed_values_default_the_gate_to_auto_and_accept_a_forced_one() -> None:
    config = load_config({"serving": {"multi_node": {"enabled": True}}})
    kwargs = {"models_bucket": "m", "compile_cache_bucket": "c", "region": "us-east-1", "hf_token_secret": "s"}
    assert serving_values(config, config.serving, **kwargs)["multiNode"]["staged"] == "auto"
    forced = serving_values(config, config.serving, staged={"multi_node": True}, **kwargs)
    assert forced["multiNode"]["staged"] is True and forced["g6e"]["staged"] == "auto"
    # `helm template` has no cluster: auto renders closed there, leaders and workers alike; true opens.
    assert group_gates(helm.render(CHART, merged(VALUES, {"multiNode": {"staged": "auto"}}), namespace=NAMESPACE)) == dict.fromkeys(ROLES, True)
    assert group_gates(helm.render(CHART, merged(VALUES, {"multiNode": {"staged": True}}), namespace=NAMESPACE)) == dict.fromkeys(ROLES, False)


# --- helm's lookup and stage.py as a real process --------------------------------------------------------


@pytest.fixture
def kube_api_multi(tmp_path: Path):
    """tests/serving/conftest.py's kube_api, with the multi-node model on (its marker and Role installed)."""
    yield from serve_kube_api(tmp_path, VALUES)


@pytest.fixture
def scout_hub():
    fake = FakeHub(SCOUT, HUB_FILES, commit=COMMIT, refs={"main": COMMIT}, token="hf_test")
    yield fake
    fake.stop()


def test_lookup_opens_the_groups_once_their_marker_holds_the_prefix(kube_api_multi) -> None:
    assert group_gates(render_live(kube_api_multi, VALUES)) == dict.fromkeys(ROLES, True)
    # gen3-g6e's marker holding the same prefix does not count: each model reads its own.
    kube_api_multi.configmaps[(NAMESPACE, STAGED_MARKERS["g6e"])]["data"] = {key(PREFIX): PREFIX}
    assert group_gates(render_live(kube_api_multi, VALUES)) == dict.fromkeys(ROLES, True)
    kube_api_multi.configmaps[(NAMESPACE, MULTI_NODE_STAGED_MARKER)]["data"] = {key(PREFIX): PREFIX}
    assert group_gates(render_live(kube_api_multi, VALUES)) == dict.fromkeys(ROLES, False)
    # Another revision is another prefix: closed again until it is staged.
    moved = merged(VALUES, {"multiNode": {"revision": "0123abc", "modelPrefix": f"{SCOUT}/0123abc/"}})
    assert group_gates(render_live(kube_api_multi, moved)) == dict.fromkeys(ROLES, True)
    looked_up = {r.path for r in kube_api_multi.requests if r.method == "GET" and "/configmaps/" in r.path}
    assert f"/api/v1/namespaces/{NAMESPACE}/configmaps/{MULTI_NODE_STAGED_MARKER}" in looked_up


def test_the_stage_job_copies_the_model_records_it_and_the_next_deploy_opens(kube_api_multi, moto, agent, scout_hub, tmp_path) -> None:
    moto.client("secretsmanager").create_secret(Name=STAGING["staging"]["hfTokenSecret"], SecretString='{"token": "hf_test"}')
    container = workload(containers(kube_api_multi.rendered), "gen3-g6e-multinode-stage", "stage")
    env = pod_env(tmp_path / "home", agent, AWS_ENDPOINT_URL=moto.endpoint, HF_ENDPOINT=scout_hub.endpoint,
                  **env_with_prefixes(container, tmp_path, **kube_api_multi.env))
    Path(env["HF_HOME"]).mkdir(parents=True, exist_ok=True)
    proc = run(container, env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    s3 = moto.client("s3")
    staged = {o["Key"] for o in s3.list_objects_v2(Bucket="models", Prefix=PREFIX).get("Contents", [])}
    assert PREFIX + ".gennstack-complete" in staged and any(k.endswith(".safetensors") for k in staged)
    marker_path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{MULTI_NODE_STAGED_MARKER}"
    [patch] = [p for p in kube_api_multi.patches() if p.path == marker_path]
    assert patch.body == {"data": {key(PREFIX): PREFIX}}
    assert f"recorded model {PREFIX} in ConfigMap {NAMESPACE}/{MULTI_NODE_STAGED_MARKER}" in proc.stdout
    # Only its own marker: gen3-g6e's stays empty (its servers stay gated until its own Job ran).
    assert not kube_api_multi.configmaps[(NAMESPACE, STAGED_MARKERS["g6e"])].get("data")
    assert group_gates(render_live(kube_api_multi, VALUES)) == dict.fromkeys(ROLES, False)


def test_notes_name_the_groups_service_and_what_they_wait_for() -> None:
    proc = helm.run("install", helm.RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE, values=VALUES)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout[proc.stdout.index("NOTES:"):]
    assert (f"gen3-g6e-multinode: http://gen3-g6e-multinode-serve.{NAMESPACE}.svc:8000/v1  model llama-4-scout  "
            "(health: /health, leaders only)") in notes
    assert f"until ConfigMap {MULTI_NODE_STAGED_MARKER} records {PREFIX},\n    which its stage Job" in notes
    opened = helm.run("install", helm.RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                      values=merged(VALUES, {"multiNode": {"staged": True}}))
    assert "gen3-g6e-multinode: waiting" not in opened.stdout
