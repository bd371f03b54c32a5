"""Karpenter's interruption queue: each EventBridge pattern matches AWS's sample event and not a near miss.

The matching is EventBridge's semantics as moto implements them (rule -> SQS target, offline).
"""

from __future__ import annotations

import pytest

from gennstack_infra.components.karpenter_interruption import INTERRUPTION_PATTERNS
from tests.eventbridge import delivered, sample
from tests.support import Synth

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


def test_every_rule_has_a_sample() -> None:
    assert set(INTERRUPTION_PATTERNS) == set(SAMPLES) == set(NEAR_MISSES)


@pytest.mark.parametrize("rule_id", sorted(SAMPLES))
def test_pattern_matches_documented_event(rule_id: str) -> None:
    assert delivered(INTERRUPTION_PATTERNS[rule_id], sample(SAMPLES[rule_id])) == 1


@pytest.mark.parametrize("rule_id", sorted(NEAR_MISSES))
def test_pattern_rejects_near_miss(rule_id: str) -> None:
    assert delivered(INTERRUPTION_PATTERNS[rule_id], sample(SAMPLES[rule_id], **NEAR_MISSES[rule_id])) == 0


def test_detail_types_are_spelled_as_aws_emits_them() -> None:
    detail_types = sorted(p["detail-type"][0] for p in INTERRUPTION_PATTERNS.values())
    assert detail_types == [
        "AWS Health Event",
        "EC2 Capacity Reservation Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
        "EC2 Spot Instance Interruption Warning",
    ]


def test_queue_accepts_messages_only_from_its_own_rules(synth: Synth) -> None:
    """Every Allow in the queue's policy is conditioned on one of its rules' ARNs (aws:SourceArn).

    Karpenter v1.14.1's getting-started CloudFormation (``KarpenterInterruptionQueuePolicy``) allows
    events.amazonaws.com and sqs.amazonaws.com SendMessage with no condition: any account's rule
    could then feed Karpenter fake interruptions. CDK's SqsQueue target adds the conditioned grant
    per rule (aws-cdk-lib 2.275.0 aws-events-targets/lib/sqs.js)."""
    (policy,) = [p for k, p in synth.resources("AWS::SQS::QueuePolicy").items() if k.startswith("KarpenterInterruption")]
    rules = {k for k in synth.resources("AWS::Events::Rule") if k.startswith("KarpenterInterruption")}
    assert len(rules) == len(INTERRUPTION_PATTERNS)
    allows = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    sources = set()
    for statement in allows:
        assert statement["Principal"] == {"Service": "events.amazonaws.com"}, statement
        assert set(statement["Condition"]) == {"ArnEquals"}, statement
        (arn,) = statement["Condition"]["ArnEquals"].values()
        assert list(statement["Condition"]["ArnEquals"]) == ["aws:SourceArn"]
        sources.add(arn["Fn::GetAtt"][0])
    assert sources == rules
