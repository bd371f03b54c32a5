"""EventBridge pattern matching, offline: a rule with the pattern, an SQS target, one event, through moto."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws

EVENTS = Path(__file__).parent / "events"


def sample(name: str, **overrides: Any) -> dict[str, Any]:
    """An AWS-documented sample event from tests/events, with top-level keys overridden."""
    return {**json.loads((EVENTS / name).read_text(encoding="utf-8")), **overrides}


def delivered(pattern: dict[str, Any], event: dict[str, Any]) -> int:
    """How many messages EventBridge delivers to a queue behind a rule with ``pattern`` for ``event``."""
    with mock_aws():
        events = boto3.client("events", region_name="us-east-2")
        sqs = boto3.client("sqs", region_name="us-east-2")
        queue_url = sqs.create_queue(QueueName="target")["QueueUrl"]
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
