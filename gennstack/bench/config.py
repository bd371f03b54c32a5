"""Typed settings of one benchmark run, validated once when the command line is parsed."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from gennstack.bench.arrivals import ARRIVALS


class ConfigError(ValueError):
    """A bad setting; the message names the option, the value and what is allowed."""


@dataclass(frozen=True, slots=True)
class Distribution:
    """A length in tokens: fixed, or sampled per request (never below 1).

    Spec strings: ``512`` (fixed), ``normal:512,128`` (mean, standard deviation; resampled
    until positive, as LLMPerf does), ``uniform:256,1024`` (inclusive integer bounds).
    """

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, spec: str, *, option: str) -> Distribution:
        text = str(spec).strip()
        allowed = "an integer N, normal:MEAN,STDDEV or uniform:LOW,HIGH"
        try:
            if ":" not in text:
                value = int(text)
                if value < 1:
                    raise ConfigError(f"{option}={spec!r}: must be at least 1")
                return cls("fixed", value)
            kind, _, params = text.partition(":")
            numbers = [float(p) for p in params.split(",")]
        except ValueError:
            raise ConfigError(f"{option}={spec!r}: expected {allowed}") from None
        if kind == "normal" and len(numbers) == 2:
            mean, std = numbers
            if mean < 1 or std < 0:
                raise ConfigError(f"{option}={spec!r}: normal needs MEAN >= 1 and STDDEV >= 0")
            return cls("normal", mean, std)
        if kind == "uniform" and len(numbers) == 2:
            low, high = numbers
            if not (1 <= low <= high) or low != int(low) or high != int(high):
                raise ConfigError(f"{option}={spec!r}: uniform needs integers 1 <= LOW <= HIGH")
            return cls("uniform", low, high)
        raise ConfigError(f"{option}={spec!r}: expected {allowed}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        while True:
            value = int(round(rng.gauss(self.a, self.b)))
            if value >= 1:
                return value

    @property
    def mean(self) -> int:
        if self.kind == "uniform":
            return int(round((self.a + self.b) / 2))
        return int(round(self.a))

    @property
    def stddev(self) -> int:
        if self.kind == "fixed":
            return 0
        if self.kind == "uniform":
            return int(round((self.b - self.a + 1) / math.sqrt(12)))
        return int(round(self.b))

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "uniform":
            return f"uniform:{int(self.a)},{int(self.b)}"
        return f"normal:{self.a:g},{self.b:g}"

    def to_dict(self) -> dict:
        return {"spec": str(self), "kind": self.kind, "mean": self.mean, "stddev": self.stddev}


def parse_concurrency(spec: str) -> tuple[int, ...]:
    """``"32"`` or ``"32,160,200"``: positive integers, run in the order given."""
    try:
        levels = tuple(int(part) for part in str(spec).split(",") if part.strip())
    except ValueError:
        raise ConfigError(
            f"--concurrency={spec!r}: expected one positive integer or a comma list such as 32,160,200"
        ) from None
    if not levels or any(level < 1 for level in levels):
        raise ConfigError(f"--concurrency={spec!r}: every level must be at least 1")
    return levels


def parse_rates(spec: str) -> tuple[tuple[float, ...], bool]:
    """``"2"``, ``"0.5,1,2"`` (requests/s, run in the order given) or ``"sweep"``: (rates, sweep)."""
    if str(spec).strip() == "sweep":
        return (), True
    try:
        rates = tuple(float(part) for part in str(spec).split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--rate={spec!r}: expected requests/s, a comma list such as 0.5,1,2, or sweep") from None
    if not rates or any(not (math.isfinite(r) and r > 0) for r in rates):
        raise ConfigError(f"--rate={spec!r}: every rate must be a finite number of requests/s above 0")
    return rates, False


WORKLOADS = ("single", "multi-turn", "shared-prefix")


@dataclass(frozen=True, slots=True)
class Workload:
    """What each request holds. ``single``: one fresh user prompt per request (the tool's original
    load). ``multi-turn``: conversations of ``turns`` turns, each turn resending the history (the
    server's own answers included) plus a new user message of ``--prompt-tokens``, ``think_time_s``
    between an answer and the next turn. ``shared-prefix``: a system prompt of ``prefix_tokens``
    picked from ``num_prefixes`` distinct ones with Zipf exponent ``prefix_zipf`` (0: uniform), then
    a distinct question of ``--prompt-tokens``. A multi-turn conversation may start with such a
    system prompt too (``num_prefixes`` given).

    Flag names follow the peers' tools where they have one: genai-perf's ``--session-turns-mean`` /
    ``--session-turn-delay-mean`` (here ``--turns`` and ``--think-time``, seconds like every time
    flag of this tool), vLLM ``bench serve``'s ``--prefix-repetition-num-prefixes`` /
    ``--prefix-repetition-prefix-len`` and inference-perf's ``shared_prefix.num_groups`` /
    ``system_prompt_len`` (here ``--num-prefixes`` and ``--prefix-tokens``); none of them skews the
    choice of prefix, so ``--prefix-zipf`` is ours (the Zipf of vLLM's multi-turn generator,
    ``benchmarks/multi_turn``, over a finite set so any exponent >= 0 is allowed). docs/benchmark.md.
    """

    kind: str = "single"
    turns: int = 1
    think_time_s: float = 0.0
    num_prefixes: int = 0
    prefix_tokens: int = 0
    prefix_zipf: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in WORKLOADS:
            raise ConfigError(f"--workload={self.kind!r}: expected one of {', '.join(WORKLOADS)}")
        if not isinstance(self.turns, int) or self.turns < 1:
            raise ConfigError(f"--turns={self.turns!r}: must be an integer of at least 1")
        if not (isinstance(self.think_time_s, (int, float)) and math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise ConfigError(f"--think-time={self.think_time_s!r}: must be 0 or more seconds")
        if not isinstance(self.num_prefixes, int) or self.num_prefixes < 0:
            raise ConfigError(f"--num-prefixes={self.num_prefixes!r}: must be an integer of at least 1")
        if not isinstance(self.prefix_tokens, int) or self.prefix_tokens < 0:
            raise ConfigError(f"--prefix-tokens={self.prefix_tokens!r}: must be an integer of at least 1")
        if not (isinstance(self.prefix_zipf, (int, float)) and math.isfinite(self.prefix_zipf) and self.prefix_zipf >= 0):
            raise ConfigError(f"--prefix-zipf={self.prefix_zipf!r}: must be a finite number >= 0 (0: every prefix equally likely)")
        if self.kind != "multi-turn" and (self.turns != 1 or self.think_time_s):
            flag = "--turns" if self.turns != 1 else "--think-time"
            raise ConfigError(f"{flag} goes with --workload multi-turn, not --workload {self.kind}")
        if self.kind == "single" and (self.num_prefixes or self.prefix_tokens or self.prefix_zipf):
            raise ConfigError("--num-prefixes, --prefix-tokens and --prefix-zipf go with --workload shared-prefix "
                              "or multi-turn, not --workload single")
        if self.kind == "shared-prefix" and not (self.num_prefixes and self.prefix_tokens):
            raise ConfigError(f"--workload shared-prefix needs --num-prefixes N and --prefix-tokens L of at least 1 "
                              f"(given {self.num_prefixes} and {self.prefix_tokens})")
        if self.kind == "multi-turn" and bool(self.num_prefixes) != bool(self.prefix_tokens):
            raise ConfigError("--workload multi-turn: give --num-prefixes and --prefix-tokens together "
                              f"(a system prompt for each conversation) or neither; given {self.num_prefixes} and {self.prefix_tokens}")
        if self.prefix_zipf and not self.num_prefixes:
            raise ConfigError("--prefix-zipf goes with --num-prefixes")

    @property
    def has_prefixes(self) -> bool:
        return self.num_prefixes > 0

    def prefix_weights(self) -> list[float]:
        """P(prefix of rank k), k = 1..N: proportional to 1 / k ** prefix_zipf (Zipf's law over a finite set)."""
        raw = [1.0 / (k ** self.prefix_zipf) for k in range(1, self.num_prefixes + 1)]
        total = math.fsum(raw)
        return [w / total for w in raw]

    def to_dict(self) -> dict:
        out: dict = {"kind": self.kind}
        if self.kind == "multi-turn":
            out.update(turns=self.turns, think_time_s=self.think_time_s)
        if self.has_prefixes:
            out.update(num_prefixes=self.num_prefixes, prefix_tokens=self.prefix_tokens, prefix_zipf=self.prefix_zipf)
        return out


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """Everything that shapes the load. Built by :func:`gennstack.bench.cli` from flags."""

    base_url: str
    model: str
    concurrency: tuple[int, ...]
    prompt_tokens: Distribution
    max_tokens: Distribution
    duration_s: float | None = None
    num_requests: int | None = None
    warmup_s: float = 0.0
    ramp_up_s: float = 0.0  # workers start evenly spread over this many seconds
    warmup_requests: int | None = None  # None: one per worker (the synchronised first wave)
    api_key: str | None = field(default=None, repr=False)
    request_timeout_s: float = 600.0
    stall_timeout_s: float = 60.0
    ignore_eos: bool = False
    include_usage: bool = True
    extra_body: dict = field(default_factory=dict)
    seed: int = 0
    # PEM file of the CA that signed the server's certificate (the gateway's own CA), trusted
    # instead of the public roots; None: the public roots.
    ca_file: str | None = None
    workload: Workload = field(default_factory=Workload)
    # response header recorded per request (requests.csv ``upstream``), e.g. the replica a gateway chose
    record_header: str | None = None
    # open loop (gennstack.bench.arrivals): requests/s per level, run after the concurrency levels; () none
    rates: tuple[float, ...] = ()
    sweep: bool = False  # --rate sweep: synchronous, throughput, then sweep_levels rates between them
    sweep_levels: int = 5
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_in_flight: int = 256  # open loop: most requests in flight at once; the rest wait, and are late
    schedule_tolerance_s: float = 0.010  # open loop: a request sent later than this after it was due is late
    slo: object | None = None  # gennstack.bench.slo.SLO
    slo_target: float = 0.9

    def __post_init__(self) -> None:
        if (self.duration_s is None) == (self.num_requests is None):
            raise ConfigError("give exactly one of --duration or --num-requests")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ConfigError(f"--duration={self.duration_s!r}: must be greater than 0 seconds")
        if self.num_requests is not None and self.num_requests < 1:
            raise ConfigError(f"--num-requests={self.num_requests!r}: must be at least 1")
        if self.ramp_up_s < 0:
            raise ConfigError(f"--ramp-up={self.ramp_up_s!r}: must be 0 or more seconds")
        if self.warmup_s < 0:
            raise ConfigError(f"--warmup-seconds={self.warmup_s!r}: must be 0 or more")
        if self.warmup_requests is not None and self.warmup_requests < 0:
            raise ConfigError(f"--warmup-requests={self.warmup_requests!r}: must be 0 or more")
        if self.duration_s is not None and self.warmup_requests is not None:
            raise ConfigError("--warmup-requests goes with --num-requests; use --warmup-seconds with --duration")
        if self.num_requests is not None and self.warmup_s:
            raise ConfigError("--warmup-seconds goes with --duration; use --warmup-requests with --num-requests")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"--base-url={self.base_url!r}: must start with http:// or https://")
        if self.request_timeout_s <= 0 or self.stall_timeout_s <= 0:
            raise ConfigError("--timeout and --stall-timeout must be greater than 0 seconds")
        if self.record_header is not None and not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", self.record_header):
            raise ConfigError(f"--record-header={self.record_header!r}: not an HTTP header name (letters, digits and -)")
        self._check_open_loop()
        if self.ca_file is not None:
            if not self.base_url.startswith("https://"):
                raise ConfigError(f"--ca-file goes with an https:// --base-url, not {self.base_url!r}")
            if not Path(self.ca_file).is_file():
                raise ConfigError(f"--ca-file={self.ca_file!r}: no such file (the CA certificate, PEM)")

    def _check_open_loop(self) -> None:
        for rate in self.rates:
            if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
                raise ConfigError(f"--rate={rate!r}: each rate must be a finite number of requests/s above 0")
        if self.arrival not in ARRIVALS:
            raise ConfigError(f"--arrival={self.arrival!r}: expected one of {', '.join(ARRIVALS)}")
        if not (isinstance(self.burstiness, (int, float)) and math.isfinite(self.burstiness) and self.burstiness > 0):
            raise ConfigError(f"--burstiness={self.burstiness!r}: must be a finite number above 0 (1: Poisson)")
        if self.burstiness != 1.0 and self.arrival != "poisson":
            raise ConfigError(f"--burstiness goes with --arrival poisson (the gamma shape of its gaps), not --arrival {self.arrival}")
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ConfigError(f"--max-in-flight={self.max_in_flight!r}: must be an integer of at least 1")
        if not (self.schedule_tolerance_s > 0 and math.isfinite(self.schedule_tolerance_s)):
            raise ConfigError(f"--schedule-tolerance={self.schedule_tolerance_s!r}: must be a number of seconds above 0")
        if not 0 < self.slo_target <= 1:
            raise ConfigError(f"--slo-target={self.slo_target!r}: must be a share above 0 and at most 1, e.g. 0.9")
        if not isinstance(self.sweep_levels, int) or self.sweep_levels < 1:
            raise ConfigError(f"--sweep-levels={self.sweep_levels!r}: must be an integer of at least 1")
        if self.sweep and self.slo is None:
            raise ConfigError("--rate sweep needs --slo (the sweep reports the highest rate that meets it)")
        if (self.rates or self.sweep) and self.ramp_up_s:
            raise ConfigError("--ramp-up goes with closed-loop --concurrency levels; an open-loop --rate level "
                              "starts requests on its schedule")

    @property
    def open_loop(self) -> bool:
        return bool(self.rates) or self.sweep

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def warmup_requests_for(self, concurrency: int) -> int:
        if self.num_requests is None:
            return 0
        return concurrency if self.warmup_requests is None else self.warmup_requests

    def to_dict(self) -> dict:
        """The settings as recorded in the result file (never the API key)."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "concurrency": list(self.concurrency),
            "prompt_tokens": self.prompt_tokens.to_dict(),
            "max_tokens": self.max_tokens.to_dict(),
            "duration_s": self.duration_s,
            "num_requests": self.num_requests,
            "warmup_s": self.warmup_s,
            "warmup_requests": self.warmup_requests,
            "ramp_up_s": self.ramp_up_s,
            "request_timeout_s": self.request_timeout_s,
            "stall_timeout_s": self.stall_timeout_s,
            "ignore_eos": self.ignore_eos,
            "include_usage": self.include_usage,
            "extra_body": self.extra_body,
            "seed": self.seed,
            "api_key_set": bool(self.api_key),
            "ca_file": self.ca_file,
            "workload": self.workload.to_dict(),
            "record_header": self.record_header,
            **self._open_loop_dict(),
        }

    def _open_loop_dict(self) -> dict:
        """Only what was asked for, so a closed-loop run's settings read as they did before open-loop levels."""
        out: dict = {}
        if self.open_loop:
            out["open_loop"] = {"rates": "sweep" if self.sweep else list(self.rates), "arrival": self.arrival,
                                "burstiness": self.burstiness, "max_in_flight": self.max_in_flight,
                                "schedule_tolerance_s": self.schedule_tolerance_s}
            if self.sweep:
                out["open_loop"]["sweep_levels"] = self.sweep_levels
        if self.slo is not None:
            out["slo"] = {**self.slo.to_dict(), "target": self.slo_target}
        return out
