"""The failing host (guardian/sim/host.py) on the virtual-time loop: it must fail the way production does."""

from __future__ import annotations

import asyncio
import time

import pytest

from guardian.sim.engine import EngineParams, SimRequest
from guardian.sim.fake_nvml import H100_TOTAL, SimGpu
from guardian.sim.host import EngineDown, HostLauncher, HostParams, SimHost
from guardian.sim.virtual_loop import run


def _host(seed: int = 1, **params: object) -> SimHost:
    return SimHost(EngineParams(), SimGpu(index=0, uuid="GPU-x", total_bytes=H100_TOTAL), seed=seed, params=HostParams(**params))  # type: ignore[arg-type]


async def _until_up(host: SimHost, limit: float = 3600.0) -> float:
    loop = asyncio.get_running_loop()
    begun = loop.time()
    while host.phase != "up":
        assert loop.time() - begun < limit, f"not up after {limit} s"
        await asyncio.sleep(0.5)
    return loop.time() - begun


def test_an_hour_of_timers_runs_in_an_instant_and_deadlines_keep_simulated_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 30)
        return loop.time(), 0.0

    wall = time.monotonic()
    assert run(main())[0] == pytest.approx(3630.0)
    assert time.monotonic() - wall < 2.0


def test_a_virtual_loop_with_nothing_to_wait_for_says_so_instead_of_hanging() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(RuntimeError, match="nothing scheduled"):
        run(main())


def test_every_start_loads_for_a_drawn_time_in_the_realistic_range() -> None:
    async def main() -> list[float]:
        host = _host(seed=3)
        loads = []
        for _ in range(5):
            host.restart({})
            loads.append(await _until_up(host))
        await host.close()
        return loads

    loads = run(main())
    assert all(30.0 <= x <= 181.0 for x in loads)
    assert len({round(x) for x in loads}) > 1  # drawn, not fixed


def test_a_leak_past_the_card_kills_the_engine_cuts_its_requests_and_systemd_restarts_it_without_the_leak() -> None:
    async def main() -> None:
        host = _host()
        host.start()
        await _until_up(host)
        finished: list[str] = []
        req = SimRequest(1000, 500, arrival=asyncio.get_running_loop().time(), ignore_eos=True)
        req.listener = lambda n, reason: finished.append(reason) if reason else None
        host.submit(req)
        await asyncio.sleep(1.0)
        host.leak(0.05)
        assert host.phase == "up"  # 92% + 0.6% + 5% still fits
        host.leak(0.05)
        assert host.phase == "exited" and [e.why for e in host.exits] == ["oom"]
        assert finished == ["abort"] and host.exits[0].cut == 1
        with pytest.raises(EngineDown):
            host.submit(SimRequest(10, 10, arrival=0.0))
        assert await HostLauncher(host).alive() is True  # systemd: activating (auto-restart)
        waited = await _until_up(host)
        assert 10 + 30 <= waited <= 10 + 181
        assert host.gpu.overhang_bytes == 0  # the leak died with the process
        await host.close()

    run(main())


def test_another_process_s_memory_survives_restarts_and_vllm_refuses_to_start_until_it_is_gone() -> None:
    async def main() -> None:
        host = _host()
        host.start()
        await _until_up(host)
        host.foreign(4242, 0.10)
        assert [e.why for e in host.exits] == ["oom"]
        await asyncio.sleep(120)
        assert "refused_to_start" in [e.why for e in host.exits]  # free < 92%: vLLM exits during start
        assert host.gpu.foreign == {4242: int(0.10 * H100_TOTAL)}
        host.foreign(4242, -1.0)
        await _until_up(host)
        host.restart({"gpu-memory-utilization": 0.8})
        host.foreign(4242, 0.10)  # while loading: 80% + 10% fits
        await _until_up(host)
        assert host.phase == "up" and host.gpu.demand_bytes < host.gpu.total_bytes
        await host.close()

    run(main())


def test_a_fresh_engine_s_prefix_cache_is_cold_so_a_restart_costs_prefill() -> None:
    async def main() -> tuple[float, float]:
        host = _host()
        host.start()
        await _until_up(host)
        loop = asyncio.get_running_loop()

        async def ttft() -> float:
            req = SimRequest(8000, 1, arrival=loop.time())
            host.submit(req)
            while req.first_token_at is None:
                await asyncio.sleep(0.01)
            return req.first_token_at - req.arrival

        cold = await ttft()
        await asyncio.sleep(120)
        warm = await ttft()
        await host.close()
        return cold, warm

    cold, warm = run(main())
    assert warm < cold * 0.9
