"""The imperative shell: read every source each poll, derive signals, export, tell systemd.

The poll is an APScheduler interval job (``max_instances=1``, ``coalesce``):
a slow poll makes the next one wait or be skipped and counted, never run
twice at once. Everything that can block (NVML, /proc) runs in worker
threads with timeouts; everything that can fail becomes a reading with a
reason. The watchdog is pinged only from a poll that completed, so a wedged
loop is restarted by systemd.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import psutil
import pynvml
from aiohttp import web
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from guardian import config as cfg
from guardian import logs
from guardian.analysis.engine_stats import EngineSignals, EngineTracker
from guardian.analysis.memory import MemoryReport, MemoryWatch
from guardian.exporter import Metrics, make_app
from guardian.record import SampleRecorder
from guardian.sample import EngineReading, NvmlReading, ProcReading, Sample
from guardian.sdnotify import Notifier, watchdog_interval
from guardian.snapshot import Snapshot, gpu_memory_by_pid
from guardian.sources.nvml import NvmlSource
from guardian.sources.offloop import OffloopWorker, WorkerBusy
from guardian.sources.process import ProcessSource
from guardian.sources.vllm import VllmScraper

log = logs.get("guardian.daemon")

REPEAT_FAILURE_LOG_EVERY = 60  # polls: a persisting failure is logged again this often


@dataclass
class _Engine:
    section: cfg.EngineSection
    scraper: VllmScraper
    processes: ProcessSource | None
    tracker: EngineTracker


class StartupError(RuntimeError):
    """The daemon cannot start as configured (the message says what to change)."""


class _FailureLog:
    """Logs a failing source when it starts failing, changes reason, every N polls, and on recovery."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.kind: str | None = None
        self.count = 0

    def observe(self, kind: str | None, reason: str | None, **fields: Any) -> None:
        if kind is None:
            if self.kind is not None:
                log.info("source_recovered", source=self.source, failed_polls=self.count, **fields)
            self.kind, self.count = None, 0
            return
        self.count += 1
        if kind != self.kind or self.count % REPEAT_FAILURE_LOG_EVERY == 0:
            log.warning("source_failed", source=self.source, kind=kind, reason=reason, failed_polls=self.count, **fields)
        self.kind = kind


class Daemon:
    def __init__(
        self,
        config: cfg.Config,
        config_path: str | Path | None = None,
        nvml_module: ModuleType | Any = pynvml,
        notifier: Notifier | None = None,
        record: SampleRecorder | None = None,
    ) -> None:
        self.config = config
        self.config_path = Path(config_path) if config_path else None
        self._nvml_module = nvml_module
        self.notifier = notifier or Notifier()
        self.metrics = Metrics(lambda: self.snapshot)
        self.snapshot: Snapshot | None = None
        self.last_poll_monotonic: float | None = None
        self.http_address: tuple[str, int] | None = None
        self._started_wall = time.time()
        self._nvml_worker = OffloopWorker("guardian-nvml")
        self._proc_worker = OffloopWorker("guardian-proc")
        self._nvml = NvmlSource(config.gpus.select, nvml_module)
        self._nvml_failures = 0
        self._nvml_log = _FailureLog("nvml")
        self._engines: dict[str, _Engine] = {}
        self._engine_logs: dict[str, _FailureLog] = {}
        self._memory = self._memory_watch(config)
        self._leaking: dict[str, bool] = {}
        self._record = record
        self._record_log = _FailureLog("record")
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._scheduler: AsyncIOScheduler | None = None
        self._stop = asyncio.Event()
        self._ready_sent = False

    @staticmethod
    def _memory_watch(config: cfg.Config) -> MemoryWatch:
        return MemoryWatch(config.leak, config.fragmentation.kv_pool_share, psutil.virtual_memory().total)

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=4))
        self._build_engines(self.config)
        for note in self.config.warnings():
            log.warning("config_warning", detail=note)
        await self._start_http()
        self._scheduler = AsyncIOScheduler()
        self._scheduler.add_listener(self._on_missed, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self._schedule()
        self._scheduler.start()
        wd = watchdog_interval()
        if wd is not None and wd < self.config.guardian.poll_interval_seconds:
            log.warning(
                "watchdog_too_short",
                watchdog_ping_every_seconds=wd,
                poll_interval_seconds=self.config.guardian.poll_interval_seconds,
                detail="WatchdogSec is shorter than two poll intervals: systemd will kill a healthy guardian",
            )
        log.info(
            "guardian_started",
            listen=f"{self.http_address[0]}:{self.http_address[1]}" if self.http_address else None,
            engines=[e.name for e in self.config.engines],
            poll_interval_seconds=self.config.guardian.poll_interval_seconds,
            config=str(self.config_path) if self.config_path else None,
        )

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, stop cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            await self.start()
            await self._stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            await self.close()

    def request_stop(self, why: str = "requested") -> None:
        if not self._stop.is_set():
            log.info("guardian_stopping", reason=why)
            self.notifier.stopping()
            self._stop.set()

    async def close(self) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if not self._nvml_worker.busy:
            self._nvml.close()
        if self._record is not None:
            self._record.close()
        self.notifier.close()

    async def _start_http(self) -> None:
        host, port = cfg.parse_listen(self.config.guardian.listen)
        app = make_app(
            self.metrics,
            lambda: self.snapshot,
            lambda: self.last_poll_monotonic,
            lambda: self.config.guardian.poll_interval_seconds,
            self._started_wall,
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if "address already in use" in str(exc).lower():
                reason = "address already in use (another guardian, or something else, listens there)"
            raise StartupError(
                f"cannot listen on {self.config.guardian.listen} (guardian.listen): {reason}"
            ) from None
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr, attr-defined]
        bound = sockets[0].getsockname() if sockets else (host, port)
        self.http_address = (bound[0], bound[1])

    def _schedule(self) -> None:
        assert self._scheduler is not None
        interval = self.config.guardian.poll_interval_seconds
        self._scheduler.add_job(
            self._poll_job,
            "interval",
            seconds=interval,
            id="poll",
            replace_existing=True,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(interval)),
            next_run_time=None if self.snapshot else _now(),
        )

    def _on_missed(self, event: JobExecutionEvent) -> None:
        self.metrics.polls_missed.inc()
        log.warning("poll_skipped", reason="the previous poll is still running or the loop was blocked")

    # -- reload ---------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the config file (SIGHUP); a bad file keeps the running config and says why."""
        if self.config_path is None:
            log.warning("config_reload_ignored", reason="guardian was started without --config")
            return False
        self.notifier.reloading()
        try:
            new = cfg.load(self.config_path)
        except cfg.ConfigError as exc:
            self.metrics.reloads.labels("refused").inc()
            log.error(
                "config_reload_refused",
                config=str(self.config_path),
                problems=[f"{i.key}: {i.message} (fix: {i.fix})" for i in exc.issues],
                detail="keeping the running config",
            )
            self.notifier.ready(self._status_line())
            return False
        old = self.config
        if new.guardian.listen != old.guardian.listen:
            log.warning(
                "config_reload_partial",
                key="guardian.listen",
                running=old.guardian.listen,
                new=new.guardian.listen,
                detail="the listen address changes only on restart",
            )
        self.config = new
        if new.gpus != old.gpus:
            if not self._nvml_worker.busy:
                self._nvml.close()
            self._nvml = NvmlSource(new.gpus.select, self._nvml_module)
        self._build_engines(new)
        if (new.leak, new.fragmentation) != (old.leak, old.fragmentation):
            self._memory = self._memory_watch(new)  # detectors start over with the new parameters
        if self._scheduler is not None and new.guardian.poll_interval_seconds != old.guardian.poll_interval_seconds:
            self._schedule()
        self.metrics.reloads.labels("applied").inc()
        log.info("config_reloaded", config=str(self.config_path), engines=[e.name for e in new.engines])
        self.notifier.ready(self._status_line())
        return True

    def _build_engines(self, config: cfg.Config) -> None:
        assert self._session is not None
        g = config.guardian
        engines: dict[str, _Engine] = {}
        for section in config.engines:
            previous = self._engines.get(section.name)
            keep = previous is not None and (
                previous.section.url,
                previous.tracker.window,
                previous.tracker.lost_after,
            ) == (section.url, g.latency_window_seconds, g.telemetry_lost_after_polls)
            tracker = (
                previous.tracker
                if keep and previous is not None
                else EngineTracker(section.name, g.latency_window_seconds, g.telemetry_lost_after_polls)
            )
            try:
                api_key = section.read_api_key()
            except OSError as exc:
                log.error("api_key_unreadable", engine=section.name, file=str(section.api_key_file), reason=exc.strerror)
                api_key = None
            engines[section.name] = _Engine(
                section=section,
                scraper=VllmScraper(section.name, section.url, self._session, g.scrape_timeout, api_key),
                processes=ProcessSource(section.process) if section.process else None,
                tracker=tracker,
            )
            self._engine_logs.setdefault(section.name, _FailureLog(f"engine:{section.name}"))
        self._engines = engines

    # -- the poll -------------------------------------------------------------

    async def _poll_job(self) -> None:
        try:
            await self.poll_once()
        except Exception:
            log.exception("poll_failed")

    async def poll_once(self) -> Snapshot:
        started = time.monotonic()
        wall = time.time()
        engines = list(self._engines.values())
        scrapes = asyncio.gather(*(e.scraper.scrape() for e in engines))
        nvml, procs, scraped = await asyncio.gather(self._read_nvml(), self._read_processes(engines), scrapes)
        readings = [_with_processes(r, procs.get(r.name)) for r in scraped]
        sample = Sample(t=started, wall=wall, nvml=nvml, engines=tuple(readings))
        by_pid = gpu_memory_by_pid(nvml)
        signals: dict[str, EngineSignals] = {}
        for engine, reading in zip(engines, readings):
            before = engine.tracker.restarts
            signals[engine.section.name] = engine.tracker.update(started, reading, by_pid)
            self._observe_engine(engine, reading, before)
        self._nvml_failures = 0 if nvml.ok else self._nvml_failures + 1
        self._nvml_log.observe(None if nvml.ok else "nvml", nvml.error)
        memory = self._memory.update(sample, signals)
        self._observe_memory(sample, memory)
        elapsed = time.monotonic() - started
        self.snapshot = Snapshot(
            sample=sample,
            engines=signals,
            nvml_lost=self._nvml_failures >= self.config.guardian.telemetry_lost_after_polls,
            poll_seconds=elapsed,
            memory=memory,
            urls={e.section.name: e.section.url for e in engines},
        )
        if self._record is not None:
            self._write_record(sample)
        self.last_poll_monotonic = time.monotonic()
        self.metrics.polls.inc()
        self.metrics.poll_duration.observe(elapsed)
        self.metrics.last_poll.set(time.time())
        status = self._status_line()
        if not self._ready_sent:
            self.notifier.ready(status)
            self._ready_sent = True
        self.notifier.watchdog(status)
        log.debug("poll_completed", duration_seconds=round(elapsed, 4), status=status)
        return self.snapshot

    def _write_record(self, sample: Sample) -> None:
        """A full disk must not stop the loop (and with it the watchdog): say so once per failure spell."""
        assert self._record is not None
        try:
            self._record.write(sample)
        except OSError as exc:
            self._record_log.observe("record", f"{self._record.path}: {exc.strerror or exc}")
        else:
            self._record_log.observe(None, None)

    async def _read_nvml(self) -> NvmlReading:
        timeout = self.config.guardian.nvml_timeout_seconds
        try:
            reading = await self._nvml_worker.call(self._nvml.read, timeout)
        except WorkerBusy:
            reading = NvmlReading(error="an earlier NVML call is still hung; skipping NVML this poll")
            self.metrics.nvml_errors.labels("hung").inc()
            return reading
        except asyncio.TimeoutError:
            self.metrics.nvml_errors.labels("timeout").inc()
            return NvmlReading(error=f"NVML did not answer within {timeout:g}s")
        if reading.error:
            self.metrics.nvml_errors.labels("unavailable").inc()
        for gpu in reading.gpus:
            if gpu.error:
                self.metrics.nvml_errors.labels("gpu_error").inc()
        return reading

    async def _read_processes(self, engines: list[_Engine]) -> dict[str, tuple[tuple[ProcReading, ...] | None, str | None]]:
        sources = [(e.section.name, e.processes) for e in engines if e.processes is not None]
        if not sources:
            return {}
        try:
            return await self._proc_worker.call(lambda: {n: s.read() for n, s in sources}, timeout=2.0)
        except (WorkerBusy, asyncio.TimeoutError):
            return {n: (None, "process scan did not finish in time") for n, _ in sources}

    def _observe_engine(self, engine: _Engine, reading: EngineReading, restarts_before: int) -> None:
        name = engine.section.name
        if reading.error_kind:
            self.metrics.scrape_errors.labels(name, reading.error_kind).inc()
        self._engine_logs[name].observe(reading.error_kind, reading.error, url=engine.section.url)
        if engine.tracker.restarts > restarts_before:
            log.warning("engine_restart_detected", engine=name, restarts=engine.tracker.restarts)

    def _observe_memory(self, sample: Sample, memory: MemoryReport) -> None:
        """One event per step found or given back, and when a series starts or stops looking like a leak."""
        for series, report in memory.leaks.items():
            for step in report.new_steps:
                self.metrics.leak_steps.labels(series).inc()
                log.info(
                    "leak_step_detected",
                    series=series,
                    at=_wall(sample, step.t),
                    size_bytes=round(step.size),
                    level_bytes=round(report.level or 0),
                    overhang_bytes=round(report.overhang),
                    held_steps=len(report.held_steps),
                    confidence=round(report.confidence, 2),
                    time_to_exhaustion_seconds=_round(report.time_to_exhaustion),
                )
            for step in report.given_back:
                self.metrics.leak_steps_given_back.labels(series).inc()
                log.info(
                    "leak_step_given_back",
                    series=series,
                    at=_wall(sample, step.t),
                    size_bytes=round(step.size),
                    held_for_seconds=round((step.given_back_at or sample.t) - step.found_at, 1),
                )
            was = self._leaking.get(series, False)
            if report.leak != was:
                self._leaking[series] = report.leak
                (log.warning if report.leak else log.info)(
                    "leak_suspected" if report.leak else "leak_cleared",
                    series=series,
                    held_steps=len(report.held_steps),
                    steps=[(_wall(sample, s.t), round(s.size)) for s in report.held_steps][-10:],
                    overhang_bytes=round(report.overhang),
                    slope_bytes_per_second=round(report.slope, 1),
                    time_to_exhaustion_seconds=_round(report.time_to_exhaustion),
                    confidence=round(report.confidence, 2),
                )

    def _status_line(self) -> str:
        snap = self.snapshot
        if snap is None:
            return "starting"
        parts = [f"{len(snap.nvml.gpus)} GPU" + ("" if snap.nvml.ok else " (NVML lost)")]
        parts += [f"{name}: {sig.brief()}" for name, sig in snap.engines.items()]
        return "; ".join(parts)


def _with_processes(
    reading: EngineReading, procs: tuple[tuple[ProcReading, ...] | None, str | None] | None
) -> EngineReading:
    if procs is None:
        return reading
    return replace(reading, processes=procs[0], process_error=procs[1])


def _wall(sample: Sample, t: float) -> str:
    """A monotonic time of this run as ISO wall-clock time."""
    return datetime.fromtimestamp(sample.wall_at(t), timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _now() -> datetime:
    return datetime.now(timezone.utc)
