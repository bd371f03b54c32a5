"""The SQS queue through which EventBridge tells Karpenter about interruptions."""

from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, Duration, Validations
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs

from constructs import Construct

# The EventBridge patterns Karpenter's own getting-started CloudFormation (v1.14) feeds its
# interruption queue, keyed by the same rule IDs. Detail-types are spelled exactly as AWS emits them: a misspelt one matches
# nothing and silently disables that kind of interruption handling (tests check each against a
# documented sample event and a near miss).
INTERRUPTION_PATTERNS: dict[str, dict[str, Any]] = {
    "SpotInterruptionRule": {"source": ["aws.ec2"], "detail-type": ["EC2 Spot Instance Interruption Warning"]},
    "RebalanceRule": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "InstanceStateChangeRule": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance State-change Notification"]},
    # Karpenter reads the EC2 scheduled changes among these itself; its CloudFormation does not
    # narrow the pattern, and neither does GenNStack.
    "ScheduledChangeRule": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
    "CapacityReservationInterruptionRule": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Capacity Reservation Instance Interruption Warning"],
    },
}


class KarpenterInterruptionQueue(Construct):
    """An encrypted, TLS-only queue fed by EventBridge rules, for Karpenter's ``settings.interruptionQueue``.

    Relies on: Karpenter deletes each message it reads, so nothing else may consume this queue
    (GenNStack's own interruption handler has its own rules); messages older than five minutes
    describe instances that are already gone, so retention is short.

    Only these rules may send to it. Each ``SqsQueue`` target grants ``events.amazonaws.com``
    SendMessage with ``ArnEquals aws:SourceArn`` = its rule (aws-cdk-lib 2.275.0
    aws-events-targets/lib/sqs.js, for a queue without a KMS key). Karpenter's getting-started
    CloudFormation (v1.14.1 website/content/en/docs/getting-started/getting-started-with-karpenter/
    cloudformation.yaml, ``KarpenterInterruptionQueuePolicy``) also allows ``events.amazonaws.com``
    and ``sqs.amazonaws.com`` with no condition, which would let any account's EventBridge rule
    feed this queue fake interruptions; GenNStack leaves that statement out.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.queue = sqs.Queue(
            self,
            "Queue",
            retention_period=Duration.minutes(5),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        Validations.of(self.queue).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SQS3",
                reason="Karpenter's interruption queue: a message is only useful within the two-minute "
                "warning, Karpenter also reconciles instance state on its own, so a dead-letter queue "
                "would only hold stale events.",
            )
        )
        self.rules: dict[str, events.Rule] = {}
        for rule_id, pattern in INTERRUPTION_PATTERNS.items():
            rule = events.Rule(
                self,
                rule_id,
                event_pattern=events.EventPattern(source=pattern["source"], detail_type=pattern["detail-type"]),
            )
            rule.add_target(targets.SqsQueue(self.queue))
            self.rules[rule_id] = rule

    def grant_consume(self, grantee: iam.IGrantable) -> None:
        """What Karpenter's controller needs: receive, delete and look up the queue."""
        self.queue.grant_consume_messages(grantee)
