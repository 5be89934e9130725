from __future__ import annotations

import asyncio
import time

import pynvml
import pytest

from guardian.sim.engine import EngineModel
from guardian.sim.fake_nvml import FakeNvml, MigSlice, SimGpu
from guardian.sources.nvml import NvmlSource, error_kind
from guardian.sources.offloop import OffloopWorker, WorkerBusy

ALL_ERROR_CODES = sorted(
    (name, getattr(pynvml, name)) for name in dir(pynvml) if name.startswith("NVML_ERROR_")
)


def _fake(n: int = 1) -> FakeNvml:
    return FakeNvml([SimGpu(index=i, uuid=f"GPU-{i}", engine=EngineModel(), pid=1000 + i) for i in range(n)])


def test_healthy_gpu_reads_every_field_with_v2_memory() -> None:
    nv = _fake()
    gpu = nv.gpus[0]
    reading = NvmlSource(nvml=nv).read()
    assert reading.ok and reading.driver_version == "570.133.20"
    (g,) = reading.gpus
    assert (g.index, g.uuid, g.name) == (0, "GPU-0", "NVIDIA H100 80GB HBM3")
    assert g.memory_total_bytes == gpu.total_bytes
    assert g.memory_used_bytes == gpu.used_bytes
    assert g.memory_reserved_bytes == gpu.reserved_bytes
    assert g.memory_used_bytes + g.memory_free_bytes + g.memory_reserved_bytes == g.memory_total_bytes
    assert g.utilization_gpu_ratio == 0.0 and g.power_watts == 70.0 and g.temperature_celsius == 32.0
    assert g.processes and g.processes[0].pid == 1000 and g.processes[0].used_bytes == gpu.process_bytes
    assert g.error is None


def test_driver_without_v2_memory_info_falls_back_to_v1() -> None:
    nv = _fake()
    nv.memory_v2 = False
    source = NvmlSource(nvml=nv)
    g = source.read().gpus[0]
    assert g.memory_reserved_bytes is None
    assert g.memory_used_bytes == nv.gpus[0].used_bytes + nv.gpus[0].reserved_bytes  # v1 counts it as used
    source.read()
    assert nv.calls["nvmlDeviceGetMemoryInfo"] == 3  # v2 tried once, never again


def test_selection_by_uuid_reads_only_that_gpu() -> None:
    reading = NvmlSource(["GPU-1"], nvml=_fake(3)).read()
    assert [g.index for g in reading.gpus] == [1]


@pytest.mark.parametrize(("name", "code"), ALL_ERROR_CODES)
def test_every_nvml_error_at_init_is_telemetry_lost_not_a_crash(name: str, code: int) -> None:
    nv = _fake()
    nv.init_error = code
    reading = NvmlSource(nvml=nv).read()
    assert not reading.ok
    assert reading.gpus == ()
    assert type(pynvml.NVMLError(code)).__name__ in reading.error


@pytest.mark.parametrize(("name", "code"), ALL_ERROR_CODES)
def test_every_nvml_error_on_a_field_leaves_that_field_unknown(name: str, code: int) -> None:
    nv = _fake()
    nv.failures["nvmlDeviceGetMemoryInfo"] = code
    reading = NvmlSource(nvml=nv).read()
    assert reading.ok
    (g,) = reading.gpus
    assert g.memory_used_bytes is None and g.memory_free_bytes is None and g.memory_total_bytes is None
    if error_kind(pynvml.NVMLError(code)) == "not_supported":
        assert g.error is None  # a GPU that lacks a feature is not an error
    else:
        assert "memory" in g.error


def test_error_classes_map_to_guardian_kinds() -> None:
    assert error_kind(pynvml.NVMLError_GpuIsLost()) == "gpu_lost"
    assert error_kind(pynvml.NVMLError_NotSupported()) == "not_supported"
    assert error_kind(pynvml.NVMLError_DriverNotLoaded()) == "driver_missing"
    assert error_kind(pynvml.NVMLError_LibraryNotFound()) == "driver_missing"
    assert error_kind(pynvml.NVMLError_NoPermission()) == "no_permission"
    assert error_kind(pynvml.NVMLError_Unknown()) == "other"


def test_unsupported_field_is_not_asked_for_again() -> None:
    nv = _fake()
    nv.failures["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource(nvml=nv)
    for _ in range(3):
        g = source.read().gpus[0]
    assert g.energy_joules is None and g.error is None
    assert nv.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1


def test_lost_gpu_is_reported_and_found_again_when_it_returns() -> None:
    nv = _fake(2)
    source = NvmlSource(nvml=nv)
    source.read()
    nv.gpus[1].lost = True
    lost = source.read()
    assert lost.gpus[0].error is None
    assert lost.gpus[1].memory_used_bytes is None and "GpuIsLost" in lost.gpus[1].error
    nv.gpus[1].lost = False
    back = source.read()
    assert back.gpus[1].error is None and back.gpus[1].memory_used_bytes is not None


def test_mig_slices_are_read_with_their_processes() -> None:
    nv = _fake()
    nv.gpus[0].mig = [MigSlice("MIG-a", 10 * 2**30, 2 * 2**30, {77: 2 * 2**30}), MigSlice("MIG-b", 20 * 2**30)]
    g = NvmlSource(nvml=nv).read().gpus[0]
    assert [m.uuid for m in g.mig] == ["MIG-a", "MIG-b"]
    assert g.mig[0].memory_used_bytes == 2 * 2**30 and g.mig[0].processes[0].pid == 77
    assert g.utilization_gpu_ratio is None  # NVML has no utilisation for MIG-enabled GPUs


def test_driver_loaded_later_is_picked_up() -> None:
    nv = _fake()
    nv.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    source = NvmlSource(nvml=nv)
    assert not source.read().ok
    nv.init_error = None
    assert source.read().ok


async def test_hung_nvml_call_times_out_and_later_polls_do_not_pile_up() -> None:
    nv = _fake()
    nv.gpus[0].hang_seconds = 1.0
    source = NvmlSource(nvml=nv)
    worker = OffloopWorker("test-nvml")
    started = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await worker.call(source.read, timeout=0.1)
    assert time.monotonic() - started < 0.5  # the loop got control back
    with pytest.raises(WorkerBusy):
        await worker.call(source.read, timeout=0.1)
    await asyncio.sleep(1.1)  # the driver comes back
    reading = await worker.call(source.read, timeout=1.0)
    assert reading.ok and reading.gpus[0].memory_used_bytes is not None
