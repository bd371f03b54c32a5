"""Karpenter's interruption queue: each EventBridge pattern matches AWS's sample event and not a near miss.

The matching is EventBridge's semantics as moto implements them (rule -> SQS target, offline).
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from constructs.karpenter_interruption import INTERRUPTION_PATTERNS

EVENTS = Path(__file__).parent / "events"
SAMPLES = {
    "SpotInterruptionRule": "ec2-spot-instance-interruption-warning.json",
    "RebalanceRule": "ec2-instance-rebalance-recommendation.json",
    "InstanceStateChangeRule": "ec2-instance-state-change-notification.json",
    "ScheduledChangeRule": "aws-health-event-ec2-scheduled-change.json",
    "CapacityReservationInterruptionRule": "ec2-capacity-reservation-instance-interruption-warning.json",
}
# A typo of the kind a widely used blueprint ships ("C2 Instance State-change Notification").
NEAR_MISSES = {
    "SpotInterruptionRule": {"detail-type": "EC2 Spot Instance Interruption warning"},
    "RebalanceRule": {"detail-type": "EC2 Instance Rebalance Recommendations"},
    "InstanceStateChangeRule": {"detail-type": "C2 Instance State-change Notification"},
    "ScheduledChangeRule": {"source": "aws.ec2"},
    "CapacityReservationInterruptionRule": {"detail-type": "EC2 Capacity Reservation Interruption Warning"},
}


def _delivered(pattern: dict, event: dict) -> int:
    """How many messages EventBridge delivers to a queue behind a rule with ``pattern``."""
    with mock_aws():
        events = boto3.client("events", region_name="us-east-2")
        sqs = boto3.client("sqs", region_name="us-east-2")
        queue_url = sqs.create_queue(QueueName="karpenter")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="rule", EventPattern=json.dumps(pattern))
        events.put_targets(Rule="rule", Targets=[{"Id": "queue", "Arn": queue_arn}])
        result = events.put_events(
            Entries=[
                {
                    "Source": event["source"],
                    "DetailType": event["detail-type"],
                    "Detail": json.dumps(event["detail"]),
                    "Resources": event["resources"],
                }
            ]
        )
        assert result["FailedEntryCount"] == 0
        return len(sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", []))


def test_every_rule_has_a_sample() -> None:
    assert set(INTERRUPTION_PATTERNS) == set(SAMPLES) == set(NEAR_MISSES)


@pytest.mark.parametrize("rule_id", sorted(SAMPLES))
def test_pattern_matches_documented_event(rule_id: str) -> None:
    event = json.loads((EVENTS / SAMPLES[rule_id]).read_text())
    assert _delivered(INTERRUPTION_PATTERNS[rule_id], event) == 1


@pytest.mark.parametrize("rule_id", sorted(NEAR_MISSES))
def test_pattern_rejects_near_miss(rule_id: str) -> None:
    event = {**json.loads((EVENTS / SAMPLES[rule_id]).read_text()), **NEAR_MISSES[rule_id]}
    assert _delivered(INTERRUPTION_PATTERNS[rule_id], event) == 0


def test_detail_types_are_spelled_as_aws_emits_them() -> None:
    detail_types = sorted(p["detail-type"][0] for p in INTERRUPTION_PATTERNS.values())
    assert detail_types == [
        "AWS Health Event",
        "EC2 Capacity Reservation Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
        "EC2 Spot Instance Interruption Warning",
    ]
