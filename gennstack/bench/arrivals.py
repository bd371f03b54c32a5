"""Open-loop arrival schedules: when each request (or conversation) is due, fixed before the level starts.

A schedule is a list of send times in seconds from the level's start, drawn from a seeded generator, so the
same seed, rate and arrival process give the same times on every machine. The gap between two arrivals is:

* ``constant``: exactly ``1 / rate``;
* ``poisson``: gamma-distributed with shape ``burstiness`` and scale ``1 / (rate * burstiness)``, so its mean is
  ``1 / rate`` and its coefficient of variation ``1 / sqrt(burstiness)``. ``burstiness`` 1 (the default) is the
  exponential gap of a Poisson process; below 1 burstier, above 1 more even. This is ``vllm bench serve``'s
  ``--burstiness`` (vllm 0.29.0 ``vllm/benchmarks/serve.py`` ``get_request``:
  ``theta = 1.0 / (current_request_rate * burstiness)``; ``np.random.gamma(shape=burstiness, scale=theta)``).

The first arrival is one gap after the start, as in vLLM (its first delay is drawn like the others). vLLM then
rescales a schedule of N requests so that the last one lands at exactly ``N / rate``; we do not (the gaps stay
independent draws, which the Poisson statistics test checks), so a seeded level's offered rate differs from the
nominal one by the sampling error, and the result reports both.
"""

from __future__ import annotations

import math
import random

ARRIVALS = ("poisson", "constant")


def schedule_rng(seed: int, rate: float) -> random.Random:
    """The generator of one level's schedule: one per (seed, rate), independent of the prompts' generator."""
    return random.Random(f"{seed}:arrivals:{rate!r}")


def gaps(rate: float, *, arrival: str, burstiness: float, rng: random.Random):
    """An endless sequence of inter-arrival gaps in seconds."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate {rate!r}: must be a finite number of requests/s above 0")
    if arrival == "constant":
        while True:
            yield 1.0 / rate
    if arrival != "poisson":
        raise ValueError(f"arrival {arrival!r}: expected one of {', '.join(ARRIVALS)}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness {burstiness!r}: must be a finite number above 0")
    theta = 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, theta)


def schedule(rate: float, *, arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0,
             count: int | None = None, until: float | None = None) -> list[float]:
    """Send times from the level's start: ``count`` of them, or every one before ``until`` seconds."""
    if (count is None) == (until is None):
        raise ValueError("give exactly one of count or until")
    times: list[float] = []
    if count == 0:
        return times
    t = 0.0
    for k, gap in enumerate(gaps(rate, arrival=arrival, burstiness=burstiness, rng=schedule_rng(seed, rate)), start=1):
        t = k / rate if arrival == "constant" else t + gap  # k / rate: no rounding carried from one gap to the next
        if until is not None and t >= until:
            break
        times.append(t)
        if count is not None and len(times) >= count:
            break
    return times
