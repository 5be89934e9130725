"""The alert lifecycle: who is told what, when, and how often. Pure; time (unix seconds) is an argument.

An alert is identified by its key (name + engine/GPU/instance). While it
fires it is told once, then again every ``repeat`` (4 h for a warning,
30 min for a page until someone acknowledges it); when it stops, one
resolved message goes to everyone who was told. Around that:

- grouping: alerts that start firing within ``group_wait`` of each other go
  out as one message per recipient (a dying engine raises several at once);
  Alertmanager's alerts come grouped already and go out at once;
- escalation: a page nobody acknowledged within ``escalate_after`` goes to
  the next contact of the on-call list as well, and so on down the list;
- storm limit: at most ``storm_limit_per_hour`` messages per recipient per
  hour; what is held back then goes out as one summary once the hour lets
  another message through;
- quiet hours, per severity (local time of the configured zone): warnings
  and info wait until the quiet hours end (and are dropped if they resolved
  meanwhile); pages are never silenced;
- info alerts are logged, never texted.

Outputs are ``Outgoing`` values (one message, one recipient, its facts most
important first); fitting them into SMS segments and delivering them
durably is the shell's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone, tzinfo
from typing import Any, Literal, Mapping

Severity = Literal["info", "warning", "page"]
RANK: dict[str, int] = {"info": 0, "warning": 1, "page": 2}
Kind = Literal["firing", "repeat", "escalation", "resolved", "summary"]


@dataclass(frozen=True)
class Alert:
    name: str  # the rule: "breaker", "restart_budget", an Alertmanager alertname
    subject: str  # the engine, GPU or instance it is about ("" when none)
    severity: Severity
    summary: str  # one line, the most important fact first
    source: str = "guardian"  # or "alertmanager"

    @property
    def key(self) -> str:
        return f"{self.name}/{self.subject}" if self.subject else self.name


@dataclass(frozen=True)
class Contact:
    name: str
    number: str  # E.164, e.g. +4915112345678


@dataclass(frozen=True)
class AlertParams:
    group_wait_seconds: float = 10.0
    repeat_warning_seconds: float = 4 * 3600.0
    repeat_page_seconds: float = 30 * 60.0
    escalate_after_seconds: float = 15 * 60.0
    storm_limit_per_hour: int = 10
    quiet_hours: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # severity -> (from hour, to hour)
    zone: tzinfo = timezone.utc

    def repeat(self, severity: str) -> float:
        return self.repeat_page_seconds if severity == "page" else self.repeat_warning_seconds

    def quiet(self, severity: str, now: float) -> bool:
        if severity == "page" or severity not in self.quiet_hours:
            return False
        start, end = self.quiet_hours[severity]
        hour = datetime.fromtimestamp(now, self.zone).hour
        return start <= hour < end if start <= end else hour >= start or hour < end


@dataclass(frozen=True)
class Tracked:
    alert: Alert
    firing: bool
    first_seen: float
    notified_at: float | None = None  # the last firing message; None: not told yet
    first_notified_at: float | None = None
    acked_by: str | None = None
    reached: int = 0  # contacts told so far: the first ``reached`` of the on-call list


@dataclass(frozen=True)
class Outgoing:
    to: Contact
    severity: Severity
    kind: Kind
    keys: tuple[str, ...]
    facts: tuple[str, ...]  # the body, most important first


@dataclass(frozen=True)
class AlertState:
    alerts: Mapping[str, Tracked] = field(default_factory=dict)
    sent: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # number -> send times within the hour
    held: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # number -> what the storm limit held back


def observe(state: AlertState, alert: Alert, firing: bool, now: float) -> AlertState:
    """An alert starts, goes on, changes severity, or stops."""
    alerts = dict(state.alerts)
    old = alerts.get(alert.key)
    if firing:
        if old is None or not old.firing:
            alerts[alert.key] = Tracked(alert, True, now)
        elif RANK[alert.severity] > RANK[old.alert.severity]:  # worse: told again as new, acks do not carry over
            alerts[alert.key] = Tracked(alert, True, old.first_seen, reached=old.reached)
        else:
            alerts[alert.key] = replace(old, alert=alert)
    elif old is not None and old.firing:
        if old.notified_at is None:
            del alerts[alert.key]  # nobody was told it started: nobody needs to hear it stopped
        else:
            alerts[alert.key] = replace(old, firing=False)
    return replace(state, alerts=alerts)


def ack(state: AlertState, key: str, who: str) -> tuple[AlertState, bool]:
    """Stop repeats and escalation of a firing alert; False when no such alert fires."""
    tracked = state.alerts.get(key)
    if tracked is None or not tracked.firing:
        return state, False
    return replace(state, alerts={**state.alerts, key: replace(tracked, acked_by=who)}), True


def due(state: AlertState, now: float, p: AlertParams, contacts: tuple[Contact, ...]) -> tuple[AlertState, list[Outgoing]]:
    """The messages to send now, and the state after sending them."""
    if not contacts:
        return state, []
    alerts = dict(state.alerts)
    per: dict[str, list[tuple[Kind, Tracked]]] = {}  # recipient number -> what to tell them

    def tell(c: Contact, kind: Kind, t: Tracked) -> None:
        per.setdefault(c.number, []).append((kind, t))

    waiting = [t for t in alerts.values() if t.firing and t.notified_at is None and t.alert.severity != "info"]
    group_ready = bool(waiting) and now - min(t.first_seen for t in waiting) >= p.group_wait_seconds
    for key, t in list(alerts.items()):
        a = t.alert
        if a.severity == "info":
            if not t.firing:
                del alerts[key]
            continue
        quiet = p.quiet(a.severity, now)
        if not t.firing:
            if not quiet:
                for c in contacts[: max(1, t.reached)]:
                    tell(c, "resolved", t)
                del alerts[key]
            continue
        if quiet:
            continue
        if t.notified_at is None:
            if group_ready or a.source == "alertmanager":  # Alertmanager grouped it already
                tell(contacts[0], "firing", t)
                alerts[key] = replace(t, notified_at=now, first_notified_at=now, reached=max(1, t.reached))
            continue
        if t.acked_by is not None:
            continue
        told = t.reached
        if now - t.notified_at >= p.repeat(a.severity):
            for c in contacts[:told]:
                tell(c, "repeat", t)
            alerts[key] = t = replace(t, notified_at=now)
        if a.severity == "page" and t.first_notified_at is not None and told < len(contacts):
            if now - t.first_notified_at >= p.escalate_after_seconds * told:
                tell(contacts[told], "escalation", t)
                alerts[key] = replace(t, reached=told + 1)
    by_number = {c.number: c for c in contacts}
    sent = {n: tuple(s for s in times if now - s < 3600) for n, times in state.sent.items()}
    held = dict(state.held)
    out: list[Outgoing] = []
    for number in sorted(set(per) | set(held)):
        contact = by_number.get(number)
        if contact is None:
            continue
        room = p.storm_limit_per_hour - len(sent.get(number, ()))
        if room <= 0:
            held[number] = held.get(number, ()) + tuple(t.alert.key for _, t in per.get(number, ()))
            continue
        if held.get(number):
            out.append(_summary(contact, held.pop(number), per.pop(number, []), now))
        elif number in per:
            out.append(_message(contact, per.pop(number), now, p.zone))
        else:
            continue
        sent[number] = sent.get(number, ()) + (now,)
    return AlertState(alerts, {n: s for n, s in sent.items() if s}, held), out


def _message(to: Contact, items: list[tuple[Kind, Tracked]], now: float, zone: tzinfo) -> Outgoing:
    items = sorted(items, key=lambda it: (-RANK[it[1].alert.severity] if it[0] != "resolved" else 1, it[1].first_seen))
    kinds = {k for k, _ in items}
    firing = [t for k, t in items if k != "resolved"]
    top = max((t.alert.severity for t in firing), key=RANK.__getitem__, default="info")
    facts: list[str] = []
    for kind, t in items:
        if kind == "resolved":  # what is over and when, not the firing text again
            headline = t.alert.summary.split(":")[0]
            facts.append(f"RESOLVED {_clock(now, zone)} {headline} (firing since {_clock(t.first_seen, zone)}, {_span(now - t.first_seen)})")
            continue
        tag = t.alert.severity.upper()
        again = {"repeat": " (still firing", "escalation": " (not acknowledged"}.get(kind, "")
        if again:
            again += f" after {_span(now - t.first_seen)})"
        facts.append(f"{tag} {_clock(t.first_seen, zone)} {t.alert.summary}{again}")
    if firing and any(t.alert.severity == "page" for t in firing):
        facts.append("ack: guardian ack " + " ".join(t.alert.key for t in firing if t.alert.severity == "page"))
    overall: Kind = "resolved" if kinds == {"resolved"} else "escalation" if "escalation" in kinds else "repeat" if kinds == {"repeat"} else "firing"
    severity: Severity = top if firing else "info"  # type: ignore[assignment]
    return Outgoing(to, severity, overall, tuple(t.alert.key for _, t in items), tuple(facts))


def _summary(to: Contact, held: tuple[str, ...], items: list[tuple[Kind, Tracked]], now: float) -> Outgoing:
    keys = tuple(dict.fromkeys(held + tuple(t.alert.key for _, t in items)))
    top: Severity = "page" if any(t.alert.severity == "page" for _, t in items) else "warning"
    facts = (f"STORM: {len(held)} messages held back by the storm limit", "alerts: " + ", ".join(keys))
    return Outgoing(to, top, "summary", keys, facts)


def _clock(t: float, zone: tzinfo) -> str:
    """When it started, in the on-call's zone: "03:12 CET"."""
    return datetime.fromtimestamp(t, zone).strftime("%H:%M %Z")


def _span(seconds: float) -> str:
    return f"{seconds / 3600:.1f}h" if seconds >= 3600 else f"{seconds / 60:.0f}min"


# -- persistence --------------------------------------------------------------------------------


def to_disk(state: AlertState) -> dict[str, Any]:
    return {
        "alerts": [
            {**{k: v for k, v in t.__dict__.items() if k != "alert"}, "alert": dict(t.alert.__dict__)}
            for t in state.alerts.values()
        ],
        "sent": {n: list(s) for n, s in state.sent.items()},
        "held": {n: list(k) for n, k in state.held.items()},
    }


def from_disk(doc: Mapping[str, Any]) -> AlertState:
    """Raises KeyError/TypeError/ValueError on a document of the wrong shape."""
    alerts = {}
    for item in doc["alerts"]:
        alert = Alert(**item["alert"])
        if alert.severity not in RANK:
            raise ValueError(f"severity {alert.severity!r}")
        alerts[alert.key] = Tracked(**{**item, "alert": alert})
    return AlertState(
        alerts,
        {str(n): tuple(float(x) for x in s) for n, s in doc["sent"].items()},
        {str(n): tuple(str(k) for k in ks) for n, ks in doc["held"].items()},
    )
