"""The listeners' limits: a connection limit answered with 503, slow headers cut, the other listener unharmed."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from guardian.listener import ListenerLimits, ListenerMetrics, serve


async def _listener(limits: ListenerLimits, name: str, metrics: ListenerMetrics) -> tuple[web.AppRunner, asyncio.Server, int]:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, keepalive_timeout=limits.idle_timeout_seconds)
    await runner.setup()
    server, (_, port) = await serve(runner, "127.0.0.1", 0, limits, name, metrics)
    return runner, server, port


async def test_past_the_connection_limit_a_client_gets_503_and_the_other_listener_still_answers() -> None:
    metrics = ListenerMetrics(CollectorRegistry())
    limits = ListenerLimits(max_connections=20, header_timeout_seconds=30, idle_timeout_seconds=30)
    gw_runner, gw_server, gw_port = await _listener(limits, "gateway", metrics)
    api_runner, api_server, api_port = await _listener(ListenerLimits(max_connections=5), "api", metrics)
    held = [await asyncio.open_connection("127.0.0.1", gw_port) for _ in range(20)]  # idle, never sending a byte
    try:
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw_port)
        refused = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{api_port}/healthz") as resp:
                api_status = resp.status
    finally:
        for _, w in held:
            w.close()
        for server, runner in ((gw_server, gw_runner), (api_server, api_runner)):
            server.close()
            await runner.cleanup()
    assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in refused and b"20 connections open" in refused
    assert api_status == 200
    assert metrics.refused.labels("gateway", "connection_limit")._value.get() == 1


async def test_a_client_that_sends_its_headers_slowly_is_cut_and_a_fast_one_is_not() -> None:
    metrics = ListenerMetrics(CollectorRegistry())
    runner, server, port = await _listener(ListenerLimits(header_timeout_seconds=0.5, idle_timeout_seconds=30), "api", metrics)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and then nothing: slowloris
        await writer.drain()
        cut = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.8)  # past the header deadline: headers came in time, the answer is there
        answered = await asyncio.wait_for(reader.read(200), 5)
        writer.close()
    finally:
        server.close()
        await runner.cleanup()
    assert cut == b"" and answered.startswith(b"HTTP/1.1 200")
    assert metrics.refused.labels("api", "slow_headers")._value.get() == 1
