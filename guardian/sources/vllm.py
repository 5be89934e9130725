"""Scraping one vLLM server: ``GET /metrics`` and ``GET /health``.

``/health`` is asked every ``HEALTH_EVERY_POLLS`` polls while ``/metrics``
answers and the last ``/health`` said 200, and on every poll otherwise:
a page that parsed says the server is up, and half of a poll's requests were
``/health`` answering what the page had already said.

The latency histograms are read every ``LATENCY_EVERY_POLLS`` scrapes (and
on the first): they were most of a scrape's parsing and of the poll's
window work, and the P99 they feed is over a minute's window, which a
reading every few seconds follows as well (the reading says whether it
carries them: ``latency_read``), and so is the prefill-time histogram whose
sum prices the gateway's long prompts. Gauges and counters are read every
poll.

Both are asked over ``guardian.http1``'s kept-alive connections, one pool per
engine: through aiohttp's client a GET was a fifth of a poll's instructions.

Whatever goes wrong (refused, timeout, 5xx, HTML instead of metrics, a page
cut off) ends as an ``EngineReading`` with ``up=False`` and a reason; nothing
raises out of ``scrape``, so one bad engine cannot stop the poll of the others.
"""

from __future__ import annotations

import asyncio
import time

from guardian import http1
from guardian.sample import EngineReading
from guardian.sources import promtext, vllm_page

HEALTH_EVERY_POLLS = 10
LATENCY_EVERY_POLLS = 5


class VllmScraper:
    def __init__(self, name: str, url: str, timeout: float, api_key: str | None = None) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self._pool = http1.Pool(self.url)
        self._timeout = timeout
        # /metrics and /health need no key, but a proxy in front of vLLM may; never logged
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._parser = promtext.Parser()
        self._health: bool | None = None  # the last /health verdict
        self._health_age = 0  # scrapes since it was asked
        self._latency_age = 0  # scrapes since the latency histograms were read (0: read them now)

    async def scrape(self) -> EngineReading:
        started = time.perf_counter()
        latency = self._latency_age == 0
        self._latency_age = (self._latency_age + 1) % LATENCY_EVERY_POLLS
        if self._health is not True or self._health_age >= HEALTH_EVERY_POLLS - 1:
            metrics, health = await asyncio.gather(self._metrics(latency), self.health())
        else:
            metrics = await self._metrics(latency)
            health = await self.health() if isinstance(metrics, _Failure) else None
        if health is not None or isinstance(metrics, _Failure):
            self._health, self._health_age = health, 0
        else:
            self._health_age += 1
        health = self._health
        elapsed = time.perf_counter() - started
        if isinstance(metrics, _Failure):
            self._parser.forget()  # it may come back as another vLLM, with other families
            self._latency_age = 0
            return EngineReading(
                name=self.name, up=False, healthy=health, error=metrics.reason, error_kind=metrics.kind, scrape_seconds=elapsed
            )
        if not vllm_page.has_engine_stats(metrics):
            return EngineReading(
                name=self.name,
                up=True,
                healthy=health,
                stats_disabled=True,
                error="the page has no vllm: engine metrics (server started with --disable-log-stats?)",
                error_kind="no_stats",
                cores=vllm_page.cores_from_page(metrics),
                scrape_seconds=elapsed,
                latency_read=latency,
            )
        return EngineReading(name=self.name, up=True, healthy=health, cores=vllm_page.cores_from_page(metrics),
                             scrape_seconds=elapsed, latency_read=latency)  # fmt: skip

    async def _metrics(self, latency: bool) -> promtext.Page | _Failure:
        try:
            status, body = await http1.get(self._pool, "/metrics", self._headers, self._timeout)
        except asyncio.TimeoutError:
            return _Failure("timeout", f"GET /metrics did not answer within {self._timeout:g}s")
        except http1.Unreachable as exc:
            return _Failure("refused", f"cannot connect to {self.url}: {exc.strerror or exc}")
        except http1.TooLarge:
            return _Failure("too_large", f"GET /metrics page is larger than {http1.MAX_WHOLE_BYTES} bytes")
        except http1.NoAnswer as exc:
            return _Failure("http_error", f"GET /metrics failed: {exc}")
        except http1.UpstreamError as exc:
            return _Failure("truncated", f"GET /metrics body was cut off: {exc}")
        except OSError as exc:
            return _Failure("http_error", f"GET /metrics failed: {type(exc).__name__}: {exc}")
        if status != 200:
            return _Failure(_status_kind(status), f"GET /metrics answered HTTP {status}")
        try:
            text = str(body, "utf-8")
        except UnicodeDecodeError as exc:
            return _Failure("parse", f"GET /metrics is not UTF-8 text (byte {exc.start})")
        try:
            return self._parser.parse(text, vllm_page.FAMILIES if latency else vllm_page.FAMILIES_WITHOUT_LATENCY)
        except promtext.ParseError as exc:
            return _Failure("truncated" if exc.truncated else "parse", f"GET /metrics is not Prometheus text: {exc}")

    async def load(self) -> float | None:
        """Requests the engine still holds (running + waiting), from one scrape; None when unknown (a restart's drain waits on it)."""
        reading = await self.scrape()
        counts = [(c.running or 0) + (c.waiting or 0) for c in reading.cores if c.running is not None]
        return sum(counts) if reading.up and counts else None

    async def health(self) -> bool | None:
        """True on 200, False on an answer that is not 200, None when there was no answer."""
        try:
            status, _ = await http1.get(self._pool, "/health", self._headers, self._timeout)
        except (asyncio.TimeoutError, http1.UpstreamError, OSError):
            return None
        return status == 200

    def close(self) -> None:
        """Its kept-alive connections closed (guardian stopping, or the engine gone from the config)."""
        self._pool.close()


class _Failure:
    __slots__ = ("kind", "reason")

    def __init__(self, kind: str, reason: str) -> None:
        self.kind = kind
        self.reason = reason


def _status_kind(status: int) -> str:
    return "http_5xx" if status >= 500 else "http_4xx" if status >= 400 else "http_other"
