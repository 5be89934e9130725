"""What came of an action: every actuator answers with one of these instead of raising.

The caller logs it, counts it (``guardian_actions_total{kind, outcome}``) and
moves on; the policy learns of the outcomes it depends on (restarts) at the
next poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["done", "not_enabled", "not_configured", "refused", "failed", "timeout", "dry_run"]


@dataclass(frozen=True)
class Outcome:
    action: str
    status: Status
    detail: str
    body: Any = None

    @property
    def ok(self) -> bool:
        return self.status in ("done", "dry_run")
