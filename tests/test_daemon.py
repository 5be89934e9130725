from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from guardian import config as cfg
from guardian import logs, status_json
from guardian.analysis.leak_rule import LeakParams
from guardian.policy import breaker
from guardian.policy.breaker import BreakerParams
from guardian.policy.evidence import EvidenceMemory, evidence
from guardian.daemon import Daemon
from guardian.sdnotify import Notifier
from guardian.sim.cluster import SimCluster
from guardian.sim.engine import SimRequest
from guardian.sources.vllm import LATENCY_EVERY_POLLS
from tests.helpers import free_port


def _config(cluster: SimCluster, extra_engines: list[cfg.EngineSection] = ()) -> cfg.Config:  # type: ignore[assignment]
    return cfg.Config(
        guardian=cfg.GuardianSection(listen="127.0.0.1:0", latency_window_seconds=30, telemetry_lost_after_polls=3),
        engines=[
            cfg.EngineSection(name="sim0", url=cluster.urls[0], process=cfg.ProcessSection(pid_file=cluster.pid_file)),
            *extra_engines,
        ],
    )


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _daemon(config: cfg.Config, cluster: SimCluster, notifier: Notifier | None = None) -> Daemon:
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=notifier or Notifier(address=""))
    await daemon.start()
    daemon.poller.pause()  # the tests drive polls themselves
    return daemon


async def test_a_poll_reads_gpu_engine_and_processes(cluster: SimCluster) -> None:
    engine = cluster.servers[0].engine
    for _ in range(5):
        engine.submit(SimRequest(prompt_tokens=2000, max_tokens=400, arrival=cluster.servers[0].now))
    daemon = await _daemon(_config(cluster), cluster)
    try:
        snap = await daemon.poll_once()
    finally:
        await daemon.close()
    gpu = snap.sample.nvml.gpus[0]
    assert gpu.memory_used_bytes == cluster.gpus[0].used_bytes
    sig = snap.engines["sim0"]
    assert sig.up and sig.healthy and sig.running == 5
    assert sig.kv_cache_usage == pytest.approx(engine.kv_usage, abs=0.01)
    assert sig.processes_alive == 1 and sig.rss_bytes > 0
    assert sig.gpu_memory_bytes == cluster.gpus[0].process_bytes  # NVML memory attributed via the pid


async def test_metrics_status_and_healthz_over_http(cluster: SimCluster, http: aiohttp.ClientSession) -> None:
    daemon = await _daemon(_config(cluster), cluster)
    try:
        base = f"http://127.0.0.1:{daemon.http_address[1]}"
        async with http.get(base + "/healthz") as resp:
            assert resp.status == 503  # no poll yet
        await daemon.poll_once()
        async with http.get(base + "/metrics") as resp:
            text = await resp.text()
        async with http.get(base + "/status") as resp:
            status = await resp.json()
        async with http.get(base + "/") as resp:
            index = await resp.json()
        async with http.get(base + "/healthz") as resp:
            assert resp.status == 200
        daemon.last_poll_monotonic = time.monotonic() - 10  # the loop stalled for 3+ intervals
        async with http.get(base + "/healthz") as resp:
            assert resp.status == 503 and "limit 3s" in (await resp.json())["reason"]
    finally:
        await daemon.close()
    assert 'guardian_engine_up{engine="sim0"} 1.0' in text
    assert 'guardian_gpu_memory_total_bytes{gpu="0"} 8.5520809984e+10' in text
    assert "guardian_poll_duration_seconds_count 1.0" in text
    assert 'guardian_build_info{python=' in text
    assert "_created" not in text  # prometheus_client's creation timestamps: series nobody reads
    assert {"GET /metrics", "GET /status", "POST /api/v1/breaker/ENGINE"} <= set(index["endpoints"])
    assert status["engines"][0]["name"] == "sim0" and status["engines"][0]["block_size"] == 16
    assert status["gpus"][0]["memory_total_gib"] == pytest.approx(79.647, abs=0.01)


async def test_engine_going_down_is_unknown_then_telemetry_lost(cluster: SimCluster, http: aiohttp.ClientSession) -> None:
    down = cfg.EngineSection(name="gone", url=f"http://127.0.0.1:{free_port()}")
    daemon = await _daemon(_config(cluster, [down]), cluster)
    try:
        for _ in range(3):
            snap = await daemon.poll_once()
        text = daemon.metrics.render().decode()
    finally:
        await daemon.close()
    gone = snap.engines["gone"]
    assert not gone.up and gone.telemetry_lost and gone.kv_cache_usage is None
    assert snap.engines["sim0"].up and not snap.engines["sim0"].telemetry_lost
    assert 'guardian_engine_telemetry_lost{engine="gone"} 1.0' in text
    assert 'guardian_scrape_errors_total{engine="gone",reason="refused"} 3.0' in text
    assert 'guardian_engine_kv_cache_usage_ratio{core="0",engine="gone"' not in text  # unknown, not 0


async def test_lost_gpu_is_telemetry_lost_and_the_loop_keeps_going(cluster: SimCluster) -> None:
    daemon = await _daemon(_config(cluster), cluster)
    cluster.gpus[0].lost = True
    try:
        for _ in range(3):
            snap = await daemon.poll_once()
    finally:
        await daemon.close()
    assert snap.sample.nvml.gpus[0].memory_used_bytes is None
    assert "GpuIsLost" in snap.sample.nvml.gpus[0].error
    assert snap.engines["sim0"].up


async def test_hung_nvml_does_not_stall_the_poll(cluster: SimCluster) -> None:
    config = _config(cluster)
    config = config.model_copy(update={"guardian": config.guardian.model_copy(update={"nvml_timeout_seconds": 0.2})})
    daemon = await _daemon(config, cluster)
    cluster.gpus[0].hang_seconds = 1.5
    try:
        started = time.monotonic()
        first = await daemon.poll_once()
        second = await daemon.poll_once()
        took = time.monotonic() - started
    finally:
        await daemon.close()
    assert took < 1.0
    assert "did not answer within 0.2s" in first.sample.nvml.error
    assert "still hung" in second.sample.nvml.error
    assert first.engines["sim0"].up and second.engines["sim0"].up


async def test_latency_quantiles_follow_the_engine(cluster: SimCluster) -> None:
    daemon = await _daemon(_config(cluster), cluster)
    server = cluster.servers[0]
    try:
        await daemon.poll_once()
        for _ in range(20):
            server.engine.submit(SimRequest(prompt_tokens=500, max_tokens=20, arrival=server.now))
        await asyncio.sleep(1.0)
        for _ in range(LATENCY_EVERY_POLLS):  # the histograms are read every few polls: by then, once
            snap = await daemon.poll_once()
    finally:
        await daemon.close()
    ttft = snap.engines["sim0"].latency["ttft"]
    assert ttft is not None and ttft.count >= 20
    assert 0.001 < ttft.p50 <= ttft.p99 < 5


async def test_reload_with_a_bad_file_keeps_the_running_config(cluster: SimCluster, tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(f'[guardian]\nlisten = "127.0.0.1:0"\n[[engines]]\nname = "sim0"\nurl = "{cluster.urls[0]}"\n')
    daemon = Daemon(cfg.load(path), path, nvml_module=cluster.nvml, notifier=Notifier(address=""))
    await daemon.start()
    try:
        path.write_text("[guardian]\npoll_interval_seconds = 0\n")
        assert daemon.reload() is False
        assert [e.name for e in daemon.config.engines] == ["sim0"]
        path.write_text(
            f'[guardian]\nlisten = "127.0.0.1:0"\n[[engines]]\nname = "sim0"\nurl = "{cluster.urls[0]}"\n'
            f'[[engines]]\nname = "other"\nurl = "{cluster.urls[0]}"\n'
        )
        assert daemon.reload() is True
        snap = await daemon.poll_once()
        text = daemon.metrics.render().decode()
    finally:
        await daemon.close()
    assert set(snap.engines) == {"sim0", "other"}
    assert 'guardian_config_reloads_total{outcome="refused"} 1.0' in text
    assert 'guardian_config_reloads_total{outcome="applied"} 1.0' in text


async def test_watchdog_is_pinged_only_by_completed_polls(cluster: SimCluster, tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(2)
    daemon = await _daemon(_config(cluster), cluster, Notifier(address=str(tmp_path / "notify")))
    try:
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(4096)  # started, but no poll yet: nothing said
        sock.settimeout(2)
        await daemon.poll_once()
        ready = sock.recv(4096).decode().split("\n")
        ping = sock.recv(4096).decode().split("\n")
        await daemon.poll_once()
        ping2 = sock.recv(4096).decode().split("\n")
    finally:
        await daemon.close()
        sock.close()
    assert ready[0] == "READY=1" and ready[1].startswith("STATUS=1 GPU; sim0: L0 kv")
    assert ping[0] == "WATCHDOG=1" and ping2[0] == "WATCHDOG=1"


def test_sighup_with_bad_config_keeps_serving_and_says_why(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "g.toml"
    path.write_text(
        f'[guardian]\nlisten = "127.0.0.1:{port}"\nlog_format = "json"\n'
        f'[[engines]]\nname = "a"\nurl = "http://127.0.0.1:{free_port()}"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "guardian", "run", "--config", str(path)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        events = _events_until(proc, "guardian_started")
        secret = "0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d"  # an auth token pasted as the account SID
        path.write_text(f"[guardian]\npoll_interval_seconds = 'soon'\n[notify.sms]\naccount_sid = '{secret}'\n")
        proc.send_signal(signal.SIGHUP)
        events += _events_until(proc, "config_reload_refused")
        refused = next(e for e in events if e["event"] == "config_reload_refused")
        deadline = time.monotonic() + 15
        status: dict = {}  # type: ignore[type-arg]
        while "engines" not in status and time.monotonic() < deadline:  # the first poll may still be running
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
                status = json.load(resp)
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    assert any("guardian.poll_interval_seconds" in p for p in refused["problems"])
    assert any("notify.sms.account_sid" in p for p in refused["problems"]) and secret not in json.dumps(refused)
    assert refused["detail"] == "keeping the running config"
    assert status["engines"][0]["name"] == "a"


def _events_until(proc: subprocess.Popen[str], event: str, timeout: float = 15) -> list[dict]:
    deadline = time.monotonic() + timeout
    seen = []
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        seen.append(record)
        if record.get("event") == event:
            return seen
    raise AssertionError(f"no {event!r} event; saw {[e.get('event') for e in seen]}")


async def test_a_leak_step_is_found_exported_and_logged(cluster: SimCluster, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("json", "info")
    config = _config(cluster).model_copy(update={"leak": LeakParams(
        warmup_seconds=0.5, settle_seconds=0.2, envelope_seconds=0.1, hold_seconds=0.3, regret_seconds=0.1, leak_steps=1
    )})
    daemon = await _daemon(config, cluster)
    gpu = cluster.gpus[0]
    try:
        settled = 0  # polls since the detector's warm-up ended: the step comes after it, however fast polls are
        for _ in range(120):
            snap = await daemon.poll_once()
            if not any(snap.memory.leaks[s].warming_up for s in ("engine/sim0/gpu", "gpu/0/used")):  # type: ignore[union-attr]
                settled += 1
            if settled == 5:
                gpu.overhang_bytes += int(0.02 * gpu.total_bytes)
            if settled == 50:
                break
            await asyncio.sleep(0.02)
        text = daemon.metrics.render().decode()
        status = status_json.status(snap, 0, 1)
    finally:
        await daemon.close()
    report = snap.memory.leaks["engine/sim0/gpu"]
    assert len(report.held_steps) == 1 and report.leak
    assert report.held_steps[0].size == pytest.approx(0.02 * gpu.total_bytes, rel=0.01)
    assert 'guardian_leak_steps_total{series="engine/sim0/gpu"} 1.0' in text
    assert 'guardian_leak_suspected{series="gpu/0/used"} 1.0' in text
    assert 'guardian_memory_overhang_bytes{series="engine/sim0/gpu"}' in text
    assert 'guardian_fragmentation_ratio{engine="sim0"}' in text
    assert 'guardian_kv_internal_fragmentation_ratio{engine="sim0"}' in text
    assert status["memory"]["engine/sim0/gpu"]["leak_suspected"] is True
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    step = next(e for e in events if e["event"] == "leak_step_detected" and e["series"] == "engine/sim0/gpu")
    assert step["size_bytes"] == pytest.approx(0.02 * gpu.total_bytes, rel=0.01)
    assert any(e["event"] == "leak_suspected" for e in events)


async def test_breaker_evidence_from_real_readings(cluster: SimCluster) -> None:
    """The breaker is not wired into the loop yet; its evidence is computed from a real poll here."""
    daemon = await _daemon(_config(cluster), cluster)
    gpu = cluster.gpus[0]
    past = EvidenceMemory()
    try:
        calm = await daemon.poll_once()
        e_calm = evidence("sim0", calm.sample, calm.engines["sim0"], calm.memory, past, 0.10)
        gpu.overhang_bytes = int(0.05 * gpu.total_bytes)
        full = await daemon.poll_once()
        e_full = evidence("sim0", full.sample, full.engines["sim0"], full.memory, past, 0.10)
    finally:
        await daemon.close()
    # vLLM's 92% budget leaves 1 - 0.92 - 0.6% driver reserve free
    assert e_calm.free_ratio == pytest.approx(0.074, abs=0.002)
    assert e_calm.over_budget_ratio == pytest.approx(0.0, abs=0.001)
    assert e_calm.health_failures == 0 and e_calm.oom is None  # no earlier poll to compare with
    assert e_full.over_budget_ratio == pytest.approx(0.05, abs=0.001)
    assert e_full.free_ratio == pytest.approx(0.024, abs=0.002) and e_full.oom is False
    state, transition = breaker.step(breaker.BreakerState(), e_full, 0.0, BreakerParams(l3_sustain_seconds=0))
    assert state.level == breaker.Level.L3 and transition.rule == "free_reserve"


async def test_a_record_file_that_cannot_be_written_does_not_stop_the_loop(cluster: SimCluster, tmp_path: Path) -> None:
    from guardian.record import SampleRecorder

    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    daemon = Daemon(_config(cluster), nvml_module=cluster.nvml, notifier=Notifier(address=""),
                    record=SampleRecorder(blocked / "samples.jsonl"))  # fmt: skip
    await daemon.start()
    daemon.poller.pause()
    try:
        first = await daemon.poll_once()
        second = await daemon.poll_once()
        text = daemon.metrics.render().decode()
    finally:
        await daemon.close()
    assert first.engines["sim0"].up and second.engines["sim0"].up
    assert "guardian_polls_total 2.0" in text
