"""``gennstack drill --target multinode``: a drill that interrupts one member node of a multi-node group.

The template (gennstack/drill/templates.py ``multinode_template``) targets, like the others, running
spot instances tagged with the generation's NodePool and the cluster (AWS FIS targets: ResourceTags
and Filters, whose paths are attributes of DescribeInstances' instance, as the existing
``State.Name``), narrowed to the groups' instance type, COUNT(1). The CLI finds it by its tags
through the stubbed FIS API, as tests/drill/test_drill_cli.py does; the handler's "drained" line
names the group it took out of routing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.stub import ANY, Stubber

from gennstack.config import load_config
from gennstack.drill.handler_log import markers_from_events
from gennstack.drill.templates import TARGET_TAG, experiment_template, multinode_template, template_tags
from tests.drill.test_drill_cli import (
    INSTANCE, REGION, TEMPLATE_ID, drill_cli, events, experiment, filtered, fis, get, handler_line, list_templates, log_event,
    logs, ms, offline, resolved, summary, terminated,
)

__all__ = ["fis", "logs", "offline"]  # the CLI tests' fixtures, used here as they are

MULTI = {"region": REGION, "drills": {"enabled": True}, "serving": {"multi_node": {"enabled": True}}}
ARGS = {"cluster_name": "gennstack", "generation": "g6e", "pool": "gen3-g6e", "minutes_before_interruption": 4,
        "role_arn": "arn:aws:iam::123456789012:role/fis", "stop_alarm_arns": ["arn:aws:cloudwatch:us-east-2:1:alarm:a"],
        "handler_log_group": "logs"}


def multinode_summary(template_id: str = TEMPLATE_ID) -> dict[str, Any]:
    return {"id": template_id, "description": "GenNStack drill", "tags": {**summary()["tags"], TARGET_TAG: "multinode"}}


def start_multinode(stubber: Stubber) -> None:
    stubber.add_response("start_experiment", experiment("initiating"),
                         {"clientToken": ANY, "experimentTemplateId": TEMPLATE_ID,
                          "tags": {"gennstack.io/drill": "spot-interruption", "gennstack.io/generation": "g6e", TARGET_TAG: "multinode"}})


def test_the_template_interrupts_one_running_spot_node_of_the_groups_instance_type() -> None:
    props = multinode_template(instance_type="g6e.12xlarge", **ARGS)
    plain = experiment_template(nodes=1, **ARGS)
    [(name, target)] = props["Targets"].items()
    assert name == "gen3-g6e-multinode-member" and props["Actions"]["interrupt"]["Targets"] == {"SpotInstances": name}
    assert target == {
        "ResourceType": "aws:ec2:spot-instance",
        "ResourceTags": {"karpenter.sh/nodepool": "gen3-g6e", "eks:eks-cluster-name": "gennstack"},
        "Filters": [{"Path": "State.Name", "Values": ["running"]}, {"Path": "InstanceType", "Values": ["g6e.12xlarge"]}],
        "SelectionMode": "COUNT(1)",
    }
    # The same action, role, stop conditions and options as the plain one-node template.
    for key in ("RoleArn", "StopConditions", "ExperimentOptions"):
        assert props[key] == plain[key]
    assert props["Actions"]["interrupt"]["Parameters"] == plain["Actions"]["interrupt"]["Parameters"]
    assert props["Tags"] == {**template_tags(cluster_name="gennstack", generation="g6e", nodes=1, target="multinode"),
                             "gennstack.io/handler-log-group": "logs"}
    assert props["Tags"][TARGET_TAG] == "multinode" and TARGET_TAG not in plain["Tags"]
    # The plain templates' tags are unchanged (a deployed stack's templates keep matching).
    assert template_tags(cluster_name="c", generation="g6e", nodes=1) == {
        "gennstack.io/drill": "spot-interruption", "gennstack.io/cluster": "c", "gennstack.io/generation": "g6e", "gennstack.io/nodes": "1"}


def test_targets_a_group_member_and_reports_its_group_drained_once(tmp_path: Path, fis: tuple[Any, Stubber],
                                                                   logs: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    # The plain one-node template carries the same drill tags: only the multinode one matches.
    list_templates(stubber, summary("EXTplain00000001"), multinode_summary())
    start_multinode(stubber)
    get(stubber, "completed", "Experiment completed.")
    resolved(stubber, INSTANCE)
    drained = handler_line("instance recorded", nodepool="gen3-g6e", generation="g6e", signal="spot_interruption_warning",
                           node="ip-10-0-1-1.us-east-2.compute.internal",
                           drained_pods=["gen3-g6e-multinode-0", "gen3-g6e-multinode-0-1"],
                           drained_groups=["gen3-g6e-multinode-0"], spare_groups=1)
    filtered(logs[1], log_event(3, drained), log_event(4, drained), log_event(9, terminated()), until_s=5)
    code, out, err, output = drill_cli(tmp_path, fis, ["--target", "multinode"], config=MULTI, logs=logs)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"12:00:00Z  drill: 1 g6e spot node holding a multi-node group member, template {TEMPLATE_ID}"
    # The whole group, once, however often the line comes.
    assert [line for line in lines if "drained" in line] == [
        f"12:00:03Z  handler: {INSTANCE} drained (node ip-10-0-1-1.us-east-2.compute.internal, "
        "pods gen3-g6e-multinode-0 gen3-g6e-multinode-0-1, group gen3-g6e-multinode-0)"]
    log = events(output)
    assert log[0]["target"] == "multinode" and log[0]["generation"] == "g6e" and log[0]["nodes"] == 1
    [marker] = [e for e in log if e["event"] == "drained"]
    assert marker["groups"] == ["gen3-g6e-multinode-0"] and marker["time"] == "2026-11-30T12:00:03Z"
    assert output.name == "result"


def test_a_plain_drill_ignores_the_multinode_template(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, multinode_summary("EXTmulti00000001"))
    code, _, err, _ = drill_cli(tmp_path, fis, ["--generation", "g6e"], config=MULTI)
    assert code == 1 and "no FIS experiment template tagged" in err and "drills.enabled: true" in err


def test_no_multinode_template_says_what_to_turn_on(tmp_path: Path, fis: tuple[Any, Stubber]) -> None:
    _, stubber = fis
    list_templates(stubber, summary())
    code, _, err, _ = drill_cli(tmp_path, fis, ["--target", "multinode"], config=MULTI)
    assert code == 1 and "serving.multi_node.enabled: true" in err and f"{TARGET_TAG}=multinode" in err


@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        (["--target", "multinode"], {"drills": {"enabled": True}}, "--target multinode: serving.multi_node.enabled is false"),
        (["--target", "multinode", "--nodes", "2"], MULTI, "--target multinode --nodes 2: allowed 1"),
        (["--target", "multinode", "--generation", "inf2"], MULTI, "--target multinode --generation inf2: the groups run on g6e"),
        (["--target", "multinode", "--local"], MULTI, "--local: --target multinode: the local drill's replicas are single processes"),
    ],
)
def test_bad_multinode_arguments_exit_2_without_calling_aws(tmp_path: Path, fis: tuple[Any, Stubber], argv: list[str],
                                                            config: dict[str, Any], message: str) -> None:
    code, _, err, _ = drill_cli(tmp_path, fis, argv, config={"region": REGION, **config})
    assert code == 2 and message in err, err


def test_a_drained_line_without_groups_is_a_plain_drain() -> None:
    """A member-type node that held single-node replicas instead: the marker says pods, no group."""
    line = handler_line("instance recorded", signal="spot_interruption_warning", node="n", drained_pods=["gen3-g6e-x"])
    [_, drained] = markers_from_events([{"timestamp": ms(1), "message": line}], [INSTANCE])
    assert "groups" not in drained.fields and drained.text.endswith("(node n, pods gen3-g6e-x)")


def test_the_stack_adds_the_member_template_only_with_multi_node_on() -> None:
    from aws_cdk import App, Stack
    from aws_cdk import aws_cloudwatch as cloudwatch
    from aws_cdk import aws_logs as logs

    from gennstack_infra.components.drills import SpotDrills

    for overlay, expected in (({}, None), ({"serving": {"multi_node": {"enabled": True}}}, "g6e.12xlarge")):
        config = load_config({"drills": {"enabled": True}, **overlay})
        stack = Stack(App(), "T")
        alarm = cloudwatch.Alarm.from_alarm_arn(stack, "A", "arn:aws:cloudwatch:us-east-2:123456789012:alarm:a")
        group = logs.LogGroup.from_log_group_name(stack, "L", "handler")
        drills = SpotDrills(stack, "D", config=config, stop_alarms=[alarm], handler_log_group=group)
        assert len(drills.templates) == len(config.generations.enabled()) * config.drills.max_nodes
        if expected is None:
            assert drills.multinode_template is None
            continue
        from aws_cdk.assertions import Template

        templates = Template.from_stack(stack).find_resources("AWS::FIS::ExperimentTemplate")
        [member] = [r["Properties"] for r in templates.values() if r["Properties"]["Tags"].get(TARGET_TAG) == "multinode"]
        [target] = member["Targets"].values()
        assert {"Path": "InstanceType", "Values": [expected]} in target["Filters"] and target["SelectionMode"] == "COUNT(1)"
        assert member["RoleArn"] == stack.resolve(drills.roles["g6e"].role_arn)
