from __future__ import annotations

import asyncio

import aiohttp

from guardian.actions.vllm_admin import NOT_ENABLED, VllmAdmin
from guardian.sim.engine import EngineModel, EngineParams, SimRequest
from guardian.sim.server import SimServer
from tests.helpers import free_port


async def _with_server(dev_mode: bool, fn):  # type: ignore[no-untyped-def]
    server = SimServer(EngineModel(EngineParams(stop_probability=0)), dev_mode=dev_mode)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            return await fn(server, VllmAdmin(server.url, session, timeout=2))
    finally:
        await server.stop()


async def test_without_dev_mode_actions_say_how_to_enable_them() -> None:
    async def go(server, admin):  # type: ignore[no-untyped-def]
        return await admin.reset_prefix_cache(), await admin.pause("wait")

    reset, pause = await _with_server(False, go)
    assert reset.status == pause.status == "not_enabled" and reset.detail == NOT_ENABLED


async def test_reset_prefix_cache_and_a_draining_pause() -> None:
    async def go(server, admin):  # type: ignore[no-untyped-def]
        reset = await admin.reset_prefix_cache()
        server.engine.submit(SimRequest(prompt_tokens=50, max_tokens=30, arrival=server.now))
        pause = await admin.pause("wait", timeout=5)
        drained = not server.engine.running
        paused = await admin.is_paused()
        resumed = await admin.resume()
        return reset, pause, drained, paused, resumed, server.engine.prefix_hit_ratio(server.engine.clock) < 0.01

    reset, pause, drained, paused, resumed, cold = await _with_server(True, go)
    assert reset.ok and reset.body == {"success": True} and cold  # the cache is empty: no hits until it fills again
    assert pause.ok and drained  # wait mode answers once the running request finished
    assert paused.body == {"is_paused": True} and resumed.ok


async def test_a_slow_or_absent_server_is_an_outcome_not_an_exception() -> None:
    async def go(server, admin):  # type: ignore[no-untyped-def]
        server.engine.submit(SimRequest(prompt_tokens=50, max_tokens=100_000, arrival=server.now))
        return await admin.pause("wait", timeout=0.3)

    slow = await _with_server(True, go)
    assert slow.status == "timeout"
    async with aiohttp.ClientSession() as session:
        gone = await VllmAdmin(f"http://127.0.0.1:{free_port()}", session).resume()
    assert gone.status == "failed" and "Connect" in gone.detail
    await asyncio.sleep(0)
