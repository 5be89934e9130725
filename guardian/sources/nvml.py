"""GPU telemetry through NVIDIA's ``pynvml`` (package ``nvidia-ml-py``).

The module object is injected (``nvml=``) so the simulator's fake NVML, which
implements the same functions and raises pynvml's own error classes, runs
through exactly this code.

Error policy: NVML failing is *telemetry lost*, never a crash. A field the
GPU does not support stays ``None`` and is not asked for again; a lost GPU
drops its cached handle and is looked up afresh next poll; a missing driver
leaves the whole reading with ``error`` set and init is retried next poll.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any, Callable, Literal, Sequence, TypeVar

import pynvml

from guardian.sample import GpuProcess, GpuReading, MigReading, NvmlReading

T = TypeVar("T")

ErrorKind = Literal["gpu_lost", "not_supported", "driver_missing", "no_permission", "timeout", "uninitialized", "other"]

_KINDS: dict[str, ErrorKind] = {
    "NVML_ERROR_GPU_IS_LOST": "gpu_lost",
    "NVML_ERROR_GPU_NOT_FOUND": "gpu_lost",
    "NVML_ERROR_RESET_REQUIRED": "gpu_lost",
    "NVML_ERROR_NOT_FOUND": "gpu_lost",
    "NVML_ERROR_NOT_SUPPORTED": "not_supported",
    "NVML_ERROR_FUNCTION_NOT_FOUND": "not_supported",
    "NVML_ERROR_DEPRECATED": "not_supported",
    "NVML_ERROR_DRIVER_NOT_LOADED": "driver_missing",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "driver_missing",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver_missing",
    "NVML_ERROR_NO_PERMISSION": "no_permission",
    "NVML_ERROR_TIMEOUT": "timeout",
    "NVML_ERROR_UNINITIALIZED": "uninitialized",
}
_KIND_BY_CODE: dict[int, ErrorKind] = {
    getattr(pynvml, name): kind for name, kind in _KINDS.items() if hasattr(pynvml, name)
}


def error_kind(exc: BaseException) -> ErrorKind:
    """Map an NVMLError (any subclass pynvml generates) to what guardian does about it."""
    return _KIND_BY_CODE.get(getattr(exc, "value", -1), "other")


def describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ itself calls into the library
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _GpuLost(Exception):
    """Raised inside one GPU's read to abandon the rest of its fields."""


class NvmlSource:
    """Reads the selected GPUs; safe to call from one worker thread at a time."""

    def __init__(self, select: Literal["all"] | Sequence[int | str] = "all", nvml: ModuleType | Any = pynvml) -> None:
        self._nvml = nvml
        self._select = select
        self._lock = threading.Lock()
        self._initialised = False
        self._driver: str | None = None
        self._handles: dict[int, Any] = {}
        self._static: dict[int, tuple[str | None, str | None]] = {}  # index -> (uuid, name)
        self._unsupported: set[tuple[int, str]] = set()
        self._memory_v2: bool | None = None  # None: not tried yet

    def read(self) -> NvmlReading:
        with self._lock:
            try:
                self._init()
                indices = self._indices()
            except self._nvml.NVMLError as exc:
                self._reset()
                return NvmlReading(error=describe(exc))
            return NvmlReading(gpus=tuple(self._gpu(i) for i in indices), driver_version=self._driver)

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                try:
                    self._nvml.nvmlShutdown()
                except self._nvml.NVMLError:
                    pass
            self._reset()

    # -- set-up ---------------------------------------------------------------

    def _init(self) -> None:
        if self._initialised:
            return
        self._nvml.nvmlInit()
        self._initialised = True
        try:
            self._driver = _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            self._driver = None

    def _reset(self) -> None:
        self._initialised = False
        self._handles.clear()

    def _indices(self) -> list[int]:
        if self._select == "all":
            return list(range(self._nvml.nvmlDeviceGetCount()))
        indices = []
        for item in self._select:
            if isinstance(item, int):
                indices.append(item)
            else:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(item)
                index = self._nvml.nvmlDeviceGetIndex(handle)
                self._handles[index] = handle
                indices.append(index)
        return indices

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return handle

    # -- one GPU --------------------------------------------------------------

    def _gpu(self, index: int) -> GpuReading:
        nv = self._nvml
        errors: list[str] = []
        try:
            handle = self._handle(index)
            uuid, name = self._identity(index, handle)
        except nv.NVMLError as exc:
            self._handles.pop(index, None)
            self._static.pop(index, None)
            return GpuReading(index=index, error=describe(exc))

        def field(key: str, call: Callable[[], T]) -> T | None:
            if (index, key) in self._unsupported:
                return None
            try:
                return call()
            except nv.NVMLError as exc:
                kind = error_kind(exc)
                if kind == "not_supported":
                    self._unsupported.add((index, key))
                else:
                    errors.append(f"{key}: {describe(exc)}")
                    if kind == "gpu_lost":
                        self._handles.pop(index, None)
                        raise _GpuLost from exc
                return None

        try:
            memory = field("memory", lambda: self._memory(handle))
            util = field("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(handle))
            power = field("power", lambda: nv.nvmlDeviceGetPowerUsage(handle))
            energy = field("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle))
            temp = field("temperature", lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
            procs = field("processes", lambda: _processes(nv.nvmlDeviceGetComputeRunningProcesses(handle)))
            mig = field("mig", lambda: self._mig(handle)) or ()
        except _GpuLost:
            return GpuReading(index=index, uuid=uuid, name=name, error="; ".join(errors))
        total, used, free, reserved = memory if memory is not None else (None, None, None, None)
        return GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            memory_total_bytes=total,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            utilization_gpu_ratio=util.gpu / 100.0 if util is not None else None,
            utilization_memory_ratio=util.memory / 100.0 if util is not None else None,
            power_watts=power / 1000.0 if power is not None else None,
            energy_joules=energy / 1000.0 if energy is not None else None,
            temperature_celsius=float(temp) if temp is not None else None,
            processes=procs,
            mig=mig,
            error="; ".join(errors) or None,
        )

    def _identity(self, index: int, handle: Any) -> tuple[str | None, str | None]:
        known = self._static.get(index)
        if known is None:
            known = self._static[index] = (
                _text(self._nvml.nvmlDeviceGetUUID(handle)),
                _text(self._nvml.nvmlDeviceGetName(handle)),
            )
        return known

    def _memory(self, handle: Any) -> tuple[int, int, int, int | None]:
        """(total, used, free, reserved): v2 where the driver has it, since v1 counts reserved memory as used."""
        nv = self._nvml
        if self._memory_v2 is not False and hasattr(nv, "nvmlMemory_v2"):
            try:
                info = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
                self._memory_v2 = True
                return int(info.total), int(info.used), int(info.free), int(info.reserved)
            except nv.NVMLError as exc:
                if error_kind(exc) != "not_supported" and getattr(exc, "value", None) != getattr(
                    nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", None
                ):
                    raise
                self._memory_v2 = False
        info = nv.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used), int(info.free), None

    def _mig(self, handle: Any) -> tuple[MigReading, ...]:
        nv = self._nvml
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return ()
        slices = []
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == nv.NVML_ERROR_NOT_FOUND:
                    continue  # this slot holds no slice
                raise
            total: int | None
            used: int | None
            free: int | None
            try:
                memory = nv.nvmlDeviceGetMemoryInfo(mig)
                total, used, free = int(memory.total), int(memory.used), int(memory.free)
            except nv.NVMLError:
                total = used = free = None
            try:
                procs: tuple[GpuProcess, ...] | None = _processes(nv.nvmlDeviceGetComputeRunningProcesses(mig))
            except nv.NVMLError:
                procs = None
            slices.append(
                MigReading(
                    index=i,
                    uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                    memory_total_bytes=total,
                    memory_used_bytes=used,
                    memory_free_bytes=free,
                    processes=procs,
                )
            )
        return tuple(slices)


def _processes(infos: Sequence[Any]) -> tuple[GpuProcess, ...]:
    # usedGpuMemory is None where NVML reports "not available" (e.g. under some containers)
    return tuple(
        GpuProcess(pid=int(p.pid), used_bytes=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None)
        for p in infos
    )


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
