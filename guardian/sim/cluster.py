"""Engines, GPUs, servers and load wired together: the simulated host ``demo``, tests and benches run.

One engine per simulated GPU, each behind its own vLLM-compatible server on a
free loopback port; one fake NVML over all GPUs. The "vLLM process" that
holds each GPU's memory is this very process, so guardian's psutil source
finds a real process through the pid file the cluster writes.

With several engines only the first can be this process; the others' GPU
memory is held by pids that exist only in the fake NVML, so guardian sees
their per-GPU series but no process tree for them (``process_engines``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from guardian.sim.engine import EngineModel
from guardian.sim.fake_nvml import FakeNvml, SimGpu
from guardian.sim.loadgen import LoadGenerator
from guardian.sim.scenarios import Scenario
from guardian.sim.server import SimServer


FAKE_PID_BASE = 4_000_000  # above Linux's pid_max: never a real process


class SimCluster:
    def __init__(self, scenario: Scenario, engines: int = 1, seed: int = 0, dev_mode: bool = True) -> None:
        self.scenario = scenario
        self.seed = seed
        self.gpus: list[SimGpu] = []
        self.servers: list[SimServer] = []
        for i in range(engines):
            engine = EngineModel(scenario.engine, seed=seed + i)
            pid = os.getpid() if i == 0 else FAKE_PID_BASE + i
            gpu = SimGpu(index=i, uuid=f"GPU-{seed:08x}-sim0-{i:04d}-0000-{i:012d}", engine=engine, pid=pid)
            self.gpus.append(gpu)
            self.servers.append(SimServer(engine, gpu, dev_mode=dev_mode))
        self.nvml = FakeNvml(self.gpus)
        self.loadgens: list[LoadGenerator] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._dir = tempfile.TemporaryDirectory(prefix="guardian-sim-")
        self.pid_file = Path(self._dir.name) / "vllm.pid"
        self.pid_file.write_text(f"{os.getpid()}\n")
        self.started_at: float | None = None

    process_engines = 1  # engines whose process tree guardian can find (through pid_file)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    async def start(self, host: str = "127.0.0.1", ports: list[int] | None = None) -> None:
        for i, server in enumerate(self.servers):
            await server.start(host, ports[i] if ports else 0)
        self.started_at = time.monotonic()
        self._tasks.append(asyncio.create_task(self._faults()))

    async def run_load(self, duration: float | None, via: str | None = None) -> None:
        """One generator per engine, at each engine's URL, or all at ``via`` (guardian's gateway)."""
        model = self.scenario.engine.model_name
        self.loadgens = [
            LoadGenerator(via or s.url, self.scenario, model, seed=self.seed * 1000 + i) for i, s in enumerate(self.servers)
        ]
        await asyncio.gather(*(g.run(duration) for g in self.loadgens))

    async def _faults(self) -> None:
        assert self.started_at is not None
        for fault in sorted(self.scenario.faults, key=lambda f: f.at):
            delay = fault.at - (time.monotonic() - self.started_at)
            if delay > 0:
                await asyncio.sleep(delay)
            for gpu in self.gpus:
                fault.apply(gpu)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self.servers:
            await server.stop()
        self._dir.cleanup()
