"""guardian's listeners (the API and scrape port, the gateway), each with limits a client cannot get around.

Without them a client on loopback could hold guardian's listeners open: open
connections until the process's file descriptors ran out (both listeners went
dark and asyncio logged tracebacks in a loop), or send a request's headers a
byte a minute. Each listener here has

- a connection limit: one more connection is answered ``503`` with a JSON
  reason and closed at once, counted, and logged once a minute at most;
- a deadline for a new connection's request headers (slow clients are closed);
- an idle timeout for kept-alive connections (aiohttp's keep-alive timeout).

Each listener has limits of its own, so a flood on the gateway cannot take the
API's connections (and the unit's ``LimitNOFILE`` is sized above both).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, cast

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from guardian import logs

log = logs.get("guardian.listener")

LOG_EVERY_SECONDS = 60.0  # a refusal kind is logged at most this often, with the count since


@dataclass(frozen=True)
class ListenerLimits:
    max_connections: int = 1024
    header_timeout_seconds: float = 10.0  # a new connection's first request headers must be complete by then
    idle_timeout_seconds: float = 30.0  # a kept-alive connection with no request is closed after this


class ListenerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.open = Gauge("guardian_listener_connections", "Open connections per listener.", ["listener"], registry=registry)
        self.refused = Counter("guardian_listener_refused", "Connections refused or closed by a listener's limits.",
                               ["listener", "reason"], registry=registry)  # fmt: skip


async def serve(runner: web.AppRunner, host: str, port: int, limits: ListenerLimits, name: str,
                metrics: ListenerMetrics) -> tuple[asyncio.Server, tuple[str, int]]:  # fmt: skip
    """Listen for ``runner``'s app with ``limits``; returns the server and the address it is bound to."""
    assert runner.server is not None, "set the runner up first"
    guard = _Guard(runner.server, limits, name, metrics)
    server = await asyncio.get_running_loop().create_server(guard, host, port, reuse_address=True)
    bound = server.sockets[0].getsockname()
    return server, (bound[0], bound[1])


class _Guard:
    """The protocol factory: counts connections, refuses past the limit, wraps each accepted one."""

    def __init__(self, factory: Callable[[], Any], limits: ListenerLimits, name: str, metrics: ListenerMetrics) -> None:
        self.factory = factory
        self.limits = limits
        self.name = name
        self.metrics = metrics
        self.open = 0
        self._said: dict[str, tuple[float, int]] = {}  # reason -> (last logged, refused since)

    def __call__(self) -> asyncio.Protocol:
        if self.open >= self.limits.max_connections:
            self.refused("connection_limit")
            return _Refuse(self.name, self.limits.max_connections)
        self.open += 1
        self.metrics.open.labels(self.name).set(self.open)
        return _Guarded(self.factory(), self)

    def closed(self) -> None:
        self.open -= 1
        self.metrics.open.labels(self.name).set(self.open)

    def refused(self, reason: str) -> None:
        self.metrics.refused.labels(self.name, reason).inc()
        last, count = self._said.get(reason, (0.0, 0))
        now = time.monotonic()
        if now - last >= LOG_EVERY_SECONDS:
            log.warning("listener_refused", listener=self.name, reason=reason, refused=count + 1,
                        max_connections=self.limits.max_connections, open=self.open,
                        header_timeout_seconds=self.limits.header_timeout_seconds)  # fmt: skip
            self._said[reason] = (now, 0)
        else:
            self._said[reason] = (last, count + 1)


class _Refuse(asyncio.Protocol):
    def __init__(self, name: str, limit: int) -> None:
        body = json.dumps({"error": {"message": f"guardian's {name} listener has {limit} connections open, its limit: "
                                                "try again shortly", "type": "ServiceUnavailableError", "code": 503}})  # fmt: skip
        self.answer = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                       f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()  # fmt: skip

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses
        stream.write(self.answer)
        stream.close()


class _Guarded(asyncio.Protocol):
    """One accepted connection: aiohttp's handler inside, a deadline on its first request's headers around it."""

    def __init__(self, inner: Any, guard: _Guard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio.Transport subclasses
        self.timer = asyncio.get_running_loop().call_later(self.guard.limits.header_timeout_seconds, self._too_slow)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.timer is not None:
            seen = self.tail + data
            if b"\r\n\r\n" in seen:
                self.timer.cancel()
                self.timer = None
            else:
                self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.guard.closed()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _too_slow(self) -> None:
        self.timer = None
        self.guard.refused("slow_headers")
        if self.transport is not None:
            self.transport.abort()
