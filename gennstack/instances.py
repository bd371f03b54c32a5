"""The accelerator instance types GenNStack knows, with the facts its NodePools are sized from.

Hand-written because nothing offline provides it: the figures are EC2's published specifications
(vCPU, memory, accelerator devices, local NVMe). Karpenter's limits, the device-plugin resource
names and the node classes' storage choices are derived from them.
"""

from __future__ import annotations

from dataclasses import dataclass

NEURON = "aws.amazon.com/neuron"
NVIDIA_GPU = "nvidia.com/gpu"
# NeuronCores a tensor-parallel rank can run on, per Neuron device (instance family): 2 per
# Inferentia2 chip; 4 logical per Trainium2 chip at LNC=2 (8 physical), as the trn2 serving runs.
NEURON_CORES_PER_DEVICE = {"inf2": 2, "trn2": 4}

# Root volumes of the EC2NodeClasses, gp3 (GiB, IOPS, MB/s), by pool. inf2 has no instance store,
# so its root volume also holds the model cache (Llama 3 70B in BF16 is ~140 GB) and gets more
# throughput; trn2 and g6e keep models on RAID0 NVMe. gennstack_infra/components/node_pools.py builds the node
# classes from these, gennstack.cost prices them.
ROOT_VOLUMES: dict[str, tuple[int, int, int]] = {
    "general": (100, 3000, 125),
    "inf2": (600, 16000, 1000),
    "trn2": (200, 6000, 500),
    "g6e": (200, 6000, 500),
}
# The system node group's root volume: the AL2023 EKS AMI's default size, encrypted gp3 at its baseline.
SYSTEM_ROOT_VOLUME_GIB = 20


@dataclass(frozen=True)
class InstanceSpec:
    vcpu: int
    memory_gib: int
    # Devices the device plugin advertises under ``accelerator_resource`` (Inferentia2/Trainium2
    # chips, or GPUs).
    accelerators: int
    accelerator_resource: str
    # Total local NVMe instance store in GB; 0 means EBS only.
    nvme_gb: int


INSTANCE_TYPES: dict[str, InstanceSpec] = {
    # Inferentia2: 12 chips (24 NeuronCores), EBS only.
    "inf2.48xlarge": InstanceSpec(192, 768, 12, NEURON, 0),
    "inf2.24xlarge": InstanceSpec(96, 384, 6, NEURON, 0),
    # Trainium2: 16 chips, 4 x 1.9 TB NVMe.
    "trn2.48xlarge": InstanceSpec(192, 2048, 16, NEURON, 7600),
    # NVIDIA L40S (48 GB each), all with local NVMe.
    "g6e.xlarge": InstanceSpec(4, 32, 1, NVIDIA_GPU, 250),
    "g6e.2xlarge": InstanceSpec(8, 64, 1, NVIDIA_GPU, 450),
    "g6e.4xlarge": InstanceSpec(16, 128, 1, NVIDIA_GPU, 600),
    "g6e.8xlarge": InstanceSpec(32, 256, 1, NVIDIA_GPU, 900),
    "g6e.16xlarge": InstanceSpec(64, 512, 1, NVIDIA_GPU, 1900),
    "g6e.12xlarge": InstanceSpec(48, 384, 4, NVIDIA_GPU, 3800),
    "g6e.24xlarge": InstanceSpec(96, 768, 4, NVIDIA_GPU, 3800),
    "g6e.48xlarge": InstanceSpec(192, 1536, 8, NVIDIA_GPU, 7600),
}


def family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def pool_limits(instance_types: tuple[str, ...], max_nodes: int) -> dict[str, int]:
    """A NodePool's limits: ``max_nodes`` of the largest configured type, per resource.

    ``cpu`` (vCPUs), ``memory_gib`` and the accelerator resource of the types. Karpenter's
    NodePools (gennstack_infra/components/node_pools.py) set them as limits, and ``gennstack preflight`` counts
    the same vCPUs against the EC2 quotas, so the two cannot drift apart.
    """
    specs = [INSTANCE_TYPES[t] for t in instance_types]
    largest = max(specs, key=lambda s: (s.accelerators, s.vcpu))
    return {
        "cpu": max_nodes * max(s.vcpu for s in specs),
        "memory_gib": max_nodes * max(s.memory_gib for s in specs),
        largest.accelerator_resource: max_nodes * max(s.accelerators for s in specs),
    }
