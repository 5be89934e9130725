"""The admission queue in simulated time: a restart is waited out when it is short enough, refused at once when not."""

from __future__ import annotations

import asyncio

import pytest

from guardian.gateway.admission import FIRST_RESTART_GUESS_SECONDS, Admission, Refusal
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


def _engine(share: float = 0.01, flood: float = 0.1) -> Admission:
    """An engine whose polls said: a 96k-token pool (long prompts: 12k tokens or more), 40 us of prefill a token."""
    adm = Admission(cap=8, queue_size=50, long_prefill_share=share, long_flood_share=flood)
    adm.kv_tokens = 96_000
    adm.prefill_seconds_per_token = 4e-5
    return adm


async def _shorts(adm: Admission) -> None:
    """A short request every 2 s, each done in 1 s."""
    while True:
        assert await adm.acquire("low", 30, tokens=800) is None
        await asyncio.sleep(1.0)
        adm.release(800)
        await asyncio.sleep(1.0)


async def _longs(adm: Admission, every: float, n: int) -> list[object]:
    """``n`` long prompts of 20k tokens (0.8 s of prefill), one every ``every`` seconds from 0.5 s, each done in 1 s:
    when each was let through (loop time), or its refusal."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(0.5)
    heard: list[object] = []
    for _ in range(n):
        asked = loop.time()
        refusal = await adm.acquire("low", 30, tokens=20_000)
        heard.append(loop.time() if refusal is None else refusal)
        if refusal is None:
            await asyncio.sleep(1.0)
            adm.release(20_000)
        await asyncio.sleep(max(0.0, asked + every - loop.time()))
    return heard


def test_occasional_long_prompts_go_as_the_pool_allows_while_short_ones_flow() -> None:
    async def main() -> list[object]:
        adm = _engine()
        flow = asyncio.ensure_future(_shorts(adm))
        heard = await _longs(adm, every=20.0, n=6)  # 0.8 s of prefill every 20 s: 4% of the engine's time
        flow.cancel()
        return heard

    assert run(main()) == [0.5, 20.5, 40.5, 60.5, 80.5, 100.5]


def test_a_flood_of_long_prompts_while_short_ones_flow_is_kept_to_its_share_and_told_its_turn_at_once() -> None:
    async def main() -> list[object]:
        adm = _engine()
        flow = asyncio.ensure_future(_shorts(adm))
        heard = await _longs(adm, every=5.0, n=15)  # 0.8 s every 5 s: 16% of the engine's time asked for
        flow.cancel()
        return heard

    heard = run(main())
    # until the asks pass 10% of a minute (the 8th), each goes at once; then the next's turn is 80 s after the
    # last (0.8 s over 1%), and those whose turn is past their 30 s deadline are told so at once
    assert heard[:7] == [0.5, 5.5, 10.5, 15.5, 20.5, 25.5, 30.5]
    assert all(isinstance(h, Refusal) for h in heard[7:])
    refusal = heard[7]
    assert refusal.status == 429 and refusal.retry_after == 60  # type: ignore[attr-defined]
    assert "a flood of long prompts (this one about 20000 tokens) takes at most 1% of the engine's time while short " \
           "requests flow: about 75s until this one's turn" in refusal.reason  # type: ignore[attr-defined]


def test_in_a_flood_a_waiting_long_prompt_goes_at_its_turn_even_with_no_release_to_wake_the_queue() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        adm = _engine(flood=0.0)  # any long prompt is a flood
        flow = asyncio.ensure_future(_shorts(adm))
        await asyncio.sleep(0.5)
        assert await adm.acquire("low", 30, tokens=14_000) is None
        adm.release(14_000)
        assert await adm.acquire("low", 100, tokens=14_000) is None  # its turn 56 s on: 0.56 s of prefill over 1%
        flow.cancel()
        return loop.time()

    assert run(main()) == pytest.approx(56.5)


def test_once_short_requests_stop_flowing_a_waiting_long_prompt_goes_without_waiting_for_its_turn() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        adm = _engine(flood=0.0)
        assert await adm.acquire("high", 30, tokens=500) is None  # the last short request, at 0
        assert await adm.acquire("low", 30, tokens=20_000) is None
        adm.release(20_000)
        assert await adm.acquire("low", 100, tokens=20_000) is None  # its turn would be at 80 s
        return loop.time()

    assert run(main()) == 10.0  # SHORT_FLOW_SECONDS after the last short request: no release woke it, its timer did


def test_a_share_of_one_lets_a_flood_of_long_prompts_go_as_the_pool_allows() -> None:
    async def main() -> list[object]:
        adm = _engine(share=1.0, flood=0.0)
        flow = asyncio.ensure_future(_shorts(adm))
        heard = await _longs(adm, every=5.0, n=4)
        flow.cancel()
        return heard

    assert run(main()) == [0.5, 5.5, 10.5, 15.5]


def test_a_flood_is_judged_over_by_the_poll_when_no_request_comes_to_judge_it() -> None:
    async def main() -> tuple[bool, bool, bool]:
        adm = _engine(flood=0.0)  # any long prompt is a flood while short ones flow
        assert await adm.acquire("high", 30, tokens=500) is None
        adm.release(500)
        assert await adm.acquire("low", 30, tokens=20_000) is None
        adm.release(20_000)
        during = adm.flooding
        await asyncio.sleep(70.0)  # nothing comes: the gauge would say "flood" for ever
        before_poll = adm.flooding
        adm.judge_flood()  # what every poll does (GatewayServer.follow)
        return during, before_poll, adm.flooding

    assert run(main()) == (True, True, False)
