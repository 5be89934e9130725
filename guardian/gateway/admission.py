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

Nor behind it in vLLM: its scheduler gives a running prefill as much of a
step's token budget as it needs, so a short request that arrives while a
30k-token prompt prefills waits for all of it (a second or more), and a
cap on prefill chunks (``--long-prefill-token-threshold``) slows every
prompt's prefill, the short ones' too. About as many short requests meet
a long prefill as the share of the engine's time long prompts prefill.
So in a flood (long prompts asking, over the last minute, for more than
``long_flood_share`` of the engine's time: their tokens at the engine's
measured prefill seconds per token) and while short requests flow (one
dispatched within ``SHORT_FLOW_SECONDS``), long prompts' prefill takes at
most ``long_prefill_share`` of the engine's time: after a long prompt
goes, the next waits its prefill time over that share. The default of
0.5% keeps the short ones' P99 near what it was without the flood (1%
left it at 2.35x on one seed of five in ``bench/efficacy.py``); the
flood is mostly answered 429, at once when the wait for the lane's turn
is past the deadline. Occasional long prompts, those of their own pool
(a bucket with its own engines) and those of a quiet engine go as the
pool allows.

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

from guardian import logs

log = logs.get("guardian.gateway")

Lane = Literal["high", "low"]
Queue = Literal["high", "low", "long"]
FIRST_RESTART_GUESS_SECONDS = 120.0  # a restart before any was measured: a model load of a couple of minutes
FIRST_PREFILL_GUESS_SECONDS_PER_TOKEN = 1e-4  # before the polls measure it: 10k prompt tokens a second (an 8B model on
# an L4, a 70B one on an H100; an 8B one on an H100 is about 3x faster), so a flood is seen from its first seconds
LONG_REQUEST_RATIO = 0.125  # a prompt of this share of the engine's KV pool or more waits in the long queue
LONG_SHARE_RATIO = 0.5  # long requests in flight together hold at most this share of the pool (one always may)
HIGH_RESERVE_RATIO = 0.2  # the last fifth of the cap's slots are the high lane's only
HIGH_WAIT_TARGET_SECONDS = 0.5  # the high lane waiting this long takes every slot (see the module doc)
RATE_WINDOW_SECONDS = 30.0  # the dispatch rate a low request's wait is predicted from
RATE_MIN_DISPATCHES = 10  # fewer in the window: no prediction (the request waits as usual)
SHORT_FLOW_SECONDS = 10.0  # a short request dispatched this recently: a flood of long prompts keeps to its share
LONG_DEMAND_WINDOW_SECONDS = 60.0  # what long prompts asked for over this long tells a flood


def _now() -> float:
    return asyncio.get_running_loop().time()


@dataclass(frozen=True)
class Refusal:
    status: int  # 429 or 503
    reason: str
    retry_after: int  # seconds


class Admission:
    def __init__(self, cap: int, queue_size: int, low_every: int = 4, restart_hold_seconds: float = 300.0,
                 long_prefill_share: float = 1.0, long_flood_share: float = 0.1, engine: str = "") -> None:
        self.engine = engine  # for the log
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
        self.prefill_seconds_per_token: float | None = None  # the engine's, from the polls; None: not measured yet
        self.long_prefill_share = long_prefill_share  # of the engine's time, in a flood while short requests flow (1: no limit)
        self.long_flood_share = long_flood_share  # long prompts asking for more of the engine's time are a flood
        self._long_asked: deque[tuple[float, int]] = deque()  # (when, prompt tokens) of the long prompts asked lately
        self._flooding = False  # as last judged: the log says when it changes
        self._last_long: tuple[float, int] = (-math.inf, 0)  # when the last long prompt went, and its tokens
        self._short_at = -math.inf  # when a short request was last dispatched
        self._long_timer: asyncio.TimerHandle | None = None  # dispatch when the long lane opens
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

    @property
    def flooding(self) -> bool:
        """Whether a flood of long prompts keeps to its share, as last judged (``judge_flood``)."""
        return self._flooding

    def is_long(self, tokens: int) -> bool:
        return self.kv_tokens is not None and tokens >= self.kv_tokens * LONG_REQUEST_RATIO

    async def acquire(self, lane: Lane, deadline_seconds: float, tokens: int = 0) -> Refusal | None:
        """None once the request may go upstream (then ``release`` it with the same tokens); else why not."""
        if lane == "low" and self.high_only:
            return Refusal(503, f"only high-priority requests are admitted while the engine is at {self.why}", 30)
        queue: Queue = "long" if self.is_long(tokens) else lane
        if queue == "long":
            self._long_asked.append((_now(), tokens))
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
            turn = self._long_wait() if queue == "long" else None
            if turn is not None and turn > deadline_seconds:
                return Refusal(429, f"a flood of long prompts (this one about {tokens} tokens) takes at most "
                                    f"{self.long_prefill_share * 100:g}% of the engine's time while short requests flow: "
                                    f"about {turn:.0f}s until this one's turn, more than the {deadline_seconds:g}s a "
                                    "request waits", min(60, max(1, math.ceil(turn))))  # fmt: skip
            wait = self._predicted_wait(self._ahead(queue))
            if wait is not None and wait > deadline_seconds:
                return Refusal(429, f"the engine is busy: about {wait:.0f}s of queue ahead, more than the "
                                    f"{deadline_seconds:g}s a request waits", min(60, max(1, math.ceil(wait))))  # fmt: skip
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[queue].append(waiter)
        self._since[waiter] = _now()
        if queue == "long":
            self._tokens[waiter] = tokens
            self._wake_when_long_opens()
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
        while (queue := self._next_queue()) is not None:
            waiter = self._queues[queue].popleft()
            if waiter.done():
                continue
            self._take(queue, self._tokens.get(waiter, 0))
            waiter.set_result(None)
        self._wake_when_long_opens()

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
        if queue == "long" and _now() < self._long_opens():
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
            self._last_long = (_now(), tokens)
        else:
            self._short_at = _now()
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

    def _prefill_seconds(self, tokens: int) -> float:
        """A prompt's prefill time at the engine's measured speed (a first guess before one is measured)."""
        return tokens * (self.prefill_seconds_per_token or FIRST_PREFILL_GUESS_SECONDS_PER_TOKEN)

    def _long_due(self) -> float:
        """When the long lane's share lets the next long prompt go: the last one's prefill time over the share after it."""
        went, tokens = self._last_long
        return went + self._prefill_seconds(tokens) / self.long_prefill_share

    def judge_flood(self) -> bool:
        """Long prompts keep to their share of the engine's time: a flood of them while short requests flow.

        Judged when a long prompt asks or waits, and by every poll (``GatewayServer.follow``), so that
        ``flooding`` and the log see a flood end on an engine no request reaches any more.
        """
        now = _now()
        while self._long_asked and self._long_asked[0][0] <= now - LONG_DEMAND_WINDOW_SECONDS:
            self._long_asked.popleft()
        asked = self._prefill_seconds(sum(tokens for _, tokens in self._long_asked))  # retries too: each ask is one
        flooding = (self.long_prefill_share < 1 and now < self._short_at + SHORT_FLOW_SECONDS
                    and asked > self.long_flood_share * LONG_DEMAND_WINDOW_SECONDS)  # fmt: skip
        if flooding != self._flooding:
            self._flooding = flooding
            log.info("long_prompt_flood_" + ("began" if flooding else "ended"), engine=self.engine,
                     asked_share=round(asked / LONG_DEMAND_WINDOW_SECONDS, 4), flood_share=self.long_flood_share,
                     long_prefill_share=self.long_prefill_share, prefill_seconds_per_token=self.prefill_seconds_per_token,
                     short_requests_flowing=now < self._short_at + SHORT_FLOW_SECONDS)  # fmt: skip
        return flooding

    def _long_opens(self) -> float:
        """When the long lane lets the next long prompt go: at once, or in a flood its turn (or when short ones stop)."""
        return min(self._long_due(), self._short_at + SHORT_FLOW_SECONDS) if self.judge_flood() else -math.inf

    def _long_wait(self) -> float | None:
        """Seconds a long prompt joining the long queue would wait for its turn in a flood, were short requests to keep
        flowing; None when there is no flood (no turns)."""
        if not self.judge_flood():
            return None
        now = _now()
        ahead = sum(self._tokens.get(w, 0) for w in self._queues["long"])
        return max(0.0, self._long_due() - now) + self._prefill_seconds(ahead) / self.long_prefill_share

    def _wake_when_long_opens(self) -> None:
        """A long prompt waiting for the lane's share is dispatched when it opens, even if no release comes first."""
        if not self._queues["long"]:  # every release comes here: nothing to judge without a long prompt waiting
            return
        opens = self._long_opens()
        if opens <= _now():
            return
        if self._long_timer is not None:
            if self._long_timer.when() <= opens:
                return
            self._long_timer.cancel()
        self._long_timer = asyncio.get_running_loop().call_at(opens, self._long_opened)

    def _long_opened(self) -> None:
        self._long_timer = None
        self.dispatch()

    def _predicted_wait(self, ahead: int) -> float | None:
        """Seconds a request with ``ahead`` requests before it would wait, from the recent dispatch rate; None: not known."""
        if not ahead:
            return None
        now = _now()
        while self._dispatched and now - self._dispatched[0] > RATE_WINDOW_SECONDS:
            self._dispatched.popleft()
        if len(self._dispatched) < RATE_MIN_DISPATCHES:
            return None
        rate = len(self._dispatched) / max(1.0, now - self._dispatched[0])
        return ahead / rate
