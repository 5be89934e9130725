"""The drained restart on a fake clock, and the two real launchers (systemd through a stand-in systemctl, a child process)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from guardian.actions.gateway import NoGateway
from guardian.actions.launcher import ChildLauncher, SystemdLauncher
from guardian.actions.outcome import Outcome
from guardian.actions.restart import DrainedRestart, RestartTimeouts
from tests.helpers import free_port


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class FakeLauncher:
    describe = "fake"

    def __init__(self, clock: FakeClock, fails: bool = False, dies_at: float | None = None) -> None:
        self.clock = clock
        self.fails = fails
        self.dies_at = dies_at
        self.restarts: list[tuple[float, dict[str, Any]]] = []

    async def restart(self, args: dict[str, Any]) -> Outcome:
        self.restarts.append((self.clock.now, dict(args)))
        return Outcome("restart", "failed" if self.fails else "done", "fake")

    async def alive(self) -> bool | None:
        return self.dies_at is None or self.clock.now < self.dies_at


class FakeAdmin:
    def __init__(self, pause: str = "done") -> None:
        self.calls: list[str] = []
        self._pause = pause

    async def pause(self, mode: str, timeout: float | None = None) -> Outcome:
        self.calls.append(f"pause({mode})")
        return Outcome(f"pause({mode})", self._pause, "fake")  # type: ignore[arg-type]

    async def resume(self) -> Outcome:
        self.calls.append("resume")
        return Outcome("resume", "done", "fake")


def procedure(clock: FakeClock, launcher: FakeLauncher, healthy_from: float, admin: Any = None,
              load: list[float] | None = None, **timeouts: float) -> DrainedRestart:  # fmt: skip
    async def healthy() -> bool | None:
        return bool(launcher.restarts) and clock.now >= healthy_from

    loads = list(load or [0.0])

    async def in_flight() -> float | None:
        return loads.pop(0) if len(loads) > 1 else loads[0]

    return DrainedRestart("e", launcher, NoGateway(), admin, healthy, in_flight, RestartTimeouts(**timeouts),
                          clock=clock, sleep=clock.sleep)  # fmt: skip


async def test_an_engine_that_takes_five_minutes_to_load_is_waited_for_not_killed() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock)
    admin = FakeAdmin()
    outcome = await procedure(clock, launcher, healthy_from=300.0, admin=admin, start_seconds=900.0).run({"max-num-seqs": 8})
    assert outcome.status == "done" and outcome.detail.startswith("healthy after 300s")
    assert len(launcher.restarts) == 1 and launcher.restarts[0][1] == {"max-num-seqs": 8}
    assert admin.calls == ["pause(wait)"]  # drained first; a fresh engine needs no resume


async def test_past_the_start_timeout_a_loading_engine_is_left_running() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock)
    outcome = await procedure(clock, launcher, healthy_from=10_000.0, start_seconds=600.0).run({})
    assert outcome.status == "timeout" and "never killed" in outcome.detail
    assert len(launcher.restarts) == 1 and 600 <= clock.now < 610


async def test_an_engine_that_exits_during_start_fails_at_once() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock, dies_at=30.0)
    outcome = await procedure(clock, launcher, healthy_from=10_000.0, start_seconds=900.0).run({})
    assert outcome.status == "failed" and "exited during start" in outcome.detail and clock.now < 35


async def test_arguments_vllm_would_refuse_stop_nothing() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock)
    admin = FakeAdmin()
    outcome = await procedure(clock, launcher, healthy_from=0.0, admin=admin).run({"block-size": 24})
    assert outcome.status == "refused" and "--block-size 24" in outcome.detail
    assert launcher.restarts == [] and admin.calls == []


async def test_without_dev_mode_the_drain_waits_for_the_engine_to_go_idle() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock)
    outcome = await procedure(clock, launcher, healthy_from=0.0, load=[5, 3, 1, 0]).run({})
    assert outcome.status == "done" and "cut" not in outcome.detail
    assert launcher.restarts[0][0] == 3.0  # restarted once the engine held no request


async def test_a_drain_past_its_deadline_restarts_anyway_and_says_what_was_cut() -> None:
    clock = FakeClock()
    launcher = FakeLauncher(clock)
    outcome = await procedure(clock, launcher, healthy_from=0.0, load=[7], drain_seconds=30.0).run({})
    assert outcome.status == "done" and "deadline passed with 7 requests in flight" in outcome.detail
    assert launcher.restarts[0][0] == 30.0


async def test_a_launcher_that_fails_resumes_the_old_engine() -> None:
    clock = FakeClock()
    admin = FakeAdmin()
    outcome = await procedure(clock, FakeLauncher(clock, fails=True), healthy_from=0.0, admin=admin).run({})
    assert outcome.status == "failed" and admin.calls == ["pause(wait)", "resume"]


# -- the real launchers -------------------------------------------------------------------------


def _fake_systemctl(tmp_path: Path, state: str = "active") -> tuple[str, Path]:
    calls = tmp_path / "calls"
    script = tmp_path / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = is-active ] && echo {state}\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), calls


async def test_systemd_launcher_writes_the_env_file_then_restarts_the_unit(tmp_path: Path) -> None:
    systemctl, calls = _fake_systemctl(tmp_path)
    env = tmp_path / "etc" / "vllm.env"
    launcher = SystemdLauncher("vllm.service", env, systemctl=systemctl)
    outcome = await launcher.restart({"max-num-seqs": 32, "speculative-config": {"method": "ngram", "num_speculative_tokens": 3}})
    assert outcome.ok, outcome.detail
    assert calls.read_text().splitlines() == ["restart --no-block vllm.service"]
    line = env.read_text().splitlines()[-1]
    assert line == 'VLLM_ARGS="--max-num-seqs 32 --speculative-config {\\"method\\":\\"ngram\\",\\"num_speculative_tokens\\":3}"'
    assert stat.S_IMODE(env.stat().st_mode) == 0o644 and await launcher.alive() is True


async def test_systemd_launcher_reports_a_failed_unit_and_a_missing_systemctl(tmp_path: Path) -> None:
    systemctl, _ = _fake_systemctl(tmp_path, state="failed")
    assert await SystemdLauncher("vllm.service", tmp_path / "a.env", systemctl=systemctl).alive() is False
    missing = SystemdLauncher("vllm.service", tmp_path / "a.env", systemctl=str(tmp_path / "nope"))
    outcome = await missing.restart({})
    assert outcome.status == "failed" and "cannot run" in outcome.detail


async def test_child_launcher_stops_the_old_engine_and_starts_the_new_one_with_the_arguments(tmp_path: Path) -> None:
    out = tmp_path / "argv"
    program = f"import sys, time; open({str(out)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n'); time.sleep(60)"
    launcher = ChildLauncher([sys.executable, "-c", program], tmp_path / "e.pid", stop_timeout=5)
    assert await launcher.alive() is False
    first = await launcher.restart({"max-num-seqs": 8})
    pid1 = _identity(tmp_path / "e.pid")["pid"]
    await _lines(out, 1)
    second = await launcher.restart({"max-num-seqs": 4, "enforce-eager": True})
    pid2 = _identity(tmp_path / "e.pid")["pid"]
    try:
        assert first.ok and second.ok and f"pid {pid1}'s group stopped" in second.detail and pid1 != pid2
        assert not psutil.pid_exists(pid1) or psutil.Process(pid1).status() == psutil.STATUS_ZOMBIE
        assert await launcher.alive() is True
        assert await _lines(out, 2) == ["--max-num-seqs 8", "--enforce-eager --max-num-seqs 4"]
        # a restarted guardian finds the engine it started through its identity (pid, start time, command line)
        assert await ChildLauncher([sys.executable], tmp_path / "e.pid").alive() is True
    finally:
        os.killpg(pid2, 9)


def _identity(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())  # type: ignore[no-any-return]


# vLLM's shape: the API server starts its engine core in the same process group; kill -9 of the
# server leaves the engine core running (and, on a GPU, holding the memory)
SERVER_WITH_ENGINE_CORE = (
    "import subprocess, sys, time; "
    "core = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
    "open(sys.argv[1], 'w').write(str(core.pid)); time.sleep(120)"
)


async def test_a_restart_after_kill_9_of_the_server_stops_its_orphaned_engine_core(tmp_path: Path) -> None:
    core_file = tmp_path / "core.pid"
    launcher = ChildLauncher([sys.executable, "-c", SERVER_WITH_ENGINE_CORE, str(core_file)], tmp_path / "e.pid", stop_timeout=5)
    await launcher.restart({})
    server = _identity(tmp_path / "e.pid")["pid"]
    deadline = time.monotonic() + 30
    while not (core_file.exists() and core_file.read_text()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    core = int(core_file.read_text())
    os.kill(server, signal.SIGKILL)
    while await launcher.alive() is not False and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert psutil.Process(core).is_running()  # the orphan lives on
    # a guardian started now finds the orphan through the identity file, and its start stops it
    later = ChildLauncher(launcher.command, tmp_path / "e.pid", stop_timeout=5)
    assert await later.alive() is False and later.identity() is not None
    outcome = await later.restart({})
    try:
        assert outcome.ok and "2 processes" not in outcome.detail and "group stopped" in outcome.detail
        assert not psutil.pid_exists(core) or psutil.Process(core).status() == psutil.STATUS_ZOMBIE
    finally:
        os.killpg(_identity(tmp_path / "e.pid")["pid"], signal.SIGKILL)


async def test_an_identity_file_naming_another_process_is_not_adopted_and_that_process_is_never_signalled(tmp_path: Path) -> None:
    # after a reboot the pid now belongs to an unrelated program: same pid, other start time and command line
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        ident = tmp_path / "e.pid"
        ident.write_text(json.dumps({"pid": bystander.pid, "started": 1000.0, "argv": ["/opt/vllm/bin/vllm", "serve"]}))
        launcher = ChildLauncher(["/opt/vllm/bin/vllm", "serve"], ident, stop_timeout=1)
        assert await launcher.alive() is False and launcher.identity() is None
        assert (await launcher.restart({})).status == "failed"  # no such program here; nothing was stopped
        ident.write_text(f"{bystander.pid}\n")  # the old plain pid file: unverifiable, not adopted either
        assert ChildLauncher(["/opt/vllm/bin/vllm"], ident).identity() is None
        assert bystander.poll() is None  # never signalled
    finally:
        bystander.kill()
        bystander.wait()


async def test_with_no_identity_kept_the_engines_port_says_whether_to_adopt_or_to_keep_out(tmp_path: Path) -> None:
    port = free_port()
    serve = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"
    command = [sys.executable, "-c", serve]
    engine = subprocess.Popen(command, start_new_session=True)
    try:
        await _listening(port)
        unwritable = tmp_path / "no-such-dir" / "e.pid"  # the identity could not be kept
        launcher = ChildLauncher(command, unwritable, port=port)
        found = launcher.adopt_listener()
        assert found is not None and found.ok and f"pid {engine.pid}" in found.detail
        assert await launcher.alive() is True
        stranger = ChildLauncher([sys.executable, "-m", "vllm"], tmp_path / "s.pid", port=port)
        refused = stranger.adopt_listener()
        assert refused is not None and refused.status == "refused" and "not touching it" in refused.detail
        assert engine.poll() is None
        assert ChildLauncher(command, tmp_path / "t.pid", port=free_port()).adopt_listener() is None  # a free port: start
    finally:
        engine.kill()
        engine.wait()


async def _listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)


async def _lines(path: Path, n: int) -> list[str]:
    deadline = time.monotonic() + 30  # a loaded machine starts Python slowly
    while not (path.exists() and len(path.read_text().splitlines()) >= n) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return path.read_text().splitlines()


async def test_child_launcher_sees_an_engine_that_died(tmp_path: Path) -> None:
    launcher = ChildLauncher([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "e.pid")
    await launcher.restart({})
    deadline = time.monotonic() + 30
    while await launcher.alive() is not False and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await launcher.alive() is False


async def test_the_child_engines_output_goes_to_its_own_log_not_guardians(tmp_path: Path, capfd: Any) -> None:
    program = "import sys; print('INFO vllm says hello'); print('WARNING and this', file=sys.stderr)"
    launcher = ChildLauncher([sys.executable, "-c", program], tmp_path / "e.pid")
    await launcher.restart({})
    deadline = time.monotonic() + 30
    while await launcher.alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    out, err = capfd.readouterr()
    assert "vllm says hello" not in out + err
    assert launcher.log_file == tmp_path / "e.log"
    assert launcher.log_file.read_text().splitlines() == ["INFO vllm says hello", "WARNING and this"]


def test_a_new_start_time_of_the_launchers_engine_counts_as_a_restart() -> None:
    from guardian.analysis.engine_stats import EngineTracker
    from guardian.sample import EngineReading

    tracker = EngineTracker("e", 60.0, 3)
    seen = [tracker.update(t, EngineReading("e", up=False, healthy=None, process_alive=True, process_started=started), {})
            for t, started in ((0.0, 1000.0), (1.0, 1000.0), (2.0, 1500.0), (3.0, 1500.0))]  # fmt: skip
    assert [s.restarts_total for s in seen] == [0, 0, 1, 1]
