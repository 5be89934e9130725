"""The imperative shell: read every source each poll, derive signals, export, tell systemd.

The poll runs on a monotonic ticker (``ticker.py``; a stepped wall clock
changes nothing): a slow poll makes the next one wait or be skipped and
counted, never run twice at once. Everything that can block (NVML, /proc) runs in worker
threads with timeouts; everything that can fail becomes a reading with a
reason. The watchdog is pinged only from a poll that completed, so a wedged
loop is restarted by systemd.

Each poll's sample goes through the ``Pipeline`` (signals, leak detectors,
breaker, response) and its decision is carried out by the ``Executor``. The
policy state is saved before any action starts (write-ahead), so a
``kill -9`` mid-transition restarts at the level it had reached, with the
restarts it had spent.
"""

from __future__ import annotations

import asyncio
import hmac
import signal
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, TextIO
from urllib.parse import urlsplit

import aiohttp
import psutil
import pynvml
from aiohttp import web

from guardian import config as cfg
from guardian import logs
from guardian.actions.executor import EngineActuators, Executor
from guardian.actions.gateway import Gateway, NoGateway
from guardian.actions.launcher import ChildLauncher, Launcher, ProcessStatus, SystemdLauncher
from guardian.actions.outcome import Outcome
from guardian.actions.vllm_admin import VllmAdmin
from guardian.analysis.memory import MemoryReport
from guardian.clock import steady_time
from guardian.exporter import Metrics, make_app
from guardian.gateway.proxy import GatewayMetrics, GatewayServer, GatewaySettings
from guardian.listener import serve
from guardian.policy.buckets import Bucket
from guardian.notify.outbox import Outbox
from guardian.notify.service import Deliverer, Notifications, Settings, SmsDeliverer, WebhookDeliverer
from guardian.notify.sms import TwilioSender, read_token
from guardian.notify import alertmanager
from guardian.notify.alerts import Contact
from guardian.pipeline import Decision, Pipeline, PollResult, tuner_move
from guardian.policy import response, tuner
from guardian.policy.response import Action, Command
from guardian.record import SampleRecorder
from guardian.sample import EngineReading, NvmlReading, ProcReading, Sample
from guardian.sdnotify import Notifier, watchdog_interval
from guardian.snapshot import ActionView, AlertView, PolicyView, Snapshot
from guardian.summary_line import summary
from guardian.sources.nvml import NvmlSource
from guardian.sources.offloop import OffloopWorker, WorkerBusy
from guardian.sources.process import ProcessSource
from guardian.sources.vllm import VllmScraper
from guardian.state import StateFile
from guardian.ticker import Ticker

log = logs.get("guardian.daemon")

STATE_FILE = "state.json"
ALERTS_FILE = "alerts.json"
NOTIFY_EVERY_SECONDS = 1.0
LAST_ACTIONS = 8  # kept for /status and guardian status
SUMMARY_EVERY_SECONDS = 5.0
LOG_ONLY = Contact("log", "-")  # the recipient when no on-call list is configured: messages are only logged

REPEAT_FAILURE_LOG_EVERY = 60  # polls: a persisting failure is logged again this often


@dataclass
class _Engine:
    section: cfg.EngineSection
    scraper: VllmScraper
    processes: ProcessSource | None
    api_key: str | None  # for a proxy in front of vLLM; the gateway sends it upstream too


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
        dry_run: bool = False,
        launchers: Mapping[str, Launcher] | None = None,
        gateway: Gateway | None = None,
        deliverers: Mapping[str, Deliverer] | None = None,
        summary_to: TextIO | None = None,
    ) -> None:
        self.config = config
        self._summary_to = summary_to  # a terminal: one line of what moved every SUMMARY_EVERY_SECONDS
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
        self.pipeline = Pipeline(config, psutil.virtual_memory().total)
        self.dry_run = dry_run or config.actions.dry_run
        self._launchers = dict(launchers or {})  # the simulator's, in the demo and tests
        self._gateway: Gateway = gateway or NoGateway()
        self.gateway: GatewayServer | None = None  # the admission gateway, when [gateway] is configured
        self._deliverers = deliverers  # tests bring their own; else from [notify]
        self.notifications: Notifications | None = None
        self.executor: Executor | None = None
        self._state = StateFile(config.guardian.state_dir / STATE_FILE)
        self._state_log = _FailureLog("state")
        self._saved: dict[str, Any] | None = None
        self._leaking: dict[str, bool] = {}
        self._record = record
        self._record_log = _FailureLog("record")
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._http_server: asyncio.Server | None = None
        self.poller: Ticker | None = None  # the poll, every poll_interval_seconds of the monotonic clock
        self._notifier_ticker: Ticker | None = None
        self._stop = asyncio.Event()
        self._ready_sent = False
        self._resuming: asyncio.Task[None] | None = None
        self._actions: deque[ActionView] = deque(maxlen=LAST_ACTIONS)  # for /status and guardian status

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=4))
        self._build_engines(self.config)
        for note in self.config.warnings():
            log.warning("config_warning", detail=note)
        self._restore_state()
        if self.config.gateway is not None:
            await self._start_gateway(self.config)
        self.notifications = self._build_notifications(self.config)
        self.notifications.start()
        self.executor = self._build_executor(self.config)
        self.executor.submit(self._reconcile())
        await self._start_children()
        self._resuming = asyncio.create_task(self._resume_paused())
        if self._record is not None:
            self._record.header = record_header(self.config, self.pipeline.host_memory)
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
            state=str(self._state.path),
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
            summary = asyncio.create_task(self._print_summaries()) if self._summary_to is not None else None
            await self._stop.wait()
            if summary is not None:
                summary.cancel()
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
            self._api,
        )
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
        self.pipeline.reconfigure(new)
        self.dry_run = self.dry_run or new.actions.dry_run
        if self.notifications is not None:
            fresh = self._build_notifications(new)
            self.notifications.settings, self.notifications.deliverers = fresh.settings, fresh.deliverers
        if self.executor is not None:
            self.executor.engines = self._actuators(new)
            self.executor.degraded = new.actions.degraded.layer()
            self.executor.timeouts = new.actions.timeouts
        if new.gateway != old.gateway:
            log.warning("config_reload_partial", key="gateway", detail="the gateway's settings change only on restart")
        if new.guardian.state_dir != old.guardian.state_dir:
            log.warning("config_reload_partial", key="guardian.state_dir", running=str(old.guardian.state_dir),
                        new=str(new.guardian.state_dir), detail="the state directory changes only on restart")  # fmt: skip
        if self.poller is not None:
            self.poller.interval = new.guardian.poll_interval_seconds  # from the next tick on
        self.metrics.reloads.labels("applied").inc()
        log.info("config_reloaded", config=str(self.config_path), engines=[e.name for e in new.engines])
        self.notifier.ready(self._status_line())
        return True

    def _build_engines(self, config: cfg.Config) -> None:
        assert self._session is not None
        g = config.guardian
        engines: dict[str, _Engine] = {}
        for section in config.engines:
            try:
                api_key = section.read_api_key()
            except OSError as exc:
                log.error("api_key_unreadable", engine=section.name, file=str(section.api_key_file), reason=exc.strerror)
                api_key = None
            engines[section.name] = _Engine(
                section=section,
                scraper=VllmScraper(section.name, section.url, self._session, g.scrape_timeout, api_key),
                processes=ProcessSource(section.process) if section.process else None,
                api_key=api_key,
            )
            self._engine_logs.setdefault(section.name, _FailureLog(f"engine:{section.name}"))
        self._engines = engines

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
        scrapes = asyncio.gather(*(e.scraper.scrape() for e in engines))
        nvml, (procs, statuses), scraped = await asyncio.gather(self._read_nvml(), self._read_processes(engines), scrapes)
        readings = [_with_processes(r, procs.get(r.name), statuses.get(r.name)) for r in scraped]
        sample = Sample(t=started, wall=wall, nvml=nvml, engines=tuple(readings),
                        gateway=self.gateway.loads() if self.gateway is not None else ())  # fmt: skip
        previous = self.snapshot.engines if self.snapshot else {}
        finished = self.executor.finished(before=started) if self.executor else {}
        result = self.pipeline.step(sample, finished)
        for engine, reading in zip(engines, readings):
            name = engine.section.name
            before = previous[name].restarts_total if name in previous else 0
            self._observe_engine(engine, reading, before, result.signals[name].restarts_total)
        self._nvml_failures = 0 if nvml.ok else self._nvml_failures + 1
        self._nvml_log.observe(None if nvml.ok else "nvml", nvml.error)
        self._observe_memory(sample, result.memory)
        self._route(result)
        if self._record is not None:
            self._write_record(sample)
        self._carry_out(result.decision)
        elapsed = time.monotonic() - started
        self.snapshot = Snapshot(
            sample=sample,
            engines=result.signals,
            nvml_lost=self._nvml_failures >= self.config.guardian.telemetry_lost_after_polls,
            poll_seconds=elapsed,
            memory=result.memory,
            urls={e.section.name: e.section.url for e in engines},
            policy=self._policy_view(),
            costs=result.costs,
            marginals={n: m for n in result.costs if (m := self.pipeline.marginal(n)) is not None},
            gateway=self.gateway.views() if self.gateway is not None else {},
            alerts=self._alert_views(),
            actions=tuple(self._actions),
        )
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

    # -- decisions and actions ----------------------------------------------------

    def _carry_out(self, decision: Decision) -> None:
        """Log and count the decision, save the state it leads to, then start its actions (write-ahead)."""
        if decision.empty:
            return
        for name, tr in decision.transitions:
            self.metrics.transitions.labels(name, f"L{int(tr.source)}", f"L{int(tr.target)}", _reason(tr.rule)).inc()
            (log.warning if tr.target > tr.source else log.info)(
                "breaker_transition", engine=name, source=f"L{int(tr.source)}", target=f"L{int(tr.target)}",
                rule=tr.rule, forced=tr.forced, dry_run=self.dry_run,
                **{k: (round(v, 4) + 0.0 if isinstance(v, float) else v) for k, v in tr.numbers.items()},  # + 0.0: no -0.0
            )  # fmt: skip
        for action in decision.actions:
            if action.kind == "restart" and not self.dry_run:
                self.metrics.restarts.labels(action.engine, action.reason).inc()
            if (found := tuner_move(action)) is not None:
                move, numbers = found
                self.metrics.tuner_moves.labels(action.engine, move, action.reason).inc()
                log.info("tuner_move", engine=action.engine, kind=move, reason=action.reason,
                         restart=action.kind == "restart", dry_run=self.dry_run,
                         **{k: v for k, v in numbers.items() if k != "move"})  # fmt: skip
        if self._record is not None:
            self._write_record(decision)
        self._save_state(decision.wall - decision.t)
        if self.executor is not None:
            self.executor.submit(decision.actions)

    def _on_outcome(self, action: Action, outcome: Outcome) -> None:
        self.metrics.actions.labels(action.engine, action.kind, outcome.status).inc()
        self._actions.append(ActionView(time.time(), action.engine, action.kind, action.reason, outcome.status, outcome.detail))

    def _alert_views(self) -> tuple[AlertView, ...]:
        if self.notifications is None:
            return ()
        return tuple(AlertView(t.alert.key, t.alert.severity, t.firing, t.first_seen, t.acked_by, t.notified_at is not None, t.alert.summary)
                     for t in self.notifications.state.alerts.values())  # fmt: skip

    def _policy_view(self) -> PolicyView:
        return PolicyView(
            states=dict(self.pipeline.states),
            budget=self.config.actions.restart_budget,
            budget_left={name: self.pipeline.budget_left(name) for name in self.pipeline.states},
            dry_run=self.dry_run,
            restarting=self.executor.restarting if self.executor else [],
            tuners=dict(self.pipeline.tuners),
            tuner_limits=dict(self.pipeline.tuner_limits),
            tuner_holds=dict(self.pipeline.tuner_holds),
            phases={name: self.pipeline.phase(name) for name in self.pipeline.states},
        )

    def _refused(self, token: str | None) -> tuple[int, dict[str, Any]] | None:
        """None when ``token`` is the API token; else the answer for the caller."""
        try:
            expected = self.config.guardian.read_api_token()
        except OSError as exc:
            log.error("api_token_unreadable", reason=exc.strerror or str(exc))
            return 503, {"error": "guardian cannot read its API token"}
        if expected is None:
            return 403, {"error": "the API is off: set guardian.api_token_file (or LoadCredential=api-token)"}
        # a header of bytes that are not UTF-8 arrives as surrogate escapes: compared as the bytes sent, never a crash
        if token is None or not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), expected.encode()):
            return 401, {"error": "missing or wrong bearer token"}
        return None

    async def _api(self, token: str | None, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        """guardian's authenticated API: breaker force/clear, alert ack, Alertmanager's webhook."""
        refused = self._refused(token)
        if refused is not None:
            return refused
        if path.startswith("breaker/"):
            return self._breaker_api(path.removeprefix("breaker/"), body)
        if path == "alerts/ack":
            return self._ack_api(body)
        if path == "alertmanager":
            return self._alertmanager_api(body)
        return 404, {"error": f"no API at /api/v1/{path}"}

    def _ack_api(self, body: Any) -> tuple[int, dict[str, Any]]:
        assert self.notifications is not None
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            return 400, {"error": 'send {"key": "breaker/ENGINE", "who": "..."}'}
        who = str(body.get("who") or "api")[:64]
        if not self.notifications.ack(body["key"], who):
            firing = sorted(k for k, t in self.notifications.state.alerts.items() if t.firing)
            return 404, {"error": f"no firing alert {body['key']!r}", "firing": firing}
        return 200, {"key": body["key"], "acknowledged_by": who}

    def _alertmanager_api(self, body: Any) -> tuple[int, dict[str, Any]]:
        assert self.notifications is not None
        try:
            count = self.notifications.alertmanager(body)
        except alertmanager.PayloadError as exc:
            return 400, {"error": str(exc)}
        except OSError as exc:  # not stored: Alertmanager retries on 5xx, never on 4xx
            log.error("alertmanager_not_queued", reason=exc.strerror or str(exc))
            return 503, {"error": "guardian could not store the alerts durably; send them again"}
        return 200, {"alerts": count}

    def _breaker_api(self, engine: str, body: Any) -> tuple[int, dict[str, Any]]:
        """``POST /api/v1/breaker/ENGINE``: force or clear, for an operator holding the API token."""
        if engine not in self.pipeline.states:
            return 404, {"error": f"no engine {engine!r}; known: {', '.join(sorted(self.pipeline.states)) or 'none'}"}
        if not isinstance(body, dict) or body.get("action") not in ("force", "clear"):
            return 400, {"error": 'send {"action": "force", "level": 0-3, "who": "..."} or {"action": "clear", "who": "..."}'}
        level = body.get("level")
        if body["action"] == "force" and (not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 3):
            return 400, {"error": "force needs an integer level from 0 to 3"}
        who = str(body.get("who") or "api")[:64]
        cmd = Command(body["action"], engine, who, level if body["action"] == "force" else None)
        t = time.monotonic()
        decision = self.pipeline.command(cmd, t, time.time())
        self._carry_out(decision)
        state = self.pipeline.states[engine]
        return 200, {"engine": engine, "level": int(state.breaker.level), "forced": state.breaker.forced,
                     "forced_by": state.breaker.forced_by, "dry_run": self.dry_run}  # fmt: skip

    def _restore_state(self) -> None:
        """Start from the saved level and restart history; a corrupt file is set aside and spends the budget."""
        offset = time.time() - time.monotonic()
        try:
            loaded = self._state.load(lambda data: (
                {name: response.from_disk(doc, offset) for name, doc in data["engines"].items()},
                {name: tuner.from_disk(doc, offset) for name, doc in data.get("tuner", {}).items()},
            ))  # fmt: skip
        except OSError as exc:
            log.error("state_unreadable", file=str(self._state.path), reason=exc.strerror or str(exc),
                      detail="starting at L0 with no restart history")  # fmt: skip
            return
        if loaded.quarantined is not None:
            log.error("state_quarantined", file=str(self._state.path), moved_to=str(loaded.quarantined),
                      reason=loaded.reason, detail="starting conservatively: the restart budget counts as spent for one window")  # fmt: skip
            self._spend_budget()
            return
        if loaded.value is None:
            return
        engines: dict[str, response.EngineState] = loaded.value[0]
        for name, tuned in loaded.value[1].items():
            if self.config.tuned(name):
                self.pipeline.tuners[name] = tuned
                log.info("tuner_restored", engine=name, batch=tuned.batch, max_num_seqs=tuned.max_num_seqs,
                         speculation=tuned.speculation, tuning_restarts_today=len(tuned.restarts))  # fmt: skip
        for name, state in engines.items():
            if name in self.pipeline.states:
                self.pipeline.states[name] = state
                log.info("state_restored", engine=name, breaker_level=f"L{int(state.breaker.level)}",
                         forced_by=state.breaker.forced_by, restarts_in_window=len(state.restarts),
                         degraded=state.degraded, gpu_memory_utilization=state.gpu_memory_utilization)  # fmt: skip
        self._saved = loaded.data

    async def _start_children(self) -> None:
        """With the child launcher guardian owns the engine: start it unless it already runs (from an earlier guardian).

        An engine an earlier guardian started is adopted only when its identity
        checks out; its orphans (a server killed, its engine core left) are
        stopped by the start. With no identity kept, a process listening on the
        engine's port is adopted if it is the engine's command and otherwise
        left alone, and no second engine is started beside it.
        """
        assert self.executor is not None
        for name, act in self.executor.engines.items():
            if not isinstance(act.launcher, ChildLauncher) or await act.launcher.alive() is not False:
                continue
            if act.launcher.identity() is None and (found := act.launcher.adopt_listener()) is not None:
                (log.info if found.ok else log.error)("engine_start_skipped", engine=name, outcome=found.status,
                                                      detail=found.detail)  # fmt: skip
                continue
            args = self.executor.args_for(name, response.restart_details(self.pipeline.states[name], response.Evidence()))
            if self.dry_run:
                log.warning("action_planned", dry_run=True, engine=name, kind="start", argv=act.launcher.command)
                continue
            outcome = await act.launcher.restart(args)
            (log.info if outcome.ok else log.error)("engine_started", engine=name, launcher=act.launcher.describe,
                                                    outcome=outcome.status, detail=outcome.detail)  # fmt: skip

    async def _resume_paused(self) -> None:
        """An engine left paused by a guardian that died mid-drain is resumed: nothing else ever would."""
        assert self.executor is not None
        for name, act in self.executor.engines.items():
            if act.admin is None or name in self.executor.restarting:
                continue
            asked = await act.admin.is_paused()
            if asked.ok and isinstance(asked.body, dict) and asked.body.get("is_paused") is True:
                resumed = await act.admin.resume()
                (log.warning if resumed.ok else log.error)(
                    "engine_resumed", engine=name, outcome=resumed.status, detail=resumed.detail,
                    reason="found paused with no restart in progress (a guardian stopped during a drain?)",
                )  # fmt: skip

    def _reconcile(self) -> list[Action]:
        """A restored level's gates, set again: the run that entered it may have died before they were."""
        return [Action("gates", name, int(s.breaker.level), "restored")
                for name, s in self.pipeline.states.items() if s.breaker.level > 0]  # fmt: skip

    def _spend_budget(self) -> None:
        now = time.monotonic()
        for name, state in self.pipeline.states.items():
            self.pipeline.states[name] = replace(state, restarts=(now,) * self.config.actions.restart_budget)

    def _save_state(self, wall_offset: float) -> None:
        data: dict[str, Any] = {"engines": {name: response.to_disk(s, wall_offset) for name, s in self.pipeline.states.items()}}
        if self.pipeline.tuners:
            data["tuner"] = {name: tuner.to_disk(s, wall_offset) for name, s in self.pipeline.tuners.items()}
        if data == self._saved:
            return
        try:
            self._state.save(data)
        except OSError as exc:
            self._state_log.observe("state", f"{self._state.path}: {exc.strerror or exc}")
            return
        self._state_log.observe(None, None)
        self._saved = data

    async def _start_gateway(self, config: cfg.Config) -> None:
        g = config.gateway
        assert g is not None
        settings = gateway_settings(config)
        api_keys = {name: engine.api_key for name, engine in self._engines.items()}
        self.gateway = GatewayServer(settings, {e.name: e.url for e in config.engines},
                                     GatewayMetrics(self.metrics.registry, self.metrics.listener), api_keys)  # fmt: skip
        host, port = cfg.parse_listen(g.listen)
        try:
            await self.gateway.start(host, port)
        except OSError as exc:
            raise StartupError(f"cannot listen on {g.listen} (gateway.listen): {exc.strerror or exc}") from None
        self._gateway = self.gateway
        log.info("gateway_started", listen=f"{self.gateway.address[0]}:{self.gateway.address[1]}" if self.gateway.address else None,
                 buckets=[f"{b.name}<={b.max_tokens}" for b in settings.buckets])  # fmt: skip

    def _build_notifications(self, config: cfg.Config) -> Notifications:
        n = config.notify
        contacts = tuple(Contact(c.name, c.number) for c in n.oncall) or (LOG_ONLY,)  # the lifecycle runs, the log tells
        settings = Settings(n.alert_params, contacts,
                            n.sms.max_segments if n.sms else 3,
                            {"page": n.page_valid_seconds, "warning": n.warning_valid_seconds, "info": n.warning_valid_seconds})  # fmt: skip
        deliverers = dict(self._deliverers) if self._deliverers is not None else self._channels(config)
        state_dir = config.guardian.state_dir
        return Notifications(settings, StateFile(state_dir / ALERTS_FILE), Outbox(state_dir / "outbox", self.metrics.outbox_quarantined.inc), deliverers,
                             on_result=lambda ch, outcome, reason: self.metrics.notifications.labels(ch, outcome, reason).inc(),
                             clock=steady_time)  # fmt: skip

    def _channels(self, config: cfg.Config) -> dict[str, Deliverer]:
        n = config.notify
        out: dict[str, Deliverer] = {}
        if "sms" in n.channels and n.sms is not None:
            token = read_token()
            if token is None:
                log.error("sms_unavailable", detail="no Twilio auth token in $TWILIO_AUTH_TOKEN or the twilio-auth-token "
                          "credential: SMS wait in the outbox until one is configured (or they expire)")  # fmt: skip
            else:
                sender = TwilioSender(n.sms.account_sid, token, n.sms.from_number, n.sms.messaging_service_sid,
                                      n.sms.status_callback, n.sms.timeout_seconds, n.sms.api_url)  # fmt: skip
                out["sms"] = SmsDeliverer(sender, n.sms.max_segments)
        if "webhook" in n.channels and n.webhook is not None:
            assert self._session is not None
            token_file = n.webhook.token_file
            token = token_file.read_text().strip() if token_file and token_file.exists() else None
            out["webhook"] = WebhookDeliverer(n.webhook.url, self._session, token, n.webhook.timeout_seconds)
        return out

    def _build_executor(self, config: cfg.Config) -> Executor:
        assert self.notifications is not None
        executor = Executor(
            self._actuators(config), self._gateway, self.notifications.record, config.actions.degraded.layer(),
            config.actions.timeouts, dry_run=self.dry_run, on_outcome=self._on_outcome,
        )  # fmt: skip
        for name, state in self.pipeline.states.items():
            executor.assume_applied(name, response.restart_details(state, response.Evidence()))
        return executor

    def _actuators(self, config: cfg.Config) -> dict[str, EngineActuators]:
        assert self._session is not None
        out = {}
        for section in config.engines:
            engine = self._engines[section.name]
            restart = section.restart
            out[section.name] = EngineActuators(
                name=section.name,
                healthy=engine.scraper.health,
                load=engine.scraper.load,
                admin=VllmAdmin(section.url, self._session) if section.dev_mode else None,
                launcher=self._launchers.get(section.name) or launcher_for(section, config.guardian.state_dir),
                base_args=config.base_args(section),
                backend=restart.attention_backend if restart else "flash_attn",
            )
        return out

    def _write_record(self, item: Sample | Decision) -> None:
        """A full disk must not stop the loop (and with it the watchdog): say so once per failure spell."""
        assert self._record is not None
        try:
            self._record.write(item)
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

    async def _read_processes(
        self, engines: list[_Engine]
    ) -> tuple[dict[str, tuple[tuple[ProcReading, ...] | None, str | None]], dict[str, ProcessStatus]]:
        """Each engine's process tree (``[engines.process]``) and its launcher's word on its main process."""
        sources = [(e.section.name, e.processes) for e in engines if e.processes is not None]
        acts = self.executor.engines if self.executor else {}
        launchers = [(n, a.launcher) for n, a in acts.items() if a.launcher is not None]
        if not sources and not launchers:
            return {}, {}

        def read() -> tuple[dict[str, tuple[tuple[ProcReading, ...] | None, str | None]], dict[str, ProcessStatus]]:
            statuses = {n: st for n, launcher in launchers if (st := launcher.status()) is not None}
            return {n: src.read() for n, src in sources}, statuses

        try:
            return await self._proc_worker.call(read, timeout=2.0)
        except (WorkerBusy, asyncio.TimeoutError):
            return {n: (None, "process scan did not finish in time") for n, _ in sources}, {}

    def _route(self, result: PollResult) -> None:
        """The gateway sends requests only to engines that are up (or not yet known), and sizes its long queue by their pools."""
        if self.gateway is not None:
            self.gateway.follow({n: e.phase for n, e in result.evidence.items()},
                                {n: sig.kv_pool_tokens for n, sig in result.signals.items()})  # fmt: skip

    def _observe_engine(self, engine: _Engine, reading: EngineReading, restarts_before: int, restarts: int) -> None:
        name = engine.section.name
        if reading.error_kind:
            self.metrics.scrape_errors.labels(name, reading.error_kind).inc()
        self._engine_logs[name].observe(reading.error_kind, reading.error, url=engine.section.url)
        if restarts > restarts_before:
            log.warning("engine_restart_detected", engine=name, restarts=restarts)

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
        parts += [f"{name}: L{int(self.pipeline.level(name))} {sig.brief()}" for name, sig in snap.engines.items()]
        return "; ".join(parts)


def _with_processes(
    reading: EngineReading, procs: tuple[tuple[ProcReading, ...] | None, str | None] | None, status: ProcessStatus | None
) -> EngineReading:
    """The reading with its process tree and its launcher's word on its main process (``EngineReading.main_process``)."""
    if procs is not None:
        reading = replace(reading, processes=procs[0], process_error=procs[1])
    if status is not None:
        reading = replace(reading, process_alive=status.alive, process_started=status.started)
    return reading


def gateway_settings(config: cfg.Config) -> GatewaySettings:
    g = config.gateway
    assert g is not None
    every = tuple(e.name for e in config.engines)
    keys: frozenset[str] = frozenset()
    if g.high_priority_keys_file is not None:
        keys = frozenset(line.strip() for line in g.high_priority_keys_file.read_text().splitlines() if line.strip())
    return GatewaySettings(
        buckets=tuple(Bucket(b.name, b.max_tokens, tuple(b.engines) or every, b.preemptible) for b in g.buckets),
        chars_per_token=g.chars_per_token, long_context_tokens=g.long_context_tokens, concurrency=g.concurrency,
        queue_size=g.queue_size, queue_deadline_seconds=g.queue_deadline_seconds, restart_hold_seconds=g.restart_hold_seconds,
        priority_header=g.priority_header.lower(),
        high_priority_keys=keys, inject_priority=g.inject_priority, high_priority_engines=tuple(g.high_priority_engines),
        priorities=tuple((str(lane), c.priority) for lane, c in config.tuner.classes.items()) if config.tuner else GatewaySettings.priorities,
        extra_paths=tuple(g.extra_paths),
        max_body_bytes=g.max_body_bytes,
        listener=g.listener_limits,
    )  # fmt: skip


def record_header(config: cfg.Config, host_memory: float | None) -> dict[str, Any]:
    """What replay needs to decide as this run does: its parameters (no secrets) and the host's memory."""
    from guardian import __version__

    return {
        "guardian_version": __version__,
        "host_memory_bytes": host_memory,
        "config": config.model_dump(mode="json", exclude={"engines": {"__all__": {"api_key"}}}),
    }


def launcher_for(section: cfg.EngineSection, state_dir: Path) -> Launcher | None:
    restart = section.restart
    if restart is None:
        return None
    if restart.launcher == "systemd":
        assert restart.unit and restart.env_file
        return SystemdLauncher(restart.unit, restart.env_file)
    assert restart.command
    return ChildLauncher(restart.command, state_dir / f"{section.name}.pid", port=urlsplit(section.url).port)


def _reason(rule: str) -> str:
    """A bounded label value: operators' names stay in the log, not in metric labels."""
    return rule.split(" ", 1)[0] if rule.startswith(("forced", "cleared", "recovered")) else rule


def _wall(sample: Sample, t: float) -> str:
    """A monotonic time of this run as ISO wall-clock time."""
    return datetime.fromtimestamp(sample.wall_at(t), timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)

