"""The daemon: start the parts a config describes, poll on a fixed interval, reload on SIGHUP, stop cleanly.

The poll runs on a monotonic ticker (``ticker.py``; a stepped wall clock
changes nothing): a slow poll makes the next one wait or be skipped and
counted, never run twice at once. Everything that can block (NVML, /proc) runs in worker
threads with timeouts (``readers``); everything that can fail becomes a reading with a
reason. The watchdog is pinged only from a poll that completed, so a wedged
loop is restarted by systemd.

Each poll's sample goes through the ``Pipeline`` (signals, leak detectors,
breaker, response) and its decision is carried out by the ``Executor``. The
policy state is saved before any action starts (write-ahead, ``persistence``), so a
``kill -9`` mid-transition restarts at the level it had reached, with the
restarts it had spent.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, TextIO

import aiohttp
import psutil
import pynvml
from aiohttp import web

from guardian import config as cfg
from guardian import logs
from guardian.actions.executor import Executor
from guardian.actions.gateway import Gateway, NoGateway
from guardian.actions.launcher import Launcher
from guardian.actions.outcome import Outcome
from guardian.daemon import children, wiring
from guardian.daemon.http_api import ControlApi, make_app
from guardian.daemon.observe import FailureLog, MemoryLog, observe_decision, observe_engine
from guardian.daemon.persistence import PolicyStore
from guardian.daemon.readers import Readers, with_processes
from guardian.daemon.views import alert_views, policy_view, status_line
from guardian.daemon.wiring import EngineHandle, StartupError
from guardian.exporter import Metrics
from guardian.gateway.proxy import GatewayServer
from guardian.listener import serve
from guardian.notify.service import Deliverer, Notifications
from guardian.pipeline import Decision, Pipeline, PollResult
from guardian.policy.response import Action
from guardian.record import SampleRecorder
from guardian.sample import Sample
from guardian.sdnotify import Notifier, watchdog_interval
from guardian.snapshot import ActionView, Snapshot
from guardian.summary_line import summary
from guardian.ticker import Ticker

log = logs.get("guardian.daemon")

NOTIFY_EVERY_SECONDS = 1.0
LAST_ACTIONS = 8  # kept for /status and guardian status
SUMMARY_EVERY_SECONDS = 5.0


class Daemon:
    def __init__(
        self,
        config: cfg.Config,
        config_path: str | Path | None = None,
        nvml_module: ModuleType | Any = pynvml,
        notifier: Notifier | None = None,
        record: SampleRecorder | None = None,
        dry_run: bool = False,
        launchers: Mapping[str, Launcher] | None = None,
        gateway: Gateway | None = None,
        deliverers: Mapping[str, Deliverer] | None = None,
        summary_to: TextIO | None = None,
    ) -> None:
        self.config = config
        self._summary_to = summary_to  # a terminal: one line of what moved every SUMMARY_EVERY_SECONDS
        self.config_path = Path(config_path) if config_path else None
        self.notifier = notifier or Notifier()
        self.metrics = Metrics(lambda: self.snapshot)
        self.snapshot: Snapshot | None = None
        self.last_poll_monotonic: float | None = None
        self.http_address: tuple[str, int] | None = None
        self._started_wall = time.time()
        self._readers = Readers(config.gpus.select, nvml_module, self.metrics)
        self._engines: dict[str, EngineHandle] = {}
        self._engine_logs: dict[str, FailureLog] = {}
        self._memory_log = MemoryLog(self.metrics)
        self.pipeline = Pipeline(config, psutil.virtual_memory().total)
        self.dry_run = dry_run or config.actions.dry_run
        self._launchers = dict(launchers or {})  # the simulator's, in the demo and tests
        self._gateway: Gateway = gateway or NoGateway()
        self.gateway: GatewayServer | None = None  # the admission gateway, when [gateway] is configured
        self._deliverers = deliverers  # tests bring their own; else from [notify]
        self.notifications: Notifications | None = None
        self.executor: Executor | None = None
        self._store = PolicyStore(config.guardian.state_dir)
        self._record = record
        self._record_log = FailureLog("record")
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._http_server: asyncio.Server | None = None
        self.poller: Ticker | None = None  # the poll, every poll_interval_seconds of the monotonic clock
        self._notifier_ticker: Ticker | None = None
        self._stop = asyncio.Event()
        self._ready_sent = False
        self._resuming: asyncio.Task[None] | None = None
        self._actions: deque[ActionView] = deque(maxlen=LAST_ACTIONS)  # for /status and guardian status
        self.api = ControlApi(lambda: self.config, self.pipeline, lambda: self.notifications, self.carry_out, lambda: self.dry_run)

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=4))
        self._set_engines(self.config)
        for note in self.config.warnings():
            log.warning("config_warning", detail=note)
        self._store.restore(self.pipeline)
        if self.config.gateway is not None:
            self.gateway = await wiring.start_gateway(self.config, self.metrics, self._engines)
            self._gateway = self.gateway
        self.notifications = wiring.build_notifications(self.config, self.metrics, self._deliverers, self._session)
        self.notifications.start()
        self.executor = wiring.build_executor(self.config, self._actuators(self.config), self._gateway, self.notifications,
                                              self.pipeline, self.dry_run, self._on_outcome)  # fmt: skip
        self.executor.submit(children.reconcile(self.pipeline))
        await children.start_children(self.executor, self.pipeline, self.dry_run)
        self._resuming = asyncio.create_task(children.resume_paused(self.executor))
        if self._record is not None:
            self._record.header = wiring.record_header(self.config, self.pipeline.host_memory)
        await self._start_http()
        self.poller = Ticker(self.config.guardian.poll_interval_seconds, self._poll_job, self._poll_skipped)
        self._notifier_ticker = Ticker(NOTIFY_EVERY_SECONDS, self._notify_job, self._notify_skipped, at_once=False)
        self.poller.start()
        self._notifier_ticker.start()
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
            dry_run=self.dry_run,
            state=str(self._store.path),
            levels={name: f"L{int(st.breaker.level)}" for name, st in self.pipeline.states.items()},
        )

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, stop cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        try:
            await self.start()
            summaries = asyncio.create_task(self._print_summaries()) if self._summary_to is not None else None
            await self._stop.wait()
            if summaries is not None:
                summaries.cancel()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            await self.close()

    async def _print_summaries(self) -> None:
        """On a terminal the JSON log says little after start: a line of what moved, like the demo's."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(SUMMARY_EVERY_SECONDS)
            print(summary(self.snapshot, time.monotonic() - started), file=self._summary_to, flush=True)

    def request_stop(self, why: str = "requested") -> None:
        if not self._stop.is_set():
            log.info("guardian_stopping", reason=why)
            self.notifier.stopping()
            self._stop.set()

    async def close(self) -> None:
        for ticker in (self.poller, self._notifier_ticker):
            if ticker is not None:
                await ticker.stop()
        if self._resuming is not None:
            self._resuming.cancel()
            await asyncio.gather(self._resuming, return_exceptions=True)
        if self.executor is not None:
            await self.executor.close()
        if self.gateway is not None:
            await self.gateway.close()
        if self._http_server is not None:
            self._http_server.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        for engine in self._engines.values():
            engine.close()
        self._readers.close()
        if self._record is not None:
            self._record.close()
        self.notifier.close()

    async def _start_http(self) -> None:
        host, port = cfg.parse_listen(self.config.guardian.listen)
        app = make_app(self.metrics, lambda: self.snapshot, lambda: self.last_poll_monotonic,
                       lambda: self.config.guardian.poll_interval_seconds, self._started_wall, self.api)  # fmt: skip
        limits = self.config.guardian.listener_limits
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=limits.idle_timeout_seconds)
        await self._runner.setup()
        try:
            self._http_server, self.http_address = await serve(self._runner, host, port, limits, "api", self.metrics.listener)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if "address already in use" in str(exc).lower():
                reason = "address already in use (another guardian, or something else, listens there)"
            raise StartupError(
                f"cannot listen on {self.config.guardian.listen} (guardian.listen): {reason}"
            ) from None

    async def _notify_job(self) -> None:
        """Due messages into the outbox, then deliver what the outbox holds (its own job: a slow SMS never delays a poll)."""
        if self.notifications is None:
            return
        try:
            self.notifications.tick()
            await self.notifications.drain()
            depth, oldest = self.notifications.depth_and_oldest()
            self.metrics.outbox_depth.set(depth)
            self.metrics.outbox_oldest.set(oldest or 0.0)
        except asyncio.CancelledError:
            log.debug("notify_cancelled", reason="guardian is stopping")  # a send in flight stays in the outbox
        except Exception:
            log.exception("notify_failed")

    def _poll_skipped(self) -> None:
        self.metrics.polls_missed.inc()
        log.warning("poll_skipped", reason="the previous poll is still running or the loop was blocked")

    def _notify_skipped(self) -> None:
        """A hanging SMS provider: counted on its own, never as a missed poll."""
        self.metrics.notify_overruns.inc()
        log.warning("notify_skipped", reason="the previous notification run is still sending")

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
            self.notifier.ready(status_line(self.snapshot, self.pipeline))
            return False
        old = self.config
        if new.guardian.listen != old.guardian.listen:
            log.warning("config_reload_partial", key="guardian.listen", running=old.guardian.listen, new=new.guardian.listen,
                        detail="the listen address changes only on restart")  # fmt: skip
        self.config = new
        if new.gpus != old.gpus:
            self._readers.reselect(new.gpus.select)
        self._set_engines(new)
        self.pipeline.reconfigure(new)
        self.dry_run = self.dry_run or new.actions.dry_run
        if self.notifications is not None and self._session is not None:
            fresh = wiring.build_notifications(new, self.metrics, self._deliverers, self._session)
            self.notifications.settings, self.notifications.deliverers = fresh.settings, fresh.deliverers
        if self.executor is not None:
            wiring.reconfigure_executor(self.executor, new, self._actuators(new))
        if new.gateway != old.gateway:
            log.warning("config_reload_partial", key="gateway", detail="the gateway's settings change only on restart")
        if new.guardian.state_dir != old.guardian.state_dir:
            log.warning("config_reload_partial", key="guardian.state_dir", running=str(old.guardian.state_dir),
                        new=str(new.guardian.state_dir), detail="the state directory changes only on restart")  # fmt: skip
        if self.poller is not None:
            self.poller.interval = new.guardian.poll_interval_seconds  # from the next tick on
        self.metrics.reloads.labels("applied").inc()
        log.info("config_reloaded", config=str(self.config_path), engines=[e.name for e in new.engines])
        self.notifier.ready(status_line(self.snapshot, self.pipeline))
        return True

    def _set_engines(self, config: cfg.Config) -> None:
        for old in self._engines.values():
            old.close()
        self._engines = wiring.build_engines(config)
        for name in self._engines:
            self._engine_logs.setdefault(name, FailureLog(f"engine:{name}"))

    def _actuators(self, config: cfg.Config) -> dict[str, Any]:
        assert self._session is not None
        return wiring.build_actuators(config, self._engines, self._session, self._launchers)

    # -- the poll -------------------------------------------------------------

    async def _poll_job(self) -> None:
        try:
            await self.poll_once()
        except asyncio.CancelledError:
            log.debug("poll_cancelled", reason="guardian is stopping")  # the scheduler's shutdown cancels a poll in flight
        except Exception:
            log.exception("poll_failed")

    async def poll_once(self) -> Snapshot:
        started = time.monotonic()
        wall = time.time()
        engines = list(self._engines.values())
        sources = {e.section.name: e.processes for e in engines if e.processes is not None}
        launchers = {n: a.launcher for n, a in (self.executor.engines if self.executor else {}).items() if a.launcher is not None}
        nvml, (procs, statuses), scraped = await asyncio.gather(
            self._readers.nvml(self.config.guardian.nvml_timeout_seconds),
            self._readers.processes(sources, launchers),
            asyncio.gather(*(e.scraper.scrape() for e in engines)),
        )
        readings = [with_processes(r, procs.get(r.name), statuses.get(r.name)) for r in scraped]
        sample = Sample(t=started, wall=wall, nvml=nvml, engines=tuple(readings),
                        gateway=self.gateway.loads() if self.gateway is not None else ())  # fmt: skip
        previous = self.snapshot.engines if self.snapshot else {}
        finished = self.executor.finished(before=started) if self.executor else {}
        result = self.pipeline.step(sample, finished)
        for engine, reading in zip(engines, readings):
            name = engine.section.name
            before = previous[name].restarts_total if name in previous else 0
            observe_engine(self.metrics, self._engine_logs[name], engine.section.url, reading, before,
                           result.signals[name].restarts_total)  # fmt: skip
        self._memory_log.observe(sample, result.memory)
        self._route(result)
        if self._record is not None:
            self._write_record(sample)
        self.carry_out(result.decision)
        elapsed = time.monotonic() - started
        self.snapshot = Snapshot(
            sample=sample,
            engines=result.signals,
            nvml_lost=self._readers.nvml_failures >= self.config.guardian.telemetry_lost_after_polls,
            poll_seconds=elapsed,
            memory=result.memory,
            urls={e.section.name: e.section.url for e in engines},
            policy=policy_view(self.pipeline, self.dry_run, self.executor.restarting if self.executor else []),
            costs=result.costs,
            marginals={n: m for n in result.costs if (m := self.pipeline.marginal(n)) is not None},
            gateway=self.gateway.views() if self.gateway is not None else {},
            alerts=alert_views(self.notifications),
            actions=tuple(self._actions),
        )
        self.last_poll_monotonic = time.monotonic()
        self.metrics.polls.inc()
        self.metrics.poll_duration.observe(elapsed)
        self.metrics.last_poll.set(time.time())
        status = status_line(self.snapshot, self.pipeline)
        if not self._ready_sent:
            self.notifier.ready(status)
            self._ready_sent = True
        self.notifier.watchdog(status)
        log.debug("poll_completed", duration_seconds=round(elapsed, 4), status=status)
        return self.snapshot

    def _route(self, result: PollResult) -> None:
        """The gateway sends requests only to engines that are up (or not yet known); its long lane follows their pools and prefill speed."""
        if self.gateway is not None:
            self.gateway.follow({n: e.phase for n, e in result.evidence.items()}, result.signals)

    # -- decisions and actions ----------------------------------------------------

    def carry_out(self, decision: Decision) -> None:
        """Log and count the decision, save the state it leads to, then start its actions (write-ahead)."""
        if decision.empty:
            return
        observe_decision(self.metrics, decision, self.dry_run)
        if self._record is not None:
            self._write_record(decision)
        self._store.save(self.pipeline, decision.wall - decision.t)
        if self.executor is not None:
            self.executor.submit(decision.actions)

    def _on_outcome(self, action: Action, outcome: Outcome) -> None:
        self.metrics.actions.labels(action.engine, action.kind, outcome.status).inc()
        self._actions.append(ActionView(time.time(), action.engine, action.kind, action.reason, outcome.status, outcome.detail))

    def _write_record(self, item: Sample | Decision) -> None:
        """A full disk must not stop the loop (and with it the watchdog): say so once per failure spell."""
        assert self._record is not None
        try:
            self._record.write(item)
        except OSError as exc:
            self._record_log.observe("record", f"{self._record.path}: {exc.strerror or exc}")
        else:
            self._record_log.observe(None, None)
