"""examples/multinode-scout.yaml (docs/serving.md's multi-node overlay) synthesizes clean: cdk-nag through the
app's own validation, cfn-lint with the committed .cfnlintrc.yaml, checkov with the accepted list,
as tests/test_compliance.py checks the default and variant synths; and it installs what it needs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from gennstack import versions
from tests.k8s_schema import validate
from tests.test_manifests import applied_objects
from tests.support import ROOT, Synth, depends_on, synthesize, unexpected_validation_findings

pytestmark = pytest.mark.slow

OVERLAY = ROOT / "examples" / "multinode-scout.yaml"
CFN_LINT = ROOT / ".venv" / "bin" / "cfn-lint"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


@pytest.fixture(scope="module")
def scout(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("scout"), yaml.safe_load(OVERLAY.read_text()))


def test_cdk_nag_finds_nothing_new(scout: Synth) -> None:
    assert scout.config.serving.multi_node.enabled
    assert unexpected_validation_findings(scout.outdir, scout.config) == []


def test_the_lws_controller_is_installed_pinned_and_the_chart_gets_the_group(scout: Synth) -> None:
    charts = {c["Properties"]["Release"]: c["Properties"] for c in scout.resources("Custom::AWSCDK-EKS-HelmChart").values()}
    lws = charts[versions.LWS.name]
    assert (lws["Chart"], lws["Repository"], lws["Version"], lws["Namespace"]) == (
        "lws", "oci://registry.k8s.io/lws/charts/lws", "0.10.0", "lws-system")
    serving = json.dumps(charts["gennstack-serving"]["Values"])
    assert "multiNode" in serving and "Llama-4-Scout-17B-16E-Instruct" in serving


def test_the_lws_controller_survives_one_replica_down(scout: Synth) -> None:
    """Two LWS controller replicas on two nodes, evicted one at a time. kubernetes-sigs/lws v0.10.0
    charts/lws/templates/webhook/webhook.yaml: ``mpod.kb.io`` (pods CREATE) and ``vpod.kb.io`` (pods
    CREATE, UPDATE) are ``failurePolicy: Fail`` for every pod with ``leaderworkerset.sigs.k8s.io/name``,
    so with the chart's default ``replicaCount: 1`` (charts/lws/values.yaml) down, the drain label patch
    and a gate removal on a group pod are refused. The chart ships no PodDisruptionBudget (nothing
    under charts/lws/templates), so the stack adds one; its selector is the chart's pod labels
    (templates/manager/deployment.yaml: ``control-plane: controller-manager`` and lws.selectorLabels,
    ``app.kubernetes.io/name: lws``, ``app.kubernetes.io/instance: <release>``; the release is ``lws``)."""
    charts = {k: c for k, c in scout.resources("Custom::AWSCDK-EKS-HelmChart").items()}
    [(chart_id, lws)] = [(k, c) for k, c in charts.items() if c["Properties"]["Release"] == versions.LWS.name]
    values = json.loads(lws["Properties"]["Values"]) if isinstance(lws["Properties"]["Values"], str) else lws["Properties"]["Values"]
    pod_labels = {"control-plane": "controller-manager", "app.kubernetes.io/name": "lws", "app.kubernetes.io/instance": "lws"}
    assert values["replicaCount"] == 2
    assert values["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": pod_labels}}]
    pdbs = [(k, o) for k, o in applied_objects(scout)
            if o["kind"] == "PodDisruptionBudget" and o["metadata"].get("namespace") == "lws-system"]
    [(pdb_id, pdb)] = pdbs
    validate(pdb)
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels}}
    # After the chart, which creates lws-system.
    assert depends_on(scout.template, pdb_id, chart_id)


def test_cfn_lint_reports_nothing(scout: Synth) -> None:
    result = subprocess.run([str(CFN_LINT), "--format", "json", *map(str, sorted(scout.outdir.glob("*.template.json")))],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert json.loads(result.stdout or "[]") == [] and result.returncode == 0, result.stdout[:4000] + result.stderr


def test_checkov_finds_only_accepted_failures(scout: Synth) -> None:
    if not CHECKOV.exists():
        message = f"{CHECKOV} not found: run `make setup`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    files = [arg for path in sorted(scout.outdir.glob("*.template.json")) for arg in ("-f", str(path))]
    result = subprocess.run([str(CHECKOV), *files, "--framework", "cloudformation", "--skip-download", "--quiet", "-o", "json"],
                            capture_output=True, text=True, timeout=600, check=False,
                            env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"})
    assert result.returncode in (0, 1), result.stderr
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    accepted = yaml.safe_load((ROOT / "compliance" / "checkov-accepted.yaml").read_text())
    failed = [(c["check_id"], c["resource"].split(".", 1)[1]) for r in reports for c in r["results"]["failed_checks"]]
    unexplained = [(check, logical) for check, logical in failed
                   if not any(e["check"] == check and logical.startswith(tuple(e["resources"])) for e in accepted)]
    assert unexplained == []


def test_readme_shows_the_overlay_as_it_is() -> None:
    readme = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    assert f"```yaml\n{OVERLAY.read_text(encoding='utf-8')}```" in readme


def test_the_groups_run_the_vllm_image_plus_ray_built_at_deploy(scout: Synth) -> None:
    """vllm/vllm-openai has no Ray (vllm-project/vllm PR #36170 removed `ray[cgraph]` from
    requirements/cuda.txt, which docker/Dockerfile installs), and the groups need it in every pod
    (the leader's `ray start --head`, vLLM's Ray executor): CDK builds assets/images/g6e-vllm-ray
    and the chart runs it."""
    import re

    from gennstack.serving.support import SUPPORT

    dockerfile = (ROOT / "assets" / "images" / "g6e-vllm-ray" / "Dockerfile").read_text()
    values = yaml.safe_load((ROOT / "assets" / "charts" / "gennstack-serving" / "values.yaml").read_text())
    assert re.findall(r"^FROM (\S+)$", dockerfile, flags=re.MULTILINE) == [values["images"]["vllm"]] == [SUPPORT["g6e"].image]
    assert "pip list --format=freeze --exclude-editable > /tmp/vllm-constraints.txt" in dockerfile
    assert "&& python3 -m pip check" in dockerfile
    (pinned,) = re.findall(r'-c /tmp/vllm-constraints.txt "ray==(\d+\.\d+\.\d+)"', dockerfile)
    # The Ray the bootstrap is tested against (tests/serving/test_multinode_bootstrap.py, requirements-dev.txt).
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert re.findall(r"^ray\[serve\]==(\S+)$", dev, flags=re.MULTILINE) == [pinned]
    assets = json.loads((scout.outdir / "GenNStack.assets.json").read_text())
    built = {i["source"]["directory"]: i for i in assets["dockerImages"].values()}
    ours = [d for d in built if (scout.outdir / d / built[d]["source"].get("dockerFile", "Dockerfile")).read_text() == dockerfile]
    assert len(ours) == 1 and built[ours[0]]["source"]["platform"] == "linux/amd64"
    charts = {c["Properties"]["Release"]: c["Properties"] for c in scout.resources("Custom::AWSCDK-EKS-HelmChart").values()}
    values = json.dumps(charts["gennstack-serving"]["Values"])
    # The image URI is a token CloudFormation joins in: the multiNode values hold the asset repository's.
    multi = values[values.index('multiNode'):]
    image = multi[multi.index('image'):][:200]
    assert "container-assets" in image and "vllm-openai" not in image


def test_summary_shows_the_groups_layout_memory_cost_gate_and_reclaim(scout: Synth) -> None:
    """`gennstack summary` on the overlay's assembly: the multi-node model's own block, its numbers from
    the capacity model (gennstack.serving.capacity) and gennstack.cost (bundled us-east-1 prices, as
    docs/serving.md's table), and the gateway's model list holding it."""
    from gennstack.cost.model import hourly_cost
    from gennstack.cost.prices import load_table
    from gennstack.serving.capacity import summary_line
    from gennstack.serving.multinode import multi_node_plan
    from gennstack.summary import summarize

    lines = summarize(scout.outdir).splitlines()
    section = scout.config.serving.multi_node
    assert ("  Multi-node llama-4-scout: meta-llama/Llama-4-Scout-17B-16E-Instruct @ main: 2 group(s) (LeaderWorkerSet "
            "gen3-g6e-multinode, one group = one replica) of 2 x g6e.12xlarge (8 GPUs), TP 4 x PP 2 over Ray; gateway "
            "backend gen3-g6e-multinode-serve (the leaders)") in lines
    assert "    Image: docker.io/vllm/vllm-openai:v0.29.0@sha256:c2914767605584b6d8f45686b82de173ecc99e781897aa3d0a66dacd72c51ae1 + Ray (built from assets/images/g6e-vllm-ray)" in lines
    memory = summary_line(multi_node_plan(section))
    assert f"    Memory: {memory} (the heaviest pipeline stage)" in lines
    assert memory == ("TP 4 x PP 2, 16 seqs x 32768 tokens; per GPU (48.00 GB): weights 27.37 GB, KV 12.61 GB, margin 8.02 GB, "
                      "free 0.00 GB; at most 15 sequences of 32768 tokens")
    spot, od = hourly_cost(scout.config, load_table("us-east-1")).total("multi_node")
    assert (round(spot, 2), round(od, 2)) == (17.04, 42.22)  # docs/serving.md: 16.79 + 0.25 of root volumes, 41.97 + 0.25
    assert ("    Cost: $17.04-$42.22/h (spot estimate to on-demand, us-east-1), 4 x g6e.12xlarge with root volumes; "
            "one group $8.52-$21.11/h") in lines
    assert ("    Staged gate: no group pod until ConfigMap gen3-g6e-multinode-staged records "
            "meta-llama/Llama-4-Scout-17B-16E-Instruct/main/ (leaders and workers wait, scheduling-gated); its stage Job "
            "records it and opens the gate, no deploy needed; staging off: deploy with serving.staging: true") in lines
    assert ("    Reclaim: losing any member (a spot reclaim of one of its 2 nodes) recreates the whole group "
            "(RecreateGroupOnPodRestart): one replica, 2 nodes' worth, down until its members are back; one group per "
            "zone, so one zone's reclaim takes at most one") in lines
    assert "  Gateway (internal NLB): models gpt-oss-20b, llama-3-70b-instruct, llama-4-maverick, llama-4-scout" in lines


def test_monitoring_scrapes_the_leaders_and_alerts_per_group(scout: Synth) -> None:
    """The overlay's template, read as tests/observability/test_exporters_deployed.py reads the default's:
    every series a rule or panel reads has a deployed exporter with what it needs (the group rule's
    kube_pod_container_status_ready from kube-state-metrics), the leaders' PodMonitor is applied, and
    the groups get their own GenNStackNoReadyReplica (tests/observability/test_multinode_monitoring.py)."""
    from gennstack.summary import summarize
    from tests.observability.test_exporters_deployed import _manifests, problems

    assert problems(scout.template, list(scout.config.generations.enabled())) == []
    monitors = {o["metadata"]["name"]: o for o in _manifests(scout.template, "EksClustermanifestScrapeTargets")}
    assert monitors["gennstack-vllm-multinode"]["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gen3-g6e-multinode", "app.kubernetes.io/component": "server",
        "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    [rule] = _manifests(scout.template, "EksClustermanifestAlertRules")
    groups = [r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "GenNStackNoReadyReplica"]
    assert [r["labels"]["generation"] for r in groups] == ["gen1-inf2", "gen2-trn2", "gen3-g6e", "gen3-g6e-multinode"]
    text = summarize(scout.outdir)
    assert "vLLM /metrics of the multi-node groups' leaders (gen3-g6e-multinode)" in text
    assert "GenNStackNoReadyReplica x4" in text
