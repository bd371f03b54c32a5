"""gennstack/system_capacity.py: the system node group's requests against its allocatable."""

from __future__ import annotations

import pytest

from gennstack import system_capacity as sc
from gennstack.config import GenNStackConfig


def test_max_pods_follows_nodeadm_eni_formula():
    """awslabs/amazon-eks-ami v20260714 nodeadm/internal/kubelet/eni_max_pods.go
    calculateStandardMaxPods: ENIs * (IPv4 per ENI - 1) + 2; instance-info.jsonl: m7i.large 3 x 10,
    m7i.xlarge 4 x 15."""
    assert sc.max_pods(sc.SYSTEM_INSTANCES["m7i.large"]) == 29
    assert sc.max_pods(sc.SYSTEM_INSTANCES["m7i.xlarge"]) == 58


@pytest.mark.parametrize(("vcpu", "reserved"), [(1, 60), (2, 70), (4, 80), (8, 90), (16, 110)])
def test_kube_reserved_cpu_follows_nodeadm(vcpu, reserved):
    """awslabs/amazon-eks-ami v20260714 nodeadm/internal/kubelet/config.go getCPUMillicoresToReserve:
    ranges 0/1000/2000/4000/total millicores at 600/100/50/25 basis points."""
    assert sc.kube_reserved_cpu_m(vcpu) == reserved


def test_kube_reserved_memory_follows_nodeadm():
    """awslabs/amazon-eks-ami v20260714 nodeadm/internal/kubelet/config.go getMemoryMebibytesToReserve:
    11 * maxPods + 255."""
    assert sc.kube_reserved_memory_mi(29) == 574
    assert sc.kube_reserved_memory_mi(58) == 893


def test_allocatable_subtracts_kube_reserved_and_eviction():
    """Capacity - kube-reserved - evictionHard memory.available 100Mi (nodeadm config.go v20260714)."""
    assert sc.allocatable("m7i.large") == sc.Requests(2000 - 70, 8192 - 574 - 100)
    assert sc.allocatable("m7i.xlarge") == sc.Requests(4000 - 80, 16384 - 893 - 100)


def test_unknown_instance_type_is_named():
    with pytest.raises(KeyError, match="c7i.large"):
        sc.allocatable("c7i.large")


def test_default_requests_per_component():
    """The sum at defaults (rate limit on, monitoring on on-demand nodes, 2 Envoy replicas)."""
    lines = {line.component: line for line in sc.deployments(GenNStackConfig())}
    assert lines["karpenter"].total == sc.Requests(1000, 2048)
    assert lines["envoy-proxy"].total == sc.Requests(2 * 510, 2 * 544)
    assert lines["envoy-gateway"].total == sc.Requests(200, 512)
    assert "prometheus" not in lines
    assert sc.total(list(lines.values())) == sc.Requests(3220, 5984)


def test_worst_case_adds_monitoring_and_scales_with_envoy_replicas():
    config = GenNStackConfig.model_validate({"gateway": {"envoy_replicas": 4}})
    worst = sc.total(sc.deployments(sc.worst_case(config)))
    assert worst == sc.Requests(3220 + 500 + 2 * 510, 5984 + 2048 + 2 * 544)


def test_fit_room_counts_daemonsets_per_node():
    fit = sc.system_fit(GenNStackConfig())
    assert fit.instance_type == "m7i.large"
    assert fit.per_node_daemonsets == sc.Requests(55, 104)
    assert fit.room(2) == sc.Requests(2 * (1930 - 55), 2 * (7518 - 104))
    # Both nodes up, the defaults fit; with one of the two down they do not (3220m > 1875m).
    assert fit.fits(2)
    assert not fit.fits(1)
