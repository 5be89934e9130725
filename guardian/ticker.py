"""A job every N seconds on the monotonic clock: the poll and the notification runs.

APScheduler's interval trigger counts in wall-clock time: a clock stepped
back an hour (NTP, a wrong RTC after a reboot) stopped polling and paging
for that hour. Here the next run is due ``interval`` seconds of
``loop.time()`` (monotonic) after the last one was due, whatever the wall
clock does. As with APScheduler's ``max_instances=1, coalesce=True``: a run
never overlaps the previous one, and ticks missed while one ran long or the
loop was blocked are skipped, each counted through ``on_skipped``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine


class Ticker:
    def __init__(self, interval: float, job: Callable[[], Coroutine[Any, Any, None]], on_skipped: Callable[[], None],
                 at_once: bool = True) -> None:  # fmt: skip
        self.interval = interval
        self._job = job
        self._on_skipped = on_skipped
        self._at_once = at_once
        self._task: asyncio.Task[None] | None = None
        self._running: asyncio.Task[None] | None = None
        self._paused = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def pause(self) -> None:
        """No more runs until ``resume`` (tests and benches drive the job themselves)."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    async def stop(self) -> None:
        """No further runs; a run in flight is cancelled (the poll and the outbox are safe to cut)."""
        for task in (self._task, self._running):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, self._running) if t is not None), return_exceptions=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + (0.0 if self._at_once else self.interval)
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            now = loop.time()
            if not self._paused:
                if self._running is not None and not self._running.done():
                    self._on_skipped()
                else:
                    self._running = asyncio.create_task(self._job())
            due += self.interval
            if due <= now:  # the loop was held past whole intervals: those ticks are gone, and counted
                missed = int((now - due) // self.interval) + 1
                for _ in range(missed):
                    self._on_skipped()
                due += missed * self.interval
