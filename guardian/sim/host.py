"""One GPU and the vLLM server on it, failing the way production does, in the event loop's time.

``bench/efficacy.py`` runs it on the virtual-time loop (``virtual_loop.py``),
so an hour of a host's life takes seconds and guardian's own async code
(admission, drained restarts) runs against it unchanged. What it models,
because guardian's protection is only worth what it prevents:

- **Model loads take time**: every start holds the weights for a load time
  drawn from a realistic range (30–180 s, log-uniform, seeded) before the
  KV pool is allocated and the server answers. vLLM refuses to start (exits
  about 15 s in) when the GPU's free memory is below what
  ``--gpu-memory-utilization`` asks for, as ``vllm serve`` does.
- **Out of memory kills**: when the engine's memory outside its pool (a leak
  in its own process), other processes' memory and the driver's reservation
  together exceed the card, the engine dies: every request in flight is cut.
- **A leak lives in a process**: the engine's own (``overhang_bytes``) dies
  with it and starts over in the next process; another process's
  (``SimGpu.foreign``) survives every vLLM restart.
- **systemd restarts what dies**: ``Restart=on-failure`` with
  ``RestartSec`` (10 s), with the arguments guardian last wrote.
- A new engine's prefix cache is empty and fills again over a minute
  (``EngineModel.start_cold``), so a restart costs prefill.

Time comes from the running loop; randomness from a seeded ``random.Random``.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field
from typing import Any, Coroutine, Literal

from guardian.actions.engine_args import EngineArgs
from guardian.actions.launcher import ProcessStatus
from guardian.actions.outcome import Outcome
from guardian.sim.engine import EngineModel, EngineParams, SimRequest
from guardian.sim.fake_nvml import SimGpu
from guardian.sim.launcher import engine_params

Phase = Literal["loading", "up", "exited"]
FIRST_PID = 5_000_000  # above Linux's pid_max: never a real process
REFUSE_AFTER_SECONDS = 15.0  # vLLM's free-memory check comes after the CUDA context, before the weights


class EngineDown(Exception):
    """The server is not listening (loading or exited): the client's connection is refused."""


@dataclass(frozen=True)
class HostParams:
    load_seconds: tuple[float, float] = (30.0, 180.0)  # a model load, drawn log-uniform in this range at every start
    restart_sec: float = 10.0  # systemd's RestartSec= for the vLLM unit
    wall_start: float = 1_800_000_000.0  # unix time at the loop's time 0


@dataclass
class Exit:
    t: float
    why: str  # oom, refused_to_start, restarted (stopped by a restart)
    cut: int  # requests in flight at that moment


@dataclass
class SimHost:
    base: EngineParams
    gpu: SimGpu
    seed: int = 0
    params: HostParams = HostParams()
    args: EngineArgs = field(default_factory=dict)  # the arguments the unit starts vLLM with (guardian's launcher writes them)
    phase: Phase = "exited"
    engine: EngineModel | None = None
    pid: int = FIRST_PID
    started: float | None = None  # loop time the current process started
    exits: list[Exit] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)  # the load time of every start
    restart_pending: bool = False  # exited, and systemd starts it again after RestartSec ("activating (auto-restart)")

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._generation = 0
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the process -------------------------------------------------------------------------

    def start(self) -> None:
        """A new vLLM process with ``args``: it loads, then serves (or refuses to start for lack of free memory)."""
        loop = asyncio.get_running_loop()
        self._generation += 1
        self.pid += 1
        self.started = loop.time()
        self.phase = "loading"
        self.restart_pending = False
        self.gpu.overhang_bytes = 0  # a new process: a leak of the old one died with it
        self.engine = EngineModel(engine_params(self.base, self.args), seed=self.seed * 1000 + self._generation)
        self.gpu.engine, self.gpu.pid, self.gpu.loading = self.engine, self.pid, True
        low, high = self.params.load_seconds
        load = math.exp(self.rng.uniform(math.log(low), math.log(high)))
        self.loads.append(load)
        self._spawn(self._load(self._generation, load))

    def restart(self, args: EngineArgs) -> None:
        """``systemctl restart``: the running process stops (cutting what it still serves) and a new one starts."""
        self.args = dict(args)
        if self.phase != "exited":
            self._exit("restarted", supervise=False)
        self.start()

    @property
    def status(self) -> ProcessStatus:
        return ProcessStatus(self.phase != "exited", None if self.started is None else self.params.wall_start + self.started)

    def check_memory(self) -> None:
        """An engine whose GPU is asked for more than it has dies of an OOM (call after memory changes)."""
        if self.phase == "up" and self.gpu.demand_bytes > self.gpu.total_bytes:
            self._exit("oom", supervise=True)

    async def _load(self, generation: int, load: float) -> None:
        util = float(self.args.get("gpu-memory-utilization", self.base.gpu_memory_utilization))  # type: ignore[arg-type]
        free = self.gpu.total_bytes - self.gpu.reserved_bytes - sum(self.gpu.foreign.values())
        if free < util * self.gpu.total_bytes:  # vLLM: "Free memory on device ... is less than desired GPU memory utilization"
            await asyncio.sleep(min(load, REFUSE_AFTER_SECONDS))
            if generation == self._generation:
                self._exit("refused_to_start", supervise=True)
            return
        await asyncio.sleep(load)
        if generation != self._generation:
            return
        assert self.engine is not None
        self.phase = "up"
        self.gpu.loading = False
        self.engine.start_cold(asyncio.get_running_loop().time())
        self.check_memory()
        if self.phase == "up":
            self._spawn(self._serve(generation, self.engine))

    def _exit(self, why: str, supervise: bool) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        cut = 0
        if engine is not None:
            doomed = list(engine.running) + list(engine.waiting)
            cut = len(doomed)
            for req in doomed:
                engine.abort(req)
        self.exits.append(Exit(loop.time(), why, cut))
        self._generation += 1
        self.phase = "exited"
        self.engine = None
        self.gpu.engine, self.gpu.pid, self.gpu.loading = None, None, False  # no process: its memory counts for nothing
        self._wake.set()
        self.restart_pending = supervise
        if supervise:
            generation = self._generation
            loop.call_later(self.params.restart_sec, lambda: self.start() if self._generation == generation else None)

    async def _serve(self, generation: int, engine: EngineModel) -> None:
        """The engine loop: a step at a time, the loop's clock following the engine's."""
        loop = asyncio.get_running_loop()
        while generation == self._generation:
            if not engine.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            engine.clock = max(engine.clock, loop.time())
            end = engine.step_once()
            await asyncio.sleep(end - loop.time())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._generation += 1
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what clients and guardian see ----------------------------------------------------------

    def submit(self, request: SimRequest) -> None:
        """Raises EngineDown when nothing listens (loading, exited)."""
        if self.phase != "up" or self.engine is None:
            raise EngineDown(f"vLLM is {self.phase}")
        self.engine.submit(request)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        if self.engine is not None:
            self.engine.abort(request)

    @property
    def load(self) -> float | None:
        """Running + waiting (None when nothing answers), as guardian's drain asks."""
        if self.phase != "up" or self.engine is None:
            return None
        return float(len(self.engine.running) + len(self.engine.waiting))

    def leak(self, fraction: float) -> None:
        self.gpu.overhang_bytes += int(fraction * self.gpu.total_bytes)
        self.check_memory()

    def foreign(self, pid: int, fraction: float) -> None:
        """Another process on the GPU takes (or, negative, gives back) memory; 0 total ends it."""
        held = self.gpu.foreign.get(pid, 0) + int(fraction * self.gpu.total_bytes)
        if held <= 0:
            self.gpu.foreign.pop(pid, None)
        else:
            self.gpu.foreign[pid] = held
        self.check_memory()


class HostLauncher:
    """guardian's systemd launcher against a simulated host: write the arguments, ``systemctl restart --no-block``."""

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.describe = "simulated vLLM unit"

    async def restart(self, args: EngineArgs) -> Outcome:
        self.host.restart(args)
        return Outcome("restart", "done", "systemctl restart (simulated)")

    async def alive(self) -> bool | None:
        return self.host.phase != "exited" or self.host.restart_pending  # systemctl is-active: activating

    def status(self) -> ProcessStatus:
        return self.host.status

