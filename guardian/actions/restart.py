"""A drained restart: stop admission, let in-flight requests finish, restart, wait for health, admit.

1. The new arguments are checked against vLLM's rules first: a restart that
   vLLM would refuse is never begun (nothing is stopped).
2. Admission stops at the gateway (when one is configured) and vLLM's
   ``/pause?mode=wait`` drains the engine: it answers once the requests it
   accepted are done. Without dev mode, guardian waits for running and
   waiting to reach zero instead. Either way the drain has a deadline; past
   it the restart goes on and the log says how many requests were cut.
3. The launcher starts the engine with the new arguments.
4. guardian waits for ``/health`` = 200 up to ``start_timeout`` (model load
   takes minutes). A loading engine is never killed: at the deadline the
   outcome is ``timeout`` and the engine is left to finish; an engine whose
   process exits during start ends the wait at once (``failed``).
5. Admission resumes. If the launcher failed, the old engine is resumed.

The clock and the sleep are arguments, so a five-minute model load is
tested in milliseconds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from guardian import logs
from guardian.actions.engine_args import EngineArgs, validate
from guardian.actions.gateway import Gateway
from guardian.actions.launcher import Launcher
from guardian.actions.outcome import Outcome
from guardian.actions.vllm_admin import VllmAdmin

log = logs.get("guardian.restart")

Probe = Callable[[], Awaitable[bool | None]]  # /health: True 200, False not 200 or refused, None unknown
Load = Callable[[], Awaitable[float | None]]  # running + waiting requests, None unknown


@dataclass(frozen=True)
class RestartTimeouts:
    drain_seconds: float = 120.0
    start_seconds: float = 900.0
    check_every_seconds: float = 1.0


@dataclass
class DrainedRestart:
    engine: str
    launcher: Launcher
    gateway: Gateway
    admin: VllmAdmin | None  # None: vLLM's dev endpoints are not enabled
    healthy: Probe
    load: Load
    timeouts: RestartTimeouts = RestartTimeouts()
    backend: str = "flash_attn"
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def run(self, args: EngineArgs) -> Outcome:
        problems = validate(args, self.backend)
        if problems:
            return Outcome("restart", "refused", "vLLM would refuse these arguments: " + "; ".join(problems))
        started = self.clock()
        self._logged("drain", await self.gateway.drain(self.engine, self.timeouts.drain_seconds))
        cut = await self._drain()
        launched = await self.launcher.restart(args)
        self._logged("launch", launched)
        if not launched.ok:
            if self.admin is not None:
                self._logged("resume", await self.admin.resume())
            self._logged("admit", await self.gateway.admit(self.engine))
            return Outcome("restart", "failed", f"{self.launcher.describe}: {launched.detail}")
        waited = await self._wait_healthy()
        self._logged("admit", await self.gateway.admit(self.engine))
        took = self.clock() - started
        if waited is not None:
            return waited
        suffix = f"; {cut}" if cut else ""
        return Outcome("restart", "done", f"healthy after {took:.0f}s{suffix}")

    async def _drain(self) -> str | None:
        """Wait for the engine to finish what it accepted; returns what was cut, if anything."""
        deadline = self.clock() + self.timeouts.drain_seconds
        if self.admin is not None:
            paused = await self.admin.pause("wait", timeout=self.timeouts.drain_seconds)
            self._logged("pause", paused)
            if paused.ok:
                return None
            if paused.status != "not_enabled":
                left = await self.load()
                if paused.status == "failed" and left is None:  # nothing answers: a dead engine holds no requests
                    return "the engine did not answer /pause (not running): nothing to drain"
                return f"drain did not finish ({paused.status}); {_count(left)} requests in flight were cut"
        while self.clock() < deadline:
            left = await self.load()
            if left == 0:
                return None
            await self.sleep(self.timeouts.check_every_seconds)
        left = await self.load()
        if left:
            log.warning("drain_deadline_passed", engine=self.engine, requests_in_flight=left,
                        drain_seconds=self.timeouts.drain_seconds)  # fmt: skip
            return f"the drain deadline passed with {_count(left)} requests in flight"
        return None

    async def _wait_healthy(self) -> Outcome | None:
        """None once /health answers 200; an outcome when the engine died or the start timeout passed."""
        start = self.clock()
        while True:
            if await self.healthy():
                log.info("engine_healthy_after_restart", engine=self.engine, seconds=round(self.clock() - start, 1))
                return None
            waited = self.clock() - start
            if await self.launcher.alive() is False:
                return Outcome("restart", "failed", f"the engine's process exited during start ({waited:.0f}s in)")
            if waited >= self.timeouts.start_seconds:
                return Outcome(
                    "restart", "timeout",
                    f"not healthy after {waited:.0f}s; left running (a loading engine is never killed)",
                )  # fmt: skip
            await self.sleep(self.timeouts.check_every_seconds)

    def _logged(self, step: str, outcome: Outcome) -> None:
        (log.info if outcome.ok or outcome.status == "not_configured" else log.warning)(
            "restart_step", engine=self.engine, step=step, outcome=outcome.status, detail=outcome.detail
        )


def _count(value: float | None) -> str:
    return "an unknown number of" if value is None else f"{value:.0f}"
