"""nodeadm's NodeConfig for the EC2NodeClasses' user data: fast image pull where the node can use it.

Karpenter v1.14.1 (aws/karpenter-provider-aws, pkg/providers/amifamily/bootstrap/nodeadm.go
``parseUserData``) takes an EC2NodeClass ``userData`` that parses as YAML as one NodeConfig part of
the MIME archive and appends its own generated NodeConfig (cluster, kubelet, the RAID0 local storage
of ``instanceStorePolicy``) after it; nodeadm merges the parts key by key (awslabs/amazon-eks-ami
nodeadm/internal/api/merge.go, mergo.WithOverride), so the feature gate set here survives.

Fast image pull is nodeadm's ``FastImagePull`` feature gate (awslabs/amazon-eks-ami at v20260625,
the Neuron classes' release, and v20260714, the others': nodeadm/ is the same at both tags). With it
nodeadm points containerd and the kubelet at the SOCI snapshotter in parallel-pull-unpack mode
(nodeadm/internal/containerd/snapshotter/soci-snapshotter.config.toml: ``max_concurrent_downloads_per_image
= 20``, ``concurrent_download_chunk_size = "16mb"``, ``max_concurrent_unpacks_per_image = 12``), and
only when the node is large enough (nodeadm/internal/containerd/config.go ``UseSOCISnapshotter``).
"""

from __future__ import annotations

import yaml

from gennstack import versions
from gennstack.instances import INSTANCE_TYPES, NEURON, ROOT_VOLUMES

# nodeadm/internal/containerd/config.go UseSOCISnapshotter (v20260625 = v20260714):
#   return totalMemory >= 7*gibibyte && totalCPUMillicores >= 4000
# totalCPUMillicores counts the logical CPUs (nodeadm/internal/system/resources.go GetMilliNumCores),
# so 4 vCPU passes; totalMemory is the kernel's online memory, a little under EC2's figure ("a
# c6a.2xlarge with 16GiB of memory showed 15.75GiB available"): a type passes here only with more
# than 7 GiB published.
FAST_IMAGE_PULL_MIN_VCPU = 4
FAST_IMAGE_PULL_MIN_MEMORY_GIB = 7
# nodeadm/doc/examples.md "Enabling fast image pull (experimental)": "We recommend at least 600MiB/s
# throughput. Below that value, you may see longer image pull times with this flag." It applies where
# the store is the root volume: without instance store, /var/lib/containerd and
# /var/lib/soci-snapshotter-grpc are on it.
FAST_IMAGE_PULL_MIN_ROOT_MIBPS = 600
# CHANGELOG.md at v20260625: "AMI Release v20250813" carries "feat(nodeadm) add SOCI snapshotter
# support" (#2352); "AMI Release v20251217" carries "feat: mount soci directory to instance store"
# (#2548): setup-local-disks bind-mounts /var/lib/soci-snapshotter-grpc onto the RAID0 array
# (BIND_SOCI="true" unless NodeConfig's localStorage.disabledMounts names SOCI).
FAST_IMAGE_PULL_SINCE = "v20250813"
SOCI_ON_INSTANCE_STORE_SINCE = "v20251217"

NODE_CONFIG_API_VERSION = "node.eks.aws/v1alpha1"


def ami_alias(instance_types: tuple[str, ...]) -> str:
    """The AMI release of a node class: Neuron instance types get ``NEURON_AMI_ALIAS``, the release
    whose Neuron driver accepts the image's Neuron runtime (gennstack/versions.py); the general and
    GPU classes ``AL2023_AMI_ALIAS``."""
    if instance_types and all(INSTANCE_TYPES[t].accelerator_resource == NEURON for t in instance_types):
        return versions.NEURON_AMI_ALIAS
    return versions.AL2023_AMI_ALIAS


def uses_instance_store(instance_types: tuple[str, ...]) -> bool:
    """Whether the class sets ``instanceStorePolicy: RAID0``: every type has local NVMe."""
    return bool(instance_types) and all(INSTANCE_TYPES[t].nvme_gb > 0 for t in instance_types)


def fast_image_pull_blocker(generation: str | None, instance_types: tuple[str, ...]) -> str | None:
    """Why a node class does not turn on fast image pull, or None when it does.

    ``generation`` None is the general CPU class: its pods' images are small, its root volume gp3
    runs at the 125 MiB/s baseline (under the 600 nodeadm recommends) and Karpenter may pick 2-vCPU
    sizes there, which nodeadm would skip anyway.
    """
    if generation is None:
        mibps = ROOT_VOLUMES["general"][2]
        return (f"general pool: small images, root volume {mibps} MiB/s (nodeadm recommends at least "
                f"{FAST_IMAGE_PULL_MIN_ROOT_MIBPS}), sizes under {FAST_IMAGE_PULL_MIN_VCPU} vCPU allowed")
    release = ami_alias(instance_types).split("@", 1)[1]
    if release < FAST_IMAGE_PULL_SINCE:
        return f"AMI {release} predates nodeadm's FastImagePull ({FAST_IMAGE_PULL_SINCE})"
    small = [t for t in instance_types
             if INSTANCE_TYPES[t].vcpu < FAST_IMAGE_PULL_MIN_VCPU
             or INSTANCE_TYPES[t].memory_gib <= FAST_IMAGE_PULL_MIN_MEMORY_GIB]
    if small:
        return (f"{', '.join(small)} under nodeadm's {FAST_IMAGE_PULL_MIN_VCPU} vCPU / {FAST_IMAGE_PULL_MIN_MEMORY_GIB} GiB "
                "minimum (it would ignore the gate there)")
    if uses_instance_store(instance_types) and release >= SOCI_ON_INSTANCE_STORE_SINCE:
        return None
    mibps = ROOT_VOLUMES[generation][2]
    if mibps < FAST_IMAGE_PULL_MIN_ROOT_MIBPS:
        return (f"its store is the root volume at {mibps} MiB/s, under the {FAST_IMAGE_PULL_MIN_ROOT_MIBPS} MiB/s "
                "nodeadm recommends")
    return None


def fast_image_pull_store(generation: str | None, instance_types: tuple[str, ...]) -> str:
    """Where the pulled layers land: ``instance store (RAID0)`` or ``root volume (N MiB/s)``."""
    if uses_instance_store(instance_types):
        return "instance store (RAID0)"
    return f"root volume ({ROOT_VOLUMES[generation or 'general'][2]} MiB/s)"


def node_config(generation: str | None, instance_types: tuple[str, ...]) -> dict | None:
    """The NodeConfig GenNStack adds to a node class's user data, or None when it adds nothing."""
    if fast_image_pull_blocker(generation, instance_types) is not None:
        return None
    return {"apiVersion": NODE_CONFIG_API_VERSION, "kind": "NodeConfig", "spec": {"featureGates": {"FastImagePull": True}}}


def user_data(generation: str | None, instance_types: tuple[str, ...]) -> str | None:
    """The EC2NodeClass ``userData``: the NodeConfig as a YAML document, or None."""
    config = node_config(generation, instance_types)
    return None if config is None else yaml.safe_dump(config, sort_keys=False)


def fast_image_pull_line(node_class_name: str, generation: str | None, instance_types: tuple[str, ...]) -> str:
    """``gennstack summary``'s line for one EC2NodeClass."""
    blocker = fast_image_pull_blocker(generation, instance_types)
    if blocker is not None:
        return f"  EC2NodeClass {node_class_name}: fast image pull off ({blocker})"
    return (f"  EC2NodeClass {node_class_name}: fast image pull on (nodeadm FastImagePull, SOCI parallel pull; "
            f"layers on {fast_image_pull_store(generation, instance_types)})")
