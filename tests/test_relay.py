"""Streamed answers relayed at the transport level: whole events in their own chunks, bounded buffers, cut streams cut."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from guardian.gateway.metrics import GatewayMetrics
from guardian.gateway.proxy import GatewayServer, GatewaySettings
from guardian.http1 import HIGH_WATER_BYTES, Connection
from guardian.policy.buckets import Bucket

EVENT = b'data: {"choices":[{"index":0,"text":" tok"}]}\n\n'


class Streamer:
    """An upstream whose streamed answer is set per test: paced events, a flood, a cut, or a JSON error."""

    def __init__(self) -> None:
        self.events = 20
        self.pace = 0.0
        self.cut_after: int | None = None
        self.written = 0  # bytes the upstream got written (its socket took them)
        self.error: tuple[int, dict[str, Any]] | None = None
        self.event = EVENT
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if self.error is not None:
            return web.json_response(self.error[1], status=self.error[0])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(self.events):
            if self.cut_after is not None and i == self.cut_after:
                assert request.transport is not None
                request.transport.close()  # the engine died mid-answer
                return resp
            await resp.write(self.event)
            self.written += len(self.event)
            if self.pace:
                await asyncio.sleep(self.pace)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Streamer, str, GatewayServer]]:
    up = Streamer()
    await up.start()
    settings = GatewaySettings(buckets=(Bucket("short", 4096, ("a",)),), concurrency=8, queue_size=8, queue_deadline_seconds=2.0)
    gw = GatewayServer(settings, {"a": up.url}, GatewayMetrics(CollectorRegistry()))
    await gw.start("127.0.0.1", 0)
    assert gw.address is not None
    yield up, f"http://127.0.0.1:{gw.address[1]}/v1/completions", gw
    await gw.close()
    assert up.runner is not None
    await up.runner.cleanup()


async def test_paced_events_arrive_whole_each_in_its_own_http_chunk(setup: tuple[Streamer, str, GatewayServer]) -> None:
    up, url, _ = setup
    up.pace = 0.01
    chunks: list[bytes] = []
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={"prompt": "hi", "stream": True}) as resp:
            pending = b""
            async for data, end in resp.content.iter_chunks():
                pending += data
                if end and pending:  # (the stream's end shows as an empty one)
                    chunks.append(pending)
                    pending = b""
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
    assert chunks == [EVENT] * 20 + [b"data: [DONE]\n\n"]


async def test_a_client_that_does_not_read_holds_the_upstream_back_instead_of_growing_a_buffer(
    setup: tuple[Streamer, str, GatewayServer],
) -> None:
    up, url, gw = setup
    up.event = b"data: " + b"x" * 65536 + b"\n\n"
    up.events = 1000  # 64 MB as fast as the upstream can write it: more than the sockets on the way hold
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.address[1])  # type: ignore[index]
    body = json.dumps({"prompt": "hi", "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")  # the head; then this client reads nothing
    await asyncio.sleep(1.0)
    stalled = up.written
    await asyncio.sleep(0.5)
    assert up.written == stalled < up.events * len(up.event) / 2  # the upstream is held back (sockets on the way hold the rest)
    assert gw._runner is not None and gw._runner.server is not None
    (handler,) = gw._runner.server.connections
    assert handler.transport is not None
    assert handler.transport.get_write_buffer_size() <= HIGH_WATER_BYTES + 256 * 1024  # bounded: the high water and one read
    writer.transport.abort()  # and when it hangs up, the request ends and the upstream's with it
    for _ in range(100):
        if gw.admission["a"].in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert gw.admission["a"].in_flight == 0


async def test_an_answer_cut_by_the_upstream_reaches_the_client_cut(setup: tuple[Streamer, str, GatewayServer]) -> None:
    up, url, _ = setup
    up.cut_after = 5
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={"prompt": "hi", "stream": True}) as resp:
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()  # never a clean end: the client's retry logic must see the cut


async def test_an_error_answer_to_a_streamed_request_passes_through_with_its_status_and_body(setup: tuple[Streamer, str, GatewayServer]) -> None:
    up, url, _ = setup
    up.error = (400, {"error": {"message": "max_tokens is too large", "type": "BadRequestError"}})
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={"prompt": "hi", "stream": True}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["message"] == "max_tokens is too large"


class _Client:
    def __init__(self) -> None:
        self.got = bytearray()

    def write(self, data: bytes) -> None:
        self.got += data

    def get_write_buffer_size(self) -> int:
        return 0


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7, 11])
def test_the_closing_chunk_is_found_and_held_back_however_the_reads_fall(cut: int) -> None:
    body = b"6\r\nhello \r\n5\r\nworld\r\n" + b"0\r\n\r\n"
    loop = asyncio.new_event_loop()
    try:
        upstream = Connection(loop)
        client = _Client()
        upstream.attach(client)  # type: ignore[arg-type]
        for i in range(0, len(body), cut):
            upstream.data_received(body[i : i + cut])
        assert upstream.done.done() and upstream.done.result() == b""
        assert bytes(client.got) == b"6\r\nhello \r\n5\r\nworld\r\n"  # the upstream's own chunks, the closing one left to write_eof
    finally:
        loop.close()


def test_the_gateway_relays_on_uvloop_as_guardian_run_uses_it() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> tuple[int, bytes, int, bytes]:
        up = Streamer()
        await up.start()
        settings = GatewaySettings(buckets=(Bucket("short", 4096, ("a",)),), concurrency=8, queue_size=8, queue_deadline_seconds=2.0)
        gw = GatewayServer(settings, {"a": up.url}, GatewayMetrics(CollectorRegistry()))
        await gw.start("127.0.0.1", 0)  # guardian's own listener (connection limits, header deadline) on uvloop's transports
        assert gw.address is not None
        url = f"http://127.0.0.1:{gw.address[1]}/v1/completions"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
                async with http.post(url, json={"prompt": "hi", "stream": True}) as streamed:
                    body = await streamed.read()
                up.error = (400, {"error": {"message": "no", "type": "BadRequestError"}})
                async with http.post(url, json={"prompt": "hi", "stream": True}) as refused:
                    error = await refused.read()
            return streamed.status, body, refused.status, error
        finally:
            await gw.close()
            assert up.runner is not None
            await up.runner.cleanup()

    status, body, error_status, error = uvloop.run(scenario())
    assert status == 200 and body == EVENT * 20 + b"data: [DONE]\n\n"
    assert error_status == 400 and b'"message": "no"' in error


async def _raw_upstream(handler: Any) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _gateway_to(url: str) -> GatewayServer:
    settings = GatewaySettings(buckets=(Bucket("short", 4096, ("a",)),), concurrency=8, queue_size=8, queue_deadline_seconds=2.0)
    gw = GatewayServer(settings, {"a": url}, GatewayMetrics(CollectorRegistry()))
    await gw.start("127.0.0.1", 0)
    return gw


ANSWER = b'{"choices":[{"text":" hi"}]}'


def _answer(head: bytes = b"Content-Type: application/json\r\n") -> bytes:
    """A plain answer of known length carrying ANSWER, with ``head``'s header lines."""
    return b"HTTP/1.1 200 OK\r\n" + head + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode() + ANSWER


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """One request read whole (head and Content-Length body); False at the connection's end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    return True


async def _through_gateway(handler: Any, requests: int) -> list[tuple[int, bytes]]:
    """``requests`` plain completions, one after the other, through a gateway in front of the raw ``handler``."""
    server, url = await _raw_upstream(handler)
    gw = await _gateway_to(url)
    answers = []
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(requests):
                async with http.post(f"http://127.0.0.1:{gw.address[1]}/v1/completions", json={"prompt": "hi"}) as resp:  # type: ignore[index]
                    answers.append((resp.status, await resp.read()))
    finally:
        await gw.close()
        server.close()
    return answers


async def test_plain_answers_reuse_one_kept_alive_upstream_connection() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while await _read_request(reader):
            writer.write(_answer())
        writer.close()

    assert await _through_gateway(handler, 10) == [(200, ANSWER)] * 10
    assert connections == 1


async def test_a_kept_alive_connection_closed_under_a_request_is_retried_on_a_new_one() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        mine, answered = connections, 0
        while await _read_request(reader):
            if mine == 1 and answered == 1:
                writer.close()  # the idle timeout struck as the second request came: it was never read
                return
            answered += 1
            writer.write(_answer())
        writer.close()

    assert await _through_gateway(handler, 2) == [(200, ANSWER)] * 2
    assert connections == 2


async def test_a_connection_the_upstream_says_to_close_is_not_kept() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        if await _read_request(reader):
            writer.write(_answer(b"Connection: close\r\n"))
        writer.close()

    assert await _through_gateway(handler, 3) == [(200, ANSWER)] * 3
    assert connections == 3


@pytest.mark.parametrize("cut", [1, 7, 1000])
def test_an_interim_100_continue_is_skipped_for_the_answer_that_follows(cut: int) -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    loop = asyncio.new_event_loop()
    try:
        upstream = Connection(loop)
        for i in range(0, len(answer), cut):
            upstream.data_received(answer[i : i + cut])
        assert upstream.head.result()[0] == 200 and upstream.done.result() == b"ok"
    finally:
        loop.close()


async def test_header_bytes_that_are_not_ascii_reach_the_upstream_as_they_came() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(_answer(b"Connection: close\r\n"))
        writer.close()

    server, url = await _raw_upstream(handler)
    gw = await _gateway_to(url)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.address[1])  # type: ignore[index]
        body = b'{"prompt": "hi"}'
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Team: \xc3\xa9quipe\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
        status = await reader.readline()
        writer.close()
    finally:
        await gw.close()
        server.close()
    assert status.startswith(b"HTTP/1.1 200") and b"X-Team: \xc3\xa9quipe" in seen[0]
