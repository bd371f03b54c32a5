"""``gennstack diagram``: a Mermaid architecture diagram drawn from the synthesized template.

The README embeds its output between ``<!-- diagram:start -->`` and ``<!-- diagram:end -->``;
``tests/test_docs.py`` regenerates it from the default synth and fails if the README drifted.
Update it with ``gennstack diagram --cdk-out cdk.out --update-readme README.md``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from gennstack.summary import CONFIG_METADATA_KEY, SummaryError, node_pools, endpoint_service_name, load_assembly

START, END = "<!-- diagram:start -->", "<!-- diagram:end -->"


def _count(template: dict[str, Any], resource_type: str) -> int:
    return sum(1 for r in template.get("Resources", {}).values() if r.get("Type") == resource_type)


def mermaid(template: dict[str, Any]) -> str:
    """A flowchart of one GenNStack template: what talks to what, and where data lives."""
    resources = template.get("Resources", {})
    config = template.get("Metadata", {}).get(CONFIG_METADATA_KEY, {})
    network = config.get("network", {})
    endpoints = sorted(
        endpoint_service_name(r)
        for r in resources.values()
        if r.get("Type") == "AWS::EC2::VPCEndpoint" and r["Properties"].get("VpcEndpointType") != "Gateway"
    )
    vpcs = [r for r in resources.values() if r.get("Type") == "AWS::EC2::VPC"]
    cidr = vpcs[0]["Properties"]["CidrBlock"] if vpcs else "?"
    azs = network.get("az_count", "?")
    lines = [
        "flowchart LR",
        f'  subgraph VPC["VPC {cidr} across {azs} AZs"]',
        f'    PUB["{azs} public subnets /{network.get("public_subnet_mask", "?")}'
        f'<br/>{_count(template, "AWS::EC2::NatGateway")} NAT gateway(s)"]',
        f'    PRIV["{azs} private subnets /{network.get("private_subnet_mask", "?")}'
        '<br/>nodes and pods (VPC CNI)"]',
        '    S3GW["S3 gateway endpoint"]',
        f'    IEP["interface endpoints<br/>{", ".join(endpoints) or "none"}"]',
        "  end",
        '  MODELS[("models bucket<br/>KMS, versioned")]',
        '  CACHE[("Neuron compile-cache bucket<br/>KMS, versioned")]',
        '  LOGS[("access-log bucket")]',
        "  PRIV -->|egress| PUB",
        "  PRIV --> S3GW",
        "  PRIV --> IEP",
        "  S3GW -->|weights| MODELS",
        "  S3GW -->|compiled artifacts| CACHE",
        "  MODELS -.->|access logs| LOGS",
        "  CACHE -.->|access logs| LOGS",
    ]
    if _count(template, "AWS::EC2::FlowLog"):
        lines.append("  VPC -.->|flow logs| LOGS")
    clusters = [r["Properties"] for r in resources.values() if r.get("Type") == "AWS::EKS::Cluster"]
    if clusters:
        # by chart name; the repo's own charts (assets, no chart name) by release
        charts = {
            r["Properties"].get("Chart") or r["Properties"].get("Release"): r["Properties"].get("Version")
            for r in resources.values()
            if r.get("Type") == "Custom::AWSCDK-EKS-HelmChart"
        }
        lines += [
            f'  subgraph EKS["EKS {clusters[0].get("Name")}, Kubernetes {clusters[0].get("Version")}"]',
            '    SYS["system node group (on-demand)<br/>Karpenter, CoreDNS, controllers"]',
            f'    KARP["Karpenter {charts.get("karpenter", "?")}"]',
        ]
        spot_pools = [p for p in node_pools(template) if p["metadata"]["name"] != "general" and not p["metadata"]["name"].endswith("-on-demand")]
        names = {p["metadata"]["name"] for p in node_pools(template)}
        for pool in spot_pools:
            name = pool["metadata"]["name"]
            requirements = {r["key"]: r.get("values", []) for r in pool["spec"]["template"]["spec"]["requirements"]}
            fallback = " + on-demand fallback" if f"{name}-on-demand" in names else ""
            node = "POOL_" + re.sub(r"[^A-Za-z0-9]", "_", name)
            model = next(
                (
                    config.get("serving", {}).get(g_name, {}).get("served_model_name", g.get("model_id"))
                    for g_name, g in config.get("generations", {}).items()
                    if name.endswith(g_name)
                ),
                "?",
            )
            lines.append(
                f'    {node}["NodePool {name}<br/>serves {model}<br/>'
                f'{", ".join(requirements.get("node.kubernetes.io/instance-type", []))}<br/>spot{fallback}"]'
            )
            lines.append(f"    KARP --> {node}")
        lines += [
            "  end",
            '  EB["EventBridge: spot warnings, rebalance,<br/>state changes, health events"] --> SQS[("interruption queue")]',
            "  SQS --> KARP",
            "  EKS -.->|nodes and pods| PRIV",
        ]
        if "gennstack-gateway" in charts:
            lines += [
                '  APPS["apps (OpenAI API, API key)"] --> NLB["NLB"] --> GW["Envoy AI Gateway<br/>route by model, 80/20 split,<br/>failover, rate limits"]',
                "  GW --> EKS",
            ]
        if any(k.startswith("InterruptionHandlerFunction") for k in resources):
            lines += [
                '  EB --> IH["interruption handler (Lambda)"]',
                "  IH -->|scales warm spares| EKS",
                '  IH --> DDB[("interruption records")]',
            ]
    else:
        for name, generation in config.get("generations", {}).items():
            if generation.get("enabled"):
                node = f"GEN_{re.sub(r'[^A-Za-z0-9]', '_', name)}"
                lines.append(
                    f'  {node}["{name}: {generation.get("model_id")}<br/>'
                    f'{", ".join(generation.get("instance_types", []))}<br/>(planned: compute layer)"]'
                )
                lines.append(f"  {node} -.-> PRIV")
    return "\n".join(lines)


def readme_block(template: dict[str, Any]) -> str:
    return f"{START}\n```mermaid\n{mermaid(template)}\n```\n{END}"


def update_readme(readme: Path, template: dict[str, Any]) -> bool:
    """Replace the diagram block in ``readme``; True when the file changed."""
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise SummaryError(f"{readme} has no {START} ... {END} block")
    updated = pattern.sub(lambda _: readme_block(template), text)
    if updated != text:
        readme.write_text(updated, encoding="utf-8")
    return updated != text


def _run(args: argparse.Namespace) -> int:
    try:
        template = load_assembly(Path(args.cdk_out))[args.stack]
        if args.update_readme:
            changed = update_readme(Path(args.update_readme), template)
            print(f"{args.update_readme}: {'updated' if changed else 'already up to date'}")
        else:
            print(mermaid(template))
    except KeyError:
        print(f"gennstack diagram: no stack {args.stack!r} in {args.cdk_out}")
        return 1
    except SummaryError as exc:
        print(f"gennstack diagram: {exc}")
        return 1
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diagram",
        help="print a Mermaid architecture diagram of the synthesized stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cdk-out", default="cdk.out", help="cloud assembly folder (default: cdk.out)")
    parser.add_argument("--stack", default="GenNStack", help="stack name (default: GenNStack)")
    parser.add_argument("--update-readme", metavar="README", help="rewrite the diagram block in this file")
    parser.set_defaults(func=_run)
