"""docs/autoscaling.md shows what the code does for the defaults: keys, defaults, messages, summary line."""

from __future__ import annotations

import pytest

from gennstack.config import ConfigError, load_config
from gennstack.serving.scaling import scaling_line
from tests.support import ROOT

DOC = (ROOT / "docs" / "autoscaling.md").read_text(encoding="utf-8")
KEYS = ("min_replicas", "max_replicas", "target_ongoing_requests", "scale_up_delay_seconds", "scale_down_delay_seconds")


def _row(key: str) -> str:
    return next(line for line in DOC.splitlines() if line.startswith(f"| `{key}`"))


def test_table_lists_every_scaling_key_with_its_defaults() -> None:
    serving = load_config({}).serving
    for key in KEYS:
        values = [getattr(getattr(serving, gen), key) for gen in ("inf2", "trn2", "g6e")]
        shown = " / ".join(str(v) for v in values) if len(set(values)) > 1 else str(values[0])
        assert f"| {shown} |" in _row(key), (key, shown, _row(key))


def test_summary_example_is_what_summary_prints() -> None:
    g6e = load_config({}).serving.g6e.model_dump()
    assert f"`{scaling_line('g6e', g6e)}`" in DOC


@pytest.mark.parametrize("serving, shown", [
    ({"g6e": {"replicas": 3}}, "serving.g6e.replicas: got 3; allowed: no longer a key: use min_replicas and max_replicas ("),
    ({"trn2": {"max_replicas": 3}}, "serving.trn2.max_replicas: got 3; allowed: at most what generations.trn2.max_nodes (2) admits"),
])
def test_quoted_errors_are_the_real_ones(serving, shown) -> None:
    assert shown in DOC.replace("...", "")
    with pytest.raises(ConfigError) as error:
        load_config({"serving": serving})
    assert shown in str(error.value)


def test_scrape_interval_is_the_vllm_pod_monitors() -> None:
    """The simulation's scrape (and the doc's) is the interval Prometheus scrapes vLLM at."""
    from gennstack.observability.manifests import pod_monitors
    from tests.autoscaling.hpa_model import SCRAPE_SECONDS

    monitor = next(m for m in pod_monitors(generations=["trn2", "g6e"], serving_namespace="s")
                   if m["metadata"]["name"] == "gennstack-vllm")
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == f"{SCRAPE_SECONDS}s"
    assert f"Prometheus last scraped (every {SCRAPE_SECONDS} s" in DOC
    assert f"a spike one scrape sees ({SCRAPE_SECONDS} s)" in DOC
