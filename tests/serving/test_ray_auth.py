"""Ray's control planes need a token: gen1-inf2's RayService and the multi-node groups' Ray heads.

Without token authentication (off by default at Ray 2.60.0) anybody who reaches a Ray head's GCS,
dashboard or client port runs code on the cluster (submits a job, replaces the Serve app). What
this relies on, read at the pinned versions:

* KubeRay v1.7.0 (ray-project/kuberay tag v1.7.0): ``rayClusterConfig.authOptions.mode: token``
  (ray-operator/apis/ray/v1/raycluster_types.go AuthOptions; needs rayVersion >= 2.52.0,
  controllers/ray/utils/validation.go). The RayCluster controller creates a Secret named after the
  cluster, owned by it, key ``auth_token`` (raycluster_controller.go reconcileAuthSecret /
  createAuthSecret), and sets ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` (from that Secret) on the
  Ray container of every pod, the autoscaler and wait-gcs-ready (common/pod.go
  SetContainerTokenAuthEnvVars; utils/constant.go RAY_AUTH_MODE_ENV_VAR, RAY_AUTH_TOKEN_ENV_VAR,
  RAY_AUTH_TOKEN_SECRET_KEY); its own dashboard client sends it (utils/util.go GetRayDashboardClientFunc).
* Ray 2.60.0 (the venv's, as the images): ``ray start`` turns authentication on only with
  RAY_AUTH_MODE=token (python/ray/_private/authentication/authentication_token_setup.py
  maybe_enable_token_auth_if_token_available); then the dashboard answers 401 without a token and
  403 with a wrong one (http_token_authentication.py get_token_auth_middleware) and the GCS refuses
  calls (InvalidAuthToken).

The real-Ray tests start a head exactly as the chart configures it (the env names and the token come
from the rendered objects) and stop it through its own process group, never ``ray stop``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gennstack.config import load_config
from tests import helm
from tests.serving.aws_fakes import free_port
from tests.serving.conftest import BUCKETS, CHART, NAMESPACE, REQUIRED, cdk_values, merged, serve_kube_api

pytestmark = pytest.mark.slow

MULTI = {"serving": {"multi_node": {"enabled": True}}}
AUTH_SECRET = "gen3-g6e-multinode-ray-auth"
# KubeRay v1.7.0 ray-operator/controllers/ray/utils/constant.go.
KUBERAY_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
KUBERAY_TOKEN_KEY = "auth_token"
RAY_CLI = Path(sys.executable).with_name("ray")
PATIENCE_S = 180


@pytest.fixture(scope="module")
def multinode() -> dict[tuple[str, str], dict]:
    rendered = helm.render(CHART, cdk_values(MULTI, load_config(MULTI).serving), namespace=NAMESPACE)
    return {(o["kind"], o["metadata"]["name"]): o for o in rendered}


def _members(objects: dict) -> dict[str, dict]:
    template = objects[("LeaderWorkerSet", "gen3-g6e-multinode")]["spec"]["leaderWorkerTemplate"]
    return {role: template[f"{role}Template"]["spec"]["containers"][0] for role in ("leader", "worker")}


def _token(objects: dict) -> str:
    return base64.b64decode(objects[("Secret", AUTH_SECRET)]["data"][KUBERAY_TOKEN_KEY]).decode()


# --- what the chart renders ------------------------------------------------------------------------


def test_gen1_ray_cluster_runs_with_kuberay_token_auth_and_no_client_port_in_its_service() -> None:
    rendered = helm.render(CHART, cdk_values(), namespace=NAMESPACE)
    cluster = next(o for o in rendered if o["kind"] == "RayService")["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    # KubeRay v1.7.0 validation.go: token mode needs a rayVersion of at least 2.52.0.
    major, minor, _ = (int(p) for p in cluster["rayVersion"].split("."))
    assert (major, minor) >= (2, 52)
    head = cluster["headGroupSpec"]
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    # The head Service (KubeRay copies these ports) has GCS for the workers and the dashboard for
    # the operator; no Ray Client port, which nothing uses.
    assert ports == {"gcs": 6379, "dashboard": 8265, "serve": 8000}
    # KubeRay's operator reaches the dashboard from its own pod: not loopback (behind the token).
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    # The token is KubeRay's to make and inject: the chart sets neither variable itself
    # (SetContainerTokenAuthEnvVars adds them only where absent).
    for group in [head, *cluster["workerGroupSpecs"]]:
        for container in group["template"]["spec"]["containers"]:
            assert not set(KUBERAY_AUTH_ENV) & {e["name"] for e in container.get("env", [])}


def test_every_group_member_gets_the_token_from_the_groups_secret(multinode) -> None:
    for role, container in _members(multinode).items():
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}, role
        assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": AUTH_SECRET, "key": KUBERAY_TOKEN_KEY}}, role
    secret = multinode[("Secret", AUTH_SECRET)]
    assert secret["type"] == "Opaque" and set(secret["data"]) == {KUBERAY_TOKEN_KEY}
    assert re.fullmatch(r"[A-Za-z0-9]{64}", _token(multinode))
    # Never in the pod spec itself.
    assert _token(multinode) not in json.dumps(multinode[("LeaderWorkerSet", "gen3-g6e-multinode")])


def test_an_upgrade_keeps_the_token_and_a_first_install_makes_a_new_one(tmp_path) -> None:
    """helm's ``lookup`` reads the live Secret at upgrade (the fake API server holds what the install
    left): the same token, so running members and new ones agree. Without a Secret (first install,
    ``helm template``) each render makes a fresh random one."""
    from tests.serving.test_staged_gate import render_live

    values = merged(REQUIRED, BUCKETS, {"multiNode": {"enabled": True}})
    for api in serve_kube_api(tmp_path, values):
        installed = api.secrets[(NAMESPACE, AUTH_SECRET)]["data"][KUBERAY_TOKEN_KEY]
        upgraded = {(o["kind"], o["metadata"]["name"]): o for o in render_live(api, values)}
        assert upgraded[("Secret", AUTH_SECRET)]["data"][KUBERAY_TOKEN_KEY] == installed
        assert f"/api/v1/namespaces/{NAMESPACE}/secrets/{AUTH_SECRET}" in {r.path for r in api.requests if r.method == "GET"}
    first = [helm.render(CHART, values, namespace=NAMESPACE) for _ in range(2)]
    tokens = {next(o for o in r if o["kind"] == "Secret" and o["metadata"]["name"] == AUTH_SECRET)["data"][KUBERAY_TOKEN_KEY]
              for r in first}
    assert len(tokens) == 2


def test_the_bootstrap_refuses_to_start_ray_without_token_auth() -> None:
    bootstrap = CHART / "files" / "multinode_bootstrap.py"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LWS_", "RAY_AUTH_"))}
    lws = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2"}
    for role, index in (("leader", "0"), ("worker", "1")):
        env = {**base, **lws, "LWS_WORKER_INDEX": index, "RAY_CLI": "/nonexistent/ray"}
        proc = subprocess.run([sys.executable, str(bootstrap), role], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "RAY_AUTH_MODE='': allowed: token" in proc.stderr, proc.stderr
        proc = subprocess.run([sys.executable, str(bootstrap), role], env={**env, "RAY_AUTH_MODE": "token"},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "RAY_AUTH_TOKEN is empty" in proc.stderr, proc.stderr


# --- on the real Ray 2.60.0 -----------------------------------------------------------------------


@contextlib.contextmanager
def ray_head(env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A Ray head with its dashboard on 127.0.0.1 (gen1's head has one), in a session of its own;
    (GCS address, dashboard port)."""
    tmp = Path(tempfile.mkdtemp(prefix="gsa", dir="/tmp"))  # short: the raylet's socket paths
    dashboard = free_port()
    proc = subprocess.Popen(
        [str(RAY_CLI), "start", "--head", "--port", "0", "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
         "--dashboard-host", "127.0.0.1", f"--dashboard-port={dashboard}", f"--ray-client-server-port={free_port()}",
         f"--dashboard-agent-listen-port={free_port()}", "--object-store-memory", "78643200",
         "--temp-dir", str(tmp / "ray"), "--disable-usage-stats"],
        env={**env, "RAY_USAGE_STATS_ENABLED": "0"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=PATIENCE_S)
        assert proc.returncode == 0, out
        match = re.search(r"--address='([^']+)'", out)
        assert match, out
        yield match.group(1), dashboard
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            time.sleep(2)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def _status(url: str, data: bytes | None = None, token: str | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as error:
        return error.code


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_") and k != "RAY_ADDRESS"}


SUBMIT = '''
import sys, time
from ray.job_submission import JobSubmissionClient, JobStatus
try:
    client = JobSubmissionClient(sys.argv[1])
    job = client.submit_job(entrypoint="python -c \\"print('job ran')\\"")
except Exception as error:
    print("refused:", type(error).__name__, error)
    sys.exit(3)
for _ in range(int(sys.argv[2])):
    status = client.get_job_status(job)
    if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        break
    time.sleep(1)
print("status:", status, "logs:", client.get_job_logs(job).strip())
'''


def _submit(env: dict[str, str], dashboard: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SUBMIT, f"http://127.0.0.1:{dashboard}", str(PATIENCE_S)],
                          env=env, capture_output=True, text=True, timeout=2 * PATIENCE_S)


def test_a_job_needs_the_token_on_a_head_started_as_the_chart_starts_it(multinode) -> None:
    """The head's environment is what the chart gives a group leader (RAY_AUTH_MODE as rendered, the
    token from the rendered Secret), as KubeRay gives gen1's head the same two variables. Without the
    token the Jobs API refuses (401, 403 with a wrong one; Ray's SDK raises AuthenticationError) and
    the GCS refuses a client; with it the job runs."""
    leader = {e["name"]: e.get("value") for e in _members(multinode)["leader"]["env"]}
    token = _token(multinode)
    auth = {"RAY_AUTH_MODE": leader["RAY_AUTH_MODE"], "RAY_AUTH_TOKEN": token}
    with ray_head({**_clean_env(), **auth}) as (address, dashboard):
        jobs = f"http://127.0.0.1:{dashboard}/api/jobs/"
        body = json.dumps({"entrypoint": "echo never"}).encode()
        assert _status(jobs, body) == 401
        assert _status(jobs, body, token="not-" + token) == 403
        assert _status(f"http://127.0.0.1:{dashboard}/api/version") == 401
        refused = _submit(_clean_env(), dashboard)
        assert refused.returncode == 3 and "refused: AuthenticationError" in refused.stdout, refused.stdout + refused.stderr

        gcs = subprocess.run(
            [sys.executable, "-c", "import sys; from ray._raylet import GcsClient; "
             "print(len(GcsClient(address=sys.argv[1]).get_all_node_info(timeout=10)), 'nodes')", address],
            env=_clean_env(), capture_output=True, text=True, timeout=PATIENCE_S)
        assert gcs.returncode != 0 and "InvalidAuthToken" in gcs.stderr, gcs.stdout + gcs.stderr

        ran = _submit({**_clean_env(), **auth}, dashboard)
        assert ran.returncode == 0 and "status: SUCCEEDED" in ran.stdout and "job ran" in ran.stdout, ran.stdout + ran.stderr
        # Health stays open (KubeRay's probes and the kubelet send no token).
        assert _status(f"http://127.0.0.1:{dashboard}/api/gcs_healthz") == 200
