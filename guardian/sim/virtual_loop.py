"""An asyncio event loop whose clock is simulated: an hour of guardian's timers runs in seconds.

guardian's async parts (the admission queue's deadlines, the drained
restart's waits, the executor's tasks) take their time from the loop. On
this loop ``time()`` is a number that jumps to the next timer whenever
nothing is ready, instead of sleeping until it, so ``bench/efficacy.py``
runs them unchanged, hour-long scenarios included, and a run is exactly
repeatable: nothing depends on how busy the machine is.

Only timers and futures: a socket that becomes readable is still noticed
(the selector is polled without waiting), but threads are not waited for,
so code that hands work to a thread does not belong on this loop.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class _Clock:
    def __init__(self, start: float) -> None:
        self.now = start


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls without waiting; where the loop would wait ``timeout``, moves the clock on by it."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("the virtual-time loop has nothing scheduled and nothing ready: every task waits for "
                               "something that will never happen")  # fmt: skip
        self.clock.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        self._virtual = _Clock(start)
        super().__init__(_JumpingSelector(self._virtual))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual.now


def run(main: Any, start: float = 0.0) -> Any:
    """``asyncio.run`` on a virtual-time loop."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)
