"""Notifications, the imperative shell: breaker actions and Alertmanager alerts in, messages out, nothing lost.

``record`` (the breaker's notify actions) and ``alertmanager`` feed the pure
lifecycle (``alerts.py``); ``tick`` asks it what is due and writes each
message to the durable outbox, one envelope per channel and recipient,
before the lifecycle's new state is committed (a message that cannot be
stored is asked for again next tick); ``drain`` delivers what is due and
acts on each outcome as ``outbox.py`` and ``sms.py`` describe. Every
message is also written to the log (event ``notification``) with the exact
text an SMS would carry, which is all the demo's channel does.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol

import aiohttp

from guardian import logs
from guardian.actions.outcome import Outcome
from guardian.notify import alertmanager
from guardian.notify.alerts import Alert, AlertParams, AlertState, Contact, Outgoing, ack, due, from_disk, observe, to_disk
from guardian.notify.outbox import Envelope, Outbox
from guardian.notify.sms import Sent, TwilioSender, mask
from guardian.notify.sms_text import fit
from guardian.policy.response import Action
from guardian.state import StateFile

log = logs.get("guardian.notify")

POSSIBLY_DUPLICATE = "(possible duplicate)"
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_CAP_SECONDS = 300.0
AUTH_RETRY_SECONDS = 60.0


class Deliverer(Protocol):
    channel: str

    async def deliver(self, env: Envelope) -> Sent: ...


@dataclass(frozen=True)
class Settings:
    params: AlertParams
    contacts: tuple[Contact, ...]
    max_segments: int = 3
    valid_seconds: Mapping[str, float] = field(default_factory=dict)  # severity -> how long a message is worth sending

    def validity(self, severity: str) -> float:
        return self.valid_seconds.get(severity, 3600.0)


class SmsDeliverer:
    channel = "sms"

    def __init__(self, sender: TwilioSender, max_segments: int) -> None:
        self.sender = sender
        self.max_segments = max_segments

    async def deliver(self, env: Envelope) -> Sent:
        body = render(env, env.max_segments or self.max_segments)
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.sender.send, env.to, body), self.sender.timeout + 5)
        except asyncio.TimeoutError:
            return Sent("uncertain", "the Twilio call did not return in time; it may have sent the message")


class WebhookDeliverer:
    """A generic JSON webhook (a chat bridge, an incident tool): one POST per message and recipient."""

    channel = "webhook"

    def __init__(self, url: str, session: aiohttp.ClientSession, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = url
        self._session = session
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def deliver(self, env: Envelope) -> Sent:
        doc = {"to": env.to, "severity": env.severity, "kind": env.kind, "alerts": list(env.keys),
               "text": render(env, 10), "possibly_duplicate": env.possibly_duplicate, "id": env.id}  # fmt: skip
        try:
            async with self._session.post(self.url, json=doc, headers=self._headers, timeout=self._timeout) as resp:
                await resp.read()
                if resp.status < 300:
                    return Sent("sent", f"HTTP {resp.status}", sid=env.id)
                if resp.status == 429 or resp.status >= 500:
                    return Sent("retry", f"HTTP {resp.status}")
                return Sent("permanent", f"HTTP {resp.status}")
        except asyncio.TimeoutError:
            return Sent("uncertain", "the webhook did not answer in time")
        except aiohttp.ClientConnectorError as exc:
            return Sent("retry", f"cannot connect: {exc.os_error.strerror or exc}")
        except (aiohttp.ClientError, OSError) as exc:
            return Sent("uncertain", f"{type(exc).__name__}: {exc}")


def render(env: Envelope, max_segments: int) -> str:
    facts = ((POSSIBLY_DUPLICATE,) if env.possibly_duplicate else ()) + env.facts
    return fit(list(facts), max_segments)


class Notifications:
    def __init__(
        self,
        settings: Settings,
        state_file: StateFile,
        outbox: Outbox,
        deliverers: Mapping[str, Deliverer],
        on_result: Callable[[str, str, str], None] = lambda channel, outcome, reason: None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.deliverers = dict(deliverers)
        self.outbox = outbox
        self._state_file = state_file
        self._on_result = on_result
        self._clock = clock
        self._rng = rng or random.Random()
        self.state = AlertState()
        self._saved: dict[str, Any] | None = None
        self._draining = False

    # -- start -----------------------------------------------------------------------

    def start(self) -> None:
        try:
            loaded = self._state_file.load(from_disk)
        except OSError as exc:
            log.error("alert_state_unreadable", file=str(self._state_file.path), reason=exc.strerror or str(exc),
                      detail="starting with no alerts: firing ones are told again")  # fmt: skip
        else:
            if loaded.quarantined is not None:
                log.error("alert_state_quarantined", moved_to=str(loaded.quarantined), reason=loaded.reason,
                          detail="starting with no alerts: firing ones are told again")  # fmt: skip
            elif loaded.value is not None:
                self.state, self._saved = loaded.value, loaded.data
        try:
            for env in self.outbox.recover():
                log.warning("notification_outcome_unknown", channel=env.channel, to=_shown(env), keys=list(env.keys),
                            detail="guardian stopped while sending it: it goes again, marked possibly duplicate")  # fmt: skip
        except OSError as exc:
            log.error("outbox_unreadable", dir=str(self.outbox.dir), reason=exc.strerror or str(exc))

    # -- in ----------------------------------------------------------------------------

    def record(self, action: Action) -> Outcome:
        """A breaker notify action as an alert: warnings and pages fire, "back to L0" resolves the engine's alerts."""
        severity = action.details.get("severity", "warning")
        more = action.details.get("more")
        text = f"{action.engine} L{action.level} {action.reason}: {action.details.get('text', '')}" + (f"; {more}" if more else "")
        now = self._clock()
        if severity == "info":
            for key, tracked in list(self.state.alerts.items()):
                a = tracked.alert
                if a.subject == action.engine and a.source == "guardian" and tracked.firing:
                    self.state = observe(self.state, a, False, now)
            self._save()
            return Outcome("notify", "done", f"{action.engine}'s alerts resolved")
        name = "breaker" if action.reason not in ("restart_failed", "restart_budget_exhausted") else action.reason
        self.state = observe(self.state, Alert(name, action.engine, severity, text), True, now)
        self._save()
        return Outcome("notify", "done", f"alert {name}/{action.engine} firing ({severity})")

    def alertmanager(self, payload: Any) -> int:
        """Alertmanager's alerts, in the outbox before this returns; raises OSError when they cannot be stored."""
        alerts = alertmanager.parse(payload)
        now = self._clock()
        state = self.state
        for alert, firing in alerts:
            state = observe(state, alert, firing, now)
        state, out = due(state, now, self.settings.params, self.settings.contacts)
        self._queue(out, now)  # raises: nothing committed, Alertmanager gets a 5xx and sends again
        self.state = state
        self._save(strict=True)
        return len(alerts)

    def ack(self, key: str, who: str) -> bool:
        self.state, found = ack(self.state, key, who)
        if found:
            log.info("alert_acknowledged", key=key, who=who)
            self._save()
        return found

    # -- out ----------------------------------------------------------------------------

    def tick(self) -> None:
        now = self._clock()
        state, out = due(self.state, now, self.settings.params, self.settings.contacts)
        try:
            self._queue(out, now)
        except OSError as exc:
            log.error("outbox_unwritable", dir=str(self.outbox.dir), reason=exc.strerror or str(exc),
                      detail="the messages stay due and are tried again next tick")  # fmt: skip
            for _ in out:
                self._on_result("outbox", "failed", "unwritable")
            return
        self._commit(state)

    async def drain(self) -> None:
        if self._draining:
            return
        self._draining = True
        try:
            for env in self.outbox.all():
                now = self._clock()
                if env.next_try > now:
                    continue
                if now > env.valid_until:
                    self.outbox.remove(env)
                    self._on_result(env.channel, "dropped", "expired")
                    log.error("notification_expired", channel=env.channel, to=_shown(env), keys=list(env.keys),
                              attempts=env.attempts, last_error=env.last_error,
                              age_seconds=round(now - env.created))  # fmt: skip
                    continue
                deliverer = self.deliverers.get(env.channel)
                if deliverer is None:
                    continue  # the channel left the config; the message waits for it or for its validity
                sending = replace(env, state="sending", attempts=env.attempts + 1)
                try:
                    self.outbox.put(sending)  # before the call: a crash now means "outcome unknown"
                except OSError as exc:
                    log.error("outbox_unwritable", dir=str(self.outbox.dir), reason=exc.strerror or str(exc))
                    return
                self._settle(sending, await deliverer.deliver(sending))
        finally:
            self._draining = False

    def depth_and_oldest(self) -> tuple[int, float | None]:
        return self.outbox.depth_and_oldest(self._clock())

    # -- inside -------------------------------------------------------------------------

    def _queue(self, out: list[Outgoing], now: float) -> None:
        for o in out:
            envs = [
                self.outbox.new(channel=ch, to=o.to.number if ch == "sms" else o.to.name, severity=o.severity,
                                facts=o.facts, keys=o.keys, kind=o.kind, created=now,
                                valid_until=now + self.settings.validity(o.severity))  # fmt: skip
                for ch in self.deliverers
            ]
            for env in envs:
                self.outbox.put(env)
            log.warning("notification", severity=o.severity, kind=o.kind, to=o.to.name, number=mask(o.to.number),
                        keys=list(o.keys), channels=sorted(self.deliverers) or ["log"],
                        text=fit(list(o.facts), self.settings.max_segments))  # fmt: skip

    def _settle(self, env: Envelope, sent: Sent) -> None:
        now = self._clock()
        fields = dict(channel=env.channel, to=_shown(env), keys=list(env.keys), attempt=env.attempts, detail=sent.detail)
        if sent.result == "sent":
            self.outbox.remove(env)
            self._on_result(env.channel, "sent", "duplicate" if env.possibly_duplicate else "ok")
            log.info("notification_sent", sid=sent.sid, possibly_duplicate=env.possibly_duplicate, **fields)
            return
        if sent.result == "permanent" or (sent.result == "too_long" and env.max_segments == 1):
            self.outbox.remove(env)
            self._on_result(env.channel, "dropped", f"code_{sent.code}" if sent.code else "refused")
            log.error("notification_dropped", code=sent.code, **fields)
            return
        if sent.result == "too_long":
            again = replace(env, state="pending", max_segments=1, next_try=now, last_error=sent.detail)
        else:
            delay = self._backoff(env.attempts) if sent.result != "auth" else max(AUTH_RETRY_SECONDS, self._backoff(env.attempts))
            again = replace(env, state="pending", next_try=now + delay, last_error=sent.detail,
                            possibly_duplicate=env.possibly_duplicate or sent.result == "uncertain")  # fmt: skip
            fields["retry_in_seconds"] = round(delay, 1)
        self.outbox.put(again)
        self._on_result(env.channel, "retried", sent.result)
        if sent.result == "auth":
            log.error("twilio_auth_failed", **fields)
        else:
            log.warning("notification_retry", reason=sent.result, **fields)

    def _backoff(self, attempts: int) -> float:
        """Exponential with full jitter in its upper half: spreads retries, never hammers a struggling API."""
        ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** max(0, attempts - 1))
        return ceiling * self._rng.uniform(0.5, 1.0)

    def _commit(self, state: AlertState) -> None:
        self.state = state
        self._save()

    def _save(self, strict: bool = False) -> None:
        data = to_disk(self.state)
        if data == self._saved:
            return
        try:
            self._state_file.save(data)
            self._saved = data
        except OSError as exc:
            log.error("alert_state_unwritable", file=str(self._state_file.path), reason=exc.strerror or str(exc))
            if strict:
                raise


def _shown(env: Envelope) -> str:
    return mask(env.to) if env.channel == "sms" else env.to
