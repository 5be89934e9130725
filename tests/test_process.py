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
from guardian.sources import process
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
        boot = psutil.boot_time()  # read again, and before the Process (which computes its start time at once)
        proc = psutil.Process(reading.pid)
        cpu = proc.cpu_times()
        # a restart is a new start time: the same ticks since boot as psutil's (each adds the boot time read from
        # the wall clock when it was asked: a clock stepped by NTP since guardian started moves psutil's, not ours)
        since_boot = proc.create_time() - boot
        assert reading.start_time - process._BOOT_TIME == pytest.approx(since_boot, abs=0.02)
        assert reading.rss_bytes == pytest.approx(proc.memory_info().rss, rel=0.05)  # stat's count, statm's within pages
        assert reading.cpu_seconds == pytest.approx(cpu.user + cpu.system, abs=0.05)
        assert reading.name == proc.name() and "guardian-test-tree" in (reading.cmdline or "") or reading.pid != tree.pid


def test_a_zombie_in_the_tree_reads_as_not_alive(tmp_path: Path) -> None:
    # the parent forks a child that exits at once and never waits for it. Not subprocess.Popen(['true']): the
    # Popen object's finaliser reaps a child that has already exited, so on a loaded machine there was no zombie
    parent = subprocess.Popen([sys.executable, "-c", "import os, time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(60)"])
    try:
        # the child has exited and is not reaped: a zombie (waited for, not slept on: a loaded machine starts the
        # parent's interpreter late)
        deadline = time.monotonic() + 30
        while not any(c.status() == psutil.STATUS_ZOMBIE for c in psutil.Process(parent.pid).children()):
            assert time.monotonic() < deadline, "the parent's child never became a zombie"
            time.sleep(0.05)
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

    def open_stat_files() -> list[str]:  # this process's open files that are the tree's /proc/<pid>/stat
        pids = [tree.pid] + [c.pid for c in psutil.Process(tree.pid).children(recursive=True)]
        links = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
        return sorted(link for link in links if link in {f"/proc/{pid}/stat" for pid in pids})

    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{tree.pid}\n")
    source = ProcessSource(ProcessSection(pid_file=pid_file))
    for _ in range(5):
        readings, _ = source.read()
        assert readings is not None and all(r.alive for r in readings)
    assert len(open_stat_files()) == 2  # the root and its child, opened once, read five times
    del source
    gc.collect()
    assert open_stat_files() == []


def test_a_rewritten_pid_file_is_read_again(tree: subprocess.Popen, tmp_path: Path) -> None:
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text("999999999\n")
    source = ProcessSource(ProcessSection(pid_file=pid_file))
    assert source.read()[0] is None
    pid_file.write_text(f"{tree.pid}\n")  # the engine restarted and wrote its new pid
    readings, error = source.read()
    assert error is None and readings is not None and readings[0].pid == tree.pid


def test_a_data_parallel_engines_cores_add_up_to_one_engine() -> None:
    from guardian.sample import CoreReading, Histogram

    def core(name: str, running: float, kv: float, tokens: float, ttft: tuple[float, float, float]) -> CoreReading:
        buckets = ((0.1, ttft[0]), (1.0, ttft[1]), (float("inf"), ttft[2]))
        return CoreReading(core=name, running=running, waiting=1.0, kv_cache_usage=kv, generation_tokens_total=tokens,
                           histograms={"vllm:time_to_first_token_seconds": Histogram(buckets=buckets, count=ttft[2], sum=1.0)},
                           cache_config={"block_size": "16", "num_gpu_blocks": "1000"})  # fmt: skip

    tracker = EngineTracker("dp", window_seconds=60, lost_after_polls=3)
    for t, tokens, ttft in ((0.0, 0.0, (0, 0, 0)), (10.0, 100.0, (10, 10, 10))):  # core 1: all fast; core 0: all slow
        reading = EngineReading(name="dp", up=True, healthy=True, latency_read=True,
                                cores=(core("0", 2, 0.3, tokens, (0, 0, ttft[2])), core("1", 3, 0.7, tokens, ttft)))  # fmt: skip
        sig = tracker.update(t, reading, {})
    assert sig.running == 5 and sig.waiting == 2 and sig.kv_cache_usage == 0.7  # added; the fullest KV cache
    assert sig.generation_tokens_per_second == 20.0 and sig.num_gpu_blocks == 1000 and sig.block_size == 16
    ttft_q = sig.latency["ttft"]
    assert ttft_q is not None and ttft_q.count == 20  # both cores' requests, not one core's:
    assert ttft_q.p50 is not None and ttft_q.p50 <= 0.1 and ttft_q.p99 == 1.0  # half fast (core 1), half slow (core 0)
