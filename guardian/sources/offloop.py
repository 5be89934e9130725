"""Run blocking calls (NVML, /proc reads) off the event loop, with a timeout that cannot stall it.

A hung NVML call (a GPU falling off the bus can block the driver for
minutes) must not stop the poll loop, Prometheus scrapes or the watchdog.
Each worker is one daemon thread: while a call is still stuck, later calls are
refused at once instead of piling up threads, and a stuck thread never blocks
interpreter exit.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


class WorkerBusy(RuntimeError):
    """The previous call has not returned yet."""


class OffloopWorker:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], asyncio.Future[object], asyncio.AbstractEventLoop]] = (
            queue.SimpleQueue()
        )
        self._busy = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    async def call(self, fn: Callable[[], T], timeout: float) -> T:
        """``fn()`` in the worker thread; TimeoutError after ``timeout``, WorkerBusy while a call is stuck."""
        if self._busy.is_set():
            raise WorkerBusy(f"{self._name}: the previous call is still running")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        future.add_done_callback(_retrieve)  # a late result after a timeout is dropped quietly
        self._busy.set()
        self._jobs.put((fn, future, loop))
        expiry = loop.call_later(timeout, _expire, future)  # one timer, where wait_for and shield added a task and futures
        try:
            return await future  # type: ignore[return-value]
        finally:
            expiry.cancel()

    def _run(self) -> None:
        while True:
            fn, future, loop = self._jobs.get()
            try:
                result: object = fn()
                error: BaseException | None = None
            except BaseException as exc:  # handed to the awaiting coroutine
                result, error = None, exc
            self._busy.clear()
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:
                pass  # the loop closed while the call was stuck


def _settle(future: asyncio.Future[object], result: object, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _expire(future: asyncio.Future[object]) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())


def _retrieve(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()
