from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from guardian.sim.engine import EngineModel, SimRequest
from guardian.sim.server import SimServer
from guardian.sources.vllm import VllmScraper
from tests.helpers import free_port


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = SimServer(EngineModel(seed=1))
    await server.start()
    yield server
    await server.stop()


async def _static(handler) -> tuple[web.AppRunner, str]:  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def test_simulated_server_is_read_like_a_real_one(sim: SimServer, session: aiohttp.ClientSession) -> None:
    sim.engine.submit(SimRequest(prompt_tokens=100, max_tokens=50, arrival=sim.now))
    reading = await VllmScraper("a", sim.url, session, timeout=2).scrape()
    assert reading.up and reading.healthy and reading.error is None
    (core,) = reading.cores
    assert core.running == 1 and core.waiting == 0
    assert core.block_size == 16 and core.num_gpu_blocks == 4096
    assert 0 < core.kv_cache_usage < 0.01


async def test_refused_connection_is_unknown_with_a_reason(session: aiohttp.ClientSession) -> None:
    reading = await VllmScraper("a", f"http://127.0.0.1:{free_port()}", session, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "refused" and "cannot connect" in reading.error
    assert reading.healthy is None and reading.cores == ()


async def test_slow_server_times_out_within_the_scrape_timeout(sim: SimServer, session: aiohttp.ClientSession) -> None:
    sim.metrics_delay = 2.0
    started = asyncio.get_running_loop().time()
    reading = await VllmScraper("a", sim.url, session, timeout=0.3).scrape()
    assert asyncio.get_running_loop().time() - started < 1.0
    assert not reading.up and reading.error_kind == "timeout"
    assert reading.healthy is True  # /health still answers: the engine is alive, the page is slow


async def test_http_500_is_reported_with_its_status(session: aiohttp.ClientSession) -> None:
    async def boom(_: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    runner, url = await _static(boom)
    try:
        reading = await VllmScraper("a", url, session, timeout=1).scrape()
    finally:
        await runner.cleanup()
    assert not reading.up and reading.error_kind == "http_5xx" and "500" in reading.error
    assert reading.healthy is False


async def test_garbage_page_is_a_parse_error_not_an_exception(sim: SimServer, session: aiohttp.ClientSession) -> None:
    sim.metrics_override = b"<html>\n<body>nginx</body>\n</html>\n"
    reading = await VllmScraper("a", sim.url, session, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "parse" and "line 1" in reading.error


async def test_binary_page_is_a_parse_error(sim: SimServer, session: aiohttp.ClientSession) -> None:
    sim.metrics_override = b"\xff\xfe\x00garbage\n"
    reading = await VllmScraper("a", sim.url, session, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "parse"


async def test_page_cut_off_mid_body_is_truncated(vllm_page: str, session: aiohttp.ClientSession) -> None:
    body = vllm_page.encode()

    async def handle(conn_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await conn_reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body[: len(body) // 2])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reading = await VllmScraper("a", f"http://127.0.0.1:{port}", session, timeout=1).scrape()
    finally:
        server.close()
    assert not reading.up and reading.error_kind == "truncated"


async def test_page_ending_without_newline_is_truncated(vllm_page: str, sim: SimServer, session: aiohttp.ClientSession) -> None:
    sim.metrics_override = vllm_page.encode()[:-20]
    reading = await VllmScraper("a", sim.url, session, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "truncated" and "no newline" in reading.error


async def test_server_with_stats_disabled_is_said_so(sim: SimServer, session: aiohttp.ClientSession) -> None:
    sim.metrics_override = b"# TYPE process_open_fds gauge\nprocess_open_fds 6.0\n"
    reading = await VllmScraper("a", sim.url, session, timeout=1).scrape()
    assert reading.up and reading.stats_disabled and "--disable-log-stats" in reading.error


async def test_a_dead_engine_core_fails_health_while_the_page_reads_then_the_server_is_gone(
    sim: SimServer, session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("guardian.sim.server.EXIT_AFTER_SECONDS", 0.3)
    sim.crash()
    reading = await VllmScraper("a", sim.url, session, timeout=1).scrape()
    assert reading.up and reading.healthy is False  # vLLM: /health 503 while /metrics still answers
    await asyncio.sleep(0.5)
    reading = await VllmScraper("a", sim.url, session, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "refused" and sim.exited


async def test_counter_reset_after_an_engine_restart_is_read_as_is(sim: SimServer, session: aiohttp.ClientSession) -> None:
    scraper = VllmScraper("a", sim.url, session, timeout=1)
    sim.engine.submit(SimRequest(prompt_tokens=100, max_tokens=5, arrival=sim.now))
    await asyncio.sleep(0.3)
    before = (await scraper.scrape()).cores[0].generation_tokens_total
    sim.engine = EngineModel(seed=2)  # a restarted engine: counters from zero
    after = (await scraper.scrape()).cores[0].generation_tokens_total
    assert before == 5 and after == 0


async def test_health_is_asked_every_tenth_poll_while_metrics_answer_and_every_poll_once_it_fails(session: aiohttp.ClientSession) -> None:
    asked: list[str] = []
    health_status = 200
    page = (Path(__file__).parent / "fixtures" / "vllm-0.33-metrics.txt").read_bytes()

    async def handler(request: web.Request) -> web.Response:
        asked.append(request.path)
        if request.path == "/health":
            return web.Response(status=health_status)
        return web.Response(body=page, content_type="text/plain")

    runner, url = await _static(handler)
    try:
        scraper = VllmScraper("a", url, session, timeout=2)
        readings = [await scraper.scrape() for _ in range(20)]
        assert asked.count("/metrics") == 20 and asked.count("/health") == 2  # polls 1 and 11
        assert all(r.up and r.healthy is True for r in readings)  # the last verdict, not a gap
        health_status = 503  # the engine core died; /metrics still answers for a few seconds
        asked.clear()
        readings = [await scraper.scrape() for _ in range(10)]
        assert asked.count("/health") == 10 and all(r.healthy is False for r in readings)  # poll 21 saw it; asked every poll since
    finally:
        await runner.cleanup()


async def test_latency_histograms_are_read_every_fifth_scrape_and_right_after_a_failure(session: aiohttp.ClientSession) -> None:
    page = (Path(__file__).parent / "fixtures" / "vllm-0.33-metrics.txt").read_bytes()
    down = False

    async def handler(request: web.Request) -> web.Response:
        if down and request.path == "/metrics":
            return web.Response(status=503)
        return web.Response(body=page, content_type="text/plain")

    runner, url = await _static(handler)
    try:
        scraper = VllmScraper("a", url, session, timeout=2)
        readings = [await scraper.scrape() for _ in range(11)]
        assert [r.latency_read for r in readings] == [True, False, False, False, False] * 2 + [True]
        for r in readings:  # gauges and counters every time; the histograms only when read
            (core, *_) = r.cores
            assert core.kv_cache_usage is not None and core.running is not None
            assert bool(core.histograms) == r.latency_read
            assert set(core.histograms) <= {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                                            "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"}  # fmt: skip
        down = True
        assert not (await scraper.scrape()).up
        down = False
        assert (await scraper.scrape()).latency_read  # back: possibly another vLLM, read whole at once
    finally:
        await runner.cleanup()
