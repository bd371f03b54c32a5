"""``gennstack summary``: what a synthesized cloud assembly would deploy, in a few lines.

It reads only the cloud assembly (``cdk.out``): the manifest, each stack's template, and the
configuration that ``GenNStack`` records in its template metadata under ``GenNStack::Config``.
So it describes exactly what was synthesized, and needs neither AWS nor the CDK.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from gennstack.config_base import frozen
from gennstack.deploy_warnings import config_warnings
from gennstack.gateway.config import ResumeSettings, alias_backends
from gennstack.gateway.values import CA_CONFIGMAP, in_cluster_dns_wildcard, nlb_dns_wildcard
from gennstack.node_config import fast_image_pull_line
from gennstack.observability.summary import monitoring_lines
from gennstack.serving.capacity import MODELS, Layout, plan, summary_line
from gennstack.serving.scaling import scaling_line
from gennstack.serving.values import STAGED_MARKERS
from gennstack.serving.support import SUPPORT, effective_release

CONFIG_METADATA_KEY = "GenNStack::Config"


class SummaryError(RuntimeError):
    """The cloud assembly is missing or not one that ``cdk synth`` wrote."""


def load_assembly(cdk_out: Path) -> dict[str, dict[str, Any]]:
    """Stack name -> CloudFormation template, for every stack in the assembly's manifest."""
    manifest_path = cdk_out / "manifest.json"
    if not manifest_path.is_file():
        raise SummaryError(f"{manifest_path} not found: run `make synth` (or `npx cdk synth`) first")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    stacks: dict[str, dict[str, Any]] = {}
    for artifact in manifest.get("artifacts", {}).values():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact.get("properties", {})
        template_file = cdk_out / properties["templateFile"]
        name = properties.get("stackName") or template_file.name.removesuffix(".template.json")
        stacks[name] = json.loads(template_file.read_text(encoding="utf-8"))
    if not stacks:
        raise SummaryError(f"{manifest_path} lists no CloudFormation stacks")
    return stacks


def _of_type(template: dict[str, Any], resource_type: str) -> list[dict[str, Any]]:
    return [r for r in template.get("Resources", {}).values() if r.get("Type") == resource_type]


_SERVICE_PREFIX = re.compile(r"^com\.amazonaws\.(?:[a-z]{2}(?:-[a-z]+)+-\d+)?\.?")


def endpoint_service_name(resource: dict[str, Any]) -> str:
    """``ecr.api`` for a VPC endpoint to ``com.amazonaws.<region>.ecr.api``, region literal or not."""
    name = resource["Properties"]["ServiceName"]
    if isinstance(name, dict):  # {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".ecr.api"]]}
        parts = name.get("Fn::Join", ["", []])[1]
        name = "".join(part for part in parts if isinstance(part, str))
    return _SERVICE_PREFIX.sub("", name)


def summarize_stack(name: str, template: dict[str, Any]) -> list[str]:
    """Human-readable lines describing one stack template."""
    resources = template.get("Resources", {})
    counts = Counter(r.get("Type") for r in resources.values())
    config = template.get("Metadata", {}).get(CONFIG_METADATA_KEY, {})
    lines = [f"Stack {name}: {len(resources)} resources ({len(counts)} types)"]

    for vpc in _of_type(template, "AWS::EC2::VPC"):
        network = config.get("network", {})
        subnets = counts["AWS::EC2::Subnet"]
        lines.append(
            f"  VPC {vpc['Properties'].get('CidrBlock')}: {network.get('az_count', '?')} AZs, "
            f"{subnets} subnets (public /{network.get('public_subnet_mask', '?')}, "
            f"private /{network.get('private_subnet_mask', '?')}), "
            f"{counts['AWS::EC2::NatGateway']} NAT gateway(s), flow logs: "
            + (", ".join(sorted(r["Properties"]["TrafficType"] for r in _of_type(template, "AWS::EC2::FlowLog"))) or "off")
        )
        endpoints = sorted(endpoint_service_name(r) for r in _of_type(template, "AWS::EC2::VPCEndpoint"))
        lines.append(f"  VPC endpoints: {', '.join(endpoints) or 'none'}")

    for logical_id, bucket in sorted(resources.items()):
        if bucket.get("Type") != "AWS::S3::Bucket":
            continue
        properties = bucket.get("Properties", {})
        rules = properties.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [{}])
        sse = rules[0].get("ServerSideEncryptionByDefault", {}).get("SSEAlgorithm", "none")
        versioned = properties.get("VersioningConfiguration", {}).get("Status") == "Enabled"
        policy = bucket.get("DeletionPolicy", "Delete")
        lines.append(
            f"  Bucket {logical_id}: {sse}, versioning {'on' if versioned else 'off'}, on stack delete: {policy}"
        )

    for cluster in _of_type(template, "AWS::EKS::Cluster"):
        properties = cluster["Properties"]
        vpc_config = properties.get("ResourcesVpcConfig", {})
        endpoint = "private"
        if vpc_config.get("EndpointPublicAccess"):
            endpoint = f"public from {', '.join(vpc_config.get('PublicAccessCidrs', []))} + private"
        auto_mode = properties.get("ComputeConfig", {}).get("Enabled")
        lines.append(
            f"  EKS cluster {properties.get('Name')}: Kubernetes {properties.get('Version')}, endpoint {endpoint}, "
            f"Auto Mode {'on' if auto_mode else 'off'}"
        )
        addons = sorted(
            f"{a['Properties']['AddonName']} {a['Properties'].get('AddonVersion', '(unpinned)')}"
            for a in _of_type(template, "AWS::EKS::Addon")
        )
        lines.append(f"    Add-ons: {', '.join(addons)}")
        for nodegroup in _of_type(template, "AWS::EKS::Nodegroup"):
            ng = nodegroup["Properties"]
            scaling = ng.get("ScalingConfig", {})
            lines.append(
                f"    Node group {', '.join(ng.get('InstanceTypes', []))}: {ng.get('CapacityType', '').lower()}, "
                f"{scaling.get('MinSize')}-{scaling.get('MaxSize')} nodes, labels {ng.get('Labels', {})}"
            )
        charts = sorted(
            f"{c['Properties'].get('Chart') or c['Properties'].get('Release')} {c['Properties'].get('Version', '(this repo)')}"
            for c in _of_type(template, "Custom::AWSCDK-EKS-HelmChart")
        )
        lines.append(f"    Helm charts: {', '.join(charts)}")
    for pool in node_pools(template):
        spec = pool["spec"]
        requirements = {r["key"]: r.get("values", []) for r in spec["template"]["spec"]["requirements"]}
        instance_types = requirements.get("node.kubernetes.io/instance-type") or ["(by category)"]
        limits = ", ".join(f"{k}={v}" for k, v in spec.get("limits", {}).items())
        lines.append(
            f"  NodePool {pool['metadata']['name']}: {', '.join(instance_types)} "
            f"({'/'.join(requirements.get('karpenter.sh/capacity-type', []))}, weight {spec.get('weight')}; limits {limits})"
        )
    lines.extend(node_class_lines(node_pools(template)))

    gateway = config.get("gateway", {})
    releases = {c["Properties"].get("Release") for c in _of_type(template, "Custom::AWSCDK-EKS-HelmChart")}
    if "gennstack-gateway" in releases:
        enabled = {name for name, g in config.get("generations", {}).items() if g.get("enabled")}
        models = sorted(m for m, b in gateway.get("models", {}).items() if b.get("generation") in enabled)
        scheme = gateway.get("load_balancer", {}).get("scheme", "internal")
        lines.append(f"  Gateway ({scheme} NLB): models {', '.join(models)}")
        lines.extend(gateway_tls_lines(gateway, config.get("region")))
        lines.extend(resume_lines(gateway, sorted(enabled)))
        for alias, targets in sorted(gateway.get("aliases", {}).items()):
            routed = alias_backends([(t["model"], t["weight"], t["priority"]) for t in targets], set(models))
            split = ", ".join(f"{b.backend} w{b.weight} p{b.priority}" for b in routed) or "dropped (no enabled target)"
            lines.append(f"    alias {alias}: {split}")
    lines.extend(monitoring_lines(template, config, {
        c["Properties"]["Chart"]: c["Properties"].get("Version", "") for c in _of_type(template, "Custom::AWSCDK-EKS-HelmChart")
        if "Chart" in c["Properties"]
    }))
    functions = [k for k in template.get("Resources", {}) if k.startswith("InterruptionHandlerFunction")]
    if functions:
        rules = [
            r["Properties"] for k, r in template["Resources"].items()
            if k.startswith("InterruptionHandler") and r["Type"] == "AWS::Events::Rule"
        ]
        patterns = sum("EventPattern" in r for r in rules)
        interruptions = config.get("interruptions", {})
        lines.append(
            f"  Interruption handler: Lambda on {patterns} EventBridge event rules and a reconcile every "
            f"{interruptions.get('reconcile_every_minutes', '?')} min, dead-letter queue with alarms, "
            f"warm spares capped at {interruptions.get('warm_spare_cap', '?')} per generation"
        )
    serving = config.get("serving", {})
    has_serving_chart = "gennstack-serving" in releases
    for gen_name, generation in config.get("generations", {}).items():
        if not generation.get("enabled"):
            lines.append(f"  Generation {gen_name}: disabled")
            continue
        section = serving.get(gen_name, {})
        replicas = f"{section.get('min_replicas', '?')}-{section.get('max_replicas', '?')} replicas"
        where = f"serves {section.get('served_model_name', '?')}, {replicas}" if has_serving_chart else "not served by this stack"
        lines.append(
            f"  Generation {gen_name}: {generation.get('model_id')} @ {generation.get('model_revision')}: {where}, "
            f"{section.get('warm_spare_replicas', 0)} warm spare(s)"
        )
        if has_serving_chart and gen_name in SUPPORT:
            lines.append(f"    {image_line(gen_name, section)}")
        if has_serving_chart and gen_name in STAGED_MARKERS:
            lines.append(f"    {staged_gate_line(gen_name, generation, bool(serving.get('staging')))}")
        if has_serving_chart and "target_ongoing_requests" in section:
            lines.append(f"    {scaling_line(gen_name, section)}")
        capacity = capacity_line(gen_name, generation, section)
        if has_serving_chart and capacity:
            lines.append(f"    Memory: {capacity}")
    if has_serving_chart and serving.get("multi_node", {}).get("enabled"):
        lines.extend(multi_node_lines(config))
    if config:
        lines.extend(system_nodes_lines(config))
        lines.extend(cost_lines(config))
        lines.extend(f"  WARNING: {warning}" for warning in config_warnings(config))
    return lines


def system_nodes_lines(recorded: dict[str, Any]) -> list[str]:
    """What the system pods request against the system nodes' allocatable (gennstack.system_capacity)."""
    from gennstack.config import GenNStackConfig
    from gennstack.config_base import frozen
    from gennstack.system_capacity import summary_line, system_fit

    try:
        config = GenNStackConfig.model_validate(frozen(recorded), strict=False)
        return [f"  {summary_line(system_fit(config))}"]
    except (ValueError, KeyError) as exc:
        return [f"  System nodes: not computed ({str(exc).splitlines()[0]})"]


def cost_lines(recorded: dict[str, Any]) -> list[str]:
    """The hourly range per generation and in total (gennstack.cost), from the recorded config and the bundled prices."""
    from gennstack.config import GenNStackConfig
    from gennstack.config_base import frozen
    from gennstack.cost.model import hourly_cost
    from gennstack.cost.prices import DEFAULT_REGION, PriceError, load_table
    from gennstack.cost.report import money, spot_label

    try:
        # CloudFormation metadata holds floats as strings: lax validation turns them back.
        config = GenNStackConfig.model_validate(frozen(recorded), strict=False)
    except ValueError as exc:
        return [f"  Cost: not computed (the recorded config does not load: {str(exc).splitlines()[0]})"]
    region = config.region or DEFAULT_REGION
    try:
        table = load_table(region)
    except PriceError:
        return [f"  Cost: no bundled prices for {region}: run `gennstack cost --live`"]
    breakdown = hourly_cost(config, table)
    lines = []
    for name, layout in breakdown.layouts.items():
        spot, od = breakdown.total(name)
        lines.append(f"  Cost {name}: {money(spot)}-{money(od)}/h, {layout.nodes} x {layout.instance_type}")
    lines.extend(f"  Cost {what.split(' ')[1]}: not priced ({why})" for what, why in breakdown.unpriced)
    spot, od = breakdown.total()
    where = region if config.region else f"{region} (no region in config)"
    prices_date = table.on_demand_price(next(iter(breakdown.layouts.values())).instance_type).as_of if breakdown.layouts else table.oldest()
    lines.append(f"  Cost per hour: {money(spot)}-{money(od)} ({spot_label(table)} to on-demand), always-on, {where} "
                 f"list prices as of {prices_date.isoformat()}; details: gennstack cost")
    return lines


def multi_node_lines(recorded: dict[str, Any]) -> list[str]:
    """serving.multi_node's model: its groups' layout, image, memory per GPU (gennstack.serving.capacity),
    cost per hour (gennstack.cost), staged gate, and what a reclaim costs (docs/serving.md)."""
    from gennstack.config import GenNStackConfig
    from gennstack.config_base import frozen
    from gennstack.cost.model import hourly_cost
    from gennstack.cost.prices import DEFAULT_REGION, PriceError, load_table
    from gennstack.cost.report import money
    from gennstack.instances import INSTANCE_TYPES
    from gennstack.serving.multinode import multi_node_plan
    from gennstack.serving.multinode_gateway import multi_node_pool
    from gennstack.serving.values import MULTI_NODE_STAGED_MARKER
    from gennstack.storage_layout import model_prefix

    try:
        config = GenNStackConfig.model_validate(frozen(recorded), strict=False)
    except ValueError as exc:
        return [f"  Multi-node: not described (the recorded config does not load: {str(exc).splitlines()[0]})"]
    m = config.serving.multi_node
    pool = multi_node_pool(m)
    gpus = INSTANCE_TYPES[m.instance_type].accelerators * m.nodes_per_replica
    lines = [
        f"  Multi-node {m.served_model_name}: {m.model_id} @ {m.model_revision}: {m.replicas} group(s) (LeaderWorkerSet "
        f"{pool}, one group = one replica) of {m.nodes_per_replica} x {m.instance_type} ({gpus} GPUs), TP "
        f"{m.tensor_parallel_size} x PP {m.pipeline_parallel_size} over Ray; gateway backend {pool}-serve (the leaders)",
        f"    Image: {m.image or SUPPORT[m.generation].image + ' + Ray (built from assets/images/g6e-vllm-ray)'}",
        f"    Memory: {summary_line(multi_node_plan(m))} (the heaviest pipeline stage)",
    ]
    region = config.region or DEFAULT_REGION
    try:
        spot, od = hourly_cost(config, load_table(region)).total("multi_node")
        nodes = m.replicas * m.nodes_per_replica
        lines.append(f"    Cost: {money(spot)}-{money(od)}/h (spot estimate to on-demand, {region}), {nodes} x {m.instance_type} "
                     f"with root volumes; one group {money(spot / m.replicas)}-{money(od / m.replicas)}/h")
    except PriceError:
        lines.append(f"    Cost: no bundled prices for {region}: run `gennstack cost --live`")
    what = model_prefix(m.model_id, m.model_revision)
    now = ("staging on: the gate opens when it finishes, then turn staging off" if config.serving.staging
           else "staging off: deploy with serving.staging: true")
    lines.append(f"    Staged gate: no group pod until ConfigMap {MULTI_NODE_STAGED_MARKER} records {what} (leaders and "
                 f"workers wait, scheduling-gated); its stage Job records it and opens the gate, no deploy needed; {now}")
    lines.append(f"    Reclaim: losing any member (a spot reclaim of one of its {m.nodes_per_replica} nodes) recreates the "
                 f"whole group (RecreateGroupOnPodRestart): one replica, {m.nodes_per_replica} nodes' worth, down until "
                 f"its members are back; one group per zone, so one zone's reclaim takes at most one")
    return lines


def gateway_tls_lines(gateway: dict[str, Any], region: str | None) -> list[str]:
    """Where TLS ends and, when it ends at Envoy, how clients get the CA to trust (docs/gateway.md)."""
    certificate_arn = gateway.get("load_balancer", {}).get("certificate_arn")
    if certificate_arn:
        return [f"    HTTPS on 443: TLS ends at the NLB (ACM {certificate_arn}), re-encrypted to Envoy"]
    suffix = "amazonaws.com.cn" if (region or "").startswith("cn-") else "amazonaws.com"
    names = [nlb_dns_wildcard(region or "<region>", suffix), in_cluster_dns_wildcard(),
             *gateway.get("tls", {}).get("hostnames", [])]
    namespace = gateway.get("namespace", "gennstack-gateway")
    return [
        f"    HTTPS on 443: TLS ends at Envoy, certificate from the gateway's own CA for {', '.join(names)}",
        f"    CA for clients: kubectl get configmap -n {namespace} {CA_CONFIGMAP} -o jsonpath='{{.data.ca\\.crt}}' > gennstack-ca.pem",
    ]


def resume_lines(gateway: dict[str, Any], generations: list[str]) -> list[str]:
    """Stream resume (docs/gateway.md, "Stream resume in the cluster"): the generations whose broken streams
    the relay resumes, and for each other enabled one why not (gennstack/gateway/resume_support.py)."""
    settings = ResumeSettings.model_validate(frozen(gateway.get("resume", {})))
    if not settings.enabled:
        return ["    stream resume: off (gateway.resume.enabled is false)"]
    on = [g for g in generations if settings.reason_off(g) is None]
    lines = [f"    stream resume: {settings.replicas} relays between the public and the routing Gateway; "
             f"on for {', '.join(on) or 'no generation'}"]
    lines += [f"    stream resume off for {g}: {settings.reason_off(g)}" for g in generations if g not in on]
    return lines


def image_line(gen_name: str, section: dict[str, Any]) -> str:
    """The image a generation runs and its Neuron release (gennstack.serving.support), from the recorded config."""
    row = SUPPORT[gen_name]
    image = section.get("image")
    if gen_name == "g6e":
        return f"Image: {image or row.image} (CUDA, vLLM {row.vllm})"
    release = effective_release(gen_name, image, section.get("neuron_release"))
    if image:
        shown = image
    elif gen_name == "inf2":
        shown = f"{row.image} + Ray Serve (built from assets/images/inf2-ray-serve)"
    else:
        shown = row.image
    plugin = f", vLLM {row.vllm} with vllm-neuron {row.plugin}" if not image else ""
    return f"Image: {shown} (Neuron {release}{plugin})"


def staged_gate_line(gen_name: str, generation: dict[str, Any], staging: bool) -> str:
    """Whom a generation's servers and warm spares wait for before they request accelerator nodes
    (the chart's `<gen>.staged` gate, docs/serving.md), and what opens it."""
    what = f"{generation.get('model_id')}/{generation.get('model_revision')}/"
    if gen_name != "g6e":
        what += " and its compiled artifacts"
    jobs = "stage Job records it and opens" if gen_name == "g6e" else "stage and compile Jobs record it, the compile Job opens"
    if staging:
        now = "staging on: the gate opens when they finish, then turn staging off"
        if gen_name != "g6e":
            now += " (a compile Job still running then is kept until it ends)"
    else:
        now = "staging off: deploy with serving.staging: true"
    return (f"Staged gate: no {gen_name} node until ConfigMap {STAGED_MARKERS[gen_name]} records {what} (servers and warm "
            f"spares wait, scheduling-gated); the {jobs} the gate, no deploy needed; {now}")


def capacity_line(gen_name: str, generation: dict[str, Any], section: dict[str, Any]) -> str | None:
    """Layout and bytes per NeuronCore/GPU (gennstack.serving.capacity), from the recorded config."""
    model = MODELS.get(generation.get("model_id", ""))
    if model is None or "max_num_seqs" not in section:
        return None
    # Template metadata may hold numbers as strings (CDK renders metadata values): convert back.
    seqs, length = int(section["max_num_seqs"]), int(section["max_model_len"])
    if gen_name == "g6e":
        layout = Layout("g6e", int(section["gpus_per_replica"]), seqs, length, float(section["gpu_memory_utilization"]))
    else:
        layout = Layout(gen_name, int(section["tensor_parallel_size"]), seqs, length,
                        vision_tensor_parallel_size=int(section.get("vision_tensor_parallel_size", 0)))
    return summary_line(plan(layout, model))


def node_class_lines(pools: list[dict[str, Any]]) -> list[str]:
    """One line per EC2NodeClass the pools use: whether its nodes pull images with nodeadm's fast image pull."""
    classes: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    for pool in pools:
        template = pool["spec"]["template"]
        requirements = {r["key"]: r.get("values", []) for r in template["spec"]["requirements"]}
        classes.setdefault(template["spec"]["nodeClassRef"]["name"], (
            template["metadata"]["labels"].get("gennstack.io/generation"),
            tuple(requirements.get("node.kubernetes.io/instance-type", ())),
        ))
    return [fast_image_pull_line(name, generation, types) for name, (generation, types) in classes.items()]


def node_pools(template: dict[str, Any]) -> list[dict[str, Any]]:
    """Karpenter NodePools among the manifests the stack applies (manifests without tokens only)."""
    pools = []
    for resource in _of_type(template, "Custom::AWSCDK-EKS-KubernetesResource"):
        manifest = resource["Properties"].get("Manifest")
        if isinstance(manifest, str):
            pools.extend(m for m in json.loads(manifest) if m.get("kind") == "NodePool")
    return pools


def summarize(cdk_out: Path) -> str:
    stacks = load_assembly(cdk_out)
    lines = [f"Cloud assembly {cdk_out}: {len(stacks)} stack(s)"]
    for name, template in sorted(stacks.items()):
        lines.extend(summarize_stack(name, template))
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    try:
        print(summarize(Path(args.cdk_out)))
    except SummaryError as exc:
        print(f"gennstack summary: {exc}")
        return 1
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "summary",
        help="print what a synthesized cloud assembly (cdk.out) would deploy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cdk-out", default="cdk.out", help="cloud assembly folder (default: cdk.out)")
    parser.set_defaults(func=_run)
