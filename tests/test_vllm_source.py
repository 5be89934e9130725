from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from guardian.sim.engine import EngineModel, SimRequest
from guardian.sim.server import SimServer
from guardian.sources.vllm import VllmScraper
from tests.helpers import free_port


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


async def test_simulated_server_is_read_like_a_real_one(sim: SimServer) -> None:
    sim.engine.submit(SimRequest(prompt_tokens=100, max_tokens=50, arrival=sim.now))
    reading = await VllmScraper("a", sim.url, timeout=2).scrape()
    assert reading.up and reading.healthy and reading.error is None
    (core,) = reading.cores
    assert core.running == 1 and core.waiting == 0
    assert core.block_size == 16 and core.num_gpu_blocks == 4096
    assert 0 < core.kv_cache_usage < 0.01


async def test_refused_connection_is_unknown_with_a_reason() -> None:
    reading = await VllmScraper("a", f"http://127.0.0.1:{free_port()}", timeout=1).scrape()
    assert not reading.up and reading.error_kind == "refused" and "cannot connect" in reading.error
    assert reading.healthy is None and reading.cores == ()


async def test_slow_server_times_out_within_the_scrape_timeout(sim: SimServer) -> None:
    sim.metrics_delay = 2.0
    started = asyncio.get_running_loop().time()
    reading = await VllmScraper("a", sim.url, timeout=0.3).scrape()
    assert asyncio.get_running_loop().time() - started < 1.0
    assert not reading.up and reading.error_kind == "timeout"
    assert reading.healthy is True  # /health still answers: the engine is alive, the page is slow


async def test_http_500_is_reported_with_its_status() -> None:
    async def boom(_: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    runner, url = await _static(boom)
    try:
        reading = await VllmScraper("a", url, timeout=1).scrape()
    finally:
        await runner.cleanup()
    assert not reading.up and reading.error_kind == "http_5xx" and "500" in reading.error
    assert reading.healthy is False


async def test_garbage_page_is_a_parse_error_not_an_exception(sim: SimServer) -> None:
    sim.metrics_override = b"<html>\n<body>nginx</body>\n</html>\n"
    reading = await VllmScraper("a", sim.url, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "parse" and "line 1" in reading.error


async def test_binary_page_is_a_parse_error(sim: SimServer) -> None:
    sim.metrics_override = b"\xff\xfe\x00garbage\n"
    reading = await VllmScraper("a", sim.url, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "parse"


async def test_page_cut_off_mid_body_is_truncated(vllm_page: str) -> None:
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
        reading = await VllmScraper("a", f"http://127.0.0.1:{port}", timeout=1).scrape()
    finally:
        server.close()
    assert not reading.up and reading.error_kind == "truncated"


async def test_page_ending_without_newline_is_truncated(vllm_page: str, sim: SimServer) -> None:
    sim.metrics_override = vllm_page.encode()[:-20]
    reading = await VllmScraper("a", sim.url, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "truncated" and "no newline" in reading.error


async def test_server_with_stats_disabled_is_said_so(sim: SimServer) -> None:
    sim.metrics_override = b"# TYPE process_open_fds gauge\nprocess_open_fds 6.0\n"
    reading = await VllmScraper("a", sim.url, timeout=1).scrape()
    assert reading.up and reading.stats_disabled and "--disable-log-stats" in reading.error


async def test_a_dead_engine_core_fails_health_while_the_page_reads_then_the_server_is_gone(
    sim: SimServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("guardian.sim.server.EXIT_AFTER_SECONDS", 0.3)
    sim.crash()
    reading = await VllmScraper("a", sim.url, timeout=1).scrape()
    assert reading.up and reading.healthy is False  # vLLM: /health 503 while /metrics still answers
    await asyncio.sleep(0.5)
    reading = await VllmScraper("a", sim.url, timeout=1).scrape()
    assert not reading.up and reading.error_kind == "refused" and sim.exited


async def test_counter_reset_after_an_engine_restart_is_read_as_is(sim: SimServer) -> None:
    scraper = VllmScraper("a", sim.url, timeout=1)
    sim.engine.submit(SimRequest(prompt_tokens=100, max_tokens=5, arrival=sim.now))
    await asyncio.sleep(0.3)
    before = (await scraper.scrape()).cores[0].generation_tokens_total
    sim.engine = EngineModel(seed=2)  # a restarted engine: counters from zero
    after = (await scraper.scrape()).cores[0].generation_tokens_total
    assert before == 5 and after == 0


async def test_health_is_asked_every_tenth_poll_while_metrics_answer_and_every_poll_once_it_fails() -> None:
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
        scraper = VllmScraper("a", url, timeout=2)
        readings = [await scraper.scrape() for _ in range(20)]
        assert asked.count("/metrics") == 20 and asked.count("/health") == 2  # polls 1 and 11
        assert all(r.up and r.healthy is True for r in readings)  # the last verdict, not a gap
        health_status = 503  # the engine core died; /metrics still answers for a few seconds
        asked.clear()
        readings = [await scraper.scrape() for _ in range(10)]
        assert asked.count("/health") == 10 and all(r.healthy is False for r in readings)  # poll 21 saw it; asked every poll since
    finally:
        await runner.cleanup()


async def test_latency_histograms_are_read_every_fifth_scrape_and_right_after_a_failure() -> None:
    page = (Path(__file__).parent / "fixtures" / "vllm-0.33-metrics.txt").read_bytes()
    down = False

    async def handler(request: web.Request) -> web.Response:
        if down and request.path == "/metrics":
            return web.Response(status=503)
        return web.Response(body=page, content_type="text/plain")

    runner, url = await _static(handler)
    try:
        scraper = VllmScraper("a", url, timeout=2)
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


class _Raw:
    """A server that writes ``answer(n)`` for the n-th request on a connection; how many requests each connection carried."""

    def __init__(self, answer) -> None:  # type: ignore[no-untyped-def]
        self.answer = answer
        self.connections: list[int] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await asyncio.sleep(0.05)  # the handlers see their clients' connections closed

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(0)
        mine = len(self.connections) - 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                self.connections[mine] += 1
                writer.write(self.answer(self.connections[mine]))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def _chunked(body: bytes, pieces: int) -> bytes:
    step = -(-len(body) // pieces)
    framed = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in (body[i : i + step] for i in range(0, len(body), step)))
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"


async def test_a_chunked_page_reads_the_same_as_one_of_known_length_and_its_connection_is_kept(vllm_page: str) -> None:
    page = vllm_page.encode()
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)
    chunked_server, plain_server = _Raw(lambda _: _chunked(page, 7)), _Raw(lambda _: plain)  # chunked: uvicorn's way
    async with chunked_server as chunked_url, plain_server as plain_url:
        chunked, known = VllmScraper("a", chunked_url, timeout=2), VllmScraper("a", plain_url, timeout=2)
        for _ in range(12):
            a, b = await chunked.scrape(), await known.scrape()
            assert a.up and a.cores == b.cores and a.cores[0].num_gpu_blocks is not None
        chunked.close()
        known.close()
    # 12 pages and 2 /health: the first poll asks both at once (two connections), every later one reuses them
    for server in (chunked_server, plain_server):
        assert len(server.connections) == 2 and sum(server.connections) == 14


async def test_a_kept_alive_connection_the_server_closed_while_idle_costs_no_failed_poll(vllm_page: str) -> None:
    page = vllm_page.encode()

    def answer(n: int) -> bytes:  # uvicorn closing an idle connection: here, after every second answer
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(page), b"Connection: close\r\n" if n == 2 else b"", page)

    server = _Raw(answer)
    async with server as url:
        scraper = VllmScraper("a", url, timeout=2)
        readings = [await scraper.scrape() for _ in range(6)]
        scraper.close()
    assert all(r.up for r in readings) and len(server.connections) >= 3


async def test_a_page_larger_than_the_limit_is_refused_without_reading_it(monkeypatch: pytest.MonkeyPatch, vllm_page: str) -> None:
    monkeypatch.setattr("guardian.http1.MAX_WHOLE_BYTES", 4096)
    async with _Raw(lambda _: _chunked(vllm_page.encode(), 40)) as url:
        reading = await VllmScraper("a", url, timeout=2).scrape()
    assert not reading.up and reading.error_kind == "too_large" and "4096 bytes" in reading.error
