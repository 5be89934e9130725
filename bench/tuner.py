"""The tuner against static presets: goodput, P99, GPU utilisation and restarts on three one-hour workloads.

    python bench/tuner.py [--minutes 60] [--seed 1] [--jobs 2]

Set-up, side by side in one run: the simulator's engine model
(``guardian/sim/engine.py``, an 8B model on an H100-like GPU: 4096 KV blocks
of 16 tokens, an 8 ms step plus 0.3 ms per running sequence plus 40 us per
prefill token) driven in simulated time, with the admission gateway's
discipline in front of it (a concurrency cap per engine and a FIFO queue).
Each workload is run once per static preset (``--max-num-seqs`` and block
size from DESIGN.md's table; the gateway cap equals ``--max-num-seqs``) and
twice with the tuner, deployed as guardian recommends: vLLM started with
``--max-num-seqs`` at the hardware cap (24 on an H100), the gateway's cap
the batch. ``tuner`` starts where guardian starts it (the cap); ``tuner-from-8``
starts the gateway's cap at the ``mixed`` preset's 8, to show the way up.
The targets are judged on ``tuner``. The tuner is
guardian's own: every poll (5 s) renders the engine's vLLM ``/metrics`` page,
parses it with guardian's scraper code, feeds guardian's ``EngineTracker``
(60 s latency window) and calls ``policy.tuner.step``; fast moves set the
gateway cap, slow ones make a drained restart (dispatch stops, the running
requests finish, the engine is down ``--load-seconds``, then starts with the
new arguments).

Workloads (seeded; prompts lognormal around 600 tokens, outputs up to 256):
diurnal (1.5 → 7.5 → 1.5 req/s over the hour), bursty (2.5 req/s with four
2-minute spikes to 10 req/s, ×4), long-context mix (3 req/s, 5% of prompts
8k–24k tokens).

Goodput: requests whose first token reached the client within the SLO (TTFT
500 ms by default, gateway queue included) per second. The bench's SLO is
500 ms, not guardian's default 200 ms: with these prompts (P99 ~2400 tokens)
the simulated engine's own TTFT P99 is ~210 ms at any batch, so a 200 ms
objective is missed by prefill alone and no batch size can meet it. Target (issue 6): the tuner's
goodput ≥ the best static preset's on every workload, its P99 ≤ 2× the best
preset's, ≤ 3 restarts per hour.

Left out: the breaker (level 0 throughout) and NVML memory; one engine.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from guardian.actions.engine_args import overlay  # noqa: E402
from guardian.analysis.engine_stats import EngineTracker  # noqa: E402
from guardian.policy import tuner  # noqa: E402
from guardian.policy.profiles import BUILTIN_PRESETS, hardware_profile  # noqa: E402
from guardian.policy.slo import Slo  # noqa: E402
from guardian.policy.tuner import Limits, TunerParams  # noqa: E402
from guardian.sample import EngineReading  # noqa: E402
from guardian.sim.engine import EngineModel, EngineParams, SimRequest  # noqa: E402
from guardian.sim.launcher import engine_params  # noqa: E402
from guardian.sources import promtext, vllm_page  # noqa: E402

POLL = 5.0
GPU = "NVIDIA H100 80GB HBM3"
SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


# -- workloads -------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt_tokens: int
    max_tokens: int


def _requests(rate: Callable[[float], float], peak: float, seconds: float, rng: random.Random, long_share: float = 0.0) -> list[Arrival]:
    """A Poisson process of varying rate by thinning: the same list for every configuration."""
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= seconds:
            return out
        if rng.random() * peak > rate(t):
            continue
        if rng.random() < long_share:
            out.append(Arrival(t, rng.randint(8192, 24576), rng.randint(64, 192)))
        else:
            out.append(Arrival(t, min(4000, max(16, int(rng.lognormvariate(math.log(600), 0.6)))), rng.randint(32, 256)))


def workloads(seconds: float, seed: int) -> dict[str, list[Arrival]]:
    def diurnal(t: float) -> float:
        return 1.5 + 6 * (1 - math.cos(2 * math.pi * t / seconds)) / 2

    spikes = [seconds * f for f in (0.15, 0.4, 0.65, 0.85)]

    def bursty(t: float) -> float:
        return 10.0 if any(s <= t < s + 120 for s in spikes) else 2.5

    return {
        "diurnal": _requests(diurnal, 7.5, seconds, random.Random(seed)),
        "bursty": _requests(bursty, 10.0, seconds, random.Random(seed + 1)),
        "long-context": _requests(lambda t: 3.0, 3.0, seconds, random.Random(seed + 2), long_share=0.05),
    }


# -- one run ---------------------------------------------------------------------


@dataclass
class Result:
    workload: str
    config: str
    finished: int = 0
    good: int = 0
    ttft: list[float] = field(default_factory=list)
    busy: float = 0.0
    restarts: int = 0
    moves: list[str] = field(default_factory=list)
    p99s: list[float | None] = field(default_factory=list)  # the engine P99 the tuner read, per poll
    seconds: float = 0.0
    wall: float = 0.0


class Bench:
    """One engine behind a gateway cap, in simulated time; the tuner optional."""

    def __init__(self, workload: str, config: str, arrivals: list[Arrival], seconds: float, seed: int, load_seconds: float,
                 slo_seconds: float) -> None:  # fmt: skip
        self.result = Result(workload, config, seconds=seconds)
        self.arrivals = arrivals
        self.seconds = seconds
        self.seed = seed
        self.load_seconds = load_seconds
        self.tuned = config.startswith("tuner")
        preset = BUILTIN_PRESETS["mixed" if self.tuned else config]
        self.params = TunerParams(slo=Slo(target_seconds=slo_seconds))
        self.limits = Limits(hardware_profile(GPU).batch_cap, fast=True, speculation_allowed=True, speculative_config=SPECULATIVE)
        # the tuner's deployment: vLLM started at the hardware cap, the gateway's cap is the batch
        seqs = self.limits.hardware_cap if self.tuned else preset["max_num_seqs"]
        self.args = {"max-num-seqs": seqs, "block-size": preset["block_size"]}
        self._engines = 0  # engines started: each restart gets a seed of its own
        self.engine = self._start(self.args)
        self.state = tuner.initial(seqs, False, self.limits)
        if config == "tuner-from-8":
            self.state = replace(self.state, batch=preset["max_num_seqs"])
        self.cap = self.state.batch if self.tuned else preset["max_num_seqs"]
        self.queue: list[tuple[float, int, Arrival]] = []  # the gateway's FIFO
        self.in_flight = 0
        self.down_until: float | None = None  # a restart: no dispatch until then
        self.draining = False
        self.pending_args: dict[str, object] | None = None
        self.tracker = EngineTracker("bench", 60.0, 3)
        self._busy_before = 0.0

    def _start(self, args: dict[str, object]) -> EngineModel:
        self._engines += 1
        base = EngineParams(max_num_batched_tokens=8192)
        return EngineModel(engine_params(base, args), seed=self.seed * 100 + self._engines)  # type: ignore[arg-type]

    def run(self) -> Result:
        started = time.process_time()
        events: list[tuple[float, int, str, Arrival | None]] = [(a.at, i, "arrive", a) for i, a in enumerate(self.arrivals)]
        n = len(events)
        events += [(k * POLL, n + k, "poll", None) for k in range(1, int(self.seconds / POLL) + 1)]
        heapq.heapify(events)
        while events:
            at, _, kind, arrival = heapq.heappop(events)
            self._advance(at)
            if kind == "arrive":
                assert arrival is not None
                heapq.heappush(self.queue, (arrival.at, id(arrival), arrival))
                self._dispatch(at)
            else:
                self._poll(at)
        self._advance(self.seconds)
        self.result.busy += self.engine.busy_seconds
        self.result.wall = time.process_time() - started
        return self.result

    def _advance(self, now: float) -> None:
        if self.down_until is not None:
            if now < self.down_until:
                return
            self.engine = self._start(self.pending_args or self.args)
            self.args = self.pending_args or self.args
            self.engine.clock = self.down_until
            self.down_until = None
            self._busy_before = 0.0
            self._dispatch(self.engine.clock)
        self.engine.advance(now)
        if self.draining and self.in_flight == 0:
            self.draining = False
            self.result.busy += self.engine.busy_seconds
            self.down_until = self.engine.clock + self.load_seconds

    def _dispatch(self, now: float) -> None:
        while self.queue and self.in_flight < self.cap and not self.draining and self.down_until is None:
            _, _, arrival = heapq.heappop(self.queue)
            self.in_flight += 1
            req = SimRequest(arrival.prompt_tokens, arrival.max_tokens, arrival=max(now, self.engine.clock))
            req.listener = self._listener(req, arrival)
            self.engine.submit(req)

    def _listener(self, req: SimRequest, arrival: Arrival) -> Callable[[int, str | None], None]:
        def on_tokens(tokens: int, reason: str | None) -> None:
            if reason is None:
                return
            self.in_flight -= 1
            self.result.finished += 1
            ttft = (req.first_token_at or req.last_token_at or self.engine.clock) - arrival.at
            self.result.ttft.append(ttft)
            if ttft <= self.params.slo.target_seconds:
                self.result.good += 1
            self._dispatch(self.engine.clock)  # the freed slot goes to the queue at once, as in the gateway

        return on_tokens

    def _poll(self, t: float) -> None:
        if not self.tuned:
            return
        restarting = self.draining or self.down_until is not None
        page = promtext.parse(self.engine.metrics.render().decode())
        reading = EngineReading("bench", up=not restarting, healthy=not restarting,
                                cores=() if restarting else vllm_page.cores_from_page(page))  # fmt: skip
        sig = self.tracker.update(t, reading, {})
        util = None if restarting else min(1.0, (self.engine.busy_seconds - self._busy_before) / POLL)
        self._busy_before = self.engine.busy_seconds
        r = tuner.reading_from(sig, self.params.slo, util, float(len(self.queue)), restarting=restarting)
        self.result.p99s.append(r.latency)
        out = tuner.step(self.state, r, t, self.params, self.limits)
        self.state = out.state
        if out.move is None:
            return
        m = out.move
        self.result.moves.append(f"{t / 60:.0f}m {m.kind} {m.old}->{m.new} ({m.reason})")
        self.cap = self.state.batch
        if m.restart:
            self.result.restarts += 1
            self.pending_args = overlay(self.args, self.state.engine_args(self.limits))
            self.draining = True
            self._advance(t)
        else:
            self._dispatch(t)


def run_one(job: tuple[str, str, list[Arrival], float, int, float, float]) -> Result:
    return Bench(*job).run()


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(0.99 * len(ordered))) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="length of each workload (default 60)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (default 2)")
    ap.add_argument("--load-seconds", type=float, default=45.0, help="simulated engine load time on a restart (default 45)")
    ap.add_argument("--slo-ms", type=float, default=500.0, help="P99 TTFT objective, also goodput's bar (default 500)")
    ap.add_argument("--only", nargs="*", help="run only these workloads (diurnal, bursty, long-context)")
    args = ap.parse_args()
    seconds = args.minutes * 60
    configs = [*BUILTIN_PRESETS, "tuner", "tuner-from-8"]
    loads = {w: a for w, a in workloads(seconds, args.seed).items() if not args.only or w in args.only}
    jobs = [(w, c, arrivals, seconds, args.seed, args.load_seconds, args.slo_ms / 1000) for w, arrivals in loads.items() for c in configs]
    print(f"{len(jobs)} runs of {args.minutes:g} simulated minutes ({sum(len(a) for a in loads.values())} requests per configuration), {args.jobs} at a time", flush=True)
    results: dict[tuple[str, str], Result] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for res in pool.map(run_one, jobs):
            results[(res.workload, res.config)] = res
            print(f"  done: {res.workload:<13} {res.config:<16} ({res.wall:.0f} s CPU)", flush=True)
    print()
    print("| workload | config | goodput req/s | finished req/s | P99 TTFT ms | GPU util | restarts |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    verdicts = []
    for w in loads:
        for c in configs:
            r = results[(w, c)]
            print(f"| {w} | {c} | {r.good / seconds:.2f} | {r.finished / seconds:.2f} | {p99(r.ttft) * 1000:.0f} | "
                  f"{r.busy / seconds * 100:.0f}% | {r.restarts} |")  # fmt: skip
        best = max(BUILTIN_PRESETS, key=lambda c: results[(w, c)].good)
        t, b = results[(w, "tuner")], results[(w, best)]
        ok = t.good >= b.good and p99(t.ttft) <= 2 * p99(b.ttft) and t.restarts <= 3 * args.minutes / 60
        verdicts.append(f"{w}: tuner goodput {t.good / seconds:.2f} vs best preset {best} {b.good / seconds:.2f} "
                        f"({(t.good / b.good - 1) * 100:+.1f}%), P99 {p99(t.ttft) / p99(b.ttft):.2f}x, "
                        f"{t.restarts} restarts: {'MET' if ok else 'NOT MET'}")  # fmt: skip
    print()
    for line in verdicts:
        print(line)
    print()
    for w in loads:
        for c in ("tuner", "tuner-from-8"):
            print(f"{c} moves, {w}: " + (", ".join(results[(w, c)].moves) or "none"))


if __name__ == "__main__":
    main()
