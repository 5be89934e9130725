"""Protection, measured: every scenario with and without guardian, in simulated time, through guardian's own code.

    python bench/efficacy.py [--seeds 3] [--jobs 2] [--only burst flood] [--minutes M] [--no-tuner]

One simulated GPU host (``guardian/sim/host.py``: model loads of 30–180 s,
out-of-memory deaths, leaks that live in a process, systemd's restart 10 s
after a death, a prefix cache that a restart empties) serves seeded clients
that behave like the OpenAI SDKs: a 429, a 5xx or a refused connection is
retried twice, after Retry-After when the answer gives one (up to 60 s),
else after 0.5 s, 1 s (less up to a quarter, at random); a stream cut after
its first token is not retried.

``unguarded``: the clients talk to vLLM, and systemd restarts it when it
dies. ``guarded``: guardian with its default settings, as ``guardian run``
wires it: every poll (1 s) reads the fake NVML through guardian's NVML
source and the engine's ``/metrics`` page through its parser, the process
through its launcher's word, into the same ``Pipeline``; the decisions go
to the same ``Executor``, whose drained restarts run the same
``DrainedRestart`` against a systemd launcher of the simulated unit; the
clients go through the same ``GatewayServer`` admission path
(``seat``/``leave``) that ``guardian run``'s gateway serves. The tuner is
on, as by default; ``--no-tuner`` runs guarded with ``[tuner] enabled = false``. Only the bytes
are missing: no sockets, no JSON. Everything runs on a virtual-time event
loop (``guardian/sim/virtual_loop.py``), so a run is exactly repeatable.

Every scenario has a calm twin (the same clients without the trouble); the
swing is a run's P99 TTFT over its calm twin's, same mode: of all requests,
then of the high lane's, then of the short prompts' (up to 4096 tokens). Goodput: requests
answered with a first token within 1 s plus the prompt's own unloaded
prefill (40 µs a token), as a share of all requests sent.

What it cannot show: one engine per host (no pool to route around a
restart), no real process, no real bytes on the wire (``bench/gateway.py``
measures the gateway's cost), pages counted as the policy decides them
(before the alert lifecycle's grouping and repeats).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # efficacy_scoring, also when loaded by the tests

from prometheus_client import CollectorRegistry  # noqa: E402

from guardian import config as cfg  # noqa: E402
from guardian import logs  # noqa: E402
from guardian.actions.executor import EngineActuators, Executor  # noqa: E402
from guardian.actions.outcome import Outcome  # noqa: E402
from guardian.daemon import gateway_settings  # noqa: E402
from guardian.gateway.metrics import GatewayMetrics  # noqa: E402
from guardian.gateway.proxy import GatewayServer, Turned  # noqa: E402
from guardian.pipeline import Pipeline  # noqa: E402
from guardian.policy.response import Action  # noqa: E402
from guardian.sample import EngineReading, ProcReading, Sample  # noqa: E402
from guardian.sim.engine import EngineParams, SimRequest  # noqa: E402
from guardian.sim.fake_nvml import H100_TOTAL, FakeNvml, SimGpu  # noqa: E402
from guardian.sim.host import EngineDown, HostLauncher, HostParams, SimHost  # noqa: E402
from guardian.sim.scenarios import Lengths  # noqa: E402
from guardian.sim.virtual_loop import run as run_virtual  # noqa: E402
from guardian.sources import promtext, vllm_page  # noqa: E402
from guardian.sources.nvml import NvmlSource  # noqa: E402

from efficacy_scoring import Mode, Result, table, verdicts  # noqa: E402

ENGINE = "vllm"
URL = "http://127.0.0.1:8000"
HOST_MEMORY = 512 * 2**30
SLO_BASE_SECONDS = 1.0
PREFILL_SECONDS_PER_TOKEN = 4e-5
MAX_RETRIES = 2  # the OpenAI SDKs' default
SHORT_PROMPT_TOKENS = 4096  # the default config's short bucket
LATE_SECONDS = 600.0  # "within ten minutes": goodput of what is sent after this


# -- scenarios ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    at: float  # seconds after the load begins
    kind: Literal["leak", "foreign"]
    amount: float  # of the GPU's memory (negative: given back)


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    minutes: float
    rate: Callable[[float], float]
    peak: float  # the highest rate (arrivals are thinned from it)
    prompt: Lengths = Lengths(1500, 0.8, 16, 16000)
    output: Lengths = Lengths(160, 0.7, 8, 1024)
    long_share: float = 0.0
    long_prompt: Lengths | None = None
    engine: EngineParams = EngineParams()
    events: tuple[Event, ...] = ()
    high_share: float = 0.25  # requests sent with x-guardian-priority: high (the rest low)
    stream_share: float = 0.5
    calm: Callable[[Case], Case] = lambda c: replace(c, events=())


def _steady(rate: float) -> Callable[[float], float]:
    return lambda t: rate


def _bursts(base: float, factor: float, every: float, length: float) -> Callable[[float], float]:
    return lambda t: base * factor if t % every >= every - length else base


STEP = 0.015  # of the card: a leak step
CASES = {
    c.name: c
    for c in (
        Case("leak-to-oom", "the engine's own process leaks 1.5% of the card every 4 min until it dies of an OOM",
             30, _steady(3.0), 3.0, events=tuple(Event(240.0 * (k + 1), "leak", STEP) for k in range(7))),
        Case("foreign-leak", "another process on the GPU grows 2% every 4 min to 8%, holds it, and exits at minute 24",
             30, _steady(3.0), 3.0,
             events=tuple(Event(240.0 * (k + 1), "foreign", 0.02) for k in range(4)) + (Event(1440.0, "foreign", -1.0),)),
        Case("leak-stops-short", "the engine's own process leaks two 1.5% steps, then stops: the card never fills",
             30, _steady(3.0), 3.0, events=(Event(240.0, "leak", STEP), Event(480.0, "leak", STEP))),
        Case("burst", "3 req/s with a 90 s burst x4 every 10 min; a quarter of the requests high priority",
             30, _bursts(3.0, 4.0, 600.0, 90.0), 12.0, calm=lambda c: replace(c, rate=_steady(3.0), peak=3.0)),
        Case("flood", "2 req/s of short prompts, and 35% of requests 16k-60k tokens",
             30, _steady(2.0), 2.0, prompt=Lengths(500, 0.7, 16, 4000), output=Lengths(300, 0.6, 16, 2048),
             long_share=0.35, long_prompt=Lengths(28000, 0.4, 16000, 60000), engine=EngineParams(num_gpu_blocks=6000),
             calm=lambda c: replace(c, long_share=0.0)),
        Case("too-small", "5 req/s against an engine started with --max-num-seqs 4",
             20, _steady(5.0), 5.0, prompt=Lengths(800, 0.6, 16, 4000), output=Lengths(120, 0.6, 8, 512),
             engine=EngineParams(max_num_seqs=4), calm=lambda c: replace(c, engine=EngineParams())),
    )
}  # fmt: skip


# -- one run ------------------------------------------------------------------------------------


class Run:
    def __init__(self, case: Case, mode: Mode, calm: bool, seed: int, state_dir: Path, tuner: bool = True) -> None:
        self.case = case.calm(case) if calm else case
        self.mode = mode
        self.tuner = tuner
        self.seed = seed
        self.result = Result(case.name, mode, calm, seed)
        self.rng = random.Random(seed)
        self.client_rng = random.Random(seed + 7)
        self.gpu = SimGpu(index=0, uuid=f"GPU-{seed:08x}-0000-0000-0000-000000000000", total_bytes=H100_TOTAL)
        self.host = SimHost(self.case.engine, self.gpu, seed=seed, params=HostParams())
        self.nvml = NvmlSource(nvml=FakeNvml([self.gpu]))
        self.state_dir = state_dir
        self.tasks: set[asyncio.Task[None]] = set()

    async def main(self) -> Result:
        loop = asyncio.get_running_loop()
        self.host.start()
        while self.host.phase != "up":  # the first load is not measured
            await asyncio.sleep(1.0)
        self.t0 = loop.time()
        guardian = asyncio.ensure_future(self.guardian()) if self.mode == "guarded" else None
        events = asyncio.ensure_future(self.events())
        await self.clients()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=900.0)  # the answers still coming
        for task in [events, guardian, *self.tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in [events, guardian, *self.tasks] if t is not None), return_exceptions=True)
        if self.mode == "guarded":
            await self.executor.close()
        await self.host.close()
        for e in self.host.exits:
            self.result.exits[e.why] += 1
            if e.why == "restarted":
                self.result.cut_by_restart += e.cut
        return self.result

    async def events(self) -> None:
        for ev in sorted(self.case.events, key=lambda e: e.at):
            await asyncio.sleep(max(0.0, self.t0 + ev.at - asyncio.get_running_loop().time()))
            if ev.kind == "leak":
                self.host.leak(ev.amount)
            else:
                self.host.foreign(4242, ev.amount)

    # -- clients ---------------------------------------------------------------------------

    async def clients(self) -> None:
        c = self.case
        loop = asyncio.get_running_loop()
        end = c.minutes * 60
        t = 0.0
        while True:
            t += self.rng.expovariate(c.peak)
            if t >= end:
                return
            if self.rng.random() * c.peak > c.rate(t):
                continue
            long = c.long_prompt is not None and self.rng.random() < c.long_share
            prompt = (c.long_prompt if long and c.long_prompt else c.prompt).draw(self.rng)
            output = c.output.draw(self.rng)
            lane = "high" if self.rng.random() < c.high_share else "low"
            stream = self.rng.random() < c.stream_share
            await asyncio.sleep(max(0.0, self.t0 + t - loop.time()))
            self.result.sent += 1
            task = asyncio.ensure_future(self.client(prompt, output, lane, stream))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def client(self, prompt: int, output: int, lane: str, stream: bool) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        r = self.result
        late = sent - self.t0 >= LATE_SECONDS
        r.late_sent += late
        for attempt in range(MAX_RETRIES + 1):
            heard, retry_after, req = await self.attempt(prompt, output, lane, stream)
            if heard == "ok":
                assert req is not None and req.first_token_at is not None and req.last_token_at is not None
                ttft = req.first_token_at - sent
                r.outcomes["ok"] += 1
                r.ttft[lane].append(ttft)
                if prompt <= SHORT_PROMPT_TOKENS:
                    r.short_ttft.append(ttft)
                    if late:
                        r.late_short_ttft.append(ttft)
                r.e2e.append(req.last_token_at - sent)
                if ttft <= SLO_BASE_SECONDS + PREFILL_SECONDS_PER_TOKEN * prompt:
                    r.good += 1
                    r.late_good += late
                return
            if heard in ("cut", "bad_request"):
                r.outcomes[heard] += 1
                return
            if attempt == MAX_RETRIES:
                r.outcomes["failed" if heard == "connection" else f"refused_{heard}"] += 1
                return
            r.retries[heard] += 1
            if retry_after is not None and 0 < retry_after <= 60:
                delay = float(retry_after)
            else:
                delay = min(0.5 * 2**attempt, 8.0) * (1 - 0.25 * self.client_rng.random())
            await asyncio.sleep(delay)

    async def attempt(self, prompt: int, output: int, lane: str, stream: bool) -> tuple[str, int | None, SimRequest | None]:
        """One try: ("ok"|"cut"|"connection"|"429"|"503"|"bad_request", Retry-After, the request)."""
        if self.mode == "unguarded":
            return await self.upstream(prompt, output, stream)
        placed = await self.gateway.seat(prompt, {"x-guardian-priority": lane})
        if isinstance(placed, Turned):
            return (str(placed.status) if placed.status in (429, 503) else "bad_request"), placed.retry_after, None
        try:
            heard, after, req = await self.upstream(prompt, output, stream)
            if heard == "connection":  # the gateway answers 502 and routes elsewhere until the next poll
                self.gateway.set_available(placed.engine, False, "refused")
                return "503", None, req
            return heard, after, req
        finally:
            self.gateway.leave(placed)

    async def upstream(self, prompt: int, output: int, stream: bool) -> tuple[str, int | None, SimRequest | None]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()
        req = SimRequest(prompt, output, arrival=loop.time())

        def on_tokens(tokens: int, reason: str | None) -> None:
            if reason is None or done.done():
                return
            if reason == "abort":  # the engine died under it (clients here never abort)
                done.set_result("cut" if stream and req.generated > 0 else "connection")
            else:
                loop.call_at(max(loop.time(), req.last_token_at or loop.time()), _settle, done, "ok")

        req.listener = on_tokens
        try:
            self.host.submit(req)
        except EngineDown:
            return "connection", None, None
        except ValueError:
            return "bad_request", None, None
        return await done, None, req

    # -- guardian ----------------------------------------------------------------------------

    async def guardian(self) -> None:
        loop = asyncio.get_running_loop()
        config = cfg.Config(
            guardian=cfg.GuardianSection(state_dir=self.state_dir),
            gateway=cfg.GatewaySection(),
            tuner=cfg.TunerSection(enabled=self.tuner),
            engines=[cfg.EngineSection(name=ENGINE, url=URL)],
        )
        self.pipeline = Pipeline(config, HOST_MEMORY)
        self.gateway = GatewayServer(gateway_settings(config), {ENGINE: URL}, GatewayMetrics(CollectorRegistry()))
        actuators = EngineActuators(ENGINE, healthy=self._healthy, load=self._load, launcher=HostLauncher(self.host),
                                    base_args=config.base_args(config.engines[0]))  # fmt: skip
        self.executor = Executor({ENGINE: actuators}, self.gateway, self._notify, config.actions.degraded.layer(),
                                 config.actions.timeouts, clock=loop.time)  # fmt: skip
        interval = config.guardian.poll_interval_seconds
        while True:
            t = loop.time()
            sample = self.sample(t)
            result = self.pipeline.step(sample, self.executor.finished(before=t))
            self.gateway.follow({n: e.phase for n, e in result.evidence.items()}, result.signals)
            for _, tr in result.decision.transitions:
                self.result.max_level = max(self.result.max_level, int(tr.target))
            for action in result.decision.actions:
                if action.kind == "restart":
                    self.result.restarts[action.reason] += 1
            self.executor.submit(result.decision.actions)
            await asyncio.sleep(max(0.0, t + interval - loop.time()))

    def sample(self, t: float) -> Sample:
        """What guardian's sources would read now: NVML (through its source), the page (through its parser), the process."""
        host = self.host
        self.gpu.tick(t)
        wall = host.params.wall_start + t
        status = host.status
        if host.phase == "up" and host.engine is not None:
            page = promtext.parse(host.engine.metrics.render().decode())
            reading = EngineReading(ENGINE, up=True, healthy=True, cores=vllm_page.cores_from_page(page))
        else:
            reading = EngineReading(ENGINE, up=False, healthy=False, error="connection refused", error_kind="refused")
        procs = (ProcReading(host.pid, "vllm", True, start_time=status.started),) if status.alive else ()
        reading = replace(reading, processes=procs, process_alive=status.alive, process_started=status.started)
        return Sample(t=t, wall=wall, nvml=self.nvml.read(), engines=(reading,), gateway=self.gateway.loads())

    async def _healthy(self) -> bool | None:
        return self.host.phase == "up"

    async def _load(self) -> float | None:
        return self.host.load

    def _notify(self, action: Action) -> Outcome:
        severity = action.details.get("severity")
        if severity == "page":
            self.result.pages += 1
            self.result.page_texts.append(f"{action.reason}: {action.details.get('text', '')}")
        elif severity == "warning":
            self.result.warnings += 1
        return Outcome("notify", "done", "counted")


def _settle(done: asyncio.Future[str], outcome: str) -> None:
    if not done.done():
        done.set_result(outcome)


def run_one(job: tuple[str, Mode, bool, int, float | None, bool]) -> Result:
    name, mode, calm, seed, minutes, tuner = job
    case = CASES[name] if minutes is None else replace(CASES[name], minutes=minutes)
    logs.configure("json", "error")
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="guardian-efficacy-") as tmp:
        result: Result = run_virtual(Run(case, mode, calm, seed, Path(tmp), tuner).main())
    result.cpu_seconds = time.process_time() - started
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="seeded runs per scenario and mode (default 3)")
    ap.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (default 2)")
    ap.add_argument("--minutes", type=float, help="shorten every scenario to this many simulated minutes")
    ap.add_argument("--only", nargs="*", choices=list(CASES), help="run only these scenarios")
    ap.add_argument("--pages", action="store_true", help="print every page guardian sent")
    ap.add_argument("--no-tuner", action="store_true", help="guarded runs with [tuner] enabled = false")
    args = ap.parse_args()
    names = args.only or list(CASES)
    jobs = [(n, m, calm, args.seed + k, args.minutes, not args.no_tuner) for n in names for m in ("unguarded", "guarded")
            for calm in (False, True) for k in range(args.seeds)]  # fmt: skip
    print(f"{len(jobs)} runs ({len(names)} scenarios x 2 modes x calm twin x {args.seeds} seeds), {args.jobs} at a time; "
          f"guarded: guardian's defaults{' with [tuner] enabled = false' if args.no_tuner else ' (the tuner on)'}", flush=True)
    results: list[Result] = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for res in pool.map(run_one, jobs):
            results.append(res)
            twin = " (calm twin)" if res.calm else ""
            print(f"  done: {res.case}{twin} {res.mode} seed {res.seed}: {res.sent} requests, {res.cpu_seconds:.0f} s CPU", flush=True)
    print()
    for line in table(results, args.seeds, list(CASES)):
        print(line)
    print()
    for line in verdicts(results, list(CASES)):
        print(line)
    print()
    for name in names:
        print(f"{name}: {CASES[name].what}")
    if args.pages:
        for r in results:
            for text in r.page_texts:
                print(f"page {r.case} {r.mode} seed {r.seed}: {text}")


if __name__ == "__main__":
    main()
