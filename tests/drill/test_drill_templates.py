"""The FIS spot-drill templates and their roles, in the synthesized template (drills on in the variant)."""

from __future__ import annotations

from typing import Any

import pytest

from gennstack.config import ConfigError, load_config
from gennstack_infra.app import STACK_NAME
from gennstack.drill.templates import HANDLER_LOG_GROUP_TAG, MAX_TAG_VALUE, TARGET_TAG, experiment_template, template_tags
from tests.support import Synth

VARIANT_POOLS = {"inf2": "gen1-inf2", "g6e": "gen3-g6e"}  # the variant disables trn2


def _templates(synth: Synth) -> dict[str, dict[str, Any]]:
    return synth.resources("AWS::FIS::ExperimentTemplate")


def test_drills_are_off_by_default(synth: Synth) -> None:
    assert _templates(synth) == {}
    assert not [k for k in synth.resources("AWS::IAM::Role") if k.startswith("SpotDrills")]


def test_one_template_per_enabled_generation_and_node_count_and_one_without_warning(synth_variant: Synth) -> None:
    found = {
        (props["Tags"]["gennstack.io/generation"], props["Tags"]["gennstack.io/nodes"], props["Tags"].get(TARGET_TAG, "nodes"))
        for props in (r["Properties"] for r in _templates(synth_variant).values())
    }
    assert found == {(gen, str(n), "nodes") for gen in VARIANT_POOLS for n in (1, 2, 3)} | {
        (gen, "1", "no-warning") for gen in VARIANT_POOLS}


@pytest.mark.parametrize("generation", sorted(VARIANT_POOLS))
def test_the_no_warning_template_terminates_one_running_node_of_the_pool_by_tag(synth_variant: Synth, generation: str) -> None:
    """aws:ec2:terminate-instances (FIS actions reference): target key Instances, resource type
    aws:ec2:instance, no parameter; the same tagged pool as the spot-interruption templates."""
    (props,) = [r["Properties"] for r in _templates(synth_variant).values()
                if r["Properties"]["Tags"]["gennstack.io/generation"] == generation
                and r["Properties"]["Tags"].get(TARGET_TAG) == "no-warning"]
    (action,) = props["Actions"].values()
    assert action["ActionId"] == "aws:ec2:terminate-instances" and "Parameters" not in action
    assert list(action["Targets"]) == ["Instances"]
    assert props["Targets"][action["Targets"]["Instances"]] == {
        "ResourceType": "aws:ec2:instance",
        "ResourceTags": {"karpenter.sh/nodepool": VARIANT_POOLS[generation], "eks:eks-cluster-name": "gennstack"},
        "Filters": [{"Path": "State.Name", "Values": ["running"]}],
        "SelectionMode": "COUNT(1)",
    }
    assert props["ExperimentOptions"]["EmptyTargetResolutionMode"] == "fail"
    assert props["StopConditions"]  # the handler's alarms, as the other templates


@pytest.mark.parametrize("generation", sorted(VARIANT_POOLS))
def test_template_interrupts_n_running_spot_nodes_of_the_pool_by_tag(synth_variant: Synth, generation: str) -> None:
    pool = VARIANT_POOLS[generation]
    for resource in _templates(synth_variant).values():
        props = resource["Properties"]
        if props["Tags"]["gennstack.io/generation"] != generation or props["Tags"].get(TARGET_TAG) == "no-warning":
            continue
        nodes = int(props["Tags"]["gennstack.io/nodes"])
        assert props["Tags"]["gennstack.io/drill"] == "spot-interruption"
        assert props["Tags"]["gennstack.io/cluster"] == "gennstack"
        (action,) = props["Actions"].values()
        assert action["ActionId"] == "aws:ec2:send-spot-instance-interruptions"
        # the variant's minutes_before_interruption: 2 (warning at once, no rebalance first)
        assert action["Parameters"] == {"durationBeforeInterruption": "PT2M"}
        (target_name,) = action["Targets"].values()
        assert list(action["Targets"]) == ["SpotInstances"]
        target = props["Targets"][target_name]
        assert target == {
            "ResourceType": "aws:ec2:spot-instance",
            "ResourceTags": {"karpenter.sh/nodepool": pool, "eks:eks-cluster-name": "gennstack"},
            "Filters": [{"Path": "State.Name", "Values": ["running"]}],
            "SelectionMode": f"COUNT({nodes})",
        }
        assert props["ExperimentOptions"]["EmptyTargetResolutionMode"] == "fail"


def test_stop_conditions_are_the_interruption_handlers_alarms(synth_variant: Synth) -> None:
    alarms = synth_variant.resources("AWS::CloudWatch::Alarm")
    wanted = sorted(k for k in alarms if k.startswith(("InterruptionHandlerErrorsAlarm", "InterruptionHandlerDeadLetterAlarm")))
    assert len(wanted) == 2
    for resource in _templates(synth_variant).values():
        conditions = resource["Properties"]["StopConditions"]
        assert all(c["Source"] == "aws:cloudwatch:alarm" for c in conditions)
        assert sorted(c["Value"]["Fn::GetAtt"][0] for c in conditions) == wanted


@pytest.mark.parametrize("generation", sorted(VARIANT_POOLS))
def test_role_may_interrupt_only_this_pools_nodes_of_this_cluster(synth_variant: Synth, generation: str) -> None:
    roles = {k: v for k, v in synth_variant.resources("AWS::IAM::Role").items() if k.startswith("SpotDrills")}
    role_id = next(k for k in roles if k.startswith(f"SpotDrills{generation.capitalize()}Role"))
    role = roles[role_id]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "fis.amazonaws.com"}
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    (policy,) = role["Policies"]
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert set(statements) == {"InterruptThisPoolsSpotNodes", "ResolveTargets"}
    write = statements["InterruptThisPoolsSpotNodes"]
    assert write["Action"] == ["ec2:SendSpotInstanceInterruptions", "ec2:TerminateInstances"]
    assert write["Condition"] == {
        "StringEquals": {
            "ec2:ResourceTag/karpenter.sh/nodepool": VARIANT_POOLS[generation],
            "ec2:ResourceTag/eks:eks-cluster-name": "gennstack",
        }
    }
    assert write["Resource"]["Fn::Join"][1][-1] == ":instance/*"
    read = statements["ResolveTargets"]
    assert read["Action"] == "ec2:DescribeInstances" and read["Condition"]["StringEquals"] == {"aws:RequestedRegion": {"Ref": "AWS::Region"}}
    # every template of this generation runs as this role, and no other
    for resource in _templates(synth_variant).values():
        props = resource["Properties"]
        if props["Tags"]["gennstack.io/generation"] == generation:
            assert props["RoleArn"] == {"Fn::GetAtt": [role_id, "Arn"]}


def test_a_longer_duration_is_iso_minutes() -> None:
    props = experiment_template(
        cluster_name="c", generation="g6e", pool="gen3-g6e", nodes=2, minutes_before_interruption=15,
        role_arn="arn:aws:iam::123456789012:role/r", stop_alarm_arns=[], handler_log_group="handler-logs",
    )
    assert props["Actions"]["interrupt"]["Parameters"] == {"durationBeforeInterruption": "PT15M"}
    assert props["Targets"]["gen3-g6e-spot-nodes"]["SelectionMode"] == "COUNT(2)"
    assert props["Tags"] == {**template_tags(cluster_name="c", generation="g6e", nodes=2), HANDLER_LOG_GROUP_TAG: "handler-logs"}


# CloudFormation names a resource without a name "<stack name>-<logical ID>-<random>" (AWS CloudFormation
# template reference, "CloudFormation resource custom naming": "MyStack-MyBucket-abcdefghijk1", a
# 12-character suffix). 32 leaves room for a longer suffix than the documented one.
GENERATED_SUFFIX_ALLOWANCE = 32


def test_every_template_names_the_interruption_handlers_log_group(synth_variant: Synth) -> None:
    groups = {k for k, v in synth_variant.resources("AWS::Logs::LogGroup").items()
              if v["Metadata"]["aws:cdk:path"] == f"{STACK_NAME}/InterruptionHandler/Logs/Resource"}
    (group,) = groups
    function = next(v for k, v in synth_variant.resources("AWS::Lambda::Function").items() if k.startswith("InterruptionHandlerFunction"))
    assert function["Properties"]["LoggingConfig"]["LogGroup"] == {"Ref": group}
    for resource in _templates(synth_variant).values():
        assert resource["Properties"]["Tags"][HANDLER_LOG_GROUP_TAG] == {"Ref": group}
    # The log group has no name of its own: CloudFormation generates it (the name is not known at
    # synth). Its worst case from the generated-name pattern fits an FIS tag value.
    assert "LogGroupName" not in synth_variant.resources("AWS::Logs::LogGroup")[group]["Properties"]
    worst = len(STACK_NAME) + 1 + len(group) + 1 + GENERATED_SUFFIX_ALLOWANCE
    assert worst <= MAX_TAG_VALUE, worst


@pytest.mark.parametrize(
    ("drills", "message"),
    [
        ({"max_nodes": 0}, "drills.max_nodes: got 0"),
        ({"max_nodes": 6}, "drills.max_nodes: got 6"),
        ({"minutes_before_interruption": 1}, "drills.minutes_before_interruption: got 1"),
        ({"minutes_before_interruption": 16}, "drills.minutes_before_interruption: got 16"),
        ({"enabled": "yes"}, "drills.enabled: got 'yes'"),
        ({"nodes": 1}, "drills.nodes: unknown key"),
    ],
)
def test_bad_drill_config_names_key_and_value(drills: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config({"drills": drills})
