"""The alert lifecycle on a fake clock: dedup, grouping, repeat, resolved, storm limit, quiet hours, escalation, ack."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from guardian.notify.alerts import (
    Alert,
    AlertParams,
    AlertState,
    Contact,
    Outgoing,
    ack,
    due,
    from_disk,
    observe,
    to_disk,
)

ALICE = Contact("alice", "+4915100000001")
BOB = Contact("bob", "+4915100000002")
CAROL = Contact("carol", "+4915100000003")
ONCALL = (ALICE, BOB, CAROL)
P = AlertParams(group_wait_seconds=10, repeat_warning_seconds=4 * 3600, repeat_page_seconds=1800,
                escalate_after_seconds=900, storm_limit_per_hour=5)  # fmt: skip
T0 = datetime(2026, 12, 2, 14, 0, tzinfo=timezone.utc).timestamp()  # 14:00 UTC
PAGE = Alert("breaker", "sim0", "page", "sim0 L3 free_reserve: free 5.4%")
WARN = Alert("breaker", "sim1", "warning", "sim1 L2 over_budget: 12% past the budget")


class Clock:
    """Drives ``due`` once a second and keeps every message."""

    def __init__(self, params: AlertParams = P, contacts: tuple[Contact, ...] = ONCALL, t0: float = T0) -> None:
        self.state = AlertState()
        self.t = t0
        self.params = params
        self.contacts = contacts
        self.out: list[tuple[float, Outgoing]] = []

    def fire(self, alert: Alert, firing: bool = True) -> None:
        self.state = observe(self.state, alert, firing, self.t)

    def run(self, seconds: float) -> list[Outgoing]:
        got = []
        end = self.t + seconds
        while self.t < end:
            self.state, out = due(self.state, self.t, self.params, self.contacts)
            got += out
            self.out += [(self.t, o) for o in out]
            self.t += 1
        return got


def test_a_firing_alert_is_told_once_after_the_group_wait_however_often_it_is_seen() -> None:
    c = Clock()
    for _ in range(30):
        c.fire(WARN)
        c.run(1)
    (msg,) = [o for _, o in c.out]
    assert c.out[0][0] == T0 + 10 and msg.to == ALICE and msg.kind == "firing"
    assert msg.facts == ("WARNING 14:00 UTC sim1 L2 over_budget: 12% past the budget",)  # when it started


def test_alerts_raised_together_go_out_as_one_message_worst_first() -> None:
    c = Clock()
    c.fire(WARN)
    c.run(4)
    c.fire(PAGE)
    (msg,) = c.run(20)
    assert msg.severity == "page" and msg.keys == ("breaker/sim0", "breaker/sim1")
    assert msg.facts[0].startswith("PAGE 14:00 UTC sim0 L3") and msg.facts[1].startswith("WARNING 14:00 UTC sim1")
    assert msg.facts[-1] == "ack: guardian ack breaker/sim0"


def test_a_page_repeats_every_half_hour_until_acknowledged_and_a_warning_every_four_hours() -> None:
    c = Clock(contacts=(ALICE,))
    c.fire(PAGE)
    c.fire(WARN)
    c.run(11)
    c.run(3 * 1800)
    repeats = [(t - T0, o.keys) for t, o in c.out if o.kind == "repeat"]
    assert [t for t, _ in repeats] == [1810, 3610, 5410] and all(k == ("breaker/sim0",) for _, k in repeats)
    state, ok = ack(c.state, "breaker/sim0", "alice")
    assert ok
    c.state = state
    c.run(4 * 3600)
    later = [(round(t - T0), o.keys) for t, o in c.out if o.kind == "repeat"][3:]
    assert later == [(4 * 3600 + 10, ("breaker/sim1",))]  # the acked page is quiet; the warning repeats on its own clock
    assert ack(c.state, "breaker/none", "alice") == (c.state, False)


def test_a_resolved_alert_sends_one_resolved_message_to_everyone_who_was_told() -> None:
    c = Clock()
    c.fire(PAGE)
    c.run(11 + 900)  # primary told, then bob by escalation
    c.fire(PAGE, firing=False)
    resolved = c.run(5)
    assert sorted(o.to.name for o in resolved) == ["alice", "bob"] and {o.kind for o in resolved} == {"resolved"}
    assert resolved[0].facts == ("RESOLVED 14:15 UTC sim0 L3 free_reserve (firing since 14:00 UTC, 15min)",)  # what ended, when
    assert c.run(3600) == [] and c.state.alerts == {}


def test_an_alert_that_stops_before_anyone_was_told_is_never_sent() -> None:
    c = Clock()
    c.fire(WARN)
    c.run(5)
    c.fire(WARN, firing=False)
    assert c.run(60) == []


def test_an_unacknowledged_page_walks_down_the_on_call_list() -> None:
    c = Clock()
    c.fire(PAGE)
    c.run(11 + 2 * 900 + 5)
    escalations = [(round(t - T0), o.to.name) for t, o in c.out if o.kind == "escalation"]
    assert escalations == [(910, "bob"), (1810, "carol")]
    assert "not acknowledged after 15min" in next(o for _, o in c.out if o.kind == "escalation").facts[0]
    repeats = {o.to.name for t, o in c.out if o.kind == "repeat"}
    assert repeats == {"alice", "bob"}  # the repeat at 30 min goes to everyone reached so far
    assert all(len(set(o.keys)) == len(o.keys) for _, o in c.out)  # carol hears of it once, as an escalation


def test_an_acknowledged_page_does_not_escalate() -> None:
    c = Clock()
    c.fire(PAGE)
    c.run(60)
    c.state, _ = ack(c.state, PAGE.key, "alice")
    c.run(3 * 900)
    assert [o.kind for _, o in c.out] == ["firing"]


def test_the_storm_limit_holds_messages_back_then_sends_one_summary() -> None:
    c = Clock(contacts=(ALICE,))
    for i in range(8):  # eight separate incidents, each told on its own
        c.fire(Alert("GuardianEngineUnhealthy", f"e{i}", "warning", f"e{i} fails /health"))
        c.run(60)
    assert len(c.out) == 5  # the limit
    c.run(3600)
    summary = c.out[-1][1]
    assert len(c.out) == 6 and summary.kind == "summary"
    assert summary.facts[0] == "STORM: 3 messages held back by the storm limit"
    assert "GuardianEngineUnhealthy/e5" in summary.facts[1] and "GuardianEngineUnhealthy/e7" in summary.facts[1]


def test_quiet_hours_hold_warnings_until_morning_but_never_pages() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    night = datetime(2026, 12, 2, 23, 30, tzinfo=berlin).timestamp()
    params = AlertParams(group_wait_seconds=10, quiet_hours={"warning": (22, 7)}, zone=berlin, storm_limit_per_hour=100)
    c = Clock(params, t0=night)
    c.fire(WARN)
    c.fire(PAGE)
    c.run(60)
    assert [o.keys for _, o in c.out] == [("breaker/sim0",)]  # the page, alone
    c.run(8 * 3600)  # 07:00 in Berlin
    (t, morning) = next((t, o) for t, o in c.out if "breaker/sim1" in o.keys)
    assert morning.kind == "firing" and datetime.fromtimestamp(t, berlin).strftime("%H:%M") == "07:00"
    assert all(o.keys == ("breaker/sim0",) for t2, o in c.out if t2 < t)  # the page kept repeating all night
    c2 = Clock(params, t0=night)
    c2.fire(WARN)
    c2.run(3600)
    c2.fire(WARN, firing=False)  # resolved during the night: nothing to say in the morning
    c2.run(8 * 3600)
    assert c2.out == []


def test_info_alerts_are_never_texted() -> None:
    c = Clock()
    c.fire(Alert("breaker", "sim0", "info", "sim0 back to L0"))
    assert c.run(3600) == []


def test_a_warning_that_becomes_a_page_is_told_again_as_a_page() -> None:
    c = Clock()
    c.fire(WARN)
    c.run(20)
    c.state, _ = ack(c.state, WARN.key, "alice")
    c.fire(Alert("breaker", "sim1", "page", "sim1 L3 engine_dead"))
    c.run(20)
    assert [(o.kind, o.severity) for _, o in c.out] == [("firing", "warning"), ("firing", "page")]


def test_the_lifecycle_survives_the_disk() -> None:
    c = Clock(contacts=(ALICE,))
    c.fire(PAGE)
    c.run(30)
    back = from_disk(to_disk(c.state))
    assert back == c.state
    c.state = back
    assert c.run(1800)[0].kind == "repeat"
