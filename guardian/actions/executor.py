"""Carries out the policy's actions: each behind its interface, with a timeout and a logged outcome.

Actions run as tasks so the poll never waits for them (a drained restart
takes minutes); one restart per engine at a time. Every outcome is logged
(``action_outcome``) and counted; a restart's outcome is also handed back to
the policy at the first poll that starts after it finished, which is how the
policy knows to stop holding the level.

``dry_run`` decides and logs every action (``action_planned``) without doing
any of it; restarts count as finished at once, so the policy goes on as it
would after a quick, successful restart.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from guardian import logs
from guardian.actions.engine_args import EngineArgs, Value, diff, overlay
from guardian.actions.gateway import Gates, Gateway
from guardian.actions.launcher import Launcher
from guardian.actions.outcome import Outcome
from guardian.actions.restart import DrainedRestart, Load, Probe, RestartTimeouts
from guardian.actions.vllm_admin import VllmAdmin
from guardian.policy.response import Action

log = logs.get("guardian.actions")


@dataclass
class EngineActuators:
    """What guardian can do to one engine."""

    name: str
    healthy: Probe
    load: Load
    admin: VllmAdmin | None = None  # None: dev mode is off, vLLM has no such endpoints
    launcher: Launcher | None = None  # None: no [engines.restart] configured
    base_args: EngineArgs = field(default_factory=dict)
    backend: str = "flash_attn"


class Executor:
    def __init__(
        self,
        engines: Mapping[str, EngineActuators],
        gateway: Gateway,
        notify: Callable[[Action], Outcome],
        degraded: Mapping[str, Value | None],
        timeouts: RestartTimeouts,
        dry_run: bool = False,
        on_outcome: Callable[[Action, Outcome], None] = lambda a, o: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engines = dict(engines)
        self.gateway = gateway
        self.notify = notify
        self.degraded = dict(degraded)
        self.timeouts = timeouts
        self.dry_run = dry_run
        self._on_outcome = on_outcome
        self._clock = clock
        self._applied: dict[str, EngineArgs] = {}
        self._restarts: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished: dict[str, tuple[bool, float]] = {}

    def args_for(self, engine: str, details: Mapping[str, Any]) -> EngineArgs:
        """The engine's arguments for a restart: base + the tuner's + the degraded profile + a lowered utilisation."""
        act = self.engines[engine]
        layers: list[Mapping[str, Value | None]] = [details.get("tuned") or {}]
        if details.get("profile") == "degraded":
            layers.append(self.degraded)
        if details.get("gpu_memory_utilization") is not None:
            layers.append({"gpu-memory-utilization": details["gpu_memory_utilization"]})
        return overlay(act.base_args, *layers)

    def assume_applied(self, engine: str, details: Mapping[str, Any]) -> None:
        """What the running engine was started with, as far as guardian knows (for the diff of the next restart)."""
        self._applied[engine] = self.args_for(engine, details)

    def submit(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if action.engine not in self.engines:
                continue  # the engine left the config since the decision
            if self.dry_run:
                self._dry(action)
            elif action.kind == "restart":
                if action.engine in self._restarts:
                    self._report(action, Outcome("restart", "refused", "a restart of this engine is still running"))
                    continue
                task = asyncio.create_task(self._restart(action))
                self._restarts[action.engine] = task
                task.add_done_callback(lambda _, name=action.engine: self._restarts.pop(name, None))  # type: ignore[misc]
            elif action.kind == "notify":
                self._report(action, self.notify(action))  # into the alert lifecycle: no I/O beyond its state file
            else:
                self._spawn(self._quick(action))

    def finished(self, before: float) -> dict[str, bool]:
        """Restart outcomes that came in before ``before`` (a poll's start), each handed over once."""
        done = {name: ok for name, (ok, at) in self._finished.items() if at < before}
        for name in done:
            del self._finished[name]
        return done

    @property
    def restarting(self) -> list[str]:
        return sorted(self._restarts)

    async def close(self) -> None:
        """Stop waiting on actions; an engine being restarted is left to its launcher, never killed here."""
        tasks = list(self._tasks) + list(self._restarts.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- the actions ----------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _quick(self, action: Action) -> None:
        act = self.engines[action.engine]
        if action.kind == "gates":
            outcome = await self.gateway.set_gates(action.engine, Gates.for_level(action.level, action.reason, action.details.get("shut")))
        elif action.kind == "tune":
            outcome = await self.gateway.set_cap(action.engine, int(action.details.get("cap", action.details["batch"])))
        else:
            outcome = (
                await act.admin.reset_prefix_cache()
                if act.admin is not None
                else Outcome("reset_prefix_cache", "not_enabled", "dev_mode is off for this engine (set it when vLLM runs with VLLM_SERVER_DEV_MODE=1)")
            )  # fmt: skip
        self._report(action, outcome)

    async def _restart(self, action: Action) -> None:
        act = self.engines[action.engine]
        args = self.args_for(action.engine, action.details)
        if act.launcher is None:
            outcome = Outcome("restart", "not_configured", "no [engines.restart] for this engine: guardian cannot restart it")
        else:
            log.info(
                "restart_begun", engine=action.engine, why=action.reason, launcher=act.launcher.describe,
                changes=diff(self._applied.get(action.engine, act.base_args), args) or ["(none)"],
            )  # fmt: skip
            procedure = DrainedRestart(
                action.engine, act.launcher, self.gateway, act.admin, act.healthy, act.load, self.timeouts, act.backend,
                clock=self._clock,
            )  # fmt: skip
            try:
                outcome = await procedure.run(args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an actuator bug must not leave the policy waiting forever
                log.exception("restart_crashed", engine=action.engine)
                outcome = Outcome("restart", "failed", f"{type(exc).__name__}: {exc}")
            if outcome.status in ("done", "timeout"):
                self._applied[action.engine] = args  # started with them, loaded or not
        self._finished[action.engine] = (outcome.ok, self._clock())
        self._report(action, outcome)

    def _dry(self, action: Action) -> None:
        fields: dict[str, Any] = {}
        if action.kind == "restart":
            args = self.args_for(action.engine, action.details)
            fields["changes"] = diff(self._applied.get(action.engine, self.engines[action.engine].base_args), args)
            self._applied[action.engine] = args
            self._finished[action.engine] = (True, self._clock())
        log.warning("action_planned", dry_run=True, engine=action.engine, kind=action.kind, breaker_level=action.level,
                    reason=action.reason, **action.details, **fields)  # fmt: skip
        self._on_outcome(action, Outcome(action.kind, "dry_run", "not carried out (--dry-run)"))

    def _report(self, action: Action, outcome: Outcome) -> None:
        emit = log.info if outcome.ok or outcome.status in ("not_configured", "not_enabled") else log.warning
        emit("action_outcome", engine=action.engine, kind=action.kind, breaker_level=action.level, reason=action.reason,
              outcome=outcome.status, detail=outcome.detail)  # fmt: skip
        self._on_outcome(action, outcome)

