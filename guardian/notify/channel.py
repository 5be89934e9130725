"""Where guardian's messages to people go, as an interface; SMS (Twilio) implements it later.

A ``Message`` carries the facts in the order a person woken at night needs
them: severity, engine, level, the rule and its numbers, the action taken.
``LogChannel`` writes the exact text to the log; it is what the demo uses
and what stands in until a paging channel is configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from guardian import logs
from guardian.actions.outcome import Outcome

log = logs.get("guardian.notify")


@dataclass(frozen=True)
class Message:
    severity: str  # info, warning, page
    engine: str
    level: int
    rule: str
    text: str
    at: str  # ISO wall-clock time

    def render(self) -> str:
        return f"[{self.severity.upper()}] {self.engine} L{self.level} {self.rule}: {self.text} ({self.at})"


class Channel(Protocol):
    name: str

    async def send(self, message: Message) -> Outcome: ...


class LogChannel:
    name = "log"

    async def send(self, message: Message) -> Outcome:
        (log.warning if message.severity != "info" else log.info)(
            "notification", channel=self.name, severity=message.severity, engine=message.engine, text=message.render()
        )
        return Outcome("notify", "done", "written to the log")
