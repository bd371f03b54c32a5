"""``serving.multi_node``: the config of a model whose replicas span several nodes, its capacity model
(memory per GPU at TP x PP) and what it switches on elsewhere (chart values, LWS controller, drain
groups, cost, system-node capacity). Off by default, and then invisible: the recorded config, the
chart values and DRAIN_ON are what they were without it."""

from __future__ import annotations

import pytest

from gennstack.config import ConfigError, load_config
from gennstack.serving.capacity import GB, MODELS, Layout, plan
from gennstack.serving.multinode import NEURON_NO_MULTI_NODE, multi_node_plan

ON = {"serving": {"multi_node": {"enabled": True}}}
SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"


def test_off_by_default_and_not_recorded() -> None:
    config = load_config({})
    assert config.serving.multi_node.enabled is False
    assert "multi_node" not in config.model_dump(mode="json")["serving"]
    on = load_config(ON)
    assert on.model_dump(mode="json")["serving"]["multi_node"]["enabled"] is True


def test_scout_parameters_follow_from_its_config() -> None:
    """Llama 4 Scout's text_config (transformers Llama4TextConfig defaults, documented as the
    meta-llama/Llama-4-Scout-17B-16E checkpoint's): 48 layers, hidden 5120, 40 query and 8 KV heads of
    128, 16 experts and a shared one of width 8192 in every layer, vocabulary 202048, untied lm_head;
    plus the vision encoder's 0.85 B (as Maverick's). 109 B total, as the model card says."""
    hidden, heads, kv, head_dim, experts, ffn, vocab, layers = 5120, 40, 8, 128, 16, 8192, 202048, 48
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
    moe = experts * 3 * hidden * ffn + 3 * hidden * ffn + hidden * experts
    per_layer = attention + moe + 2 * hidden
    params = layers * per_layer + 2 * vocab * hidden + hidden + 850_000_000
    scout = MODELS[SCOUT]
    assert scout.weight_bytes == params * 2 and round(params / 1e9) == 109
    assert (scout.num_layers, scout.num_kv_heads, scout.head_dim, scout.vocab_size) == (layers, kv, head_dim, vocab)


def test_memory_per_gpu_at_tp4_pp2_is_the_heaviest_stage() -> None:
    """Two g6e.12xlarge, 8 L40S: each GPU holds a quarter of one pipeline stage (24 layers, plus the
    embedding and the vision encoder on the first stage, the lm_head on the last) and the KV cache of
    its stage's 24 layers for its 2 of the 8 KV heads."""
    scout = MODELS[SCOUT]
    p = multi_node_plan(load_config(ON).serving.multi_node)
    embedding = scout.vocab_size * scout.hidden_size * 2
    vision = scout.vision_params * 2
    layers = scout.weight_bytes - 2 * embedding - scout.hidden_size * 2 - vision
    first_stage = layers // 2 + embedding + vision
    assert p.weights == -(-first_stage // 4)
    assert 27 * GB < p.weights < 28 * GB  # about 217 GB / 8 GPUs
    assert p.kv_per_sequence == 24 * 2 * 2 * 128 * 2 * 32768  # layers, K+V, heads per rank, head_dim, bf16, tokens
    assert p.kv_cache > 12 * GB and p.max_sequences >= 15
    # The same layout on one node (TP 4, no PP) cannot hold the weights: ~54 GB per GPU.
    one_node = plan(Layout("g6e", 4, 16, 32768, 0.9), scout)
    assert one_node.weights > 48 * GB


def test_pipeline_parallel_one_is_the_single_node_model() -> None:
    gpt = MODELS["openai/gpt-oss-20b"]
    assert plan(Layout("g6e", 1, 64, 32768, 0.9), gpt).weights == gpt.weight_bytes
    assert plan(Layout("g6e", 2, 64, 32768, 0.9, pipeline_parallel_size=1), gpt).weights == -(-gpt.weight_bytes // 2)


@pytest.mark.parametrize(("override", "message"), [
    ({"generation": "trn2"}, "serving.multi_node.generation: got 'trn2'; allowed: " + NEURON_NO_MULTI_NODE),
    ({"generation": "inf2"}, "multi-node inference will be supported in future Neuron releases"),
    ({"tensor_parallel_size": 2}, "serving.multi_node.tensor_parallel_size: got 2; allowed: 4, the GPUs of one g6e.12xlarge"),
    ({"nodes_per_replica": 3}, "serving.multi_node.pipeline_parallel_size: got 2; allowed: nodes_per_replica (3)"),
    ({"instance_type": "g6e.2xlarge"}, "serving.multi_node.instance_type: got 'g6e.2xlarge'; allowed: a multi-GPU g6e type"),
    ({"instance_type": "g6e.24xlarge"}, "serving.multi_node.instance_type: got 'g6e.24xlarge'; allowed: one of generations.g6e.instance_types"),
    ({"gpu_memory_utilization": 0.5}, "serving.multi_node.nodes_per_replica: got 2 at TP 4 x PP 2; allowed: enough GPUs that the weights fit"),
    ({"max_model_len": 1_048_576}, "serving.multi_node.max_model_len: got 1048576 at TP 4 x PP 2; allowed: a context whose KV cache fits"),
    ({"replicas": 2}, "serving.multi_node.replicas: got 2; allowed: what generations.g6e.max_nodes (8) admits"),
    ({"model_id": "meta-llama/Llama-3.1-8B"}, "serving.multi_node.model_id: got 'meta-llama/Llama-3.1-8B'; allowed: a model whose shape"),
    ({"replics": 2}, "serving.multi_node.replics: unknown key"),
])
def test_bad_layouts_are_refused_with_the_key_the_value_and_what_fits(override, message) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config({"serving": {"multi_node": {"enabled": True, **override}}})
    assert message in str(excinfo.value)


def test_groups_need_their_generation_and_a_zone_each() -> None:
    with pytest.raises(ConfigError, match=r"serving.multi_node.generation: got 'g6e'; allowed: an enabled generation"):
        load_config({**ON, "generations": {"g6e": {"enabled": False}}})
    with pytest.raises(ConfigError, match=r"serving.multi_node.replicas: got 3; allowed: at most network.az_count \(2\)"):
        load_config({"serving": {"multi_node": {"enabled": True, "replicas": 3}}, "network": {"az_count": 2},
                     "generations": {"g6e": {"max_nodes": 20}}})
    assert load_config({}, "examples/multinode-scout.yaml").serving.multi_node.replicas == 2


def test_what_it_switches_on_only_when_on() -> None:
    from gennstack.cost.model import hourly_cost, multi_node_items
    from gennstack.cost.prices import load_table
    from gennstack.system_capacity import deployments
    from gennstack_infra.components.interruption_handler import drain_on

    off, on = load_config({}), load_config({}, "examples/multinode-scout.yaml")
    assert "groups" not in drain_on(off)["gen3-g6e"]
    assert drain_on(on)["gen3-g6e"]["groups"] == "app.kubernetes.io/name=gen3-g6e-multinode,app.kubernetes.io/component=server"
    table = load_table("us-east-1")
    assert "multi_node" not in hourly_cost(off, table).groups
    nodes, volumes = multi_node_items(on, table)
    assert nodes.quantity == 4 and nodes.on_demand_usd_per_hour == pytest.approx(4 * table.on_demand_price("g6e.12xlarge").usd)
    assert "lws-controller-manager" not in {line.component for line in deployments(off)}
    assert "lws-controller-manager" in {line.component for line in deployments(on)}


def test_warm_spare_groups_are_priced_like_groups() -> None:
    """A spare group holds nodes_per_replica nodes as a serving group does (templates/multinode-warm-spare.yaml),
    so the cost counts it, as it counts single-node spares like replicas."""
    from gennstack.cost.model import multi_node_items
    from gennstack.cost.prices import load_table

    table = load_table("us-east-1")
    config = load_config({"serving": {"multi_node": {"warm_spare_replicas": 1}}}, "examples/multinode-scout.yaml")
    nodes, volumes = multi_node_items(config, table)
    assert nodes.quantity == volumes.quantity == 6  # (2 groups + 1 spare group) x 2 nodes
    assert nodes.on_demand_usd_per_hour == pytest.approx(6 * table.on_demand_price("g6e.12xlarge").usd)
    assert "2 group(s) + 1 warm spare group(s) of 2" in nodes.name


def test_readme_shows_the_capacity_model_and_the_cost_of_the_overlay() -> None:
    """docs/serving.md's multi-node table holds gennstack.serving.capacity's and gennstack.cost's numbers
    for examples/multinode-scout.yaml."""
    from gennstack.cost.model import multi_node_items
    from gennstack.cost.prices import load_table
    from gennstack.serving.capacity import gb
    from tests.support import ROOT

    readme = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    config = load_config({}, "examples/multinode-scout.yaml")
    p = multi_node_plan(config.serving.multi_node)
    assert (f"weights {gb(p.weights)}, KV cache {gb(p.kv_cache)} (paged, shared; {gb(p.kv_per_sequence)} per "
            f"32768-token sequence), margin {gb(p.margin)}: at most {p.max_sequences} sequences of 32768 tokens") in readme
    nodes, volumes = multi_node_items(config, load_table("us-east-1"))
    assert (f"{nodes.spot_usd_per_hour:.2f} $/h at the spot estimate, {nodes.on_demand_usd_per_hour:.2f} $/h on-demand, "
            f"plus {volumes.on_demand_usd_per_hour:.2f} $/h of root volumes") in readme
    assert f"`startup_timeout_seconds` {config.serving.multi_node.startup_timeout_seconds} s" in readme
