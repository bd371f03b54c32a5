"""The local drill's real-model case (gennstack/drill/smollm2_drill.py, ``gennstack drill --local --cases
smollm2``): SmolLM2 replicas on the demo token server behind real Envoy, the replica serving a stream SIGKILLed
mid-answer, the resume relay off and on. Skips without `make setup-demo`, fails under CI=true."""

from __future__ import annotations

import json

import pytest

from gennstack.drill.smollm2_drill import DemoDrillSettings, demo_markdown, run_demo_drill
from tests.gateway.test_gateway_smollm2 import _require_llama_cpp

# real Envoy, the relay and llama.cpp processes: `make test`'s serial phase
pytestmark = [pytest.mark.slow, pytest.mark.timing]

SMALL = DemoDrillSettings(replicas=2, streams=3, max_tokens=64, kill_after_chunks=16)


def test_settings_are_checked() -> None:
    for settings, message in ((DemoDrillSettings(replicas=1), "replicas 1"), (DemoDrillSettings(streams=9), "streams 9"),
                              (DemoDrillSettings(kill_after_chunks=96), "kill_after_chunks 96")):
        with pytest.raises(ValueError, match=message):
            settings.check()


def test_a_killed_smollm2_replica_breaks_streams_only_with_resume_off(tmp_path) -> None:
    _require_llama_cpp()
    off, on = run_demo_drill(tmp_path, SMALL)
    print(demo_markdown(SMALL, [off, on]))
    for row in (off, on):
        assert row.mid_answer >= 1, row  # the killed replica was serving a stream, text had arrived
    # off: each stream cut mid-answer is broken; the others are the untouched replica's text
    assert off.broken == off.mid_answer and off.resumed == 0 and off.identical == off.streams - off.broken, off
    # on: nothing broken, every cut stream resumed, every text the untouched replica's
    assert on.broken == 0 and on.resumed == on.mid_answer and on.identical == on.streams, on
    saved = json.loads((tmp_path / "smollm2.json").read_text())
    assert [r["resume"] for r in saved["rows"]] == [False, True]
    assert (tmp_path / "smollm2.md").read_text().count("\n| o") == 2
