"""Admission to one upstream engine: a concurrency cap, and a bounded queue in front of it in lanes (high, low, long).

Bursts wait in the queue instead of reaching vLLM all at once; a full queue,
or a request still waiting at its deadline, is answered 429 with
Retry-After (the client's retry beats a request vLLM would only queue
deeper). A low-priority request whose wait, predicted from the queue ahead
of it and the rate slots freed lately, is past its deadline hears so at
once, with that wait as Retry-After, instead of after the deadline.

High priority goes first, and the last fifth of the cap is its alone
(``HIGH_RESERVE_RATIO``, one slot at least left to the low lane): an urgent
request arriving at a busy engine finds a slot instead of waiting for one
to free. Every ``low_every``-th free slot goes to the low
lane when both wait, so low priority cannot starve under sustained high
load, except while the oldest high-priority request has waited
``HIGH_WAIT_TARGET_SECONDS``: then the high lane is behind and keeps every
slot until it catches up.

The breaker's gates act here: ``pause_low`` (L2) keeps the low lane
waiting (until the gate opens, or 429 at the deadline); ``high_only`` (L3)
refuses the low lane at once. ``drain`` (a restart) stops dispatching and
waits until nothing is in flight; queued requests wait for ``admit``.

Long prompts (``LONG_REQUEST_RATIO`` of the engine's KV pool or more, the
pool as the last poll read it) wait in a queue of their own, served when
neither lane waits and only while the long requests in flight hold less
than ``LONG_SHARE_RATIO`` of the pool (one may always go): a flood of long
contexts fills half the pool at most, and the short requests behind it are
never behind it in the queue.

A restart is priced by what this engine's restarts took (drain to admit,
the last one; a first guess before any): a request that arrives during one
waits for it and then its usual deadline, when the restart is expected to
end within ``restart_hold_seconds`` (the OpenAI SDKs wait 600 s for an
answer); otherwise it is answered 503 at once, with Retry-After the time
left, instead of 429 after waiting for nothing.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Literal

Lane = Literal["high", "low"]
Queue = Literal["high", "low", "long"]
FIRST_RESTART_GUESS_SECONDS = 120.0  # a restart before any was measured: a model load of a couple of minutes
LONG_REQUEST_RATIO = 0.125  # a prompt of this share of the engine's KV pool or more waits in the long queue
LONG_SHARE_RATIO = 0.5  # long requests in flight together hold at most this share of the pool (one always may)
HIGH_RESERVE_RATIO = 0.2  # the last fifth of the cap's slots are the high lane's only
HIGH_WAIT_TARGET_SECONDS = 0.5  # the high lane waiting this long takes every slot (see the module doc)
RATE_WINDOW_SECONDS = 30.0  # the dispatch rate a low request's wait is predicted from
RATE_MIN_DISPATCHES = 10  # fewer in the window: no prediction (the request waits as usual)


def _now() -> float:
    return asyncio.get_running_loop().time()


@dataclass(frozen=True)
class Refusal:
    status: int  # 429 or 503
    reason: str
    retry_after: int  # seconds


class Admission:
    def __init__(self, cap: int, queue_size: int, low_every: int = 4, restart_hold_seconds: float = 300.0) -> None:
        self.cap = cap
        self.queue_size = queue_size
        self.low_every = low_every
        self.in_flight = 0
        self.pause_low = False
        self.high_only = False
        self.why = "breaker L0"  # the level and rule behind the gates, for the refusal's text
        self.draining = False
        self.restart_hold_seconds = restart_hold_seconds
        self.restart_seconds: float | None = None  # what the last restart took, drain to admit
        self._drain_began: float | None = None
        self.kv_tokens: int | None = None  # the engine's KV pool in tokens (blocks x block size), from the last poll
        self._long_in_flight: Counter[int] = Counter()  # prompt sizes of the long requests in flight: a release matches its take
        self._queues: dict[Queue, deque[asyncio.Future[None]]] = {"high": deque(), "low": deque(), "long": deque()}
        self._tokens: dict[asyncio.Future[None], int] = {}  # a long waiter's prompt tokens
        self._since: dict[asyncio.Future[None], float] = {}  # when each waiter began to wait
        self._dispatched: deque[float] = deque()  # when slots were taken, over the last RATE_WINDOW_SECONDS
        self._high_streak = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def long_tokens(self) -> int:
        """Prompt tokens of the long requests in flight."""
        return sum(size * n for size, n in self._long_in_flight.items())

    @property
    def long_count(self) -> int:
        """Long requests in flight."""
        return sum(self._long_in_flight.values())

    def is_long(self, tokens: int) -> bool:
        return self.kv_tokens is not None and tokens >= self.kv_tokens * LONG_REQUEST_RATIO

    async def acquire(self, lane: Lane, deadline_seconds: float, tokens: int = 0) -> Refusal | None:
        """None once the request may go upstream (then ``release`` it with the same tokens); else why not."""
        if lane == "low" and self.high_only:
            return Refusal(503, f"only high-priority requests are admitted while the engine is at {self.why}", 30)
        queue: Queue = "long" if self.is_long(tokens) else lane
        if self._may_dispatch(queue, tokens) and not self._ahead(queue):
            self._take(queue, tokens)
            return None
        if self.draining and self._drain_began is not None:
            left = max(0.0, self._drain_began + (self.restart_seconds or FIRST_RESTART_GUESS_SECONDS) - _now())
            if left > self.restart_hold_seconds:
                return Refusal(503, f"the engine is restarting, about {left:.0f}s left", max(1, math.ceil(left)))
            deadline_seconds += left  # wait the restart out, then as long as anyone waits
        if self.queued >= self.queue_size:
            return Refusal(429, f"the queue in front of the engine is full ({self.queue_size} waiting)", 1)
        if queue != "high" and not (self.pause_low or self.draining):
            wait = self._predicted_wait()
            if wait is not None and wait > deadline_seconds:
                return Refusal(429, f"the engine is busy: about {wait:.0f}s of queue ahead, more than the "
                                    f"{deadline_seconds:g}s a request waits", min(60, max(1, math.ceil(wait))))  # fmt: skip
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[queue].append(waiter)
        self._since[waiter] = _now()
        if queue == "long":
            self._tokens[waiter] = tokens
        waiter.add_done_callback(self._forget)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), deadline_seconds)
            return None
        except asyncio.TimeoutError:
            if waiter.done() and not waiter.cancelled():  # granted as the deadline passed: keep it
                return None
            waiter.cancel()
            self._queues[queue].remove(waiter)
            why = f"low-priority work is paused ({self.why})" if lane == "low" and self.pause_low else "the engine is busy"
            return Refusal(429, f"{why}: waited {deadline_seconds:g}s in the queue", max(1, int(deadline_seconds / 2)))
        except asyncio.CancelledError:  # the client went away while waiting
            if waiter.done() and not waiter.cancelled():
                self.release(tokens)
            elif waiter in self._queues[queue]:
                self._queues[queue].remove(waiter)
            raise

    def release(self, tokens: int = 0) -> None:
        held = self._long_in_flight.get(tokens, 0)
        if held > 1:
            self._long_in_flight[tokens] = held - 1
        elif held:
            del self._long_in_flight[tokens]  # no zero entries: one per size ever seen would pile up
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()
        self.dispatch()

    def dispatch(self) -> None:
        """Hand free slots to waiting requests: high first, the low lane every ``low_every``-th slot."""
        while True:
            queue = self._next_queue()
            if queue is None:
                return
            waiter = self._queues[queue].popleft()
            if waiter.done():
                continue
            self._take(queue, self._tokens.get(waiter, 0))
            waiter.set_result(None)

    async def drain(self, timeout: float) -> int:
        """Stop dispatching; wait until nothing is in flight. Returns what is still in flight at the timeout."""
        self.draining = True
        self._drain_began = _now()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.in_flight

    def admit(self) -> None:
        if self.draining and self._drain_began is not None:
            self.restart_seconds = _now() - self._drain_began
        self.draining = False
        self._drain_began = None
        self.dispatch()

    def _may_dispatch(self, queue: Queue, tokens: int = 0) -> bool:
        if self.draining or self.in_flight >= self.cap:
            return False
        if queue == "long" and self.kv_tokens is not None and (held := self.long_tokens):
            if held + tokens > self.kv_tokens * LONG_SHARE_RATIO:
                return False
        if queue != "high":
            reserve = min(self.cap - 1, math.ceil(self.cap * HIGH_RESERVE_RATIO))
            return not (self.pause_low or self.high_only) and self.in_flight < self.cap - reserve
        return True

    def _next_queue(self) -> Queue | None:
        high = bool(self._queues["high"]) and self._may_dispatch("high")
        low = bool(self._queues["low"]) and self._may_dispatch("low")
        if high and low:
            oldest = self._since.get(self._queues["high"][0])
            behind = oldest is not None and _now() - oldest >= HIGH_WAIT_TARGET_SECONDS
            return "low" if self._high_streak >= self.low_every and not behind else "high"
        if high or low:
            return "high" if high else "low"
        longs = self._queues["long"]
        return "long" if longs and self._may_dispatch("long", self._tokens.get(longs[0], 0)) else None

    def _take(self, queue: Queue, tokens: int = 0) -> None:
        self._high_streak = self._high_streak + 1 if queue == "high" else 0
        if queue == "long":
            self._long_in_flight[tokens] += 1
        self.in_flight += 1
        self._idle.clear()
        self._dispatched.append(_now())

    def _ahead(self, queue: Queue) -> int:
        """Requests served before one joining ``queue``: high before low, both before long."""
        order: tuple[Queue, ...] = ("high", "low", "long")
        return sum(len(self._queues[q]) for q in order[: order.index(queue) + 1])

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        self._since.pop(waiter, None)
        self._tokens.pop(waiter, None)

    def _predicted_wait(self) -> float | None:
        """Seconds a request joining the back of the queue would wait, from the recent dispatch rate; None: not known."""
        if not self.queued:
            return None
        now = _now()
        while self._dispatched and now - self._dispatched[0] > RATE_WINDOW_SECONDS:
            self._dispatched.popleft()
        if len(self._dispatched) < RATE_MIN_DISPATCHES:
            return None
        rate = len(self._dispatched) / max(1.0, now - self._dispatched[0])
        return self.queued / rate
