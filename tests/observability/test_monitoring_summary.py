"""`gennstack summary` says what is scraped, which dashboards and which alerts the stack deploys."""

from __future__ import annotations

from gennstack.summary import summarize
from tests.support import Synth


def _monitoring_lines(synth: Synth) -> list[str]:
    lines = summarize(synth.outdir).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  Monitoring: "))
    return lines[start:start + 5]


def test_default_stack(synth: Synth) -> None:
    monitoring, scraped, dashboards, alerts, thresholds = _monitoring_lines(synth)
    assert monitoring == ("  Monitoring: kube-prometheus-stack 88.3.0 in monitoring (Prometheus 100 GiB, 15 d retention, "
                          "on on-demand general-pool nodes; remote write to Amazon Managed Service for Prometheus off)")
    assert scraped == (
        "    Scraped: vLLM /metrics (gen2-trn2, gen3-g6e); Ray Serve (gen1-inf2); Envoy proxies and AI Gateway GenAI "
        "metrics; Karpenter; neuron-monitor; DCGM exporter (GPU nodes); CloudWatch via YACE (interruption handler, "
        "its dead-letter queue); Kubernetes (kube-state-metrics, node-exporter, kubelet)")
    assert dashboards == "    Dashboards (Grafana folder GenNStack): cost, gateway, gen1-inf2, gen2-trn2, gen3-g6e, spot"
    assert alerts == (
        "    Alerts: GenNStackNoReadyReplica x3, GenNStackTimeToFirstTokenOverSLO, GenNStackHighErrorRate, "
        "GenNStackKVCacheFull, GenNStackAcceleratorPodPending, GenNStackStreamResumeFailing, GenNStackGatewayCertificateExpiring, "
        "GenNStackCloudWatchExporterAbsent, GenNStackCloudWatchExporterErrors, GenNStackInterruptionDeadLetters")
    assert thresholds == ("    Alert thresholds: TTFT p95 > 2.0 s for 10 min, errors > 5 %, KV cache >= 98 %, "
                          "accelerator pods Pending > 15 min")


def test_variant_stack(synth_variant: Synth) -> None:
    """trn2 disabled, remote write on, on the system nodes."""
    monitoring, scraped, _, alerts, _ = _monitoring_lines(synth_variant)
    assert "on the system node group; remote write to Amazon Managed Service for Prometheus on" in monitoring
    assert scraped.startswith("    Scraped: vLLM /metrics (gen3-g6e); Ray Serve (gen1-inf2);")
    assert "GenNStackNoReadyReplica x2" in alerts
