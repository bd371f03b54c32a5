"""Every bad configuration value fails with a message naming the key, the value and what is allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gennstack.config import GENERATION_NAMES, ConfigError, GenNStackConfig, load_config
from tests.support import ROOT


def test_defaults_are_valid_and_frozen() -> None:
    config = load_config({})
    assert config.network.az_count == 3
    assert config.network.nat_gateways == 1
    assert config.storage.removal_policy == "retain"
    assert tuple(config.generations.enabled()) == GENERATION_NAMES
    with pytest.raises(Exception, match="frozen"):
        config.network.az_count = 2  # type: ignore[misc]


def test_cdk_json_defaults_equal_model_defaults() -> None:
    """cdk.json spells out the defaults for users to edit; they must not drift from the model."""
    from gennstack_infra.app import cdk_json_context

    assert load_config(cdk_json_context()["gennstack"]) == GenNStackConfig()


# (config, fragments the message must contain: key, value, allowed)
BAD_CONFIGS = [
    pytest.param({"clustername": "x"}, ["clustername", "unknown key", "'cluster_name'"], id="unknown-top-level-key"),
    pytest.param({"network": {"azs": 3}}, ["network.azs", "unknown key", "'az_count'"], id="unknown-nested-key"),
    pytest.param({"network": {"az_count": "3"}}, ["network.az_count", "'3'", "valid integer"], id="wrong-type-int"),
    pytest.param(
        {"generations": {"g6e": {"enabled": "yes"}}}, ["generations.g6e.enabled", "'yes'", "valid boolean"], id="wrong-type-bool"
    ),
    pytest.param(
        {"network": {"flow_log_traffic": "all"}}, ["network.flow_log_traffic", "'all'", "'ALL' or 'REJECT'"], id="bad-literal"
    ),
    pytest.param({"account": 123456789012}, ["account", "123456789012", "valid string"], id="wrong-type-account"),
    pytest.param({"network": {"az_count": 1}}, ["network.az_count", "got 1", "greater than or equal to 2"], id="az-count-low"),
    pytest.param({"network": {"az_count": 7}}, ["network.az_count", "got 7", "less than or equal to 6"], id="az-count-high"),
    pytest.param({"network": {"nat_gateways": 0}}, ["network.nat_gateways", "got 0", "greater than or equal to 1"], id="nat-zero"),
    pytest.param(
        {"network": {"az_count": 2, "nat_gateways": 3}}, ["network.nat_gateways", "got 3", "at most az_count (2)"], id="nat-over-azs"
    ),
    pytest.param({"network": {"vpc_cidr": "10.0.0.0/33"}}, ["network.vpc_cidr", "10.0.0.0/33", "IPv4 CIDR"], id="cidr-bad-mask"),
    pytest.param({"network": {"vpc_cidr": "10.0.0.300/16"}}, ["network.vpc_cidr", "10.0.0.300/16", "IPv4 CIDR"], id="cidr-bad-octet"),
    pytest.param({"network": {"vpc_cidr": "10.0.1.0/16"}}, ["network.vpc_cidr", "host bits set"], id="cidr-host-bits"),
    pytest.param({"network": {"vpc_cidr": "10.0.0.0/8"}}, ["network.vpc_cidr", "between /16 and /24"], id="cidr-too-big"),
    pytest.param({"network": {"vpc_cidr": "52.0.0.0/16"}}, ["network.vpc_cidr", "52.0.0.0/16", "private"], id="cidr-public"),
    pytest.param(
        {"network": {"vpc_cidr": "10.0.0.0/20"}},
        ["network.private_subnet_mask", "got 18", "fit in vpc_cidr 10.0.0.0/20"],
        id="subnets-do-not-fit",
    ),
    pytest.param(
        {"network": {"interface_endpoints": ["ecr.api", "s3"]}},
        ["network.interface_endpoints", "'s3'", "allowed: ['autoscaling'"],
        id="unknown-endpoint",
    ),
    pytest.param(
        {"network": {"interface_endpoints": ["sts", "sts"]}}, ["network.interface_endpoints", "more than once"], id="dup-endpoint"
    ),
    pytest.param(
        {"network": {"availability_zones": ["us-east-1a", "us-east-1b", "us-east-1c"]}},
        ["network.availability_zones", "us-east-1a", "null unless region is set"],
        id="zones-without-region",
    ),
    pytest.param(
        {"region": "us-east-2", "network": {"availability_zones": ["us-east-2a", "us-west-2b", "us-east-2c"]}},
        ["network.availability_zones", "us-west-2b", "zone names of region us-east-2"],
        id="zones-wrong-region",
    ),
    pytest.param(
        {"region": "us-east-2", "network": {"availability_zones": ["us-east-2a"]}},
        ["network.availability_zones", "exactly az_count (3)"],
        id="zones-wrong-count",
    ),
    pytest.param({"region": "mars-1"}, ["region", "'mars-1'", "AWS region name"], id="bad-region"),
    pytest.param(
        {"region": "us-northsoutheast-1234567"}, ["region", "at most 20 characters"], id="region-name-too-long"
    ),
    pytest.param({"account": "1234"}, ["account", "'1234'", "12-digit"], id="bad-account"),
    pytest.param({"cluster_name": "9lives"}, ["cluster_name", "'9lives'", "start with a letter"], id="bad-cluster-name"),
    pytest.param({"tags": {"aws:owner": "me"}}, ["tags", "aws:owner", "must not start with 'aws:'"], id="reserved-tag"),
    pytest.param(
        {"storage": {"removal_policy": "delete"}}, ["storage.removal_policy", "'delete'", "'retain' or 'destroy'"], id="bad-removal"
    ),
    pytest.param(
        {"storage": {"compile_cache_expiry_days": 7}},
        ["storage.compile_cache_expiry_days", "got 7", "0 (never expire) or at least 30"],
        id="cache-expiry-too-short",
    ),
    pytest.param(
        {"storage": {"compile_cache_expiry_days": None}},
        ["storage.compile_cache_expiry_days", "got None", "valid integer"],
        id="null-is-not-never",
    ),
    pytest.param(
        {"generations": {"gen4": {"enabled": True}}},
        ["generations.gen4", "a generation name, one of ['inf2', 'trn2', 'g6e']"],
        id="unknown-generation",
    ),
    pytest.param(
        {"generations": {"g6e": {"instance_types": ["p5.48xlarge"]}}},
        ["generations.g6e.instance_types", "'p5.48xlarge'", "one of ['g6e.12xlarge'"],
        id="wrong-instance-family",
    ),
    pytest.param(
        {"generations": {"inf2": {"instance_types": ["inf2.8xlarge"]}}},
        ["generations.inf2.instance_types", "'inf2.8xlarge'", "one of ['inf2.24xlarge', 'inf2.48xlarge']"],
        id="instance-type-too-small-for-the-catalog",
    ),
    pytest.param(
        {"generations": {"trn2": {"instance_types": ["trn2.48xlarge", "trn2.48xlarge"]}}},
        ["generations.trn2.instance_types", "each type at most once"],
        id="duplicate-instance-type",
    ),
    pytest.param(
        {"cluster": {"kubernetes_version": "1.30"}},
        ["cluster.kubernetes_version", "'1.30'", "'1.36'"],
        id="unsupported-kubernetes-version",
    ),
    pytest.param(
        {"cluster": {"public_endpoint_cidrs": ["0.0.0.0/33"]}},
        ["cluster.public_endpoint_cidrs", "'0.0.0.0/33' is not an IPv4 CIDR"],
        id="bad-endpoint-cidr",
    ),
    pytest.param(
        {"cluster": {"admin_role_arns": ["arn:aws:iam::123456789012:user/bob"]}},
        ["cluster.admin_role_arns", "is not an IAM role ARN"],
        id="admin-not-a-role",
    ),
    pytest.param(
        {"cluster": {"system_node_instance_types": ["g6e.xlarge"]}},
        ["cluster.system_node_instance_types", "'g6e.xlarge' is not a general-purpose"],
        id="accelerator-as-system-node",
    ),
    pytest.param(
        {"cluster": {"system_nodes_min": 3, "system_nodes_max": 2}},
        ["cluster.system_nodes_max", "got 2", "at least system_nodes_min (3)"],
        id="system-nodes-max-below-min",
    ),
    pytest.param(
        {"generations": {"inf2": {"instance_types": []}}}, ["generations.inf2.instance_types", "at least one"], id="no-instance-types"
    ),
    pytest.param(
        {"generations": {"trn2": {"model_id": "llama"}}},
        ["generations.trn2.model_id", "'llama'", "Hugging Face repository id"],
        id="bad-model-id",
    ),
    pytest.param(
        {"generations": {"trn2": {"model_revision": "refs/pr/1"}}},
        ["generations.trn2.model_revision", "refs/pr/1", "without '/'"],
        id="bad-revision",
    ),
    pytest.param(
        {"generations": {"g6e": {"max_nodes": 1000}}},
        ["generations.g6e.max_nodes", "got 1000", "less than or equal to 100"],
        id="max-nodes-high",
    ),
    pytest.param(
        {"generations": {"trn2": {"capacity_reservation_ids": ["cr-123"]}}},
        ["generations.trn2.capacity_reservation_ids", "'cr-123' is not a capacity reservation id"],
        id="bad-capacity-reservation",
    ),
    pytest.param(
        {"generations": {"trn2": {"capacity_reservation_ids": ["cr-0123456789abcdef0"] * 2}}},
        ["generations.trn2.capacity_reservation_ids", "more than once"],
        id="duplicate-capacity-reservation",
    ),
    pytest.param(
        {"generations": {"g6e": {"enabeld": False}}},
        ["generations.g6e.enabeld", "unknown key", "'enabled'"],
        id="generation-key-typo",
    ),
    pytest.param(
        {"generations": {name: {"enabled": False} for name in GENERATION_NAMES}},
        ["generations", "at least one enabled generation"],
        id="all-generations-disabled",
    ),
    pytest.param({"network": "big"}, ["network", "'big'", "valid dictionary"], id="section-not-object"),
]


@pytest.mark.parametrize(("config", "fragments"), BAD_CONFIGS)
def test_bad_config_names_key_value_and_allowed(config: dict, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(config)
    message = str(excinfo.value)
    assert message.startswith("GenNStack config is invalid:")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_all_errors_reported_at_once() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config({"network": {"az_count": 0, "flow_log_traffic": "no"}, "bogus": 1})
    message = str(excinfo.value)
    assert "network.az_count" in message and "network.flow_log_traffic" in message and "bogus" in message


def test_partial_generation_keeps_its_defaults() -> None:
    # Two g6e nodes admit two replicas in the worst case (gennstack.serving.scaling.check_nodes_admit).
    config = load_config({"generations": {"trn2": {"enabled": False}, "g6e": {"max_nodes": 2}},
                          "serving": {"g6e": {"min_replicas": 1, "max_replicas": 2}}})
    assert config.generations.trn2.enabled is False
    assert config.generations.trn2.instance_types == ("trn2.48xlarge",)
    assert config.generations.g6e.max_nodes == 2
    assert config.generations.g6e.model_id == "openai/gpt-oss-20b"
    assert tuple(config.generations.enabled()) == ("inf2", "g6e")


def test_context_must_be_an_object() -> None:
    with pytest.raises(ConfigError, match="context key 'gennstack' must be an object"):
        load_config("az_count=3")  # type: ignore[arg-type]


def test_config_file_json_is_merged_over_context(tmp_path) -> None:
    file = tmp_path / "prod.json"
    file.write_text(json.dumps({"region": "us-east-2", "network": {"nat_gateways": 3}}))
    config = load_config({"network": {"az_count": 3, "flow_log_traffic": "REJECT"}}, str(file))
    assert config.region == "us-east-2"
    assert config.network.nat_gateways == 3
    assert config.network.flow_log_traffic == "REJECT"  # from context, not replaced by the file's network object


def test_config_file_yaml(tmp_path) -> None:
    file = tmp_path / "dev.yaml"
    file.write_text("storage:\n  removal_policy: destroy\n")
    assert load_config({}, str(file)).storage.removal_policy == "destroy"


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("missing.json", None, "does not exist"),
        ("bad.json", "{not json", "could not be read"),
        ("bad.yaml", "a: [1,", "not valid YAML"),
        ("list.json", "[1, 2]", "must hold an object"),
        ("conf.toml", "a = 1", "must end in .json, .yaml or .yml"),
    ],
)
def test_bad_config_file(tmp_path, name: str, content: str | None, fragment: str) -> None:
    file = tmp_path / name
    if content is not None:
        file.write_text(content)
    with pytest.raises(ConfigError) as excinfo:
        load_config({}, str(file))
    assert fragment in str(excinfo.value) and name in str(excinfo.value)


def test_bad_value_in_config_file_names_the_key(tmp_path) -> None:
    file = tmp_path / "prod.json"
    file.write_text(json.dumps({"network": {"nat_gateways": 9}}))
    with pytest.raises(ConfigError, match=r"network\.nat_gateways: got 9"):
        load_config({}, str(file))


def test_build_app_fails_before_any_construct(monkeypatch) -> None:
    """A bad config stops the app before a stack exists (no half-built app, no synth)."""
    import gennstack_infra.app as app_module

    created = []
    monkeypatch.setattr(app_module, "GenNStack", lambda *a, **k: created.append(1))
    with pytest.raises(ConfigError, match="network.az_count"):
        app_module.build_app(context={"gennstack": {"network": {"az_count": 9}}})
    assert created == []


def test_app_exits_2_with_message_on_bad_config(tmp_path) -> None:
    """What a user sees from `cdk synth -c config=...`: the message, exit code 2, no traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"network": {"vpc_cidr": "10.0.0.0/99"}}))
    # The CDK CLI hands context to the app this way.
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({"config": str(bad)})}
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "network.vpc_cidr: got '10.0.0.0/99'" in result.stderr
    assert "Traceback" not in result.stderr
