"""A seeded open-loop load generator: Poisson arrivals at the scenario's rate, over real HTTP.

Open loop on purpose: arrivals do not wait for answers, as real users do not,
so an overloaded engine builds a queue instead of slowing the generator down.

Clients retry a request that was not accepted (503, or a connection that
failed before any answer) with backoff for up to ``retry_seconds``, as the
OpenAI SDKs do; a request cut after its answer began is never retried and
counts as ``cut``. That is the line a drained restart must not cross.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Callable

import aiohttp

from guardian.sim.scenarios import Scenario
from guardian.sim.server import CHARS_PER_TOKEN


class LoadGenerator:
    def __init__(
        self,
        url: str,
        scenario: Scenario,
        model: str,
        seed: int = 0,
        max_in_flight: int = 512,
        clock: Callable[[], float] = time.monotonic,
        retry_seconds: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.scenario = scenario
        self.model = model
        self.rng = random.Random(seed)
        self.max_in_flight = max_in_flight
        self.retry_seconds = retry_seconds
        self.outcomes: Counter[str] = Counter()
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, duration: float | None) -> None:
        """Send requests until ``duration`` seconds have passed (None: until cancelled)."""
        t0 = self._clock()
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
            try:
                while duration is None or self._clock() - t0 < duration:
                    t = self._clock() - t0
                    rate = max(self.scenario.rate(t), 1e-3)
                    await asyncio.sleep(self.rng.expovariate(rate))
                    if len(self._tasks) >= self.max_in_flight:
                        self.outcomes["dropped_by_generator"] += 1
                        continue
                    task = asyncio.create_task(self._one(session))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            finally:
                if self._tasks:  # still waiting for their answers when the run ends: requests too, not lost from the count
                    self.outcomes["in_flight_at_end"] += len(self._tasks)
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _one(self, session: aiohttp.ClientSession) -> None:
        s = self.scenario
        prompt = "x" * (s.draw_prompt(self.rng) * CHARS_PER_TOKEN)
        stream = self.rng.random() < s.stream_share
        body = {"model": self.model, "prompt": prompt, "max_tokens": s.output.draw(self.rng), "stream": stream}
        give_up = self._clock() + self.retry_seconds
        backoff = 0.1
        while True:
            try:
                resp = await session.post(self.url + "/v1/completions", json=body)
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                resp = None  # not accepted: nothing was answered
            if resp is not None and resp.status != 503:
                break
            if resp is not None:
                resp.release()
            if self._clock() + backoff > give_up:
                self.outcomes["503" if resp is not None else "connection_error"] += 1
                return
            self.outcomes["retried"] += 1
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
        try:
            async with resp:
                async for _ in resp.content.iter_any():
                    pass
                self.outcomes[str(resp.status)] += 1
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            self.outcomes["cut"] += 1

    @property
    def failures(self) -> int:
        """Requests that did not end in 200: refused past the retry time, or cut after their answer began."""
        return sum(n for outcome, n in self.outcomes.items() if outcome not in ("200", "retried", "in_flight_at_end"))
