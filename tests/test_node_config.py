"""nodeadm's fast image pull in the EC2NodeClasses' user data, pinned to awslabs/amazon-eks-ami at the pinned AMIs.

Upstream facts (awslabs/amazon-eks-ami, tags v20260625 and v20260714; nodeadm/ is identical at both):
- nodeadm/api/v1alpha1/nodeconfig_types.go: ``FastImagePull Feature = "FastImagePull"`` ("This flag will be
  ignored on instances with memory and vCPU below a certain threshold"); featuregates.go: ``FastImagePull:
  DefaultFalse``, so without the gate nothing changes.
- nodeadm/internal/containerd/config.go ``UseSOCISnapshotter``: ``return totalMemory >= 7*gibibyte &&
  totalCPUMillicores >= 4000``.
- nodeadm/doc/examples.md: "We recommend at least 600MiB/s throughput".
- CHANGELOG.md: v20250813 "feat(nodeadm) add SOCI snapshotter support"; v20251217 "feat: mount soci directory
  to instance store" (templates/al2023/runtime/bin/setup-local-disks BIND_SOCI="true").
Karpenter v1.14.1 pkg/providers/amifamily/bootstrap/nodeadm.go ``parseUserData``: user data that is not MIME
and parses as YAML becomes a NodeConfig part ahead of Karpenter's own.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from gennstack import node_config, versions
from gennstack.config import load_config
from gennstack.instances import INSTANCE_TYPES, NVIDIA_GPU, ROOT_VOLUMES, InstanceSpec
from gennstack.node_config import fast_image_pull_blocker, node_config as build_node_config
from gennstack_infra.components.node_pools import node_classes
from tests.k8s_schema import _strict

NODECONFIG_CRD = Path(__file__).parent / "crds" / "node.eks.aws" / "NodeConfig.yaml"


def _nodeconfig_schema() -> dict:
    crd = yaml.safe_load(NODECONFIG_CRD.read_text(encoding="utf-8"))
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return _strict(served["schema"]["openAPIV3Schema"])


def _classes(overrides: dict | None = None) -> dict[str, dict]:
    config = load_config(overrides or {})
    return {c["metadata"]["name"]: c for c in node_classes(config, node_role="KarpenterNodeRole", security_group_id="sg-1")}


def test_accelerator_classes_turn_on_fast_image_pull_and_the_general_class_does_not() -> None:
    classes = _classes()
    for name in ("gen1-inf2", "gen2-trn2", "gen3-g6e"):
        data = classes[name]["spec"]["userData"]
        # Karpenter's parseUserData: not MIME, parses as YAML -> a NodeConfig part (not a shell script).
        assert not data.lstrip().startswith(("MIME-Version:", "Content-Type:"))
        document = yaml.safe_load(data)
        assert document["apiVersion"] == "node.eks.aws/v1alpha1" and document["kind"] == "NodeConfig"
        assert document["spec"]["featureGates"] == {"FastImagePull": True}, name
    assert "userData" not in classes["general"]["spec"]


def test_user_data_validates_against_nodeadms_nodeconfig_crd() -> None:
    schema = _nodeconfig_schema()
    document = build_node_config("g6e", ("g6e.xlarge",))
    jsonschema.validate(document, schema)
    # The strict schema rejects a misplaced key, so the check above can fail.
    with pytest.raises(jsonschema.ValidationError, match="featureGate"):
        jsonschema.validate({**document, "spec": {"featureGate": {"FastImagePull": True}}}, schema)


def test_nodeadm_thresholds_and_g6e_xlarge_is_in() -> None:
    """4000 millicores and 7 GiB (UseSOCISnapshotter, ``>=``): g6e.xlarge, 4 vCPU / 32 GiB, passes."""
    assert (node_config.FAST_IMAGE_PULL_MIN_VCPU, node_config.FAST_IMAGE_PULL_MIN_MEMORY_GIB) == (4, 7)
    assert INSTANCE_TYPES["g6e.xlarge"].vcpu == 4
    assert fast_image_pull_blocker("g6e", ("g6e.xlarge",)) is None
    assert "userData" in _classes({"generations": {"g6e": {"instance_types": ["g6e.xlarge"]}}})["gen3-g6e"]["spec"]


@pytest.mark.parametrize(("vcpu", "memory", "on"), [(4, 8, True), (3, 32, False), (4, 7, False), (2, 4, False)])
def test_a_type_under_the_minimum_keeps_the_gate_off(monkeypatch: pytest.MonkeyPatch, vcpu: int, memory: int,
                                                     on: bool) -> None:
    """7 GiB published is under 7 GiB online (config.go: "an instance will have less available RAM shown in the
    kernel than its specs"), so it stays off; one small type in a class turns the class off."""
    monkeypatch.setitem(INSTANCE_TYPES, "g6e.test", InstanceSpec(vcpu, memory, 1, NVIDIA_GPU, 250))
    blocker = fast_image_pull_blocker("g6e", ("g6e.2xlarge", "g6e.test"))
    assert (blocker is None) is on
    if not on:
        assert "g6e.test under nodeadm's 4 vCPU / 7 GiB minimum" in blocker


def test_root_volume_store_needs_600_mibps(monkeypatch: pytest.MonkeyPatch) -> None:
    """inf2 has no instance store: the layers land on its root volume, 1000 MiB/s >= 600."""
    assert not node_config.uses_instance_store(("inf2.48xlarge",))
    assert ROOT_VOLUMES["inf2"][2] >= node_config.FAST_IMAGE_PULL_MIN_ROOT_MIBPS == 600
    assert fast_image_pull_blocker("inf2", ("inf2.48xlarge",)) is None
    monkeypatch.setitem(ROOT_VOLUMES, "inf2", (600, 16000, 500))
    assert "root volume at 500 MiB/s, under the 600 MiB/s" in fast_image_pull_blocker("inf2", ("inf2.48xlarge",))


def test_instance_store_classes_need_no_root_throughput(monkeypatch: pytest.MonkeyPatch) -> None:
    """trn2/g6e set RAID0; from v20251217 the SOCI store is on it, so their 500 MiB/s root volume is not the store."""
    assert ROOT_VOLUMES["g6e"][2] < 600 and ROOT_VOLUMES["trn2"][2] < 600
    assert fast_image_pull_blocker("g6e", ("g6e.12xlarge",)) is None
    # On a release before v20251217 the store would be the root volume, which is too slow.
    monkeypatch.setattr(versions, "AL2023_AMI_ALIAS", "al2023@v20251120")
    assert "root volume at 500 MiB/s" in fast_image_pull_blocker("g6e", ("g6e.12xlarge",))


def test_ami_before_v20250813_has_no_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    assert versions.NEURON_AMI_ALIAS >= "al2023@v20251217" and versions.AL2023_AMI_ALIAS >= "al2023@v20251217"
    monkeypatch.setattr(versions, "NEURON_AMI_ALIAS", "al2023@v20250731")
    assert fast_image_pull_blocker("trn2", ("trn2.48xlarge",)) == (
        "AMI v20250731 predates nodeadm's FastImagePull (v20250813)")
    assert "userData" not in _classes()["gen2-trn2"]["spec"]


def test_summary_lines_name_the_store_and_the_general_pool_reason() -> None:
    assert node_config.fast_image_pull_line("gen1-inf2", "inf2", ("inf2.48xlarge",)) == (
        "  EC2NodeClass gen1-inf2: fast image pull on (nodeadm FastImagePull, SOCI parallel pull; "
        "layers on root volume (1000 MiB/s))")
    assert "layers on instance store (RAID0)" in node_config.fast_image_pull_line("gen3-g6e", "g6e", ("g6e.xlarge",))
    assert node_config.fast_image_pull_line("general", None, ()).startswith(
        "  EC2NodeClass general: fast image pull off (general pool: small images, root volume 125 MiB/s")
