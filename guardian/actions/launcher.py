"""How a vLLM engine is (re)started with new arguments: a systemd unit, or a child process of guardian.

A launcher only starts the new engine; waiting for it to load and become
healthy is the drained restart's job (``actions/restart.py``), which never
kills an engine that is still loading. ``alive`` lets that wait notice an
engine that died during start instead of waiting for the whole timeout.

- ``SystemdLauncher``: writes the arguments to the environment file the vLLM
  unit's ``ExecStart=… $VLLM_ARGS`` reads (atomically: a crash mid-write
  leaves the old file), then ``systemctl restart --no-block UNIT``. guardian's
  user needs the right to restart that one unit (polkit rule or sudoers line).
- ``ChildLauncher``: guardian runs ``command + argv`` itself in a new session
  (hosts without systemd). Its pid is kept in a file so a restarted guardian
  finds the engine it started instead of starting a second one.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Protocol, Sequence

import psutil

from guardian import logs
from guardian.actions.engine_args import EngineArgs, to_argv, to_env_file
from guardian.actions.outcome import Outcome
from guardian.state import atomic_write

log = logs.get("guardian.launcher")


class Launcher(Protocol):
    describe: str

    async def restart(self, args: EngineArgs) -> Outcome: ...

    async def alive(self) -> bool | None:
        """Whether the engine's process is running (or starting); None when it cannot be told."""
        ...


class SystemdLauncher:
    def __init__(
        self, unit: str, env_file: Path, variable: str = "VLLM_ARGS", systemctl: str = "systemctl", timeout: float = 30.0
    ) -> None:
        self.unit = unit
        self.env_file = env_file
        self.variable = variable
        self.systemctl = systemctl
        self.timeout = timeout
        self.describe = f"systemd unit {unit} (arguments in {env_file})"

    async def restart(self, args: EngineArgs) -> Outcome:
        try:
            atomic_write(self.env_file, to_env_file(args, self.variable).encode(), mode=0o644)
        except OSError as exc:
            return Outcome("restart", "failed", f"cannot write {self.env_file}: {exc.strerror or exc}")
        code, out = await self._systemctl("restart", "--no-block", self.unit)
        if code != 0:
            return Outcome("restart", "failed", f"systemctl restart {self.unit} exited {code}: {out}")
        return Outcome("restart", "done", f"systemctl restart {self.unit}")

    async def alive(self) -> bool | None:
        code, out = await self._systemctl("is-active", self.unit)
        state = out.strip()
        if state in ("active", "activating", "reloading"):
            return True
        if state in ("inactive", "failed", "deactivating"):
            return False
        return None

    async def _systemctl(self, *argv: str) -> tuple[int, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                self.systemctl, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as exc:
            return 127, f"cannot run {self.systemctl}: {exc.strerror or exc}"
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, f"no answer within {self.timeout:g}s"
        return proc.returncode or 0, out.decode(errors="replace").strip()[:300]


class ChildLauncher:
    def __init__(self, command: Sequence[str], pid_file: Path, stop_timeout: float = 30.0) -> None:
        self.command = list(command)
        self.pid_file = pid_file
        self.stop_timeout = stop_timeout
        self.describe = f"child process {self.command[0]} (pid in {pid_file})"
        self._proc: asyncio.subprocess.Process | None = None

    async def restart(self, args: EngineArgs) -> Outcome:
        stopped = await self._stop()
        argv = self.command + to_argv(args)
        try:
            self._proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            return Outcome("restart", "failed", f"cannot start {self.command[0]}: {exc.strerror or exc}")
        try:
            atomic_write(self.pid_file, f"{self._proc.pid}\n".encode(), mode=0o644)
        except OSError as exc:
            log.warning("pid_file_unwritable", file=str(self.pid_file), reason=exc.strerror or str(exc))
        return Outcome("restart", "done", f"{stopped}; started pid {self._proc.pid}")

    async def alive(self) -> bool | None:
        if self._proc is not None:
            return self._proc.returncode is None
        proc = self._adopted()
        return proc is not None

    def _adopted(self) -> psutil.Process | None:
        """The engine a previous guardian started, if its pid file names a live process."""
        try:
            pid = int(self.pid_file.read_text().strip())
            proc = psutil.Process(pid)
            return None if proc.status() == psutil.STATUS_ZOMBIE else proc
        except (OSError, ValueError, psutil.Error):
            return None

    async def _stop(self) -> str:
        """SIGTERM to the engine's process group, SIGKILL after ``stop_timeout``: vLLM's workers go with it."""
        if self._proc is not None and self._proc.returncode is None:
            pid = self._proc.pid
            os.killpg(pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self._proc.wait(), self.stop_timeout)
                return f"pid {pid} stopped"
            except asyncio.TimeoutError:
                os.killpg(pid, signal.SIGKILL)
                await self._proc.wait()
                return f"pid {pid} killed after {self.stop_timeout:g}s"
        adopted = self._adopted() if self._proc is None else None
        if adopted is None:
            return "no engine was running"
        try:
            os.killpg(adopted.pid, signal.SIGTERM)
            _, alive = await asyncio.to_thread(psutil.wait_procs, [adopted], self.stop_timeout)
            if alive:
                os.killpg(adopted.pid, signal.SIGKILL)
                return f"pid {adopted.pid} killed after {self.stop_timeout:g}s"
        except (ProcessLookupError, psutil.Error):
            pass
        return f"pid {adopted.pid} stopped"
