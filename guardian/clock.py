"""Unix seconds that never jump while guardian runs: wall time at start plus the monotonic time since.

Alert repeats, escalation and message validity are kept on disk as unix
times (they must mean the same after a restart or a reboot), but within a run
they must not follow the wall clock: NTP stepping it forward an hour dropped
every queued page as expired, stepping it back held repeats for an hour.
``CLOCK_BOOTTIME`` counts on through suspend, as an on-call's hour does.
"""

from __future__ import annotations

import time

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
_BASE = time.time() - time.clock_gettime(_BOOTTIME)


def steady_time() -> float:
    return _BASE + time.clock_gettime(_BOOTTIME)
