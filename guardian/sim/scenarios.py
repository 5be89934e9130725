"""Named, seeded workloads and faults for the simulator: what ``guardian demo --scenario`` plays.

A scenario is data: a request-rate curve, prompt and output length
distributions, engine parameters, and a timeline of GPU faults. The same
scenario with the same seed produces the same arrivals and the same faults,
so a demo run and a test see the same story.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from guardian.sim.engine import EngineParams
from guardian.sim.fake_nvml import SimGpu


@dataclass(frozen=True)
class Lengths:
    """Log-normal token counts, clipped: most prompts are short, a few are very long."""

    median: int
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return int(min(self.high, max(self.low, rng.lognormvariate(math.log(self.median), self.sigma))))


@dataclass(frozen=True)
class Fault:
    """Something that happens to a GPU at ``at`` seconds into the run."""

    at: float
    kind: str  # leak_step, spike, give_back, gpu_lost, gpu_back, hang
    amount: float = 0.0  # fraction of GPU memory (leak_step, spike) or seconds (hang)

    def apply(self, gpu: SimGpu) -> None:
        if self.kind in ("leak_step", "spike"):
            gpu.overhang_bytes += int(self.amount * gpu.total_bytes)
        elif self.kind == "give_back":
            gpu.overhang_bytes = max(0, gpu.overhang_bytes - int(self.amount * gpu.total_bytes))
        elif self.kind == "gpu_lost":
            gpu.lost = True
        elif self.kind == "gpu_back":
            gpu.lost = False
        elif self.kind == "hang":
            gpu.hang_seconds = self.amount
        else:
            raise ValueError(f"unknown fault kind {self.kind!r}")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    rate: Callable[[float], float]  # requests per second at t seconds
    prompt: Lengths
    output: Lengths
    engine: EngineParams = EngineParams()
    faults: tuple[Fault, ...] = ()
    stream_share: float = 0.5  # share of requests sent with stream=true
    long_share: float = 0.0  # share of requests drawn from long_prompt instead
    long_prompt: Lengths | None = None
    demo_seconds: float = 60.0  # how long `guardian demo` plays it by default
    # breaker thresholds this scenario is played with in the demo (BreakerParams field -> value)
    breaker: Mapping[str, float] = field(default_factory=dict)
    preset: str | None = None  # the engine preset the demo's config names (the engine's params match it)
    tuner: Mapping[str, Any] | None = None  # [tuner] settings the demo runs with; None: no tuner

    def draw_prompt(self, rng: random.Random) -> int:
        if self.long_prompt is not None and rng.random() < self.long_share:
            return self.long_prompt.draw(rng)
        return self.prompt.draw(rng)


def _steady(t: float) -> float:
    return 4.0


def _burst(t: float) -> float:
    return 24.0 if t % 20.0 >= 14.0 else 1.5  # 6 s of burst every 20 s


# The demo's staircase: steps far enough apart for the detector's hold (20 polls)
# to finish between them, and a spike given back that must not count.
STAIRCASE_STEPS = (10.0, 40.0, 70.0, 100.0)
STAIRCASE_STEP_RATIO = 0.015  # of the GPU's memory


def _staircase() -> tuple[Fault, ...]:
    leak = tuple(Fault(t, "leak_step", STAIRCASE_STEP_RATIO) for t in STAIRCASE_STEPS)
    spike = (Fault(25.0, "spike", 0.02), Fault(27.0, "give_back", 0.02))  # after the warm-up, between two steps
    return spike + leak


# The breaker's walk: a leak big enough to cross every level in turn. The
# engine leaves 30% of its GPU free so the leak has room; 6% steps, 30 s
# apart so the leak detector holds each one (20 polls) before the next.
BREAKER_STEPS = (8.0, 38.0, 68.0, 98.0)
BREAKER_STEP_RATIO = 0.06
# With the default thresholds a leak enters L2 (2% past the budget) long before
# fragmentation reaches 35%; these make each level's rule fire in turn: one
# step is fragmentation (L1), two are past the budget (L2), four eat the
# reserve (L3).
BREAKER_THRESHOLDS = {
    "l1_enter_fragmentation_ratio": 0.05,
    "l1_exit_fragmentation_ratio": 0.04,
    "l2_budget_margin_ratio": 0.10,
}


# The tuner in seconds instead of minutes: short windows and cooldowns, a queue
# held 5 s (not 5 min) before the engine's own --max-num-seqs is raised.
TUNER_DEMO: Mapping[str, Any] = {
    "slo": {"target_seconds": 0.5}, "window_seconds": 6.0, "min_samples": 6, "cooldown_seconds": 6.0,
    "up_window_seconds": 2.0, "up_min_samples": 2, "up_cooldown_seconds": 2.0, "pinned_seconds": 5.0,
}  # fmt: skip


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="steady",
            description="a steady chat workload: 4 req/s, prompts around 1500 tokens",
            rate=_steady,
            prompt=Lengths(1500, 0.8, 16, 16000),
            output=Lengths(160, 0.7, 8, 1024),
        ),
        Scenario(
            name="burst",
            description="1.5 req/s with a 24 req/s burst for 6 s every 20 s: queueing and TTFT spikes",
            rate=_burst,
            prompt=Lengths(800, 0.8, 16, 8000),
            output=Lengths(200, 0.7, 8, 1024),
        ),
        Scenario(
            name="staircase-leak",
            description="steady load while GPU memory outside vLLM's pool steps up 1.5% every 30 s (and one spike given back)",
            rate=_steady,
            prompt=Lengths(1500, 0.8, 16, 16000),
            output=Lengths(160, 0.7, 8, 1024),
            faults=_staircase(),
            demo_seconds=90.0,
        ),
        Scenario(
            name="long-context-flood",
            description="a third of requests carry 16k-60k token prompts: the gateway keeps them to 0.5% of the engine's time "
            "while short requests flow (the rest 429 + Retry-After): the KV cache never fills, the breaker stays at L0",
            rate=lambda t: 3.0,
            prompt=Lengths(500, 0.7, 16, 4000),
            output=Lengths(300, 0.6, 16, 2048),
            long_share=0.35,
            long_prompt=Lengths(28000, 0.4, 16000, 60000),
            engine=EngineParams(num_gpu_blocks=6000),
        ),
        Scenario(
            name="tuner-queue",
            description="5 req/s against an engine started at the low_latency preset (--max-num-seqs 4): the gateway's "
            "queue builds, the tuner restarts the engine at the GPU's batch cap, and the gateway's cap follows",
            rate=lambda t: 5.0,
            prompt=Lengths(800, 0.6, 16, 4000),
            output=Lengths(120, 0.6, 8, 512),
            engine=EngineParams(max_num_seqs=4),
            preset="low_latency",
            tuner=TUNER_DEMO,
            demo_seconds=60.0,
        ),
        Scenario(
            name="breaker-staircase",
            description="a leak of 6% steps in vLLM's own process walks the breaker up L1 -> L2 -> L3; guardian "
            "drains and restarts the engine (the leak dies with it), and the level comes back down",
            rate=_steady,
            prompt=Lengths(1500, 0.8, 16, 16000),
            output=Lengths(160, 0.7, 8, 1024),
            engine=EngineParams(gpu_memory_utilization=0.7, num_gpu_blocks=8000),
            faults=tuple(Fault(t, "leak_step", BREAKER_STEP_RATIO) for t in BREAKER_STEPS),
            demo_seconds=140.0,
            breaker=BREAKER_THRESHOLDS,
        ),
    )
}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; choose one of: {', '.join(SCENARIOS)}") from None
