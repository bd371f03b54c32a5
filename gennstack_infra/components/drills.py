"""Spot drills: AWS FIS experiment templates that interrupt a generation's spot nodes on purpose.

Created only with ``drills.enabled``. Per enabled generation: one IAM role that FIS assumes, allowed
to send spot interruptions to, or terminate, only instances tagged as this cluster's spot NodePool of
that generation, one template per node count (1 .. ``drills.max_nodes``), one that terminates a node
without warning (``gennstack drill --target no-warning``), plus, with
``serving.multi_node`` on, one that interrupts a member node of a multi-node group (same role: the
members run on the generation's spot NodePool). ``gennstack drill`` starts
one (docs/spot-drills.md). What each template holds: ``gennstack.drill.templates``; a tag names the
interruption handler's log group, where ``gennstack drill`` reads the handler's lines afterwards.

Stop conditions: the interruption handler's alarms (its errors, its dead-letter queue). The drill
exists to exercise the handler and Karpenter; once the handler fails, the drill measures a broken
system, so FIS stops it. The gateway has no CloudWatch metric to alarm on (Envoy's metrics stay in
the cluster). FIS cannot withdraw a notice already sent: a stop keeps the experiment from going on,
it does not save an instance already warned.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Aws, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_fis as fis
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs

from constructs import Construct
from gennstack.config import GenNStackConfig
from gennstack.drill.templates import experiment_template, multinode_template, no_warning_template, role_statements

_IDS = {"inf2": "Inf2", "trn2": "Trn2", "g6e": "G6e"}


class SpotDrills(Construct):
    """FIS roles and experiment templates; ``templates[(generation, nodes)]``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: GenNStackConfig,
        stop_alarms: list[cloudwatch.IAlarm],
        handler_log_group: logs.ILogGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        from gennstack_infra.components.node_pools import POOL_NAMES

        drills = config.drills
        self.roles: dict[str, iam.Role] = {}
        self.templates: dict[tuple[str, int], fis.CfnExperimentTemplate] = {}
        self.multinode_template: fis.CfnExperimentTemplate | None = None
        self.no_warning_templates: dict[str, fis.CfnExperimentTemplate] = {}
        multi_node = config.serving.multi_node
        for generation in config.generations.enabled():
            pool = POOL_NAMES[generation]
            role = iam.Role(
                self,
                f"{_IDS[generation]}Role",
                assumed_by=iam.ServicePrincipal(
                    "fis.amazonaws.com",
                    conditions={
                        "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                        "ArnLike": {"aws:SourceArn": f"arn:{Aws.PARTITION}:fis:{Aws.REGION}:{Aws.ACCOUNT_ID}:experiment/*"},
                    },
                ),
                description=f"GenNStack drills: FIS may interrupt {pool} spot nodes of {config.cluster_name} only",
                inline_policies={
                    "SpotInterruptions": iam.PolicyDocument.from_json(
                        {
                            "Version": "2012-10-17",
                            "Statement": role_statements(
                                cluster_name=config.cluster_name, pool=pool,
                                partition=Aws.PARTITION, region=Aws.REGION, account=Aws.ACCOUNT_ID,
                            ),
                        }
                    )
                },
            )
            Validations.of(role).acknowledge(
                Acknowledgment(
                    id="AwsSolutions-IAM5[Resource::*]",
                    reason="ec2:DescribeInstances, which FIS needs to resolve the target's tags, has no "
                    "resource-level permissions; it is read-only and limited to this region. The writes, "
                    "ec2:SendSpotInstanceInterruptions and ec2:TerminateInstances, are limited to instances "
                    "tagged with this cluster's name and this generation's spot NodePool.",
                ),
                Acknowledgment(
                    id="AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:instance/*]",
                    reason="Karpenter's instance IDs are not known at deploy time; the statement's "
                    "conditions require the karpenter.sh/nodepool and eks:eks-cluster-name tags of this "
                    "generation's spot NodePool.",
                ),
            )
            self.roles[generation] = role
            for nodes in range(1, drills.max_nodes + 1):
                properties = experiment_template(
                    cluster_name=config.cluster_name,
                    generation=generation,
                    pool=pool,
                    nodes=nodes,
                    minutes_before_interruption=drills.minutes_before_interruption,
                    role_arn=role.role_arn,
                    stop_alarm_arns=[alarm.alarm_arn for alarm in stop_alarms],
                    handler_log_group=handler_log_group.log_group_name,
                )
                template = fis.CfnExperimentTemplate(
                    self,
                    f"{_IDS[generation]}Nodes{nodes}",
                    description=properties["Description"],
                    role_arn=properties["RoleArn"],
                    targets={},
                    stop_conditions=[],
                    tags=properties["Tags"],
                )
                # The plain-data properties as they are (tested on their own): jsii's typed structs
                # would only restate them.
                for key in ("Targets", "Actions", "StopConditions", "ExperimentOptions"):
                    template.add_property_override(key, properties[key])
                self.templates[(generation, nodes)] = template
            self.no_warning_templates[generation] = _template(self, f"{_IDS[generation]}NoWarning", no_warning_template(
                cluster_name=config.cluster_name, generation=generation, pool=pool, role_arn=role.role_arn,
                stop_alarm_arns=[alarm.alarm_arn for alarm in stop_alarms],
                handler_log_group=handler_log_group.log_group_name,
            ))
            if multi_node.enabled and multi_node.generation == generation:
                self.multinode_template = _template(self, f"{_IDS[generation]}MultiNodeMember", multinode_template(
                    cluster_name=config.cluster_name, generation=generation, pool=pool,
                    instance_type=multi_node.instance_type,
                    minutes_before_interruption=drills.minutes_before_interruption, role_arn=role.role_arn,
                    stop_alarm_arns=[alarm.alarm_arn for alarm in stop_alarms],
                    handler_log_group=handler_log_group.log_group_name,
                ))


def _template(scope: Construct, construct_id: str, properties: dict) -> fis.CfnExperimentTemplate:
    template = fis.CfnExperimentTemplate(
        scope, construct_id, description=properties["Description"], role_arn=properties["RoleArn"],
        targets={}, stop_conditions=[], tags=properties["Tags"],
    )
    for key in ("Targets", "Actions", "StopConditions", "ExperimentOptions"):
        template.add_property_override(key, properties[key])
    return template
