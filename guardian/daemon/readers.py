"""The poll's inputs that can block: NVML and the process scan, each in its own worker thread with a timeout.

A hung NVML call (a wedged driver) holds its worker, and later polls skip
NVML with a reason instead of queueing behind it; the loop, and with it the
watchdog, keeps running.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import ModuleType
from typing import Any, Mapping

from guardian.actions.launcher import Launcher, ProcessStatus
from guardian.daemon.observe import FailureLog
from guardian.exporter import Metrics
from guardian.sample import EngineReading, NvmlReading, ProcReading
from guardian.sources.nvml import NvmlSource
from guardian.sources.offloop import OffloopWorker, WorkerBusy
from guardian.sources.process import ProcessSource

Tree = tuple[tuple[ProcReading, ...] | None, str | None]  # an engine's process readings, or None and why

PROCESS_SCAN_TIMEOUT_SECONDS = 2.0


class Readers:
    def __init__(self, select: Any, nvml_module: ModuleType | Any, metrics: Metrics) -> None:
        self._module = nvml_module
        self._metrics = metrics
        self._nvml_worker = OffloopWorker("guardian-nvml")
        self._proc_worker = OffloopWorker("guardian-proc")
        self._nvml = NvmlSource(select, nvml_module)
        self._nvml_log = FailureLog("nvml")
        self.nvml_failures = 0  # polls in a row without NVML

    def reselect(self, select: Any) -> None:
        """A reload that changed ``[gpus]``: a fresh NVML source (the old one is closed unless a call still hangs in it)."""
        self.close()
        self._nvml = NvmlSource(select, self._module)

    def close(self) -> None:
        if not self._nvml_worker.busy:
            self._nvml.close()

    async def nvml(self, timeout: float) -> NvmlReading:
        reading = await self._read_nvml(timeout)
        self.nvml_failures = 0 if reading.ok else self.nvml_failures + 1
        self._nvml_log.observe(None if reading.ok else "nvml", reading.error)
        return reading

    async def _read_nvml(self, timeout: float) -> NvmlReading:
        errors = self._metrics.nvml_errors
        try:
            reading = await self._nvml_worker.call(self._nvml.read, timeout)
        except WorkerBusy:
            errors.labels("hung").inc()
            return NvmlReading(error="an earlier NVML call is still hung; skipping NVML this poll")
        except asyncio.TimeoutError:
            errors.labels("timeout").inc()
            return NvmlReading(error=f"NVML did not answer within {timeout:g}s")
        if reading.error:
            errors.labels("unavailable").inc()
        for gpu in reading.gpus:
            if gpu.error:
                errors.labels("gpu_error").inc()
        return reading

    async def processes(
        self, sources: Mapping[str, ProcessSource], launchers: Mapping[str, Launcher]
    ) -> tuple[dict[str, Tree], dict[str, ProcessStatus]]:
        """Each engine's process tree (``[engines.process]``) and its launcher's word on its main process."""
        if not sources and not launchers:
            return {}, {}

        def read() -> tuple[dict[str, Tree], dict[str, ProcessStatus]]:
            statuses = {n: st for n, launcher in launchers.items() if (st := launcher.status()) is not None}
            return {n: src.read() for n, src in sources.items()}, statuses

        try:
            return await self._proc_worker.call(read, timeout=PROCESS_SCAN_TIMEOUT_SECONDS)
        except (WorkerBusy, asyncio.TimeoutError):
            return {n: (None, "process scan did not finish in time") for n in sources}, {}


def with_processes(reading: EngineReading, procs: Tree | None, status: ProcessStatus | None) -> EngineReading:
    """The reading with its process tree and its launcher's word on its main process (``EngineReading.main_process``)."""
    changes: dict[str, object] = {}
    if procs is not None:
        changes.update(processes=procs[0], process_error=procs[1])
    if status is not None:
        changes.update(process_alive=status.alive, process_started=status.started)
    return replace(reading, **changes) if changes else reading  # type: ignore[arg-type]
