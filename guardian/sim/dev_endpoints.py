"""vLLM's dev endpoints on the simulated server (``VLLM_SERVER_DEV_MODE=1``): pause, resume, sleep, reset, info.

They exist only in dev mode, as on a real server: without it they are 404,
which is how guardian tells "not enabled" from "failed".
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from guardian.sim.openai_bodies import error

if TYPE_CHECKING:
    from guardian.sim.server import SimServer

VLLM_VERSION = "0.33.0"


class DevEndpoints:
    def __init__(self, server: SimServer) -> None:
        self.server = server

    def add_to(self, r: web.UrlDispatcher) -> None:
        r.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        r.add_post("/pause", self._pause)
        r.add_post("/resume", self._resume)
        r.add_get("/is_paused", self._is_paused)
        r.add_post("/sleep", self._sleep)
        r.add_post("/wake_up", self._wake_up)
        r.add_get("/is_sleeping", self._is_sleeping)
        r.add_get("/server_info", self._server_info)
        r.add_post("/release_kv_cache_memory", self._release_kv_cache_memory)

    async def _reset_prefix_cache(self, _: web.Request) -> web.Response:
        return web.json_response({"success": self.server.engine.reset_prefix_cache()})

    async def _pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return error(400, f"mode must be abort, wait or keep, not {mode!r}", "BadRequestError")
        self.server.engine.pause(mode)  # type: ignore[arg-type]
        self.server.resumed.clear()
        if mode == "wait":  # drains: answers once every request it accepted is done
            while self.server.engine.running or self.server.engine.waiting:
                await asyncio.sleep(0.01)
        return web.json_response({"status": "paused"})

    async def _is_paused(self, _: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.server.engine.paused is not None})

    async def _is_sleeping(self, _: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.server.engine.sleep_level > 0})

    async def _resume(self, _: web.Request) -> web.Response:
        self.server.engine.resume()
        self.server.resumed.set()
        self.server.wake.set()
        return web.json_response({"status": "resumed"})

    async def _sleep(self, request: web.Request) -> web.Response:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            level = -1
        if level not in (0, 1, 2):
            return error(400, "level must be 0, 1 or 2", "BadRequestError")
        self.server.engine.sleep(level)
        return web.Response(status=200)

    async def _wake_up(self, _: web.Request) -> web.Response:
        self.server.engine.wake_up()
        return web.Response(status=200)

    async def _release_kv_cache_memory(self, _: web.Request) -> web.Response:
        if self.server.engine.running or self.server.engine.waiting:
            return error(400, "Cannot release KV cache memory while requests are in flight.", "BadRequestError")
        self.server.engine.sleep(2)  # the pool is dropped as by sleep level 2; /wake_up brings it back
        return web.json_response({"success": True})

    async def _server_info(self, _: web.Request) -> web.Response:
        p = self.server.engine.params
        return web.json_response(
            {"vllm_version": VLLM_VERSION, "vllm_config": {"model": p.model_name, "max_num_seqs": p.max_num_seqs,
             "block_size": p.block_size, "gpu_memory_utilization": p.gpu_memory_utilization,
             "max_model_len": p.max_model_len, "num_gpu_blocks": p.num_gpu_blocks}}  # fmt: skip
        )
