"""A small HTTP/1.1 client on asyncio protocols: kept-alive connections, answers relayed or read whole.

Both of guardian's hot paths talk HTTP/1.1 to vLLM on loopback: the gateway
(a completion per request, a stream of events each) and the poll (``GET
/metrics`` per engine every few seconds). Through aiohttp's client each
exchange built a request and a response object, a stream reader with its
task wake-ups, and a timeout timer per read: most of the gateway's CPU per
event and a fifth of a poll's instructions. Here a connection is a plain
``asyncio.Protocol``: the answer's head is parsed once; a body of known length
is collected as it comes; a chunked body is passed on as it is read, still in
its own framing, which is only followed (chunk sizes, to find the end), never
rebuilt: to a client's transport (the gateway's relay) or to a buffer that is
de-chunked once at the end (``get``).

Back-pressure is kept: when the client's transport holds more than
``HIGH_WATER_BYTES`` unsent, reading from the upstream pauses until it is
under ``LOW_WATER_BYTES``, so a client that does not read costs a bounded
buffer and vLLM sees its socket fill, as with a direct client.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Mapping, Protocol
from urllib.parse import urlsplit

HIGH_WATER_BYTES = 256 * 1024
LOW_WATER_BYTES = 64 * 1024
RESUME_CHECK_SECONDS = 0.005  # while paused: how often the client's buffer is looked at
MAX_HEAD_BYTES = 64 * 1024
MAX_WHOLE_BYTES = 16 * 1024 * 1024  # an answer read whole (known length, or collected by ``get``)


class Sink(Protocol):
    """Where a chunked body is passed: a client's transport (the gateway), or ``get``'s buffer."""

    def write(self, data: bytes | memoryview) -> None: ...

    def get_write_buffer_size(self) -> int: ...

    def is_closing(self) -> bool: ...


class UpstreamError(Exception):
    """The upstream broke the answer (closed, sent a head that is not HTTP, or an oversized one)."""


class TooLarge(UpstreamError):
    """The answer is larger than ``MAX_WHOLE_BYTES``: not read further (the connection is closed)."""


class NoAnswer(UpstreamError):
    """The upstream broke off before its answer's head: nothing was sent to the client, which may still be answered."""


class Unreachable(OSError):
    """No connection to the upstream: nothing was sent to the client."""


class Connection(asyncio.Protocol):
    """One connection's exchanges, one at a time: the head parsed, then the body relayed (chunked) or collected (known length)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._timer: asyncio.TimerHandle | None = None
        self.reset()

    def reset(self) -> None:
        """Ready for the next exchange on this connection (kept alive, from the pool)."""
        loop = self.loop
        self.head: asyncio.Future[tuple[int, str, list[tuple[str, str]]]] = loop.create_future()
        self.done: asyncio.Future[bytes | memoryview] = loop.create_future()  # the whole body (known length), or b"" once relayed
        for future in (self.head, self.done):  # an exchange given up (the client left) leaves no "never retrieved" noise
            future.add_done_callback(_retrieved)
        self._buffer = bytearray()  # the start of a head split across reads
        self._parts: list[bytes | memoryview] = []  # the body as read (of known length, or before a client was attached)
        self._size = 0  # their bytes
        self._client: Sink | None = None
        self.sink: Sink | None = None  # where a chunked body goes from the moment the head is read (``get``)
        self.chunked = False
        self._length: int | None = None
        self._line = bytearray()  # a chunk-size line split across reads
        self._left = 0  # bytes of the current chunk still to pass (data and its CRLF)
        self._in_trailer = False
        self._paused = False
        self._keep_alive = True  # the answer did not say Connection: close

    def expire_at(self, deadline: float) -> None:
        """The exchange fails with ``asyncio.TimeoutError`` at ``deadline`` (loop time) unless it is over and given back.

        One timer for the whole exchange, where ``asyncio.wait_for`` made a
        waiter, a timer and a callback for each of the head and the body.
        """
        self._timer = self.loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        for future in (self.head, self.done):
            if not future.done():
                future.set_exception(asyncio.TimeoutError())
        self.close()

    def settle(self) -> None:
        """The exchange is over (read, or given up): its timer stops."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._client is not None:
            self._relay(data)
        elif self.head.done():
            self._take(data)
        else:
            if self._buffer:  # the rest of a split head (rare): read from the two together
                self._buffer += data
                data, self._buffer = bytes(self._buffer), bytearray()
            self._read_head(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.head.done():
            self.head.set_exception(UpstreamError("the upstream closed the connection before answering"))
        elif not self.done.done():
            if self._length is None and not self.chunked:  # read to the end: the end is the body's end
                self.done.set_result(b"".join(self._parts))
            else:
                self.done.set_exception(UpstreamError("the upstream closed the connection in the middle of the answer"))

    # -- the head ----------------------------------------------------------------------------------

    def _read_head(self, data: bytes) -> None:
        """The head from ``data``; what follows it is the body's start, kept without a copy (a page is most of one read)."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > MAX_HEAD_BYTES:
                self.head.set_exception(UpstreamError("the upstream's answer head is too large"))
                self.close()
            else:
                self._buffer += data
            return
        lines = data[:end].decode("latin-1").split("\r\n")
        rest = memoryview(data)[end + 4 :]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self.head.set_exception(UpstreamError(f"the upstream's answer is not HTTP/1.1: {lines[0][:80]!r}"))
            self.close()
            return
        if parts[1].startswith("1") and parts[1] != "101":  # an interim answer (100 Continue): the real one follows
            self._read_head(bytes(rest))
            return
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]) if k]
        for key, value in headers:
            low = key.lower()
            if low == "transfer-encoding" and "chunked" in value.lower():
                self.chunked = True
            elif low == "content-length" and value.isdigit():
                self._length = int(value)
            elif low == "connection" and "close" in value.lower():
                self._keep_alive = False
        self._keep_alive = self._keep_alive and parts[0] == "HTTP/1.1"
        self.head.set_result((int(parts[1]), parts[2] if len(parts) > 2 else "", headers))
        if self.chunked and self.sink is not None:  # straight on, not kept until the reader looks at the head
            self._client = self.sink
            if rest:
                self._relay(data, end + 4)
        else:
            self._take(rest)

    def _take(self, part: bytes | memoryview) -> None:
        """Body bytes read before anyone relays them: kept as read, joined once the body of known length is whole."""
        if part:
            self._parts.append(part)
            self._size += len(part)
        if self._length is None or self.chunked or self.done.done():
            return
        if self._length > MAX_WHOLE_BYTES:
            self.fail(TooLarge(f"the answer is larger than {MAX_WHOLE_BYTES} bytes"))
        elif self._size >= self._length:
            body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            self.done.set_result(body if len(body) == self._length else memoryview(body)[: self._length])

    # -- the relay -----------------------------------------------------------------------------------

    def attach(self, client: Sink) -> None:
        """From now on body bytes go to ``client`` as they come; what came before goes first."""
        self._client = client
        early, self._parts = b"".join(self._parts), []
        if early:
            self._relay(early)

    def _relay(self, data: bytes, offset: int = 0) -> None:
        """Pass ``data[offset:]`` on up to the closing chunk, following the chunk sizes to know where the answer ends.

        A size line split across reads is held back until it is whole: it may be the closing chunk's.
        """
        n = len(data)
        i, end = offset, offset if self._in_trailer else n  # data[offset:end] is passed on
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
                self.fail(UpstreamError(f"a chunk size that is not hex: {line[:40]!r}"))
                return
            if size == 0:  # the closing chunk: not passed on (write_eof writes the client's own)
                end, held = start, b""
                self._in_trailer = True
                continue
            self._left = size + 2  # the data and its CRLF
        if held:
            payload: bytes | memoryview = held + data[offset:end]
        else:  # a view of the read where it is not passed whole: no copy
            payload = memoryview(data)[offset:end] if offset or end < n else data
        if payload:
            assert self._client is not None
            self._client.write(payload)
            if not self._paused and self._client.get_write_buffer_size() > HIGH_WATER_BYTES:
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
        if self._client.is_closing() or self._client.get_write_buffer_size() <= LOW_WATER_BYTES:
            self._paused = False
            self.transport.resume_reading()
        else:
            self.loop.call_later(RESUME_CHECK_SECONDS, self._maybe_resume)

    @property
    def reusable(self) -> bool:
        """The answer was read to its end (its length exactly, or its closing chunk) and neither side said Connection: close."""
        done = self.done
        if not (self._keep_alive and not self.closed and done.done() and not done.cancelled() and done.exception() is None):
            return False
        return self._in_trailer if self.chunked else self._length is not None and self._size == self._length

    def fail(self, exc: UpstreamError) -> None:
        """The exchange given up with ``exc``, and the connection with it (what is left of the answer is not read)."""
        if not self.done.done():
            self.done.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Pool:
    """Idle keep-alive connections to one upstream, each back after an answer read to its end.

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
        self._idle: list[tuple[float, Connection]] = []
        self._closed = False

    async def open(self, timeout: float) -> tuple[Connection, bool]:
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
                loop.create_connection(lambda: Connection(loop), self.host, self.port, ssl=self.ssl),
                timeout,
            )  # fmt: skip
        except OSError as exc:
            raise Unreachable(exc.errno, exc.strerror or str(exc)) from None
        return fresh, False

    def give(self, upstream: Connection) -> None:
        upstream.settle()
        if upstream.reusable and len(self._idle) < self.SIZE and not self._closed:
            self._idle.append((upstream.loop.time(), upstream))
        else:
            upstream.close()

    def close(self) -> None:
        """Its idle connections closed; one in use is closed when given back."""
        self._closed = True
        for _, upstream in self._idle:
            upstream.close()
        self._idle.clear()


class _Collected:
    """A chunked answer ``get`` reads whole: the reads kept as they come (in their framing), de-chunked once at the end."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0
        self.connection: Connection | None = None

    def write(self, data: bytes | memoryview) -> None:
        self.parts.append(data)
        self.size += len(data)
        if self.size > MAX_WHOLE_BYTES and self.connection is not None:
            self.connection.fail(TooLarge(f"the answer is larger than {MAX_WHOLE_BYTES} bytes"))

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def data(self) -> bytes | memoryview:
        """The body without its framing (sizes already checked by the relay; the closing chunk was never passed).

        A page sent as one chunk (uvicorn's way) comes back as a view of the read that carried it: not copied.
        """
        if self.size > MAX_WHOLE_BYTES:  # the last read both passed the limit and ended the answer
            raise TooLarge(f"the answer is larger than {MAX_WHOLE_BYTES} bytes")
        view = memoryview(self.parts[0] if len(self.parts) == 1 else b"".join(self.parts))
        chunks, i = [], 0
        while i < len(view):
            line = bytes(view[i : i + 1024])  # the size line, and its extensions if any
            eol = line.find(b"\n")
            if eol < 0:
                line = bytes(view[i:])
                eol = line.index(b"\n")
            size = int(line[:eol].split(b";", 1)[0], 16)
            chunks.append(view[i + eol + 1 : i + eol + 1 + size])
            i += eol + 1 + size + 2
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def send(pool: Pool, message: bytes, deadline: float,
               sink: Sink | None = None) -> tuple[Connection, tuple[int, str, list[tuple[str, str]]]]:  # fmt: skip
    """``message`` (a whole request) sent on a connection of ``pool``; that connection and the answer's head.

    With ``sink``, a chunked body goes there as it is read, from the head on.

    The caller gives the connection back to the pool once the answer is read
    (or given up). Raises ``Unreachable`` when no connection can be made,
    ``NoAnswer`` when the upstream closes before any answer and
    ``asyncio.TimeoutError`` when ``deadline`` (loop time) passes first. A
    kept-alive connection the upstream closed just as the request went out
    is retried once on a new one: the upstream never read the request.
    """
    loop = asyncio.get_running_loop()
    for attempt in (1, 2):
        connection, reused = await pool.open(deadline - loop.time())
        connection.expire_at(deadline)
        connection.sink = sink
        if isinstance(sink, _Collected):
            sink.connection = connection  # a body past the limit closes it
        try:
            assert connection.transport is not None
            connection.transport.write(message)
            return connection, await connection.head
        except UpstreamError as exc:
            pool.give(connection)
            if reused and attempt == 1:
                continue
            raise NoAnswer(str(exc)) from None
        except BaseException:
            pool.give(connection)
            raise
    raise AssertionError("unreachable")


async def get(pool: Pool, path: str, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes | memoryview]:
    """``GET path``: the answer's status and whole body (as read: not copied again), on a kept-alive connection of ``pool``.

    Raises what ``send`` raises, ``TooLarge``, ``asyncio.TimeoutError``, and
    ``UpstreamError`` when the upstream breaks off the body.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    lines = [f"GET {pool.prefix}{path} HTTP/1.1", f"Host: {pool.netloc}", *(f"{k}: {v}" for k, v in headers.items())]
    collected = _Collected()
    connection, (status, _, _) = await send(pool, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), deadline, collected)
    try:
        body = await connection.done
        return status, collected.data() if connection.chunked else body
    finally:
        pool.give(connection)
