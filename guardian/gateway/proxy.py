"""The admission gateway: an OpenAI-compatible reverse proxy in front of local vLLM servers.

Clients point at guardian instead of vLLM. For ``/v1/completions`` and
``/v1/chat/completions`` guardian estimates the prompt's length, picks the
bucket and with it the upstream pool (``policy/buckets.py``), takes the
request's lane (``x-guardian-priority: high|low``, or an API key listed as
high priority; the preemptible bucket is low by nature; the high lane may
have a dedicated pool of its own), applies the
breaker's gates of the chosen engine, waits for admission (``admission.py``)
and streams the request and the answer through unchanged, byte for byte:
SSE chunks are written as they arrive, a client that goes away cancels the
upstream request, upstream errors pass through with their status and body.
``GET /v1/models`` and the operator's ``extra_paths`` are passed through to
the least loaded engine that is up; every other path is answered 404 here
(``routes.py``: vLLM's admin endpoints are never proxied). Engines that are
dead, loading or hung (the daemon's lifecycle, each poll; a refused
connection at once) get no requests; with none left in a pool the answer
is 503 + Retry-After at once.

It is also the breaker's ``Gateway``: ``set_gates`` (L1 refuse long
contexts with 503 + Retry-After and a JSON error that says why; L2 pause the
low lane; L3 high priority only), ``drain`` and ``admit`` for restarts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter as CounterOf
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import aiohttp
from aiohttp import web

from guardian import http1, logs
from guardian.actions.gateway import Gates
from guardian.actions.outcome import Outcome
from guardian.analysis.engine_stats import EngineSignals
from guardian.gateway import relay, routes
from guardian.gateway.admission import Admission, Lane, Refusal
from guardian.gateway.metrics import AdmissionGauges, GatewayMetrics
from guardian.listener import ListenerLimits, serve
from guardian.policy.buckets import BadRequest, Bucket, choose, prompt_tokens
from guardian.sample import GatewayLoad
from guardian.snapshot import GatewayView

log = logs.get("guardian.gateway")

WHOLE_BODY_BYTES = 1 << 20  # answers up to this size with a Content-Length are relayed whole
RETRY_AFTER_NO_ENGINE_SECONDS = 10  # no engine of the pool is up: a model load takes longer, a blip less


@dataclass(frozen=True)
class GatewaySettings:
    buckets: tuple[Bucket, ...]  # sorted by max_tokens
    chars_per_token: float = 4.0
    long_context_tokens: int = 32768  # L1 refuses prompts estimated above this
    concurrency: int = 64  # per engine: the effective batch
    queue_size: int = 256  # per engine
    queue_deadline_seconds: float = 30.0
    restart_hold_seconds: float = 300.0
    long_prefill_share: float = 0.005  # of an engine's time, a flood of long prompts' while short requests flow (admission.py)
    long_flood_share: float = 0.1  # long prompts asking for more of an engine's time are a flood
    priority_header: str = "x-guardian-priority"
    high_priority_keys: frozenset[str] = frozenset()
    inject_priority: bool = False  # only when vLLM runs with --scheduling-policy priority
    high_priority_engines: tuple[str, ...] = ()  # a dedicated pool (its own GPU or MIG slice) for the high lane
    upstream_timeout_seconds: float = 600.0
    priorities: tuple[tuple[str, int], ...] = (("high", 0), ("low", 10))  # lane -> vLLM priority ([tuner.classes])
    extra_paths: tuple[str, ...] = ()  # proxied as they are, beyond the OpenAI inference paths (never an admin path)
    max_body_bytes: int | None = None  # None: sized for the largest bucket's prompt (see body_limit)
    listener: ListenerLimits = ListenerLimits(max_connections=4096, idle_timeout_seconds=75.0)

    @property
    def body_limit(self) -> int:
        """Bytes a request body may have: 16 per token of the largest bucket (JSON-escaped text, token ids), 2 MiB at least."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        largest = max((b.max_tokens for b in self.buckets), default=0)
        return max(2 * 1024 * 1024, 16 * largest)


@dataclass(frozen=True)
class Seat:
    """A request admitted to an engine: send it there, then ``leave``."""

    engine: str
    lane: Lane
    bucket: str
    tokens: int  # the prompt's estimate: what its place in the KV pool is accounted by


@dataclass(frozen=True)
class Turned:
    """A request the gateway answers itself: a client error, or a refusal with Retry-After."""

    status: int
    message: str
    kind: str
    retry_after: int | None = None

    @classmethod
    def refused(cls, refusal: Refusal) -> Turned:
        kind = "RateLimitError" if refusal.status == 429 else "ServiceUnavailableError"
        return cls(refusal.status, refusal.reason, kind, refusal.retry_after)

    def response(self) -> web.Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return _error(self.status, self.message, self.kind, headers)


class GatewayServer:
    def __init__(
        self, settings: GatewaySettings, upstreams: Mapping[str, str], metrics: GatewayMetrics,
        api_keys: Mapping[str, str | None] | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.upstreams = {name: url.rstrip("/") for name, url in upstreams.items()}
        self.metrics = metrics
        self.api_keys = dict(api_keys or {})  # engine -> key to send upstream (replaces the client's)
        self.admission = {name: Admission(settings.concurrency, settings.queue_size, restart_hold_seconds=settings.restart_hold_seconds,
                                          long_prefill_share=settings.long_prefill_share,
                                          long_flood_share=settings.long_flood_share, engine=name)
                          for name in self.upstreams}  # fmt: skip
        metrics.registry.register(AdmissionGauges(self.admission))
        self.pools = {name: http1.Pool(url) for name, url in self.upstreams.items()}  # kept-alive connections per engine
        self.gates = {name: Gates() for name in self.upstreams}
        self.down: dict[str, str] = {}  # engines not to route to, and why (dead, starting, unresponsive, refused)
        self.refused: CounterOf[str] = CounterOf()  # requests the gateway answered 429/503 itself, per engine
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.address: tuple[str, int] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=self.settings.upstream_timeout_seconds),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=self.settings.body_limit)
        for path in routes.GENERATE:
            app.router.add_post(path, self._generate)
        for path in routes.READ_ONLY:
            app.router.add_get(path, self._passthrough)
        for path in self.settings.extra_paths:
            if not routes.admin(path):  # the config refuses them too; this is the last word
                app.router.add_route("*", path, self._passthrough)
        app.router.add_route("*", "/{tail:.*}", self._not_routed)
        limits = self.settings.listener
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, keepalive_timeout=limits.idle_timeout_seconds)
        await self._runner.setup()
        self._server, self.address = await serve(self._runner, host, port, limits, "gateway", self.metrics.listener)

    async def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- the breaker's Gateway ----------------------------------------------------------------

    async def set_gates(self, engine: str, gates: Gates) -> Outcome:
        if engine not in self.admission:
            return Outcome("gates", "not_configured", f"the gateway has no upstream {engine!r}")
        self.gates[engine] = gates
        adm = self.admission[engine]
        adm.pause_low, adm.high_only, adm.why = gates.pause_low_priority, gates.high_priority_only, gates.why()
        adm.dispatch()
        return Outcome("gates", "done", f"refuse long contexts: {gates.refuse_long_context}, pause low: "
                                        f"{gates.pause_low_priority}, high only: {gates.high_priority_only}")  # fmt: skip

    async def set_cap(self, engine: str, cap: int) -> Outcome:
        if engine not in self.admission:
            return Outcome("cap", "not_configured", f"the gateway has no upstream {engine!r}")
        adm = self.admission[engine]
        was, adm.cap = adm.cap, cap
        adm.dispatch()  # a larger cap admits queued requests at once; a smaller one lets in-flight ones finish
        return Outcome("cap", "done", f"concurrency {was} -> {cap} ({adm.in_flight} in flight, {adm.queued} queued)")

    def set_available(self, engine: str, available: bool, why: str) -> None:
        """The daemon's word after each poll: route to this engine or not (its lifecycle phase)."""
        if engine not in self.admission:
            return
        if available:
            if self.down.pop(engine, None) is not None:
                log.info("gateway_engine_routed", engine=engine, reason=why)
        elif self.down.get(engine) != why:
            self.down[engine] = why
            log.warning("gateway_engine_skipped", engine=engine, reason=why)

    def views(self) -> dict[str, GatewayView]:
        """Per engine, for ``/status`` and ``guardian status``: gates, routing, refusals."""
        return {name: GatewayView(_gates_text(self.gates[name]), name not in self.down, self.down.get(name), self.refused[name],
                                  self.admission[name].flooding)
                for name in self.admission}  # fmt: skip

    def loads(self) -> tuple[GatewayLoad, ...]:
        """What the poll records of the gateway: per engine, its queue, in-flight requests (long ones apart) and cap."""
        return tuple(GatewayLoad(name, a.queued, a.in_flight, a.cap, a.long_count) for name, a in self.admission.items())

    async def drain(self, engine: str, timeout: float) -> Outcome:
        if engine not in self.admission:
            return Outcome("drain", "not_configured", f"the gateway has no upstream {engine!r}")
        left = await self.admission[engine].drain(timeout)
        if left:
            return Outcome("drain", "timeout", f"{left} requests still in flight after {timeout:g}s")
        return Outcome("drain", "done", "no request in flight; new ones wait in the gateway's queue")

    async def admit(self, engine: str) -> Outcome:
        if engine not in self.admission:
            return Outcome("admit", "not_configured", f"the gateway has no upstream {engine!r}")
        self.admission[engine].admit()
        self.down.pop(engine, None)  # the restart found it healthy (or resumed the old one): route to it again
        return Outcome("admit", "done", "admitting again")

    # -- requests -------------------------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        s = self.settings
        limit = s.body_limit
        if request.content_length is not None and request.content_length > limit:  # refused before reading it
            return _too_large(limit)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(limit)
        try:
            # on the loop: the body limit keeps this to a few tens of ms at most (json.loads holds the GIL, so a
            # thread would not free the loop for it: bench/gateway.py --big-bodies measured it slower)
            body: Any = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "The request body is not valid JSON.", "BadRequestError")
        except RecursionError:
            return _error(400, "The request body is nested too deeply.", "BadRequestError")
        try:
            tokens = prompt_tokens(body, s.chars_per_token, request.path == "/v1/chat/completions")
        except BadRequest as exc:
            return _error(400, str(exc), "BadRequestError")
        placed = await self.seat(tokens, request.headers)
        if isinstance(placed, Turned):
            return placed.response()
        if s.inject_priority and isinstance(body, dict):
            body["priority"] = dict(s.priorities)[placed.lane]
            raw = json.dumps(body).encode()
        begun = time.perf_counter()
        try:
            response = await self._forward(request, placed.engine, raw, True, isinstance(body, dict) and body.get("stream") is True)
            self.metrics.count(placed.lane, placed.bucket, str(response.status))
            return response
        except asyncio.CancelledError:
            self.metrics.count(placed.lane, placed.bucket, "client_gone")
            raise
        finally:
            self.metrics.upstream.observe(time.perf_counter() - begun)
            self.leave(placed)

    async def seat(self, tokens: int, headers: Mapping[str, str]) -> Seat | Turned:
        """Where a request of about ``tokens`` prompt tokens goes, once admitted there; or the answer that turns it away.

        Everything the gateway decides about a request, without its bytes:
        ``bench/efficacy.py`` sends simulated requests through this same path.
        """
        s = self.settings
        started = time.perf_counter()
        choice = choose(s.buckets, tokens)
        lane = self._lane(headers, choice.bucket)
        self.metrics.decision.observe(time.perf_counter() - started)
        if choice.bucket is None:
            self.metrics.count(lane, "none", "too_long")
            largest = s.buckets[-1].max_tokens if s.buckets else 0
            return Turned(400, f"The prompt is about {choice.tokens} tokens, longer than the largest bucket "
                               f"({largest} tokens) this gateway serves.", "BadRequestError")  # fmt: skip
        bucket = choice.bucket.name
        dedicated = lane == "high" and bool(s.high_priority_engines)
        pool = s.high_priority_engines if dedicated else choice.bucket.engines
        engine = self._pick(pool)
        if engine is None:
            self.metrics.count(lane, bucket, "refused_503")
            return Turned.refused(Refusal(503, "no engine of this pool can take requests now ("
                                               + ", ".join(f"{e}: {self.down.get(e, 'unknown')}" for e in self._pool(pool)) + ")",
                                          RETRY_AFTER_NO_ENGINE_SECONDS))  # fmt: skip
        if self.gates[engine].refuse_long_context and choice.tokens > s.long_context_tokens:
            self.metrics.count(lane, bucket, "refused_long")
            self.refused[engine] += 1
            return Turned.refused(Refusal(503, f"long-context requests (about {choice.tokens} tokens, above "
                                               f"{s.long_context_tokens}) are refused while {engine} is at "
                                               f"{self.gates[engine].why()}", 60))  # fmt: skip
        admission = self.admission[engine]
        waited = time.perf_counter()
        refusal = await admission.acquire(lane, s.queue_deadline_seconds, choice.tokens)
        self.metrics.queue_wait.observe(time.perf_counter() - waited)
        if refusal is not None:
            self.metrics.count(lane, bucket, f"refused_{refusal.status}")
            self.refused[engine] += 1
            return Turned.refused(refusal)
        return Seat(engine, lane, bucket, choice.tokens)

    def leave(self, seat: Seat) -> None:
        """The seated request is over (answered, failed or gone): its place goes to the next."""
        self.admission[seat.engine].release(seat.tokens)

    def follow(self, phases: Mapping[str, str | None], signals: Mapping[str, EngineSignals]) -> None:
        """The poll's word: route only to engines that are up (or not yet known); their KV pools' sizes and prefill speed."""
        for name, phase in phases.items():
            self.set_available(name, phase in (None, "up"), phase or "unknown")
        for name, sig in signals.items():
            admission = self.admission.get(name)
            if admission is None:
                continue
            if tokens := sig.kv_pool_tokens:
                admission.kv_tokens = tokens
            if sig.prefill_seconds_per_token:  # none in the window (idle): the last known speed holds
                admission.prefill_seconds_per_token = sig.prefill_seconds_per_token
            admission.judge_flood()

    async def _not_routed(self, request: web.Request) -> web.Response:
        what = "one of vLLM's admin endpoints, never proxied" if routes.admin(request.path) else "not proxied"
        return _error(404, f"{request.method} {request.path} is {what}: this gateway serves "
                           f"{', '.join(routes.GENERATE + routes.READ_ONLY + self.settings.extra_paths)}", "NotFoundError")  # fmt: skip

    async def _passthrough(self, request: web.Request) -> web.StreamResponse:
        engine = self._pick(list(self.upstreams)) or next(iter(self.upstreams))
        return await self._forward(request, engine, await request.read())

    async def _forward(self, request: web.Request, engine: str, data: bytes, generate: bool = False,
                       stream: bool = False) -> web.StreamResponse:  # fmt: skip
        """The request sent on to ``engine`` and its answer back; a completion relayed at the transport level (``relay.py``)."""
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in relay.HOP_BY_HOP}
        key = self.api_keys.get(engine)
        if key and routes.authenticated(request.path):  # the engine's key on paths vLLM authenticates, nowhere else
            headers["Authorization"] = f"Bearer {key}"
        if generate:
            try:
                return await relay.relay(request, self.pools[engine], headers, data, self.settings.upstream_timeout_seconds, stream)
            except (http1.Unreachable, http1.NoAnswer, asyncio.TimeoutError) as exc:
                if isinstance(exc, http1.Unreachable):
                    self.set_available(engine, False, "refused")  # until the next poll says otherwise
                return _error(502, f"the gateway got no answer from {engine}: {exc or type(exc).__name__}", "BadGatewayError")
        url = self.upstreams[engine] + request.rel_url.path_qs
        try:
            async with self._session.request(request.method, url, data=data or None, headers=headers) as up:
                passed = [(k, v) for k, v in up.headers.items() if k.lower() not in relay.HOP_BY_HOP]
                if up.content_length is not None and up.content_length <= WHOLE_BODY_BYTES:
                    # a complete answer of known size (not a stream): one write instead of a chunked stream
                    whole = web.Response(status=up.status, reason=up.reason, body=await up.read())
                    for k, v in passed:
                        whole.headers.add(k, v)
                    return whole
                response = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in passed:
                    response.headers.add(k, v)
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientConnectorError, asyncio.TimeoutError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                self.set_available(engine, False, "refused")  # until the next poll says otherwise
            return _error(502, f"the gateway could not reach {engine}: {type(exc).__name__}", "BadGatewayError")

    def _lane(self, headers: Mapping[str, str], bucket: Bucket | None) -> Lane:
        asked = headers.get(self.settings.priority_header, "").strip().lower()
        if asked in ("high", "low"):
            return asked  # type: ignore[return-value]
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer ") and auth[7:].strip() in self.settings.high_priority_keys:
            return "high"
        return "low" if bucket is not None and bucket.preemptible else "high"

    def _pool(self, engines: Sequence[str]) -> list[str]:
        return [e for e in engines if e in self.admission] or list(self.admission)

    def _pick(self, engines: Sequence[str]) -> str | None:
        """The least loaded engine of the pool that is up and not draining.

        A draining engine (guardian is restarting it) only when every engine
        that is not down drains: its queue holds the request until the
        restart ends. None when every engine of the pool is down (dead,
        loading, hung): the client hears so at once.
        """
        candidates = [e for e in self._pool(engines) if e not in self.down or self.admission[e].draining]
        if not candidates:
            return None
        open_ = [e for e in candidates if not self.admission[e].draining] or candidates
        return min(open_, key=lambda e: self.admission[e].in_flight + self.admission[e].queued)


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status, headers=headers)  # fmt: skip


def _gates_text(g: Gates) -> str:
    why = g.why().removeprefix("breaker ")
    if g.high_priority_only:
        return f"high priority only: {why}"
    if g.pause_low_priority:
        return f"low lane paused: {why}"
    if g.refuse_long_context:
        return f"long contexts refused: {why}"
    return "open"


def _too_large(limit: int) -> web.Response:
    resp = _error(413, f"The request body is larger than this gateway takes ({limit} bytes, sized for the largest "
                       "bucket's prompt; [gateway] max_body_bytes).", "RequestTooLargeError")  # fmt: skip
    resp.force_close()  # the rest of the body is never read: the connection ends with the answer
    return resp

