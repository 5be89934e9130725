"""When the tuner may restart an engine: allowed windows and blackouts as cron expressions.

A window opens at each time its cron expression fires (APScheduler's
crontab syntax: minute hour day month day-of-week) and stays open for
``duration_minutes``. Restarts for tuning happen only inside an allowed
window (none configured: always allowed) and never inside a blackout (the
month-end reporting batch, a launch). Pure: the time is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from datetime import datetime, timedelta, timezone, tzinfo

from apscheduler.triggers.cron import CronTrigger


@dataclass(frozen=True)
class Window:
    cron: str
    duration_minutes: float

    def trigger(self, tz: tzinfo) -> CronTrigger:
        """Raises ValueError for an expression APScheduler does not accept."""
        return _trigger(self.cron, tz)

    def contains(self, wall: float, tz: tzinfo) -> bool:
        now = datetime.fromtimestamp(wall, timezone.utc)
        opened = self.trigger(tz).get_next_fire_time(None, now - timedelta(minutes=self.duration_minutes))
        return opened is not None and opened <= now


@lru_cache(maxsize=256)
def _trigger(cron: str, tz: tzinfo) -> CronTrigger:
    """Parsed once per expression and zone: the tuner asks every poll."""
    return CronTrigger.from_crontab(cron, timezone=tz)


def open_for_restarts(wall: float, allowed: tuple[Window, ...], blackouts: tuple[Window, ...], tz: tzinfo) -> bool:
    if any(w.contains(wall, tz) for w in blackouts):
        return False
    return not allowed or any(w.contains(wall, tz) for w in allowed)
