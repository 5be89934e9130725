"""The running parts built from a config: engines' scrapers, notification channels, actuators, the gateway.

One place builds them, at start and again on a reload, so what a reload
changes is exactly what a start would have built from the same file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import aiohttp

from guardian import config as cfg
from guardian import logs
from guardian.actions.executor import EngineActuators, Executor
from guardian.actions.gateway import Gateway
from guardian.actions.launcher import ChildLauncher, Launcher, SystemdLauncher
from guardian.actions.outcome import Outcome
from guardian.actions.vllm_admin import VllmAdmin
from guardian.clock import steady_time
from guardian.exporter import Metrics
from guardian.gateway.metrics import GatewayMetrics
from guardian.gateway.proxy import GatewayServer, GatewaySettings
from guardian.notify.alerts import Contact
from guardian.notify.outbox import Outbox
from guardian.notify.service import Deliverer, Notifications, Settings, SmsDeliverer, WebhookDeliverer
from guardian.notify.sms import TwilioSender, read_token
from guardian.pipeline import Pipeline
from guardian.policy import response
from guardian.policy.buckets import Bucket
from guardian.policy.response import Action
from guardian.sources.process import ProcessSource
from guardian.sources.vllm import VllmScraper
from guardian.state import StateFile

log = logs.get("guardian.daemon")

ALERTS_FILE = "alerts.json"
LOG_ONLY = Contact("log", "-")  # the recipient when no on-call list is configured: messages are only logged


class StartupError(RuntimeError):
    """The daemon cannot start as configured (the message says what to change)."""


@dataclass
class EngineHandle:
    section: cfg.EngineSection
    scraper: VllmScraper
    processes: ProcessSource | None
    api_key: str | None  # for a proxy in front of vLLM; the gateway sends it upstream too

    def close(self) -> None:
        """Its kept-alive connections closed (its process source closes its files when it is dropped)."""
        self.scraper.close()


def build_engines(config: cfg.Config) -> dict[str, EngineHandle]:
    engines: dict[str, EngineHandle] = {}
    for section in config.engines:
        try:
            api_key = section.read_api_key()
        except OSError as exc:
            log.error("api_key_unreadable", engine=section.name, file=str(section.api_key_file), reason=exc.strerror)
            api_key = None
        engines[section.name] = EngineHandle(
            section=section,
            scraper=VllmScraper(section.name, section.url, config.guardian.scrape_timeout, api_key),
            processes=ProcessSource(section.process) if section.process else None,
            api_key=api_key,
        )
    return engines


def build_notifications(config: cfg.Config, metrics: Metrics, deliverers: Mapping[str, Deliverer] | None,
                        session: aiohttp.ClientSession) -> Notifications:  # fmt: skip
    """Notifications with ``deliverers`` (tests bring their own) or the channels ``[notify]`` configures."""
    n = config.notify
    contacts = tuple(Contact(c.name, c.number) for c in n.oncall) or (LOG_ONLY,)  # the lifecycle runs, the log tells
    settings = Settings(n.alert_params, contacts,
                        n.sms.max_segments if n.sms else 3,
                        {"page": n.page_valid_seconds, "warning": n.warning_valid_seconds, "info": n.warning_valid_seconds})  # fmt: skip
    chosen = dict(deliverers) if deliverers is not None else channels(config, session)
    state_dir = config.guardian.state_dir
    return Notifications(settings, StateFile(state_dir / ALERTS_FILE), Outbox(state_dir / "outbox", metrics.outbox_quarantined.inc), chosen,
                         on_result=lambda ch, outcome, reason: metrics.notifications.labels(ch, outcome, reason).inc(),
                         clock=steady_time)  # fmt: skip


def channels(config: cfg.Config, session: aiohttp.ClientSession) -> dict[str, Deliverer]:
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
        token_file = n.webhook.token_file
        token = token_file.read_text().strip() if token_file and token_file.exists() else None
        out["webhook"] = WebhookDeliverer(n.webhook.url, session, token, n.webhook.timeout_seconds)
    return out


def build_actuators(config: cfg.Config, engines: Mapping[str, EngineHandle], session: aiohttp.ClientSession,
                    launchers: Mapping[str, Launcher]) -> dict[str, EngineActuators]:  # fmt: skip
    """Each engine's means of action; ``launchers`` are the simulator's (demo, tests), else from ``[engines.restart]``."""
    out = {}
    for section in config.engines:
        engine = engines[section.name]
        restart = section.restart
        out[section.name] = EngineActuators(
            name=section.name,
            healthy=engine.scraper.health,
            load=engine.scraper.load,
            admin=VllmAdmin(section.url, session) if section.dev_mode else None,
            launcher=launchers.get(section.name) or launcher_for(section, config.guardian.state_dir),
            base_args=config.base_args(section),
            backend=restart.attention_backend if restart else "flash_attn",
        )
    return out


def build_executor(config: cfg.Config, actuators: dict[str, EngineActuators], gateway: Gateway, notifications: Notifications,
                   pipeline: Pipeline, dry_run: bool, on_outcome: Callable[[Action, Outcome], None]) -> Executor:  # fmt: skip
    executor = Executor(actuators, gateway, notifications.record, config.actions.degraded.layer(),
                        config.actions.timeouts, dry_run=dry_run, on_outcome=on_outcome)  # fmt: skip
    for name, state in pipeline.states.items():
        executor.assume_applied(name, response.restart_details(state, response.Evidence()))
    return executor


def reconfigure_executor(executor: Executor, config: cfg.Config, actuators: dict[str, EngineActuators]) -> None:
    """A reload: new actuators and restart settings; restarts in flight finish with what they started with."""
    executor.engines = actuators
    executor.degraded = config.actions.degraded.layer()
    executor.timeouts = config.actions.timeouts


async def start_gateway(config: cfg.Config, metrics: Metrics, engines: Mapping[str, EngineHandle]) -> GatewayServer:
    g = config.gateway
    assert g is not None
    settings = gateway_settings(config)
    api_keys = {name: engine.api_key for name, engine in engines.items()}
    gateway = GatewayServer(settings, {e.name: e.url for e in config.engines},
                            GatewayMetrics(metrics.registry, metrics.listener), api_keys)  # fmt: skip
    host, port = cfg.parse_listen(g.listen)
    try:
        await gateway.start(host, port)
    except OSError as exc:
        raise StartupError(f"cannot listen on {g.listen} (gateway.listen): {exc.strerror or exc}") from None
    log.info("gateway_started", listen=f"{gateway.address[0]}:{gateway.address[1]}" if gateway.address else None,
             buckets=[f"{b.name}<={b.max_tokens}" for b in settings.buckets])  # fmt: skip
    return gateway


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
        long_prefill_share=g.long_prefill_share, long_flood_share=g.long_flood_share,
        priority_header=g.priority_header.lower(),
        high_priority_keys=keys, inject_priority=g.inject_priority, high_priority_engines=tuple(g.high_priority_engines),
        priorities=tuple((str(lane), c.priority) for lane, c in config.tuner.classes.items()),
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
