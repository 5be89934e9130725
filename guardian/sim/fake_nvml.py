"""A fake ``pynvml``: the functions guardian's NVML source calls, over simulated GPUs.

It raises pynvml's *own* error classes (``pynvml.NVMLError(code)`` resolves
to ``NVMLError_GpuIsLost`` and friends) and returns objects with the same
attribute names as pynvml's ctypes structs, so ``guardian.sources.nvml`` runs
unchanged against it. Constants and error classes not defined here are
taken from the real module.

A simulated GPU's memory follows its engine the way vLLM's does: the process
takes ``gpu_memory_utilization × total`` at start and holds it, flat; what a
leak adds (``overhang_bytes``) comes on top and is what guardian must find.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from guardian.sim.engine import EngineModel

GiB = 2**30
WEIGHTS_SHARE_OF_BUDGET = 0.25  # a loading engine holds its weights (about a quarter of its budget), not yet its KV pool
H100_TOTAL = 85_520_809_984  # what NVML reports for an H100 80GB HBM3 (81559 MiB)


@dataclass
class MigSlice:
    uuid: str
    total_bytes: int
    used_bytes: int = 0
    pids: dict[int, int] = field(default_factory=dict)  # pid -> used bytes


@dataclass
class SimGpu:
    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_bytes: int = H100_TOTAL
    engine: EngineModel | None = None
    pid: int | None = None  # the engine process holding memory on this GPU
    context_bytes: int = 512 * 2**20  # CUDA context outside vLLM's budget
    overhang_bytes: int = 0  # leaked or spiked memory on top of the budget, in the engine's process
    loading: bool = False  # the engine's process is loading the model: its context and weights, no KV pool yet
    foreign: dict[int, int] = field(default_factory=dict)  # other processes on this GPU: pid -> bytes
    idle_watts: float = 70.0
    max_watts: float = 700.0
    lost: bool = False
    hang_seconds: float = 0.0  # the next memory read blocks this long (a wedged driver)
    mig: list[MigSlice] = field(default_factory=list)
    utilization: float = 0.0
    energy_mj: float = 0.0
    _last_t: float | None = None
    _last_busy: float = 0.0

    @property
    def process_bytes(self) -> int:
        if self.engine is None:
            return 0
        budget = int(self.engine.params.gpu_memory_utilization * self.total_bytes) - self.context_bytes
        if self.loading:
            budget = int(budget * WEIGHTS_SHARE_OF_BUDGET)
        elif self.engine.sleep_level == 1:
            budget = int(budget * 0.15)  # weights offloaded, KV cache dropped
        elif self.engine.sleep_level == 2:
            budget = 0
        return self.context_bytes + budget + self.overhang_bytes

    @property
    def reserved_bytes(self) -> int:
        return int(self.total_bytes * 0.006)

    @property
    def demand_bytes(self) -> int:
        """What the processes on this GPU hold or ask for, the driver's reservation included; above the total is an OOM."""
        return self.reserved_bytes + self.process_bytes + sum(self.foreign.values()) + sum(s.used_bytes for s in self.mig)

    @property
    def used_bytes(self) -> int:
        return min(self.total_bytes, self.demand_bytes) - self.reserved_bytes

    def tick(self, now: float) -> None:
        """Advance utilisation and energy to ``now`` from the engine's busy time.

        Utilisation is taken over at least a second, as NVML samples it; the
        engine books a whole step's time at once, so shorter spans would flap
        between 0 and 100%.
        """
        busy = self.engine.busy_seconds if self.engine else 0.0
        if self._last_t is None:
            self._last_t, self._last_busy = now, busy
            return
        dt = now - self._last_t
        if dt < 1.0:
            return
        self.utilization = max(0.0, min(1.0, (busy - self._last_busy) / dt))
        self.energy_mj += self.power_mw * dt
        self._last_t, self._last_busy = now, busy

    @property
    def power_mw(self) -> float:
        return (self.idle_watts + (self.max_watts - self.idle_watts) * self.utilization) * 1000.0


@dataclass(frozen=True)
class _Handle:
    gpu: SimGpu
    mig: MigSlice | None = None


class FakeNvml:
    """Module-like: ``NvmlSource(nvml=FakeNvml([...]))``."""

    def __init__(self, gpus: list[SimGpu], driver_version: str = "570.133.20") -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.initialised = False
        self.init_error: int | None = None  # e.g. NVML_ERROR_DRIVER_NOT_LOADED
        self.failures: dict[str, int] = {}  # function name -> error code raised on every call
        self.calls: dict[str, int] = {}
        self.memory_v2 = True
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)  # constants and the NVMLError classes

    # -- helpers ----------------------------------------------------------------

    def _enter(self, fn: str, handle: _Handle | None = None) -> None:
        with self._lock:
            self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        code = self.failures.get(fn)
        if code is not None:
            raise pynvml.NVMLError(code)
        if handle is not None and handle.gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    # -- the pynvml API -----------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return _Handle(gpu)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        self._enter("nvmlDeviceGetHandleByUUID")
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return _Handle(gpu)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        return handle.gpu.index

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return handle.mig.uuid if handle.mig else handle.gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return handle.gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        gpu = handle.gpu
        if gpu.hang_seconds:
            hang, gpu.hang_seconds = gpu.hang_seconds, 0.0
            time.sleep(hang)
        if version is not None and not self.memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if handle.mig is not None:
            s = handle.mig
            return SimpleNamespace(total=s.total_bytes, used=s.used_bytes, free=s.total_bytes - s.used_bytes)
        reserved = gpu.reserved_bytes
        used = gpu.used_bytes
        if version is None:  # v1 counts the driver's reservation as used
            return SimpleNamespace(total=gpu.total_bytes, used=used + reserved, free=gpu.total_bytes - used - reserved)
        return SimpleNamespace(
            version=version, total=gpu.total_bytes, reserved=reserved, used=used, free=gpu.total_bytes - used - reserved
        )

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        if handle.gpu.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        util = round(handle.gpu.utilization * 100)
        return SimpleNamespace(gpu=util, memory=round(util * 0.6))

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return int(handle.gpu.power_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return int(handle.gpu.energy_mj)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        return int(32 + 45 * handle.gpu.utilization)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        if handle.mig is not None:
            pids = handle.mig.pids
            return [SimpleNamespace(pid=p, usedGpuMemory=b, gpuInstanceId=0, computeInstanceId=0) for p, b in pids.items()]
        gpu = handle.gpu
        held = dict(gpu.foreign)
        if gpu.engine is not None and gpu.pid is not None:
            held[gpu.pid] = gpu.process_bytes
        return [SimpleNamespace(pid=pid, usedGpuMemory=b, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF) for pid, b in held.items()]

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        if not handle.gpu.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(handle.gpu.mig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, handle.gpu.mig[index])
