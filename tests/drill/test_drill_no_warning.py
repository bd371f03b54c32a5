"""``gennstack drill --target no-warning``: one spot node of the pool terminated with no notice.

The template (gennstack/drill/templates.py ``no_warning_template``) runs ``aws:ec2:terminate-instances`` (AWS FIS
actions reference: target key ``Instances``, resource type ``aws:ec2:instance``, no parameter) on one running node
of the same tagged spot NodePool as the spot-interruption templates, under the same role and stop conditions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from botocore.stub import Stubber

from gennstack.drill.templates import TARGET_TAG, experiment_template, no_warning_template, role_statements, template_tags
from tests.drill.test_drill_cli import (
    INSTANCE, REGION, TEMPLATE_ID, drill_cli, events, experiment, filtered, fis, get, list_templates, log_event, logs, offline,
    resolved, summary, terminated,
)

__all__ = ["fis", "logs", "offline"]  # the CLI tests' fixtures, used here as they are

DRILLS = {"region": REGION, "drills": {"enabled": True}}
ARGS = {"cluster_name": "gennstack", "generation": "g6e", "pool": "gen3-g6e",
        "role_arn": "arn:aws:iam::123456789012:role/fis", "stop_alarm_arns": ["arn:aws:cloudwatch:us-east-2:1:alarm:a"],
        "handler_log_group": "logs"}


def no_warning_summary(template_id: str = TEMPLATE_ID) -> dict[str, Any]:
    return {"id": template_id, "description": "GenNStack drill", "tags": {**summary()["tags"], TARGET_TAG: "no-warning"}}


def start_no_warning(stubber: Stubber) -> None:
    stubber.add_response("start_experiment", experiment("initiating"),
                         {"clientToken": ANY, "experimentTemplateId": TEMPLATE_ID,
                          "tags": {"gennstack.io/drill": "spot-interruption", "gennstack.io/generation": "g6e",
                                   TARGET_TAG: "no-warning"}})


def test_the_template_terminates_one_running_node_of_the_pool_under_the_drill_role() -> None:
    props = no_warning_template(**ARGS)
    plain = experiment_template(nodes=1, minutes_before_interruption=4, **ARGS)
    [(name, target)] = props["Targets"].items()
    assert props["Actions"] == {"terminate": {"ActionId": "aws:ec2:terminate-instances", "Description": ANY,
                                              "Targets": {"Instances": name}}}
    assert target == {"ResourceType": "aws:ec2:instance",
                      "ResourceTags": {"karpenter.sh/nodepool": "gen3-g6e", "eks:eks-cluster-name": "gennstack"},
                      "Filters": [{"Path": "State.Name", "Values": ["running"]}], "SelectionMode": "COUNT(1)"}
    for key in ("RoleArn", "StopConditions", "ExperimentOptions"):
        assert props[key] == plain[key]
    assert props["Tags"] == {**template_tags(cluster_name="gennstack", generation="g6e", nodes=1, target="no-warning"),
                             "gennstack.io/handler-log-group": "logs"}
    # The role may terminate only what it may interrupt: this cluster's pool, by tag.
    [write] = [s for s in role_statements(cluster_name="gennstack", pool="gen3-g6e", partition="aws", region=REGION,
                                          account="123456789012") if "ec2:TerminateInstances" in s["Action"]]
    assert write["Condition"] == {"StringEquals": {"ec2:ResourceTag/karpenter.sh/nodepool": "gen3-g6e",
                                                   "ec2:ResourceTag/eks:eks-cluster-name": "gennstack"}}


def test_starts_the_no_warning_template_and_reports_the_node_gone(tmp_path: Path, fis: tuple[Any, Stubber],
                                                                  logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    # The plain one-node template carries the same drill tags: only the no-warning one matches.
    list_templates(stubber, summary("EXTplain00000001"), no_warning_summary())
    start_no_warning(stubber)
    get(stubber, "completed", "Experiment completed.")
    resolved(stubber, INSTANCE)
    filtered(logs[1], log_event(3, terminated()), until_s=5)
    code, out, err, output = drill_cli(tmp_path, fis, ["--generation", "g6e", "--target", "no-warning"], config=DRILLS, logs=logs)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"12:00:00Z  drill: 1 g6e spot node terminated without warning, template {TEMPLATE_ID}"
    log = events(output)
    assert log[0]["target"] == "no-warning"
    # No warning and no rebalance came: the handler saw only the node go.
    assert not [e for e in log if e["event"] in ("interruption_warning", "rebalance_recommendation")]
    assert [e["event"] for e in log if e.get("source") == "interruption-handler"] == ["node_gone"]


def test_the_no_warning_drill_reads_its_replacements_phases(tmp_path: Path, fis: tuple[Any, Stubber],
                                                            logs: tuple[Any, Stubber]) -> None:
    """Its targets are ordinary server nodes: with --prometheus-url the replacements' markers come as for
    --target nodes (only --target multinode gets none; found by the upstream review)."""
    from gennstack.drill import cli

    _, stubber = fis
    list_templates(stubber, no_warning_summary())
    start_no_warning(stubber)
    get(stubber, "completed", "Experiment completed.")
    resolved(stubber, INSTANCE)
    filtered(logs[1], log_event(3, terminated()), until_s=5)
    asked: list[dict[str, Any]] = []
    original = cli.replacement_markers

    def markers(prometheus: Any, **kwargs: Any) -> int:
        asked.append(kwargs)
        return 0

    cli.replacement_markers = markers
    try:
        code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e", "--target", "no-warning",
                                                    "--prometheus-url", "http://127.0.0.1:9"], config=DRILLS, logs=logs)
    finally:
        cli.replacement_markers = original
    assert (code, err) == (0, "") and [(a["pool"], a["served"]) for a in asked] == [("gen3-g6e", True)]


def test_no_template_says_what_to_deploy(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e", "--target", "no-warning"], config=DRILLS)
    assert code == 1 and "deployed before the no-warning templates existed" in err and f"{TARGET_TAG}=no-warning" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--generation", "g6e", "--target", "no-warning", "--nodes", "2"], "--target no-warning --nodes 2: allowed 1"),
        (["--target", "no-warning", "--local"], "--local: --target no-warning: the local drill's no-warning case is --cases resume"),
    ],
)
def test_bad_no_warning_arguments_exit_2_without_calling_aws(tmp_path: Path, fis: tuple[Any, Stubber], argv: list[str],
                                                             message: str) -> None:
    code, _, err, _ = drill_cli(tmp_path, fis, argv, config=DRILLS)
    assert code == 2 and message in err
