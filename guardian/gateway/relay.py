"""Answers relayed from vLLM to the gateway's clients over ``guardian.http1``'s connections.

A streamed answer is most of a gateway's work (an 8-GPU host streams tens of
thousands of events a second). Its chunks are handed from the upstream's
connection to the client's transport as they are read, still in the
upstream's own chunked framing (``http1.Connection``); the closing chunk is
left to aiohttp's ``write_eof``, so the client's response ends the way every
other response of the gateway does.

``Transfer-Encoding: chunked`` answers are relayed this way; an answer of
known length (a completion that is not streamed; vLLM's JSON errors, even
for a streamed request) is read whole and returned as an ordinary response,
and its connection is kept alive for the next (``http1.Pool``). A stream has
a connection of its own (``Connection: close``): a connect is small beside a
stream's events.
"""

from __future__ import annotations

import asyncio
from typing import Mapping

from aiohttp import web

from guardian import http1

# headers of one connection, not passed from client to vLLM or back (the relay also drops trailers, hence Trailer;
# the body is sent whole, hence Expect; its length and Host are the gateway's own)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
                        "transfer-encoding", "upgrade", "host", "content-length", "expect"})  # fmt: skip


async def relay(request: web.Request, pool: http1.Pool, headers: Mapping[str, str], body: bytes, timeout: float,
                stream: bool) -> web.StreamResponse:  # fmt: skip
    """``request`` sent upstream with ``headers`` and ``body``; the answer relayed back to its client.

    Raises ``http1.Unreachable`` when the upstream cannot be reached,
    ``http1.NoAnswer`` or ``asyncio.TimeoutError`` when it answers nothing
    usable in time (the caller may still answer the client), and
    ``http1.UpstreamError`` when it
    breaks off an answer already begun: the client's connection is closed
    on it then, and its stream ends cut, as the upstream's did.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    lines = [f"{request.method} {pool.prefix}{request.rel_url.path_qs} HTTP/1.1", f"Host: {pool.netloc}", f"Content-Length: {len(body)}"]
    lines += ["Connection: close"] if stream else []
    lines += [f"{k}: {v}" for k, v in headers.items()]
    message = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body  # the header bytes as they came
    upstream, (status, reason, head) = await http1.send(pool, message, deadline)
    try:
        passed = [(k, v) for k, v in head if k.lower() not in HOP_BY_HOP]
        if not upstream.chunked:
            whole = web.Response(status=status, reason=reason or None, body=bytes(await upstream.done))
            for k, v in passed:
                whole.headers.add(k, v)
            return whole
        return await _relay_chunked(request, upstream, status, reason, passed, timeout)
    finally:
        pool.give(upstream)  # kept when the answer was read to its end and may be; else closed (and its request with it)


async def _relay_chunked(request: web.Request, upstream: http1.Connection, status: int, reason: str, passed: list[tuple[str, str]],
                         timeout: float) -> web.StreamResponse:  # fmt: skip
    response = web.StreamResponse(status=status, reason=reason or None)
    for k, v in passed:
        response.headers.add(k, v)
    response.enable_chunked_encoding()
    await response.prepare(request)
    if request.transport is None:  # the client is gone already
        raise http1.UpstreamError("the client closed the connection")
    upstream.attach(request.transport)
    try:
        await upstream.done
    except asyncio.TimeoutError:
        raise http1.UpstreamError(f"the answer took longer than {timeout:g}s") from None
    await response.write_eof()
    return response
