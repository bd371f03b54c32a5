"""`gennstack summary`: what `make synth` prints about the synthesized assembly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gennstack.cli import main
from gennstack.deploy_warnings import NO_ADMIN, ZONES_BY_GETAZS, config_warnings, unpinned_revision
from gennstack.summary import SummaryError, summarize
from tests.support import Synth


def test_summary_of_default_stack(synth: Synth) -> None:
    text = summarize(synth.outdir)
    assert "Stack GenNStack:" in text
    assert "VPC 10.0.0.0/16: 3 AZs, 6 subnets (public /24, private /18), 1 NAT gateway(s), flow logs: ALL" in text
    assert "VPC endpoints: dynamodb, ec2, ecr.api, ecr.dkr, logs, s3, sqs, sts" in text
    assert "Bucket ModelStorageModelsBucket2AA7EB86: aws:kms, versioning on, on stack delete: Retain" in text
    assert "EKS cluster gennstack: Kubernetes 1.36, endpoint private, Auto Mode off" in text
    assert "karpenter 1.14.1" in text and "nvidia-device-plugin 0.20.1" in text
    assert "NodePool gen1-inf2: inf2.48xlarge (spot, weight 50; limits cpu=768, memory=3072Gi, aws.amazon.com/neuron=48)" in text
    assert "NodePool gen1-inf2-on-demand: inf2.48xlarge (on-demand, weight 10;" in text
    assert "Generation g6e: openai/gpt-oss-20b @ main: serves gpt-oss-20b, 2-6 replicas, 0 warm spare(s)" in text
    # Per generation: the scaling range, scaler and signal (gennstack.serving.scaling).
    lines = text.splitlines()
    assert ("    Scaling: 2-6 replicas by KEDA/HPA on vllm:num_requests_running + vllm:num_requests_waiting per replica, "
            "target 51 (batch 64); up after 60 s, down after 600 s below target; at most 384 sequences at once") in lines
    assert ("    Scaling: 1-2 replicas by KEDA/HPA on vllm:num_requests_running + vllm:num_requests_waiting per replica, "
            "target 12 (batch 16); up after 60 s, down after 1800 s below target; at most 32 sequences at once") in lines
    assert ("    Scaling: 1-2 replicas by Ray Serve autoscaling on in-flight requests per replica, "
            "target 16 (batch 20); up after 60 s, down after 600 s below target; at most 40 sequences at once") in lines
    assert "Generation inf2: meta-llama/Meta-Llama-3-70B-Instruct @ main: serves llama-3-70b-instruct, 1-2 replicas" in text
    assert "    stream resume: 2 relays between the public and the routing Gateway; on for g6e, inf2, trn2" in lines
    # Per generation: the image it runs and its Neuron release (gennstack.serving.support).
    dlc = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"
    assert (f"    Image: {dlc} + Ray Serve (built from assets/images/inf2-ray-serve) (Neuron 2.28.0, vLLM 0.13.0 "
            "with vllm-neuron release-0.4.1)") in lines
    assert f"    Image: {dlc} (Neuron 2.28.0, vLLM 0.13.0 with vllm-neuron release-0.4.1)" in lines
    assert any(line.startswith("    Image: docker.io/vllm/vllm-openai:v0.29.0@sha256:") and line.endswith("(CUDA, vLLM 0.29.0)")
               for line in lines)
    # Per generation: layout and bytes per NeuronCore/GPU from gennstack.serving.capacity.
    assert ("    Memory: TP 24, 20 seqs x 8192 tokens; per NeuronCore (16.00 GB): weights 6.22 GB, KV 6.71 GB, "
            "margin 1.60 GB, free 1.47 GB; at most 24 sequences of 8192 tokens") in text.splitlines()
    assert ("    Memory: TP 64 (vision TP 16), 16 seqs x 8192 tokens; per NeuronCore (24.00 GB): weights 12.71 GB, "
            "KV 3.22 GB, margin 2.40 GB, free 5.67 GB; at most 44 sequences of 8192 tokens") in text.splitlines()
    assert ("    Memory: TP 1, 64 seqs x 32768 tokens; per GPU (48.00 GB): weights 13.80 GB, KV 26.18 GB, "
            "margin 8.02 GB, free 0.00 GB; at most 25 sequences of 32768 tokens") in text.splitlines()
    assert "Gateway (internal NLB): models gpt-oss-20b, llama-3-70b-instruct, llama-4-maverick" in text
    assert "alias gennstack-default: gpt-oss-20b w80 p0, llama-4-maverick w20 p0, llama-3-70b-instruct w1 p1" in text
    assert ("    HTTPS on 443: TLS ends at Envoy, certificate from the gateway's own CA for *.elb.<region>.amazonaws.com, "
            "*.envoy-gateway-system.svc.cluster.local") in text.splitlines()
    assert ("    CA for clients: kubectl get configmap -n gennstack-gateway gennstack-gateway-ca "
            "-o jsonpath='{.data.ca\\.crt}' > gennstack-ca.pem") in text.splitlines()
    assert "Interruption handler: Lambda on 4 EventBridge event rules and a reconcile every 1 min" in text
    # The system pods against the system nodes (gennstack.system_capacity; checked in tests/test_system_capacity.py).
    assert ("  system nodes: 4 x m7i.large; pods request 4540m CPU / 8236Mi of 7000m / 29656Mi left after DaemonSets "
            "(5250m / 22242Mi with one node down)") in text.splitlines()
    # The hourly range per generation and in total (gennstack.cost; the figures are checked by hand in tests/cost).
    assert "  Cost inf2: $5.61-$13.40/h, 1 x inf2.48xlarge" in text.splitlines()
    assert "  Cost g6e: $1.61-$3.85/h, 2 x g6e.xlarge" in text.splitlines()
    assert ("  Cost trn2: not priced (no on-demand price for trn2.48xlarge in us-east-1; "
            "price it with `gennstack cost --price trn2.48xlarge=USD_PER_HOUR`)") in text.splitlines()
    # 4 system nodes (2 more than before: + 0.2059836 $/h, tests/cost/test_cost_model.py).
    assert ("  Cost per hour: $8.00-$18.02 (spot (estimate: 60% off on-demand) to on-demand), always-on, us-east-1 "
            "(no region in config) list prices as of 2026-07-06; details: gennstack cost") in text.splitlines()
    # The defaults leave nobody able to reach the cluster and the zones to Fn::GetAZs: both said.
    assert f"  WARNING: {NO_ADMIN}" in text
    assert f"  WARNING: {ZONES_BY_GETAZS}" in text
    for generation in ("inf2", "trn2", "g6e"):
        assert f"  WARNING: {unpinned_revision(generation, 'main')}" in text


def test_synth_warns_when_nobody_can_reach_the_cluster(synth: Synth, synth_variant: Synth) -> None:
    """aws-cdk-lib 2.275 reports construct warnings in the synth's validation report (printed by `cdk synth`).

    The variant names an admin role, so it has no such warning.
    """
    def warnings(s: Synth) -> list[str]:
        report_file = s.outdir / "validation-report.json"
        if not report_file.exists():
            return []
        report = json.loads(report_file.read_text())
        return [
            violation["description"] for plugin in report["pluginReports"] for violation in plugin["violations"]
            if violation["severity"] == "warning"
        ]

    assert any(NO_ADMIN in w for w in warnings(synth))
    assert not any(NO_ADMIN in w for w in warnings(synth_variant))


def test_summary_of_variant(synth_variant: Synth) -> None:
    text = summarize(synth_variant.outdir)
    assert "2 AZs" in text and "2 NAT gateway(s)" in text and "flow logs: REJECT" in text
    # trn2 is disabled: its model leaves the alias as the gateway routes it (gateway.config.routing_table)
    assert "    alias gennstack-default: gpt-oss-20b w80 p0, llama-3-70b-instruct w1 p1" in text.splitlines()
    assert "eks-auth" in text and "ssm" in text
    assert "on stack delete: Delete" in text
    assert "Generation trn2: disabled" in text
    assert "NodePool gen2-trn2" not in text
    assert "Gateway (internal NLB): models gpt-oss-20b, llama-3-70b-instruct\n" in text + "\n"
    assert "endpoint public from 203.0.113.0/24 + private" in text
    # eu-west-1 has no bundled prices: said, not guessed.
    assert "  Cost: no bundled prices for eu-west-1: run `gennstack cost --live`" in text.splitlines()
    # An admin role and zones are set; the revisions are still branches (trn2 is disabled).
    assert [line for line in text.splitlines() if "WARNING" in line] == [
        f"  WARNING: {unpinned_revision(g, 'main')}" for g in ("inf2", "g6e")
    ]


def test_cli_prints_summary(synth: Synth, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", "--cdk-out", str(synth.outdir)]) == 0
    assert "Stack GenNStack" in capsys.readouterr().out


def test_missing_assembly_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SummaryError, match="run `make synth`"):
        summarize(tmp_path)
    assert main(["summary", "--cdk-out", str(tmp_path)]) == 1
    assert "manifest.json not found" in capsys.readouterr().out


def test_a_pinned_commit_is_not_warned_about() -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    config = {"cluster": {"admin_role_arns": ["arn:aws:iam::123456789012:role/a"]}, "network": {"availability_zones": ["x"]},
              "generations": {"g6e": {"enabled": True, "model_revision": commit},
                              "inf2": {"enabled": False, "model_revision": "main"}}}
    assert config_warnings(config) == []


def test_gateway_tls_lines_say_where_tls_ends_and_where_the_ca_is() -> None:
    from gennstack.summary import gateway_tls_lines

    lines = gateway_tls_lines({"namespace": "gw", "tls": {"hostnames": ["llm.example.com"]}}, "eu-west-1")
    assert lines[0].endswith("own CA for *.elb.eu-west-1.amazonaws.com, *.envoy-gateway-system.svc.cluster.local, "
                             "llm.example.com")
    assert "kubectl get configmap -n gw gennstack-gateway-ca" in lines[1]
    assert "*.elb.cn-north-1.amazonaws.com.cn," in gateway_tls_lines({}, "cn-north-1")[0]
    arn = "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"
    assert gateway_tls_lines({"load_balancer": {"certificate_arn": arn}}, "us-east-1") == [
        f"    HTTPS on 443: TLS ends at the NLB (ACM {arn}), re-encrypted to Envoy"]


def test_resume_lines_name_each_generation_on_and_why_the_others_are_off() -> None:
    """`gennstack summary` says where stream resume is on and, per enabled generation that is off, why
    (docs/gateway.md, "Stream resume in the cluster")."""
    from gennstack.summary import resume_lines

    assert resume_lines({}, ["g6e", "inf2", "trn2"]) == [
        "    stream resume: 2 relays between the public and the routing Gateway; on for g6e, inf2, trn2"]
    assert resume_lines({"resume": {"generations": {"inf2": False}}}, ["g6e", "inf2"]) == [
        "    stream resume: 2 relays between the public and the routing Gateway; on for g6e",
        "    stream resume off for inf2: gateway.resume.generations.inf2 is false"]
    assert resume_lines({"resume": {"enabled": False}}, ["g6e"]) == ["    stream resume: off (gateway.resume.enabled is false)"]


def test_summary_says_where_fast_image_pull_is_on(synth: Synth) -> None:
    """One line per EC2NodeClass (gennstack.node_config): on for the accelerator classes, off with the reason for
    the general one."""
    lines = summarize(synth.outdir).splitlines()
    assert ("  EC2NodeClass gen1-inf2: fast image pull on (nodeadm FastImagePull, SOCI parallel pull; "
            "layers on root volume (1000 MiB/s))") in lines
    assert ("  EC2NodeClass gen3-g6e: fast image pull on (nodeadm FastImagePull, SOCI parallel pull; "
            "layers on instance store (RAID0))") in lines
    assert any(line.startswith("  EC2NodeClass general: fast image pull off (general pool:") for line in lines)
