"""What the stack's AWS FIS spot-interruption experiment templates hold, as plain data.

``gennstack_infra/components/drills.py`` turns these into ``AWS::FIS::ExperimentTemplate`` resources and IAM roles;
``gennstack drill`` finds a template again by :func:`template_tags`. Nothing here calls AWS.

Relies on (AWS FIS user guide, actions reference, ``aws:ec2:send-spot-instance-interruptions``): the
action's target key is ``SpotInstances`` of resource type ``aws:ec2:spot-instance``; its one parameter
``durationBeforeInterruption`` (ISO 8601, 2 to 15 minutes) is the time until EC2 reclaims the
instance; EC2 sends the interruption warning two minutes before that, and a rebalance recommendation
at the start when the duration is longer than two minutes. For a node lost without warning
(``aws:ec2:terminate-instances``, the same reference): target key ``Instances`` of resource type
``aws:ec2:instance``, no parameter, permission ``ec2:TerminateInstances`` (and ``ec2:DescribeInstances``
to resolve the target); EC2 terminates the instance at once, no notice, no rebalance recommendation. And (aws/karpenter-provider-aws v1.14.1,
``pkg/utils/utils.go`` ``GetTags``): Karpenter tags every instance it launches with
``karpenter.sh/nodepool=<NodePool>`` and ``eks:eks-cluster-name=<cluster>``.
"""

from __future__ import annotations

from typing import Any

ACTION_ID = "aws:ec2:send-spot-instance-interruptions"
RESOURCE_TYPE = "aws:ec2:spot-instance"
TARGET_KEY = "SpotInstances"
NODEPOOL_TAG = "karpenter.sh/nodepool"
CLUSTER_TAG = "eks:eks-cluster-name"

# Tags on each template: how `gennstack drill` finds the one for a cluster, generation and count.
DRILL_TAG = "gennstack.io/drill"
DRILL_KIND = "spot-interruption"
CLUSTER_NAME_TAG = "gennstack.io/cluster"
GENERATION_TAG = "gennstack.io/generation"
NODES_TAG = "gennstack.io/nodes"
# What a template interrupts: absent (templates from before it existed) or "nodes", any running spot
# nodes of the pool; "multinode", one member node of a multi-node group (:func:`multinode_template`);
# "no-warning", one running spot node of the pool terminated with no notice (:func:`no_warning_template`).
TARGET_TAG = "gennstack.io/target"
TARGETS = ("nodes", "multinode", "no-warning")
TERMINATE_ACTION_ID = "aws:ec2:terminate-instances"
INSTANCE_RESOURCE_TYPE = "aws:ec2:instance"
INSTANCES_TARGET_KEY = "Instances"
# Not part of the match: where `gennstack drill` reads the interruption handler's log lines afterwards.
HANDLER_LOG_GROUP_TAG = "gennstack.io/handler-log-group"
# AWS FIS tag values: at most 256 characters.
MAX_TAG_VALUE = 256


def template_tags(*, cluster_name: str, generation: str, nodes: int, target: str = "nodes") -> dict[str, str]:
    """The tags that identify a drill template; ``target`` "nodes" adds none (the templates as they
    always were), "multinode" adds :data:`TARGET_TAG`."""
    return {
        DRILL_TAG: DRILL_KIND,
        CLUSTER_NAME_TAG: cluster_name,
        GENERATION_TAG: generation,
        NODES_TAG: str(nodes),
        **({TARGET_TAG: target} if target != "nodes" else {}),
    }


def multinode_template(
    *,
    cluster_name: str,
    generation: str,
    pool: str,
    instance_type: str,
    minutes_before_interruption: int,
    role_arn: str,
    stop_alarm_arns: list[str],
    handler_log_group: str,
) -> dict[str, Any]:
    """``AWS::FIS::ExperimentTemplate`` properties: interrupt one member node of a multi-node group.

    The members run on the generation's NodePool, each alone on a node of ``serving.multi_node.instance_type``
    (the chart's required node affinity, one pod a node taking all its GPUs), so the target is one
    running spot node of ``pool`` of that type: the resource filter ``InstanceType`` (a path of
    DescribeInstances' instance, as ``State.Name``). EC2 tags say nothing of pods: where the
    generation's single-node replicas may also run on that type, the node FIS picks can hold those
    instead; the handler's lines afterwards say which (a drained group, or drained pods).
    """
    properties = experiment_template(
        cluster_name=cluster_name, generation=generation, pool=pool, nodes=1,
        minutes_before_interruption=minutes_before_interruption, role_arn=role_arn,
        stop_alarm_arns=stop_alarm_arns, handler_log_group=handler_log_group,
    )
    [target] = properties["Targets"].values()
    target["Filters"] = [*target["Filters"], {"Path": "InstanceType", "Values": [instance_type]}]
    properties["Targets"] = {f"{pool}-multinode-member": target}
    properties["Actions"]["interrupt"]["Targets"] = {TARGET_KEY: f"{pool}-multinode-member"}
    properties["Description"] = (
        f"GenNStack drill: spot interruption of one multi-node group member ({instance_type}) of NodePool {pool} "
        f"({minutes_before_interruption} min to reclaim)"
    )
    properties["Tags"] = {**properties["Tags"], TARGET_TAG: "multinode"}
    return properties


def no_warning_template(
    *,
    cluster_name: str,
    generation: str,
    pool: str,
    role_arn: str,
    stop_alarm_arns: list[str],
    handler_log_group: str,
) -> dict[str, Any]:
    """``AWS::FIS::ExperimentTemplate`` properties: terminate one running node of ``pool`` with no notice.

    What drain routing cannot save and stream resume must (a node lost to hardware, a kernel panic, a
    reclaim that came without its warning): no rebalance recommendation, no two-minute warning, the
    instance goes at once. The target is the same tagged spot NodePool nodes as :func:`experiment_template`'s,
    as an ``aws:ec2:instance`` (the terminate action's resource type), one of them.
    """
    properties = experiment_template(
        cluster_name=cluster_name, generation=generation, pool=pool, nodes=1, minutes_before_interruption=2,
        role_arn=role_arn, stop_alarm_arns=stop_alarm_arns, handler_log_group=handler_log_group,
    )  # the role, stop conditions, options and tags of the one-node template; its own target and action
    [target] = properties["Targets"].values()
    name = f"{pool}-node"
    properties["Targets"] = {name: {**target, "ResourceType": INSTANCE_RESOURCE_TYPE}}
    properties["Actions"] = {"terminate": {
        "ActionId": TERMINATE_ACTION_ID,
        "Description": "terminate at once: no rebalance recommendation, no interruption warning",
        "Targets": {INSTANCES_TARGET_KEY: name},
    }}
    properties["Description"] = f"GenNStack drill: one {generation} node of NodePool {pool} terminated without warning"
    properties["Tags"] = {**properties["Tags"], TARGET_TAG: "no-warning"}
    return properties


def target_tags(*, cluster_name: str, pool: str) -> dict[str, str]:
    """The tags that pick one generation's spot NodePool nodes of this cluster (and nothing else)."""
    return {NODEPOOL_TAG: pool, CLUSTER_TAG: cluster_name}


def experiment_template(
    *,
    cluster_name: str,
    generation: str,
    pool: str,
    nodes: int,
    minutes_before_interruption: int,
    role_arn: str,
    stop_alarm_arns: list[str],
    handler_log_group: str,
) -> dict[str, Any]:
    """``AWS::FIS::ExperimentTemplate`` properties: interrupt ``nodes`` running spot nodes of ``pool``.

    FIS fixes a target's selection mode in the template (StartExperiment takes no target override),
    so each node count is its own template. ``EmptyTargetResolutionMode: fail``: a drill with no spot
    node to interrupt fails with a reason instead of "completing" having done nothing. Its tags are
    :func:`template_tags` and :data:`HANDLER_LOG_GROUP_TAG`, the interruption handler's log group.
    """
    target = f"{pool}-spot-nodes"
    return {
        "Description": (
            f"GenNStack drill: spot interruption of {nodes} {generation} node(s) of NodePool {pool} "
            f"({minutes_before_interruption} min to reclaim)"
        ),
        "RoleArn": role_arn,
        "Targets": {
            target: {
                "ResourceType": RESOURCE_TYPE,
                "ResourceTags": target_tags(cluster_name=cluster_name, pool=pool),
                "Filters": [{"Path": "State.Name", "Values": ["running"]}],
                "SelectionMode": f"COUNT({nodes})",
            }
        },
        "Actions": {
            "interrupt": {
                "ActionId": ACTION_ID,
                "Description": "rebalance recommendation now (above 2 minutes), warning 2 minutes before the reclaim",
                "Parameters": {"durationBeforeInterruption": f"PT{minutes_before_interruption}M"},
                "Targets": {TARGET_KEY: target},
            }
        },
        "StopConditions": [{"Source": "aws:cloudwatch:alarm", "Value": arn} for arn in stop_alarm_arns],
        "ExperimentOptions": {"AccountTargeting": "single-account", "EmptyTargetResolutionMode": "fail"},
        "Tags": {
            **template_tags(cluster_name=cluster_name, generation=generation, nodes=nodes),
            HANDLER_LOG_GROUP_TAG: handler_log_group,
        },
    }


def role_statements(*, cluster_name: str, pool: str, partition: str, region: str, account: str) -> list[dict[str, Any]]:
    """The FIS role's permissions: interrupt, or terminate without warning (:func:`no_warning_template`),
    only instances tagged as this cluster's ``pool``.

    ``ec2:DescribeInstances`` (FIS resolves the target's tags with it) has no resource-level
    permissions; it is read-only and limited to the stack's region.
    """
    conditions = {f"ec2:ResourceTag/{key}": value for key, value in target_tags(cluster_name=cluster_name, pool=pool).items()}
    return [
        {
            "Sid": "InterruptThisPoolsSpotNodes",
            "Effect": "Allow",
            "Action": ["ec2:SendSpotInstanceInterruptions", "ec2:TerminateInstances"],
            "Resource": f"arn:{partition}:ec2:{region}:{account}:instance/*",
            "Condition": {"StringEquals": conditions},
        },
        {
            "Sid": "ResolveTargets",
            "Effect": "Allow",
            "Action": "ec2:DescribeInstances",
            "Resource": "*",
            "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
        },
    ]
