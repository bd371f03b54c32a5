"""The serving config section and serving_values: every bad value fails with key, value and what is allowed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gennstack.config import ConfigError, FieldError
from gennstack.serving import ServingConfig
from tests.serving.conftest import cdk_values


def error(data: dict) -> tuple[str, str]:
    """(location, message) of the single error ``data`` causes."""
    with pytest.raises(ValidationError) as info:
        ServingConfig.model_validate(data)
    [item] = info.value.errors(include_url=False)
    ctx_error = (item.get("ctx") or {}).get("error")
    loc = ".".join(str(part) for part in item["loc"])
    if isinstance(ctx_error, FieldError):
        return ".".join(filter(None, [loc, ctx_error.key])), str(ctx_error)
    return loc, item["msg"]


def test_defaults_are_the_documented_layouts() -> None:
    serving = ServingConfig()
    assert serving.namespace == "gennstack-serving"
    assert (serving.inf2.served_model_name, serving.trn2.served_model_name, serving.g6e.served_model_name) == (
        "llama-3-70b-instruct", "llama-4-maverick", "gpt-oss-20b")
    assert (serving.inf2.tensor_parallel_size, serving.inf2.max_num_seqs) == (24, 20)
    assert (serving.trn2.tensor_parallel_size, serving.trn2.context_parallel_size, serving.trn2.vision_tensor_parallel_size,
            serving.trn2.save_sharded_checkpoint) == (64, 16, 16, True)
    assert serving.g6e.gpus_per_replica == 1
    assert all(s.warm_spare_replicas == 0 for s in (serving.inf2, serving.trn2, serving.g6e))
    assert serving.staging is False
    # The original layout is one setting away.
    assert ServingConfig.model_validate({"g6e": {"gpus_per_replica": 4}}).g6e.gpus_per_replica == 4


@pytest.mark.parametrize("data, key, expected", [
    ({"inf2": {"min_replicas": 3}}, "inf2.max_replicas", "got 2; allowed: at least min_replicas (3)"),
    ({"inf2": {"target_ongoing_requests": 24}}, "inf2.target_ongoing_requests", "got 24; allowed: at most max_num_seqs (20)"),
    ({"trn2": {"tensor_parallel_size": 48}}, "trn2.tensor_parallel_size",
     "got 48; allowed: a divisor of the 64 logical NeuronCores"),
    ({"trn2": {"context_parallel_size": 24}}, "trn2.context_parallel_size",
     "got 24; allowed: a divisor of tensor_parallel_size (64): [1, 2, 4, 8, 16, 32, 64]"),
    ({"trn2": {"vision_tensor_parallel_size": 12}}, "trn2.vision_tensor_parallel_size",
     "got 12; allowed: a divisor of tensor_parallel_size (64, the vision encoder's world size)"),
])
def test_layout_errors_name_key_value_and_allowed(data, key, expected) -> None:
    location, message = error(data)
    assert location == key
    assert expected in message


@pytest.mark.parametrize("data, key, expected", [
    ({"g6e": {"gpus_per_replica": 3}}, "g6e.gpus_per_replica", "must be 1, 2, 4 or 8"),
    ({"g6e": {"gpus_per_replica": "1"}}, "g6e.gpus_per_replica", "Input should be a valid integer"),
    ({"g6e": {"gpu_memory_utilization": 0.99}}, "g6e.gpu_memory_utilization", "less than or equal to 0.95"),
    ({"inf2": {"served_model_name": "Llama 3"}}, "inf2.served_model_name", "lowercase letters, digits"),
    ({"inf2": {"image": "vllm/vllm-openai"}}, "inf2.image", "pinned by tag or digest"),
    ({"g6e": {"image": "docker.io/vllm/vllm-openai:latest"}}, "g6e.image", "':latest' moves"),
    ({"trn2": {"warm_spare_replicas": -1}}, "trn2.warm_spare_replicas", "greater than or equal to 0"),
    ({"inf2": {"max_model_len": 100}}, "inf2.max_model_len", "greater than or equal to 256"),
    ({"namespace": "GenNStack"}, "namespace", "must be a DNS label"),
    ({"g6e": {"tensor_parallel_size": 4}}, "g6e.tensor_parallel_size", "Extra inputs are not permitted"),
    ({"staging": "yes"}, "staging", "Input should be a valid boolean"),
    ({"g6e": {"tool_call_parser": "open ai"}}, "g6e.tool_call_parser", "should match pattern"),
])
def test_field_errors_name_key_and_allowed(data, key, expected) -> None:
    location, message = error(data)
    assert location == key
    assert expected in message


def test_config_is_frozen() -> None:
    with pytest.raises(ValidationError):
        ServingConfig().g6e.min_replicas = 3  # type: ignore[misc]


@pytest.mark.parametrize("context, serving, expected", [
    ({"generations": {"g6e": {"instance_types": ["g6e.xlarge", "g6e.2xlarge"]}}}, {"g6e": {"gpus_per_replica": 4}},
     "serving.g6e.gpus_per_replica: got 4; allowed: at most 1"),
    ({"generations": {"inf2": {"instance_types": ["inf2.24xlarge"]}}}, {},
     "serving.inf2.tensor_parallel_size: got 24; allowed: at most the 12 NeuronCores"),
])
def test_serving_values_checks_replicas_fit_the_instance_types(context, serving, expected) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        cdk_values(context, ServingConfig.model_validate(serving))


def test_serving_values_fit_check_skips_disabled_generations() -> None:
    context = {"generations": {"g6e": {"enabled": False, "instance_types": ["g6e.xlarge"]}}}
    values = cdk_values(context, ServingConfig.model_validate({"g6e": {"gpus_per_replica": 4}}))
    assert values["g6e"]["enabled"] is False


@pytest.mark.parametrize("token", ["models_bucket", "compile_cache_bucket", "region", "hf_token_secret"])
def test_serving_values_needs_every_cdk_input(token) -> None:
    with pytest.raises(ConfigError, match=f"{token}: got ''"):
        cdk_values(**{token: ""})


def test_serving_values_shape() -> None:
    values = cdk_values()
    assert values["aws"] == {"region": "eu-west-1"}
    assert values["buckets"] == {"models": "gennstack-models-1a2b", "compileCache": "gennstack-compile-cache-1a2b"}
    assert values["serviceAccounts"] == {"serving": {"name": "gennstack-serving"}, "staging": {"name": "gennstack-staging"},
                                        "compile": {"name": "gennstack-compile"}}
    assert values["staging"]["enabled"] is False
    assert values["inf2"]["neuronChips"] == 12 and values["trn2"]["neuronChips"] == 16
    assert values["inf2"]["modelId"] == "meta-llama/Meta-Llama-3-70B-Instruct"
    assert "image" not in values["g6e"]
    assert cdk_values(serving=ServingConfig.model_validate({"g6e": {"image": "registry.example.com/vllm:1.2.3"}}))["g6e"]["image"] == (
        "registry.example.com/vllm:1.2.3")


def test_tool_calling_can_be_turned_off() -> None:
    assert cdk_values()["g6e"]["toolCallParser"] == "openai"
    assert cdk_values(serving=ServingConfig.model_validate({"g6e": {"tool_call_parser": None}}))["g6e"]["toolCallParser"] == ""
