"""Streamed answers relayed at the transport level: upstream bytes written to the client as they are read.

A streamed answer is most of a gateway's work (an 8-GPU host streams tens of
thousands of events a second). Through aiohttp's client each event costs a
parse into a stream reader, a task wake-up, a timeout timer and a re-encoding
into a new HTTP chunk. Here the upstream connection is a plain asyncio
protocol: the answer's head is parsed once, and from then on every read is
handed to the client's transport as it is, still in the upstream's own
chunked framing, which is only followed (chunk sizes, to find the end), never
rebuilt. The closing chunk is left to aiohttp's ``write_eof``, so the client's
response ends the way every other response of the gateway does.

Back-pressure is kept: when the client's transport holds more than
``HIGH_WATER_BYTES`` unsent, reading from the upstream pauses until it is
under ``LOW_WATER_BYTES``, so a client that does not read costs a bounded
buffer and vLLM sees its socket fill, as with a direct client.

``Transfer-Encoding: chunked`` answers are relayed this way; an answer of
known length (a completion that is not streamed; vLLM's JSON errors, even
for a streamed request) is read whole and returned as an ordinary response,
and its connection is kept alive for the next (``Pool``). A stream has a
connection of its own (``Connection: close``): a connect is small beside a
stream's events.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Mapping
from urllib.parse import urlsplit

from aiohttp import web

# headers of one connection, not passed from client to vLLM or back (the relay also drops trailers, hence Trailer;
# the body is sent whole, hence Expect; its length and Host are the gateway's own)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
                        "transfer-encoding", "upgrade", "host", "content-length", "expect"})  # fmt: skip
HIGH_WATER_BYTES = 256 * 1024
LOW_WATER_BYTES = 64 * 1024
RESUME_CHECK_SECONDS = 0.005  # while paused: how often the client's buffer is looked at
MAX_HEAD_BYTES = 64 * 1024
MAX_WHOLE_BYTES = 16 * 1024 * 1024  # an answer of known length, read whole


class UpstreamError(Exception):
    """The upstream broke the answer (closed, sent a head that is not HTTP, or an oversized one)."""


class NoAnswer(UpstreamError):
    """The upstream broke off before its answer's head: nothing was sent to the client, which may still be answered."""


class Unreachable(OSError):
    """No connection to the upstream: nothing was sent to the client."""


class _Upstream(asyncio.Protocol):
    """One upstream exchange: the head parsed, then the body relayed (chunked) or collected (of known length)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reset()

    def reset(self) -> None:
        """Ready for the next exchange on this connection (kept alive, from the pool)."""
        loop = self.loop
        self.head: asyncio.Future[tuple[int, str, list[tuple[str, str]]]] = loop.create_future()
        self.done: asyncio.Future[bytes] = loop.create_future()  # the whole body (known length), or b"" once relayed
        for future in (self.head, self.done):  # an exchange given up (the client left) leaves no "never retrieved" noise
            future.add_done_callback(_retrieved)
        self._buffer = bytearray()  # the head; then body bytes that came before the client was attached
        self._client: asyncio.BaseTransport | None = None
        self._chunked = False
        self._length: int | None = None
        self._line = bytearray()  # a chunk-size line split across reads
        self._left = 0  # bytes of the current chunk still to pass (data and its CRLF)
        self._in_trailer = False
        self._paused = False
        self._keep_alive = True  # the answer did not say Connection: close

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._client is not None:
            self._relay(data)
        elif not self.head.done():
            self._buffer += data
            self._read_head()
        else:
            self._buffer += data
            if self._length is not None:
                self._check_whole()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.head.done():
            self.head.set_exception(UpstreamError("the upstream closed the connection before answering"))
        elif not self.done.done():
            if self._length is None and not self._chunked:  # read to the end: the end is the body's end
                self.done.set_result(bytes(self._buffer))
            else:
                self.done.set_exception(UpstreamError("the upstream closed the connection in the middle of the answer"))

    # -- the head ----------------------------------------------------------------------------------

    def _read_head(self) -> None:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                self.head.set_exception(UpstreamError("the upstream's answer head is too large"))
                self.close()
            return
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + 4]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self.head.set_exception(UpstreamError(f"the upstream's answer is not HTTP/1.1: {lines[0][:80]!r}"))
            self.close()
            return
        if parts[1].startswith("1") and parts[1] != "101":  # an interim answer (100 Continue): the real one follows
            self._read_head()
            return
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]) if k]
        for key, value in headers:
            low = key.lower()
            if low == "transfer-encoding" and "chunked" in value.lower():
                self._chunked = True
            elif low == "content-length" and value.isdigit():
                self._length = int(value)
            elif low == "connection" and "close" in value.lower():
                self._keep_alive = False
        self._keep_alive = self._keep_alive and parts[0] == "HTTP/1.1"
        self.head.set_result((int(parts[1]), parts[2] if len(parts) > 2 else "", headers))
        if not self._chunked and self._length is not None:
            self._check_whole()

    def _check_whole(self) -> None:
        assert self._length is not None
        if self._length > MAX_WHOLE_BYTES:
            self.done.set_exception(UpstreamError(f"the upstream's answer is larger than {MAX_WHOLE_BYTES} bytes"))
            self.close()
        elif len(self._buffer) >= self._length and not self.done.done():
            self.done.set_result(bytes(self._buffer[: self._length]))

    # -- the relay -----------------------------------------------------------------------------------

    def attach(self, client: asyncio.BaseTransport) -> None:
        """From now on body bytes go to ``client`` as they come; what came before goes first."""
        self._client = client
        early, self._buffer = bytes(self._buffer), bytearray()
        if early:
            self._relay(early)

    def _relay(self, data: bytes) -> None:
        """Pass ``data`` on up to the closing chunk, following the chunk sizes to know where the answer ends.

        A size line split across reads is held back until it is whole: it may be the closing chunk's.
        """
        n = len(data)
        i, end = 0, 0 if self._in_trailer else n  # data[:end] is passed on
        held = b""  # the start of a split size line, from the read before: passed on before data
        while i < n and not self.done.done():
            if self._left:
                step = min(self._left, n - i)
                self._left -= step
                i += step
                continue
            eol = data.find(b"\n", i)
            if eol < 0:
                self._line += data[i:]
                end = min(end, i)
                break
            start, i = i, eol + 1
            line = data[start:eol]
            if self._line:
                held, line = bytes(self._line), bytes(self._line) + line
                self._line.clear()
            if self._in_trailer:
                held = b""
                if not line.strip():
                    self.done.set_result(b"")
                continue
            try:
                size = int(line.split(b";", 1)[0].strip() or b"x", 16)
            except ValueError:
                self.done.set_exception(UpstreamError(f"a chunk size that is not hex: {line[:40]!r}"))
                self.close()
                return
            if size == 0:  # the closing chunk: not passed on (write_eof writes the client's own)
                end, held = start, b""
                self._in_trailer = True
                continue
            self._left = size + 2  # the data and its CRLF
        payload = held + data[:end] if held else data[:end] if end < n else data
        if payload:
            assert self._client is not None
            self._client.write(payload)  # type: ignore[attr-defined]
            if not self._paused and self._client.get_write_buffer_size() > HIGH_WATER_BYTES:  # type: ignore[attr-defined]
                self._pause()

    def _pause(self) -> None:
        """The client reads slower than the upstream writes: stop reading until it has caught up."""
        assert self.transport is not None
        self._paused = True
        self.transport.pause_reading()
        self.loop.call_later(RESUME_CHECK_SECONDS, self._maybe_resume)

    def _maybe_resume(self) -> None:
        if self.transport is None or self.transport.is_closing() or self._client is None:
            return
        if self._client.is_closing() or self._client.get_write_buffer_size() <= LOW_WATER_BYTES:  # type: ignore[attr-defined]
            self._paused = False
            self.transport.resume_reading()
        else:
            self.loop.call_later(RESUME_CHECK_SECONDS, self._maybe_resume)

    @property
    def reusable(self) -> bool:
        """The answer was of known length and read exactly, and neither side said Connection: close."""
        return (self._keep_alive and not self.closed and self._length is not None and self.done.done()
                and not self.done.exception() and len(self._buffer) == self._length)  # fmt: skip

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Pool:
    """Idle keep-alive connections to one upstream, for answers of known length (a stream has its own connection).

    A connection idle for ``IDLE_SECONDS`` is not used again: vLLM's server
    (uvicorn) closes idle ones after 5 s, and a request sent as it does is
    lost. One that was closed under a request before any answer came is
    retried once on a new connection: the upstream never read it.
    """

    IDLE_SECONDS = 4.0
    SIZE = 64

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        secure = parts.scheme == "https"
        self.ssl = ssl.create_default_context() if secure else None  # once: loading the CA store is not per connection
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if secure else 80)
        self.netloc = parts.netloc
        self.prefix = parts.path.rstrip("/")
        self._idle: list[tuple[float, _Upstream]] = []

    async def open(self, timeout: float) -> tuple[_Upstream, bool]:
        """A connection: an idle one (True) or a new one (False)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._idle:
            since, upstream = self._idle.pop()
            if upstream.reusable and now - since < self.IDLE_SECONDS:  # nothing came or went while idle
                upstream.reset()
                return upstream, True
            upstream.close()
        try:
            _, fresh = await asyncio.wait_for(
                loop.create_connection(lambda: _Upstream(loop), self.host, self.port, ssl=self.ssl),
                timeout,
            )  # fmt: skip
        except OSError as exc:
            raise Unreachable(exc.errno, exc.strerror or str(exc)) from None
        return fresh, False

    def give(self, upstream: _Upstream) -> None:
        if upstream.reusable and len(self._idle) < self.SIZE:
            self._idle.append((upstream.loop.time(), upstream))
        else:
            upstream.close()

    def close(self) -> None:
        for _, upstream in self._idle:
            upstream.close()
        self._idle.clear()


async def relay(request: web.Request, pool: Pool, headers: Mapping[str, str], body: bytes, timeout: float,
                stream: bool) -> web.StreamResponse:  # fmt: skip
    """``request`` sent upstream with ``headers`` and ``body``; the answer relayed back to its client.

    Raises ``Unreachable`` when the upstream cannot be reached, ``NoAnswer``
    or ``asyncio.TimeoutError`` when it answers nothing usable in time (the
    caller may still answer the client), and ``UpstreamError`` when it
    breaks off an answer already begun: the client's connection is closed
    on it then, and its stream ends cut, as the upstream's did.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    lines = [f"{request.method} {pool.prefix}{request.rel_url.path_qs} HTTP/1.1", f"Host: {pool.netloc}", f"Content-Length: {len(body)}"]
    lines += ["Connection: close"] if stream else []
    lines += [f"{k}: {v}" for k, v in headers.items()]
    message = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body  # the header bytes as they came
    for attempt in (1, 2):
        upstream, reused = await pool.open(deadline - loop.time())
        try:
            assert upstream.transport is not None
            upstream.transport.write(message)
            try:
                status, reason, head = await asyncio.wait_for(upstream.head, deadline - loop.time())
            except UpstreamError as exc:
                if reused and attempt == 1:
                    continue  # a kept-alive connection the upstream had just closed: it never read the request
                raise NoAnswer(str(exc)) from None
            passed = [(k, v) for k, v in head if k.lower() not in HOP_BY_HOP]
            if not upstream._chunked:
                whole = web.Response(status=status, reason=reason or None, body=await asyncio.wait_for(upstream.done, deadline - loop.time()))
                for k, v in passed:
                    whole.headers.add(k, v)
                return whole
            return await _relay_chunked(request, upstream, status, reason, passed, deadline, timeout)
        finally:
            pool.give(upstream)  # kept when the answer was read whole and may be; else closed (and its request with it)
    raise AssertionError("unreachable")


async def _relay_chunked(request: web.Request, upstream: _Upstream, status: int, reason: str, passed: list[tuple[str, str]],
                         deadline: float, timeout: float) -> web.StreamResponse:  # fmt: skip
    response = web.StreamResponse(status=status, reason=reason or None)
    for k, v in passed:
        response.headers.add(k, v)
    response.enable_chunked_encoding()
    await response.prepare(request)
    if request.transport is None:  # the client is gone already
        raise UpstreamError("the client closed the connection")
    upstream.attach(request.transport)
    try:
        await asyncio.wait_for(upstream.done, deadline - upstream.loop.time())
    except asyncio.TimeoutError:
        raise UpstreamError(f"the answer took longer than {timeout:g}s") from None
    await response.write_eof()
    return response
