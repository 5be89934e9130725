from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from guardian.analysis.engine_stats import EngineTracker
from guardian.config import ProcessSection
from guardian.sample import EngineReading, ProcReading
from guardian.sources.process import ProcessSource

SLEEPER = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)  # guardian-test-tree"]


@pytest.fixture
def tree():
    proc = subprocess.Popen(SLEEPER)
    time.sleep(0.5)
    yield proc
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_pid_file_finds_the_process_and_its_children(tree: subprocess.Popen, tmp_path: Path) -> None:
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{tree.pid}\n")
    readings, error = ProcessSource(ProcessSection(pid_file=pid_file)).read()
    assert error is None
    assert len(readings) == 2 and readings[0].pid == tree.pid
    assert all(r.alive and r.rss_bytes > 0 and r.start_time > 0 for r in readings)


def test_the_numbers_read_from_proc_are_the_ones_psutil_gives(tree: subprocess.Popen, tmp_path: Path) -> None:
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{tree.pid}\n")
    readings, _ = ProcessSource(ProcessSection(pid_file=pid_file)).read()
    for reading in readings:
        proc = psutil.Process(reading.pid)
        cpu = proc.cpu_times()
        assert reading.start_time == pytest.approx(proc.create_time(), abs=0.02)  # a restart is a new start time: same clock
        assert reading.rss_bytes == pytest.approx(proc.memory_info().rss, rel=0.05)  # stat's count, statm's within pages
        assert reading.cpu_seconds == pytest.approx(cpu.user + cpu.system, abs=0.05)
        assert reading.name == proc.name() and "guardian-test-tree" in (reading.cmdline or "") or reading.pid != tree.pid


def test_a_zombie_in_the_tree_reads_as_not_alive(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(['true']); time.sleep(60)"])
    try:
        time.sleep(0.5)  # the child has exited and is not reaped: a zombie
        pid_file = tmp_path / "vllm.pid"
        pid_file.write_text(str(parent.pid))
        readings, _ = ProcessSource(ProcessSection(pid_file=pid_file)).read()
        assert [r.alive for r in readings] == [True, False]
    finally:
        parent.kill()
        parent.wait()


def test_match_finds_the_root_of_the_tree(tree: subprocess.Popen) -> None:
    readings, error = ProcessSource(ProcessSection(match="guardian-test-tree")).read()
    assert error is None and readings[0].pid == tree.pid and len(readings) == 2


def test_missing_pid_file_and_dead_pid_are_reasons_not_exceptions(tmp_path: Path) -> None:
    readings, error = ProcessSource(ProcessSection(pid_file=tmp_path / "none.pid")).read()
    assert readings is None and "No such file" in error
    (tmp_path / "dead.pid").write_text("999999999\n")
    readings, error = ProcessSource(ProcessSection(pid_file=tmp_path / "dead.pid")).read()
    assert readings is None and "is not running" in error


def test_a_missing_systemd_unit_is_a_reason(tmp_path: Path) -> None:
    readings, error = ProcessSource(ProcessSection(systemd_unit="no-such-unit-guardian.service"), tmp_path).read()
    assert readings is None and "no-such-unit-guardian.service" in error


def test_a_new_root_start_time_counts_as_a_restart() -> None:
    tracker = EngineTracker("a", 60, 3)

    def reading(start: float) -> EngineReading:
        return EngineReading(name="a", up=False, healthy=None, processes=(ProcReading(1, "vllm", True, start_time=start),))

    tracker.update(0, reading(1000.0), {})
    tracker.update(1, reading(1000.0), {})
    assert tracker.restarts == 0
    tracker.update(2, reading(1500.0), {})
    assert tracker.restarts == 1


def test_a_process_that_renames_itself_after_start_shows_its_new_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from guardian.sources import process

    renames = "import time; time.sleep(0.4); open('/proc/self/comm', 'w').write('VLLM::EngineCor'); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", renames])
    try:
        pid_file = tmp_path / "vllm.pid"
        pid_file.write_text(f"{proc.pid}\n")
        source = ProcessSource(ProcessSection(pid_file=pid_file))
        before, _ = source.read()
        time.sleep(1.0)
        monkeypatch.setattr(process, "CHILDREN_SECONDS", 0.0)  # the tree's next walk is due
        after, _ = source.read()
    finally:
        proc.kill()
        proc.wait()
    assert before is not None and after is not None
    assert before[0].name != "VLLM::EngineCor" and after[0].name == "VLLM::EngineCor"


def test_a_source_keeps_one_stat_file_per_process_and_closes_them_when_dropped(tree: subprocess.Popen, tmp_path: Path) -> None:
    import gc
    import os

    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{tree.pid}\n")
    before = len(os.listdir("/proc/self/fd"))
    source = ProcessSource(ProcessSection(pid_file=pid_file))
    for _ in range(5):
        readings, _ = source.read()
        assert readings is not None and all(r.alive for r in readings)
    assert len(os.listdir("/proc/self/fd")) == before + 2  # the root and its child, opened once, read five times
    del source
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_rewritten_pid_file_is_read_again(tree: subprocess.Popen, tmp_path: Path) -> None:
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text("999999999\n")
    source = ProcessSource(ProcessSection(pid_file=pid_file))
    assert source.read()[0] is None
    pid_file.write_text(f"{tree.pid}\n")  # the engine restarted and wrote its new pid
    readings, error = source.read()
    assert error is None and readings is not None and readings[0].pid == tree.pid
