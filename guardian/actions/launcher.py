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
  (hosts without systemd) and owns that session's process group.

What a real ``vllm serve`` does shapes the child launcher. ``kill -9`` of its
API server leaves the engine core and workers running (renamed
``VLLM::EngineCore``, ``VLLM::Worker``) in the same group, holding the GPU:
a restart stops every member of the group, not only the process it started.
Pids are reused (after a reboot, or a long uptime), so the engine is known by
its identity, pid *and* start time *and* command line, kept in a JSON file:
a pid file that names another process is never adopted, and that process is
never signalled. When no identity could be kept (a full disk), the engine's
port tells: a process listening there with the engine's command is adopted,
anything else there stops guardian from starting a second engine beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, Sequence

import psutil

from guardian import logs
from guardian.actions.engine_args import EngineArgs, to_argv, to_env_file
from guardian.actions.outcome import Outcome
from guardian.state import atomic_write

log = logs.get("guardian.launcher")

LOG_KEEP_BYTES = 64 * 2**20  # a child engine's log is rotated (one old file kept) at a start once past this


@dataclass(frozen=True)
class ProcessStatus:
    """The engine's main process as its launcher knows it: the lifecycle's process inputs."""

    alive: bool
    started: float | None  # unix seconds


class Launcher(Protocol):
    describe: str

    async def restart(self, args: EngineArgs) -> Outcome: ...

    async def alive(self) -> bool | None:
        """Whether the engine's process is running (or starting); None when it cannot be told."""
        ...

    def status(self) -> ProcessStatus | None:
        """Cheap, every poll: the engine's process, or None when this launcher cannot tell (ask the process tree)."""
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

    def status(self) -> ProcessStatus | None:
        return None  # systemctl per poll is too dear: [engines.process] systemd_unit reads the unit's cgroup instead

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


@dataclass(frozen=True)
class Identity:
    """One process, beyond doubt: a pid alone may since have been given to another program."""

    pid: int
    started: float  # psutil create_time
    argv: tuple[str, ...]

    def matches(self, proc: psutil.Process) -> bool:
        """Same start time, and the same command line where one can be read (a dying process's reads empty)."""
        try:
            argv = tuple(proc.cmdline())
            return abs(proc.create_time() - self.started) < 0.05 and argv in (self.argv, ())
        except psutil.Error:
            return False

    def members(self) -> list[psutil.Process]:
        """Every live process of the group it leads, the leader's orphans included (none started before it).

        Linux gives a pid out again only once no process group is known by
        it: a live process with the leader's pid that is not the leader means
        the group is gone and that pid is someone else's.
        """
        try:
            leader = psutil.Process(self.pid)
            if leader.status() != psutil.STATUS_ZOMBIE and not self.matches(leader):
                return []
        except psutil.Error:
            pass  # the leader is gone (or a zombie); its group may live on
        out = []
        for proc in psutil.process_iter(["create_time"]):
            try:
                if os.getpgid(proc.pid) == self.pid and proc.info["create_time"] >= self.started - 0.05:
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        out.append(proc)
            except (OSError, psutil.Error):
                continue
        return out


class ChildLauncher:
    def __init__(self, command: Sequence[str], pid_file: Path, stop_timeout: float = 30.0, port: int | None = None) -> None:
        self.command = list(command)
        self.pid_file = pid_file
        self.stop_timeout = stop_timeout
        self.port = port  # the engine's: to find an engine whose identity could not be kept
        self.describe = f"child process {self.command[0]} (identity in {pid_file}, output in {pid_file.with_suffix('.log')})"
        self._proc: asyncio.subprocess.Process | None = None  # kept so the child is reaped
        self._identity: Identity | None = None
        self._loaded = False

    async def restart(self, args: EngineArgs) -> Outcome:
        stopped = await self._stop()
        argv = self.command + to_argv(args)
        try:
            output = self._output()
        except OSError as exc:
            return Outcome("restart", "failed", f"cannot open {self.log_file}: {exc.strerror or exc}")
        try:
            with output:  # the child keeps its own descriptor
                self._proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=output,
                                                                  stderr=asyncio.subprocess.STDOUT, start_new_session=True)  # fmt: skip
        except OSError as exc:
            return Outcome("restart", "failed", f"cannot start {self.command[0]}: {exc.strerror or exc}")
        try:  # as the kernel tells it after exec: a script's interpreter comes first
            proc = psutil.Process(self._proc.pid)
            started, seen = proc.create_time(), tuple(proc.cmdline()) or tuple(argv)
        except psutil.Error:
            started, seen = 0.0, tuple(argv)  # exited already: the start wait sees it
        self._identity = Identity(self._proc.pid, started, seen)
        self._save()
        return Outcome("restart", "done", f"{stopped}; started pid {self._proc.pid}")

    @property
    def log_file(self) -> Path:
        """vLLM's own output, beside its identity file: not mixed into guardian's JSON log (nor held on a caller's pipe)."""
        return self.pid_file.with_suffix(".log")

    def _output(self) -> BinaryIO:
        """The engine's log, appended; the previous one kept as ``.log.1`` once it passes LOG_KEEP_BYTES."""
        try:
            if self.log_file.stat().st_size > LOG_KEEP_BYTES:
                os.replace(self.log_file, self.log_file.with_suffix(".log.1"))
        except FileNotFoundError:
            pass
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        return self.log_file.open("ab")

    def status(self) -> ProcessStatus | None:
        ident = self.identity()
        if ident is None:
            return ProcessStatus(False, None)
        try:
            proc = psutil.Process(ident.pid)
            alive = ident.matches(proc) and proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.Error:
            alive = False
        return ProcessStatus(alive, ident.started)

    async def alive(self) -> bool | None:
        status = self.status()
        return status.alive if status else None

    def identity(self) -> Identity | None:
        """The engine this launcher owns: started by this guardian, or by an earlier one and proven to be it."""
        if not self._loaded:
            self._loaded = True
            self._identity = self._identity or self._adopt()
        return self._identity

    def adopt_listener(self) -> Outcome | None:
        """No engine of ours is known: if something listens on the engine's port, adopt it when it is ours, else refuse.

        None: the port is free (start an engine). An outcome: do not start one.
        """
        if self.port is None:
            return None
        pid = _listener(self.port)
        if pid is None:
            return None
        try:
            proc = psutil.Process(pid)
            leader = psutil.Process(os.getpgid(pid))
            argv = tuple(leader.cmdline())
            ours = runs(argv, self.command)
            started = leader.create_time()
        except (OSError, psutil.Error):
            return Outcome("start", "refused", f"port {self.port} is taken by pid {pid}, which guardian cannot inspect")
        if not ours:
            return Outcome("start", "refused", f"port {self.port} is taken by pid {pid} ({proc.name()}), not an engine "
                                               f"started with {self.command[0]}: not starting a second engine, not touching it")  # fmt: skip
        self._identity = Identity(leader.pid, started, argv)
        self._save()
        return Outcome("start", "done", f"adopted the engine already listening on port {self.port} (pid {leader.pid})")

    def _adopt(self) -> Identity | None:
        """The identity an earlier guardian kept, if it still names that engine or its orphans."""
        try:
            doc = json.loads(self.pid_file.read_text())
            ident = Identity(int(doc["pid"]), float(doc["started"]), tuple(str(a) for a in doc["argv"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("engine_identity_unusable", file=str(self.pid_file), reason=str(exc),
                        detail="not adopting anything it names")  # fmt: skip
            return None
        try:
            proc = psutil.Process(ident.pid)
            proc = None if proc.status() == psutil.STATUS_ZOMBIE else proc
        except psutil.Error:
            proc = None
        if proc is not None and ident.matches(proc):
            log.info("engine_adopted", pid=ident.pid, file=str(self.pid_file))
            return ident
        orphans = ident.members()
        if orphans:
            log.warning("engine_orphans_found", pid=ident.pid, orphans=[p.pid for p in orphans],
                        detail="the engine's server is gone but processes of its group live on; a start stops them")  # fmt: skip
            return ident
        if proc is not None and proc.is_running():
            log.warning("engine_identity_stale", pid=ident.pid, file=str(self.pid_file),
                        detail="that pid now belongs to another process: not adopted, never signalled")  # fmt: skip
        return None

    def _save(self) -> None:
        ident = self._identity
        assert ident is not None
        doc = {"pid": ident.pid, "started": ident.started, "argv": list(ident.argv)}
        try:
            atomic_write(self.pid_file, json.dumps(doc).encode() + b"\n", mode=0o644)
        except OSError as exc:
            log.error("engine_identity_unwritable", file=str(self.pid_file), reason=exc.strerror or str(exc),
                      detail="a guardian started later finds this engine by its port instead")  # fmt: skip

    async def _stop(self) -> str:
        """SIGTERM to every member of the engine's group, SIGKILL after ``stop_timeout``: orphans of a dead server too."""
        ident = self.identity()
        members = ident.members() if ident is not None else []
        if ident is None or not members:
            return "no engine was running"
        for proc in members:
            _signal(proc, signal.SIGTERM)
        _, alive = await asyncio.to_thread(psutil.wait_procs, members, self.stop_timeout)
        for proc in alive:
            _signal(proc, signal.SIGKILL)
        if alive:
            await asyncio.to_thread(psutil.wait_procs, alive, 5.0)
        if self._proc is not None and self._proc.pid == ident.pid:
            await self._proc.wait()
        what = f"{len(members)} processes of pid {ident.pid}'s group"
        return f"{what} killed after {self.stop_timeout:g}s" if alive else f"{what} stopped"


def runs(cmdline: Sequence[str], command: Sequence[str]) -> bool:
    """Whether a process's command line is ``command`` (and its arguments), perhaps behind a script's interpreter."""
    n = len(command)
    return any(list(cmdline[i : i + n]) == list(command) for i in (0, 1))


def _signal(proc: psutil.Process, sig: signal.Signals) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def _listener(port: int) -> int | None:
    """The pid listening on a loopback TCP port, if this user may see it."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return next((c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid), None)
