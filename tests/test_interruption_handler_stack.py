"""The interruption handler's infrastructure: triggers, retries, dead letters, network and cluster access."""

from __future__ import annotations

import json

import pytest

from gennstack_infra.components.interruption_handler import (
    HANDLER_PATTERNS,
    KUBERNETES_GROUP,
    TABLE_ACTIONS,
    rbac_manifests,
    warm_spares,
)
from gennstack.config import load_config
from tests.eventbridge import delivered, sample
from tests.k8s_schema import validate
from tests.support import ROOT, Synth


def _resources(synth: Synth, resource_type: str, prefix: str = "InterruptionHandler") -> dict[str, dict]:
    return {k: v for k, v in synth.resources(resource_type).items() if k.startswith(prefix)}


def _function(synth: Synth) -> tuple[str, dict]:
    ((logical_id, function),) = _resources(synth, "AWS::Lambda::Function").items()
    return logical_id, function["Properties"]


# --- which events trigger it -----------------------------------------------------------------

MATCHES = {
    "RebalanceRule": sample("ec2-instance-rebalance-recommendation.json"),
    "SpotWarningRule": sample("ec2-spot-instance-interruption-warning.json"),
    "ScheduledChangeRule": sample("aws-health-event-ec2-scheduled-change.json"),
    "TerminalStateRule": sample(
        "ec2-instance-state-change-notification.json", detail={"instance-id": "i-abcd1111", "state": "terminated"}
    ),
}
NEAR_MISSES = {
    "RebalanceRule": sample("ec2-instance-rebalance-recommendation.json", source="aws.ec3"),
    "SpotWarningRule": sample("ec2-spot-instance-interruption-warning.json", **{"detail-type": "EC2 Spot Instance Interruption"}),
    "ScheduledChangeRule": sample(
        "aws-health-event-ec2-scheduled-change.json",
        detail={"service": "RDS", "eventTypeCategory": "scheduledChange"},
    ),
    # The documented sample itself: a node starting is no interruption.
    "TerminalStateRule": sample("ec2-instance-state-change-notification.json"),
}


@pytest.mark.parametrize("rule_id", sorted(HANDLER_PATTERNS))
def test_pattern_matches_documented_event(rule_id: str) -> None:
    assert delivered(HANDLER_PATTERNS[rule_id], MATCHES[rule_id]) == 1


@pytest.mark.parametrize("rule_id", sorted(HANDLER_PATTERNS))
def test_pattern_rejects_near_miss(rule_id: str) -> None:
    assert delivered(HANDLER_PATTERNS[rule_id], NEAR_MISSES[rule_id]) == 0


def test_rules_in_template_target_the_function_with_bounded_retries_and_dlq(synth: Synth) -> None:
    function_id, _ = _function(synth)
    ((dlq_id, _),) = _resources(synth, "AWS::SQS::Queue").items()
    rules = _resources(synth, "AWS::Events::Rule")
    patterns = sorted(json.dumps(r["Properties"]["EventPattern"], sort_keys=True) for r in rules.values() if "EventPattern" in r["Properties"])
    assert patterns == sorted(json.dumps(p, sort_keys=True) for p in HANDLER_PATTERNS.values())
    schedules = [r["Properties"]["ScheduleExpression"] for r in rules.values() if "ScheduleExpression" in r["Properties"]]
    assert schedules == ["rate(1 minute)"]
    for rule in rules.values():
        (target,) = rule["Properties"]["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}
        assert target["RetryPolicy"] == {"MaximumRetryAttempts": 4, "MaximumEventAgeInSeconds": 600}
        assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [dlq_id, "Arn"]}}


def test_never_consumes_karpenters_queue(synth: Synth) -> None:
    """Karpenter deletes what it reads: the handler has its own rules and no event source mapping."""
    assert synth.resources("AWS::Lambda::EventSourceMapping") == {}


# --- the function ---------------------------------------------------------------------------


def test_function_runtime_network_and_failure_handling(synth: Synth, synth_variant: Synth) -> None:
    function_id, function = _function(synth)
    assert function["Runtime"] == "python3.14"
    assert function["Handler"] == "interruption_handler.handler.lambda_handler"
    # No reserved concurrency by default: it fails in accounts whose quota is 100 or less.
    assert "ReservedConcurrentExecutions" not in function
    assert function["TracingConfig"] == {"Mode": "Active"}
    assert _function(synth_variant)[1]["ReservedConcurrentExecutions"] == 5  # opted in
    assert all("Private" in s["Ref"] for s in function["VpcConfig"]["SubnetIds"])
    ((dlq_id, _),) = _resources(synth, "AWS::SQS::Queue").items()
    assert function["DeadLetterConfig"] == {"TargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]}}
    (invoke_config,) = _resources(synth, "AWS::Lambda::EventInvokeConfig").values()
    assert invoke_config["Properties"]["MaximumRetryAttempts"] == 2
    assert invoke_config["Properties"]["MaximumEventAgeInSeconds"] == 600
    (layer,) = function["Layers"]
    assert layer["Ref"].startswith("InterruptionHandlerPowertoolsLayer")


def test_function_environment_contract(synth: Synth) -> None:
    _, function = _function(synth)
    env = function["Environment"]["Variables"]
    assert env["CLUSTER_NAME"] == "gennstack"
    assert env["CLUSTER_ENDPOINT"]["Fn::GetAtt"][1] == "Endpoint"
    assert env["CLUSTER_CA"]["Fn::GetAtt"][1] == "CertificateAuthorityData"
    assert env["RECORD_TTL_SECONDS"] == "1800" and env["REPLACEMENT_GRACE_SECONDS"] == "900"
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "GenNStack"
    assert env["ACCOUNT_ID"] == {"Ref": "AWS::AccountId"}  # events of other accounts are dropped
    spares = json.loads(env["WARM_SPARES"])
    assert spares == {
        "gen1-inf2": {"baseline": 0, "cap": 2, "deployment": "gen1-inf2-warm-spare", "generation": "inf2", "namespace": "gennstack-serving"},
        "gen2-trn2": {"baseline": 0, "cap": 2, "deployment": "gen2-trn2-warm-spare", "generation": "trn2", "namespace": "gennstack-serving"},
        "gen3-g6e": {"baseline": 0, "cap": 2, "deployment": "gen3-g6e-warm-spare", "generation": "g6e", "namespace": "gennstack-serving"},
    }


def test_warm_spares_follow_enabled_generations_and_cap() -> None:
    config = load_config({"generations": {"trn2": {"enabled": False}}, "interruptions": {"warm_spare_cap": 1}})
    spares = warm_spares(config, namespace="ns", baselines={"inf2": 3})
    assert set(spares) == {"gen1-inf2", "gen3-g6e"}
    assert spares["gen1-inf2"]["baseline"] == 1  # never above the cap
    assert spares["gen3-g6e"] == {"generation": "g6e", "namespace": "ns", "deployment": "gen3-g6e-warm-spare", "baseline": 0, "cap": 1}


def test_function_asset_holds_only_the_handler_package(synth: Synth) -> None:
    _, function = _function(synth)
    asset = synth.outdir / f"asset.{function['Code']['S3Key'].removesuffix('.zip')}"
    files = sorted(str(p.relative_to(asset)) for p in asset.rglob("*") if p.is_file())
    assert files and all(f.startswith("interruption_handler/") and f.endswith(".py") for f in files), files
    assert "interruption_handler/handler.py" in files


def test_layer_asset_is_powertools_with_pydantic(synth: Synth) -> None:
    (layer,) = _resources(synth, "AWS::Lambda::LayerVersion").values()
    assert layer["Properties"]["CompatibleRuntimes"] == ["python3.14"]
    asset = synth.outdir / f"asset.{layer['Properties']['Content']['S3Key'].removesuffix('.zip')}"
    names = {p.name for p in (asset / "python").iterdir()}
    assert {"aws_lambda_powertools", "pydantic", "pydantic_core"} <= names
    assert not list(asset.rglob("*.pyc"))


# --- permissions ----------------------------------------------------------------------------


def test_iam_is_least_privilege(synth: Synth) -> None:
    _, function = _function(synth)
    role_id = function["Role"]["Fn::GetAtt"][0]
    (policy,) = [p for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert not {a for a in actions if a.endswith("*") and not a.startswith("dynamodb:")}
    describe = next(s for s in statements if s["Action"] == "ec2:DescribeInstances")
    assert describe["Condition"] == {"StringEquals": {"aws:RequestedRegion": {"Ref": "AWS::Region"}}}
    table_id = next(iter(_resources(synth, "AWS::DynamoDB::GlobalTable")))
    dynamo = [s for s in statements if any(a.startswith("dynamodb:") for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))]
    assert dynamo and all(json.dumps(s["Resource"]).count(table_id) >= 1 for s in dynamo)
    assert {a for a in actions if a.startswith("dynamodb:")} == set(TABLE_ACTIONS)
    assert not {a for a in actions if a.startswith(("sqs:Receive", "sqs:Delete", "eks:", "sts:"))}


# boto3's DynamoDB Table resource methods -> the IAM action each one calls.
TABLE_METHODS = {
    "put_item": "dynamodb:PutItem", "update_item": "dynamodb:UpdateItem", "scan": "dynamodb:Scan",
    "get_item": "dynamodb:GetItem", "query": "dynamodb:Query", "delete_item": "dynamodb:DeleteItem",
    "batch_writer": "dynamodb:BatchWriteItem", "load": "dynamodb:DescribeTable", "reload": "dynamodb:DescribeTable",
}


def test_table_grant_is_the_handlers_table_calls() -> None:
    """The handler's ``table.<method>(...)`` calls, read from its code, need exactly TABLE_ACTIONS."""
    import ast

    called = set()
    for path in (ROOT / "lambdas" / "interruption_handler").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "table":
                called.add(node.func.attr)
    assert called and called <= set(TABLE_METHODS), called
    assert {TABLE_METHODS[m] for m in called} == set(TABLE_ACTIONS)


def test_cluster_access_is_one_group_bound_to_scale_the_warm_spares(synth: Synth) -> None:
    """And, with drain routing on (the default for g6e and trn2), the drainers' group (tests/test_drain_routing.py)."""
    _, function = _function(synth)
    (entry,) = _resources(synth, "AWS::EKS::AccessEntry").values()
    assert entry["Properties"]["PrincipalArn"] == {"Fn::GetAtt": [function["Role"]["Fn::GetAtt"][0], "Arn"]}
    assert entry["Properties"]["KubernetesGroups"] == [KUBERNETES_GROUP, "gennstack:serving-drainers"]
    assert not entry["Properties"].get("AccessPolicies")
    manifests = rbac_manifests(namespace="gennstack-serving", deployments=["gen3-g6e-warm-spare", "gen1-inf2-warm-spare"])
    for manifest in manifests:
        validate(manifest)
    role, binding = manifests
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": ["gen1-inf2-warm-spare", "gen3-g6e-warm-spare"],
            "verbs": ["get", "patch"],
        }
    ]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": KUBERNETES_GROUP}]


def test_network_path_https_only_to_the_api(synth: Synth) -> None:
    _, function = _function(synth)
    (sg_ref,) = function["VpcConfig"]["SecurityGroupIds"]
    sg_id = sg_ref["Fn::GetAtt"][0]
    security_group = synth.template["Resources"][sg_id]["Properties"]
    assert security_group["SecurityGroupEgress"] == [
        {"CidrIp": "0.0.0.0/0", "Description": "HTTPS to EKS and AWS APIs", "FromPort": 443, "IpProtocol": "tcp", "ToPort": 443}
    ]
    ingress = [
        r["Properties"] for r in synth.resources("AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"].get("SourceSecurityGroupId") == {"Fn::GetAtt": [sg_id, "GroupId"]}
    ]
    assert ingress and all(i["FromPort"] == 443 and i["ToPort"] == 443 for i in ingress)
    endpoints = [e["Properties"]["ServiceName"] for e in synth.resources("AWS::EC2::VPCEndpoint").values()]
    assert any("dynamodb" in json.dumps(name) for name in endpoints), "DynamoDB gateway endpoint missing"


def test_table_dlq_and_alarms(synth: Synth) -> None:
    (table,) = _resources(synth, "AWS::DynamoDB::GlobalTable").values()
    assert table["Properties"]["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert table["Properties"]["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    (replica,) = table["Properties"]["Replicas"]
    assert replica["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    ((dlq_id, dlq),) = _resources(synth, "AWS::SQS::Queue").items()
    assert dlq["Properties"]["SqsManagedSseEnabled"] is True
    alarms = [a["Properties"] for a in _resources(synth, "AWS::CloudWatch::Alarm").values()]
    assert {a["MetricName"] for a in alarms} == {"ApproximateNumberOfMessagesVisible", "Errors"}
    for alarm in alarms:
        assert alarm["Threshold"] == 0 and alarm["ComparisonOperator"] == "GreaterThanThreshold"


def _rbac_objects(synth: Synth) -> list[dict]:
    (rbac,) = [m for k, m in synth.resources("Custom::AWSCDK-EKS-KubernetesResource").items()
               if k.startswith("InterruptionHandlerRbac")]
    return json.loads(rbac["Properties"]["Manifest"])


def test_return_to_spot_is_on_by_default_and_names_its_scaled_objects_and_rights(synth: Synth) -> None:
    """The handler's RETURN_TO_SPOT names the serving chart's ScaledObjects (templates/scaledobjects.yaml: named
    after the pool) and the cluster access lists exactly those (tests/test_return_to_spot_policy.py)."""
    _, function = _function(synth)
    moves = json.loads(function["Environment"]["Variables"]["RETURN_TO_SPOT"])
    assert moves["generations"] == {"g6e": {"namespace": "gennstack-serving", "scaled_object": "gen3-g6e"},
                                    "trn2": {"namespace": "gennstack-serving", "scaled_object": "gen2-trn2"}}
    assert moves["policy"]["drain_grace_s"] == 600 and moves["policy"]["release_bound_s"] == 1900
    objects = _rbac_objects(synth)
    [role] = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "gennstack-return-to-spot"]
    assert role["rules"] == [{"apiGroups": ["keda.sh"], "resources": ["scaledobjects"],
                              "resourceNames": ["gen2-trn2", "gen3-g6e"], "verbs": ["get", "patch"]}]
    assert any(o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith("return-to-spot-min-only")
               for o in objects)


def test_return_to_spot_when_off_has_no_moves_and_no_access(synth_variant: Synth) -> None:
    """The variant turns it off: no moves, no access."""
    _, function = _function(synth_variant)
    assert json.loads(function["Environment"]["Variables"]["RETURN_TO_SPOT"]) == {}
    assert not [o for o in _rbac_objects(synth_variant) if "return-to-spot" in o["metadata"]["name"]]
