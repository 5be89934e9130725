"""The admission queue in simulated time: a restart is waited out when it is short enough, refused at once when not."""

from __future__ import annotations

import asyncio

from guardian.gateway.admission import FIRST_RESTART_GUESS_SECONDS, Admission
from guardian.sim.virtual_loop import run


def test_a_request_arriving_during_a_restart_waits_it_out_instead_of_a_429_at_the_queue_deadline() -> None:
    async def main() -> tuple[object, float, float | None]:
        loop = asyncio.get_running_loop()
        adm = Admission(cap=2, queue_size=10, restart_hold_seconds=300)
        await adm.drain(timeout=10)
        waiting = asyncio.ensure_future(adm.acquire("low", deadline_seconds=30))
        await asyncio.sleep(100)  # the model loads for 100 s: longer than the 30 s deadline
        assert not waiting.done()
        adm.admit()
        return await waiting, loop.time(), adm.restart_seconds

    refusal, at, measured = run(main())
    assert refusal is None and at == 100 and measured == 100


def test_a_restart_longer_than_the_hold_is_answered_503_at_once_with_the_time_left() -> None:
    async def main() -> object:
        adm = Admission(cap=2, queue_size=10, restart_hold_seconds=60)
        await adm.drain(timeout=10)
        await asyncio.sleep(20)
        return await adm.acquire("high", deadline_seconds=30)

    refusal = run(main())
    assert refusal is not None and refusal.status == 503  # type: ignore[attr-defined]
    assert refusal.retry_after == FIRST_RESTART_GUESS_SECONDS - 20  # type: ignore[attr-defined]
    assert "restarting, about 100s left" in refusal.reason  # type: ignore[attr-defined]


def test_long_prompts_wait_in_their_own_queue_holding_half_the_pool_at_most_and_never_block_short_ones() -> None:
    async def main() -> None:
        adm = Admission(cap=8, queue_size=50)
        adm.kv_tokens = 96_000  # long: 12k tokens or more; together at most 48k in flight
        assert await adm.acquire("low", 30, tokens=30_000) is None
        second = asyncio.ensure_future(adm.acquire("low", 30, tokens=30_000))  # 60k would pass half the pool: waits
        await asyncio.sleep(0)
        assert not second.done() and adm.long_tokens == 30_000
        short = await adm.acquire("low", 30, tokens=800)  # not behind the long one in the queue
        assert short is None and adm.in_flight == 2
        adm.release(30_000)
        await asyncio.sleep(0.01)
        assert second.done() and second.result() is None and adm.long_tokens == 30_000
        adm.release(30_000)
        adm.release(800)
        assert adm.long_tokens == 0 and adm.in_flight == 0

    run(main())


def test_the_last_fifth_of_the_cap_is_the_high_lane_s_so_an_urgent_request_finds_a_slot_at_a_busy_engine() -> None:
    async def main() -> None:
        adm = Admission(cap=5, queue_size=50)
        for _ in range(4):
            assert await adm.acquire("low", 30) is None
        fifth_low = asyncio.ensure_future(adm.acquire("low", 30))
        await asyncio.sleep(0.01)
        assert not fifth_low.done()  # the low lane stops one short of the cap
        assert await adm.acquire("high", 30) is None and adm.in_flight == 5
        fifth_low.cancel()

    run(main())


def test_a_low_request_whose_predicted_wait_passes_its_deadline_is_told_at_once_with_that_wait() -> None:
    async def main() -> tuple[object, float]:
        loop = asyncio.get_running_loop()
        adm = Admission(cap=1, queue_size=500)
        for _ in range(12):  # one slot freed a second: the rate the prediction uses
            assert await adm.acquire("high", 30) is None
            await asyncio.sleep(1.0)
            adm.release()
        assert await adm.acquire("high", 30) is None
        waiting = [asyncio.ensure_future(adm.acquire("low", 300)) for _ in range(40)]
        await asyncio.sleep(0.01)
        began = loop.time()
        refusal = await adm.acquire("low", 30)  # 40 ahead at one a second: about 40 s
        for w in waiting:
            w.cancel()
        return refusal, loop.time() - began

    refusal, waited = run(main())
    assert refusal is not None and refusal.status == 429 and waited == 0  # type: ignore[attr-defined]
    assert 30 < refusal.retry_after <= 60 and "of queue ahead" in refusal.reason  # type: ignore[attr-defined]
