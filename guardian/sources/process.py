"""The vLLM process tree through psutil: API server, engine core(s), workers.

Finding the processes is the expensive part (``systemctl``, a scan of
``/proc``), so the roots are found once and looked for again only when one of
them is gone. A known tree's numbers (state, RSS, CPU, start time) are read
every poll from ``/proc/<pid>/stat``, kept open and read again from its start
(one system call; the kernel writes it afresh on each read, and a process
that is gone, even if its pid is reused, answers ESRCH): through psutil's
``oneshot`` they were two files opened and a dozen wrapped calls, a seventh
of a poll's CPU for 8 single-process engines (a real engine has several
processes). A pid file is read again only when its inode, size or mtime
changed. psutil still finds the processes and names them.
"""

from __future__ import annotations

import os
import subprocess
import time
import weakref
from pathlib import Path
from typing import Protocol

import psutil

from guardian.sample import ProcReading

RESCAN_SECONDS = 30.0  # how often a name match looks for new roots while the old ones live
CHILDREN_SECONDS = 10.0  # how often a live tree is walked for new children (psutil reads all of /proc)
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_BOOT_TIME = psutil.boot_time()  # start times as psutil gives them: boot time + ticks since boot


class ProcessLookup(Protocol):
    """How to find an engine's processes, exactly one of the three set (``[engines.process]`` is one)."""

    @property
    def systemd_unit(self) -> str | None: ...
    @property
    def pid_file(self) -> Path | None: ...
    @property
    def match(self) -> str | None: ...


class ProcessNotFound(RuntimeError):
    pass


class ProcessSource:
    def __init__(self, section: ProcessLookup, cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
        self._section = section
        self._cgroup_root = cgroup_root
        self._cgroup: Path | None = None
        self._roots: list[psutil.Process] = []
        self._scanned_at = 0.0
        self._tree: dict[int, psutil.Process] = {}
        self._tree_roots: list[int] = []
        self._tree_at = 0.0
        self._identity: dict[int, tuple[str, str | None]] = {}  # pid -> (name, cmdline)
        self._dirty = False
        self._stat_files: dict[int, int] = {}  # pid -> its open /proc/<pid>/stat
        self._pid_file: tuple[tuple[int, int, int], int] | None = None  # (inode, size, mtime) of the pid file, and its pid
        # closed with the source, not by a call: a reload drops it from the loop while the /proc worker may still read it
        weakref.finalize(self, _close_all, self._stat_files)

    def read(self) -> tuple[tuple[ProcReading, ...] | None, str | None]:
        """The tree's readings, or (None, reason) when no process could be found."""
        try:
            roots = self._current_roots()
        except ProcessNotFound as exc:
            return None, str(exc)
        readings = tuple(self._reading(p) for p in self._walk(roots).values())
        if not all(r.alive for r in readings):
            self._dirty = True  # someone exited: look for roots and children afresh next poll
        return readings, None

    def _current_roots(self) -> list[psutil.Process]:
        s = self._section
        stale = self._dirty or not self._roots
        if s.systemd_unit is not None:
            stale = True  # reading cgroup.procs is cheap and sees a restarted unit at once
        elif s.pid_file is not None:
            stale = stale or [self._pid_in(s.pid_file)] != [r.pid for r in self._roots]
        elif time.monotonic() - self._scanned_at > RESCAN_SECONDS:
            stale = True
        if stale:
            self._roots = self._find()
            self._scanned_at = time.monotonic()
        return self._roots

    def _walk(self, roots: list[psutil.Process]) -> dict[int, psutil.Process]:
        """Roots and their descendants; walked again only when something changed or the walk is old."""
        now = time.monotonic()
        same_roots = [r.pid for r in roots] == self._tree_roots
        if same_roots and not self._dirty and now - self._tree_at < CHILDREN_SECONDS:
            return self._tree
        tree: dict[int, psutil.Process] = {}
        for root in roots:
            tree[root.pid] = root
            try:
                for child in root.children(recursive=True):
                    tree.setdefault(child.pid, self._tree.get(child.pid, child))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self._tree, self._tree_roots, self._tree_at = tree, [r.pid for r in roots], now
        for pid in [pid for pid in self._stat_files if pid not in tree]:
            os.close(self._stat_files.pop(pid))
        self._identity = {}  # names read again with the tree: vLLM renames its processes after they start (VLLM::EngineCore)
        self._dirty = False
        return tree

    def _reading(self, proc: psutil.Process) -> ProcReading:
        try:
            state, cpu, start, rss = self._stat(proc.pid)
            ident = self._identity.get(proc.pid)
            if ident is None:
                ident = self._identity[proc.pid] = (proc.name(), " ".join(proc.cmdline())[:200] or None)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            return ProcReading(pid=proc.pid, name="?", alive=False)
        except (psutil.AccessDenied, PermissionError):
            return ProcReading(pid=proc.pid, name="?", alive=True)
        return ProcReading(pid=proc.pid, name=ident[0], alive=state != b"Z", rss_bytes=rss, cpu_seconds=cpu, start_time=start,
                           cmdline=ident[1])  # fmt: skip

    def _stat(self, pid: int) -> tuple[bytes, float, float, int]:
        """State letter, CPU seconds (user + system), start time (unix seconds) and RSS bytes of ``pid``."""
        fd = self._stat_files.get(pid)
        if fd is None:
            fd = self._stat_files[pid] = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            data = os.pread(fd, 4096, 0)
            if not data:
                raise ProcessLookupError(pid)
        except OSError:  # gone (ESRCH): the file is closed with it, and a reused pid opens its own
            os.close(self._stat_files.pop(pid))
            raise
        return _parsed_stat(data)

    def _pid_in(self, path: Path) -> int:
        """The pid in ``path``; the file read again only when it changed (a restarted engine writes a new one)."""
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ProcessNotFound(f"pid file {path}: {exc.strerror or exc}") from None
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._pid_file is None or self._pid_file[0] != seen:
            self._pid_file = (seen, _pid_from_file(path))
        return self._pid_file[1]

    def _find(self) -> list[psutil.Process]:
        s = self._section
        if s.pid_file is not None:
            return [_process(self._pid_in(s.pid_file), f"pid file {s.pid_file}")]
        if s.systemd_unit is not None:
            return self._unit_processes(s.systemd_unit)
        assert s.match is not None
        return _match(s.match)

    def _unit_processes(self, unit: str) -> list[psutil.Process]:
        if self._cgroup is None:
            self._cgroup = self._cgroup_root / _unit_cgroup(unit).lstrip("/")
        try:
            pids = [int(line) for line in (self._cgroup / "cgroup.procs").read_text().split()]
        except (OSError, ValueError) as exc:
            self._cgroup = None
            raise ProcessNotFound(f"unit {unit}: cannot read its cgroup ({exc})") from None
        procs = [p for p in (_process_or_none(pid) for pid in pids) if p is not None]
        if not procs:
            raise ProcessNotFound(f"unit {unit} has no running process")
        # keep only the tops of the tree: children are added by read()
        pidset = {p.pid for p in procs}
        return [p for p in procs if _ppid(p) not in pidset]


def _unit_cgroup(unit: str) -> str:
    try:
        out = subprocess.run(
            ["systemctl", "show", "--property=ControlGroup", "--value", unit],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except FileNotFoundError:
        raise ProcessNotFound(f"unit {unit}: systemctl is not available on this host") from None
    except (subprocess.SubprocessError, OSError) as exc:
        raise ProcessNotFound(f"unit {unit}: systemctl show failed ({exc})") from None
    if not out:
        raise ProcessNotFound(f"unit {unit} is not running (no control group)")
    return out


def _close_all(files: dict[int, int]) -> None:
    for fd in files.values():
        os.close(fd)
    files.clear()


def _parsed_stat(data: bytes) -> tuple[bytes, float, float, int]:
    fields = data[data.rindex(b")") + 2 :].split()  # after the name, which may hold spaces and parentheses: field 3 on
    return fields[0], (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[19]) / _TICKS + _BOOT_TIME, int(fields[21]) * _PAGE_BYTES


def _pid_from_file(path: Path) -> int:
    """The pid in ``path``: plain ``os`` calls, no text layer."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            text = os.read(fd, 64).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
    except OSError as exc:
        raise ProcessNotFound(f"pid file {path}: {exc.strerror or exc}") from None
    if not text.isdigit():
        raise ProcessNotFound(f"pid file {path} does not hold a pid ({text[:20]!r})")
    return int(text)


def _process(pid: int, where: str) -> psutil.Process:
    found = _process_or_none(pid)
    if found is None:
        raise ProcessNotFound(f"{where}: process {pid} is not running")
    return found


def _process_or_none(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        proc.create_time()  # pins the identity: a reused pid later reads as a different process
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _match(pattern: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "name"]):
        cmdline = " ".join(proc.info.get("cmdline") or []) or (proc.info.get("name") or "")
        if pattern in cmdline:
            found.append(proc)
    if not found:
        raise ProcessNotFound(f"no process matches {pattern!r}")
    pids = {p.pid for p in found}
    return [p for p in found if _ppid(p) not in pids]


def _ppid(proc: psutil.Process) -> int | None:
    try:
        return proc.ppid()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
