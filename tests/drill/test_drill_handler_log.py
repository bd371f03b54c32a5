"""gennstack.drill.handler_log on its own: resolved targets (Stubber, paginated), filter patterns, markers."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gennstack.drill.config import MAX_DRILL_NODES
from gennstack.drill.handler_log import (
    MAX_FILTER_PATTERN,
    filter_patterns,
    handler_events,
    instance_id_of,
    markers_from_events,
    resolved_instances,
)

REGION = "us-east-2"
LONGEST = "i-0123456789abcdef0"  # 17 hex digits, the longest EC2 instance ID


def _client(service: str) -> tuple[Any, Stubber]:
    client = boto3.Session(region_name=REGION, aws_access_key_id="AKIAIOSFODNN7EXAMPLE",
                           aws_secret_access_key="secret").client(service, region_name=REGION)
    stubber = Stubber(client)
    stubber.activate()
    return client, stubber


def test_resolved_instances_follow_pages_and_take_arns_or_ids_of_spot_targets_only() -> None:
    fis, stubber = _client("fis")
    stubber.add_response("list_experiment_resolved_targets", {
        "resolvedTargets": [
            {"resourceType": "aws:ec2:spot-instance", "targetName": "gen3-g6e-spot-nodes",
             "targetInformation": {"arn": f"arn:aws:ec2:{REGION}:123456789012:instance/i-0a1b2c3d4e5f60718"}},
            {"resourceType": "aws:ec2:instance", "targetName": "other",
             "targetInformation": {"arn": f"arn:aws:ec2:{REGION}:123456789012:instance/i-0000000000000000a"}},
        ],
        "nextToken": "page-2",
    }, {"experimentId": "EXP1"})
    stubber.add_response("list_experiment_resolved_targets", {
        "resolvedTargets": [
            {"resourceType": "aws:ec2:spot-instance", "targetName": "gen3-g6e-spot-nodes",
             "targetInformation": {"identifier": "i-1234abcd", "zone": "us-east-2a"}},
            {"resourceType": "aws:ec2:spot-instance", "targetName": "gen3-g6e-spot-nodes",
             "targetInformation": {"arn": f"arn:aws-us-gov:ec2:{REGION}:123456789012:instance/i-0a1b2c3d4e5f60718"}},
        ],
    }, {"experimentId": "EXP1", "nextToken": "page-2"})
    assert resolved_instances(fis, "EXP1") == ["i-0a1b2c3d4e5f60718", "i-1234abcd"]
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize(("value", "expected"), [
    ("i-0a1b2c3d4e5f60718", "i-0a1b2c3d4e5f60718"),
    ("arn:aws:ec2:us-east-2:123456789012:instance/i-1234abcd", "i-1234abcd"),
    ("arn:aws:ec2:us-east-2:123456789012:volume/vol-1234abcd", None),
    ("i-12345", None),
    ("us-east-2a", None),
])
def test_instance_id_of(value: str, expected: str | None) -> None:
    assert instance_id_of(value) == expected


def test_the_worst_drill_fits_one_filter_pattern() -> None:
    """drills.max_nodes is at most MAX_DRILL_NODES; COUNT(n) resolves n instances, each ID at most 19 characters."""
    (pattern,) = filter_patterns([LONGEST] * MAX_DRILL_NODES)
    assert len(pattern) <= MAX_FILTER_PATTERN
    assert pattern.startswith('{ ($.instance_id = "i-0123456789abcdef0") || ')


def test_many_instances_are_split_into_patterns_within_the_limit() -> None:
    instances = [f"i-{n:017x}" for n in range(60)]
    patterns = filter_patterns(instances)
    assert len(patterns) > 1 and all(len(p) <= MAX_FILTER_PATTERN for p in patterns)
    assert [i for p in patterns for i in instances if f'"{i}"' in p] == instances


def test_a_pattern_never_holds_anything_but_instance_ids() -> None:
    with pytest.raises(ValueError, match="not an EC2 instance ID"):
        filter_patterns(['i-1234abcd") || ($.level = "INFO'])


def test_handler_events_ask_each_pattern_and_follow_pages() -> None:
    logs, stubber = _client("logs")
    instances = [f"i-{n:017x}" for n in range(30)]
    first, second = filter_patterns(instances)
    event = {"timestamp": 1_700_000_000_000, "message": "{}", "logStreamName": "s", "ingestionTime": 1_700_000_000_100, "eventId": "1"}
    common = {"logGroupName": "g", "startTime": 1, "endTime": 2}
    stubber.add_response("filter_log_events", {"events": [event], "nextToken": "t"}, {**common, "filterPattern": first})
    stubber.add_response("filter_log_events", {"events": [event]}, {**common, "filterPattern": first, "nextToken": "t"})
    stubber.add_response("filter_log_events", {"events": []}, {**common, "filterPattern": second})
    assert len(handler_events(logs, log_group="g", instances=instances, start_ms=1, end_ms=2)) == 2
    stubber.assert_no_pending_responses()


def test_lines_of_other_instances_and_unparsable_lines_are_left_out() -> None:
    events = [
        {"timestamp": 1000, "message": '{"outcome": "terminated", "instance_id": "i-0000000000000000b", "detail": "terminated"}'},
        {"timestamp": 1000, "message": "REPORT RequestId: x Duration: 2 ms"},
        {"timestamp": 1000, "message": '{"outcome": "recorded", "instance_id": "i-1234abcd", "signal": "something_new"}'},
        {"timestamp": 1000, "message": '{"outcome": "ignored", "instance_id": "i-1234abcd", "reason": "no_record", "detail": "terminated"}'},
        {"timestamp": 2000, "message": '{"outcome": "terminated", "instance_id": "i-1234abcd", "detail": "found by reconciler"}'},
    ]
    (marker,) = markers_from_events(events, ["i-1234abcd"])
    assert (marker.event, marker.fields, marker.time.timestamp()) == ("node_gone", {"state": "found by reconciler"}, 2.0)
