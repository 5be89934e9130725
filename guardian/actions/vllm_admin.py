"""vLLM's operational endpoints (``VLLM_SERVER_DEV_MODE=1``), each call with a timeout and an outcome.

A server started without dev mode has no such routes and answers 404; that
is reported as ``not_enabled`` with what to change, never as a failure of
guardian. Every call returns an ``Outcome`` instead of raising, so the caller
can log it and move on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import aiohttp

from guardian.actions.outcome import Outcome

NOT_ENABLED = "start vLLM with VLLM_SERVER_DEV_MODE=1 to enable this action"


class VllmAdmin:
    def __init__(self, url: str, session: aiohttp.ClientSession, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._session = session
        self._timeout = timeout

    async def reset_prefix_cache(self) -> Outcome:
        """Free cached prefix blocks of finished requests; running requests keep theirs."""
        out = await self._call("POST", "/reset_prefix_cache", "reset_prefix_cache",
                               params={"reset_running_requests": "false", "reset_external": "false"})  # fmt: skip
        if out.ok and isinstance(out.body, dict) and out.body.get("success") is False:
            return Outcome(out.action, "refused", "vLLM answered success=false (requests may hold the blocks)", out.body)
        return out

    async def pause(self, mode: Literal["abort", "wait", "keep"], timeout: float | None = None) -> Outcome:
        """``wait`` drains: it answers once in-flight requests are done, so give it the drain deadline."""
        return await self._call("POST", "/pause", f"pause({mode})", params={"mode": mode}, timeout=timeout)

    async def resume(self) -> Outcome:
        return await self._call("POST", "/resume", "resume")

    async def is_paused(self) -> Outcome:
        return await self._call("GET", "/is_paused", "is_paused")

    async def _call(
        self, method: str, path: str, action: str, params: dict[str, str] | None = None, timeout: float | None = None
    ) -> Outcome:
        limit = aiohttp.ClientTimeout(total=timeout or self._timeout)
        try:
            async with self._session.request(method, self.url + path, params=params, timeout=limit) as resp:
                text = await resp.text()
                if resp.status == 404:
                    return Outcome(action, "not_enabled", NOT_ENABLED)
                if resp.status != 200:
                    return Outcome(action, "refused", f"HTTP {resp.status}: {text[:200]}")
                try:
                    body: Any = await resp.json(content_type=None) if text else None
                except ValueError:
                    body = text
                return Outcome(action, "done", f"HTTP {resp.status}", body)
        except asyncio.TimeoutError:
            return Outcome(action, "timeout", f"no answer within {limit.total:g}s")
        except (aiohttp.ClientError, OSError) as exc:
            return Outcome(action, "failed", f"{type(exc).__name__}: {exc}")
