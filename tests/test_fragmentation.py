from __future__ import annotations

import random

import aiohttp
import pytest

from guardian.analysis.fragmentation import fragmentation, kv_internal_fragmentation
from guardian.sim.engine import EngineModel, EngineParams, SimRequest
from guardian.sim.server import SimServer
from guardian.sources import promtext, vllm_page


def _estimate(engine: EngineModel) -> float:
    (core,) = vllm_page.cores_from_page(promtext.parse(engine.metrics.render().decode()))
    return kv_internal_fragmentation(core.running, core.kv_cache_usage, core.num_gpu_blocks, core.block_size)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("mix", "prompt", "output"), [("short", (20, 400), (16, 200)), ("long", (4000, 30000), (64, 512))])
def test_estimate_is_within_5_points_of_the_simulators_truth(block_size: int, mix: str, prompt, output) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(block_size)
    engine = EngineModel(EngineParams(num_gpu_blocks=200_000 // block_size * 16, block_size=block_size, max_num_seqs=48), seed=1)
    t = 0.0
    checked = 0
    for i in range(400):
        t += 0.05
        if len(engine.running) + len(engine.waiting) < 40:
            engine.submit(SimRequest(prompt_tokens=rng.randint(*prompt), max_tokens=rng.randint(*output), arrival=t))
        engine.advance(t)
        if i >= 100 and i % 20 == 0 and len(engine.running) >= 8:
            truth = engine.truth()["kv_internal_fragmentation_ratio"]
            assert abs(_estimate(engine) - truth) < 0.05, (mix, block_size, truth)
            checked += 1
    assert checked >= 10


def test_no_running_sequences_means_no_internal_waste() -> None:
    assert kv_internal_fragmentation(0, 0.0, 1000, 16) == 0.0
    assert kv_internal_fragmentation(None, 0.5, 1000, 16) is None


def test_ratio_combines_waste_and_overhang_over_held_memory() -> None:
    # 10% of used slots empty, KV half full of a 40 GiB pool -> 2 GiB waste; 3 GiB overhang; 70 GiB held
    f = fragmentation(0.10, 0.5, 40 * 2**30, 3 * 2**30, 70 * 2**30)
    assert f.kv_internal_waste_bytes == pytest.approx(2 * 2**30)
    assert f.ratio == pytest.approx(5 / 70)
    assert fragmentation(None, None, None, None, 70 * 2**30).ratio is None


async def test_simulator_serves_its_truth() -> None:
    server = SimServer(EngineModel(EngineParams(stop_probability=0)))
    await server.start()
    try:
        server.engine.submit(SimRequest(prompt_tokens=100, max_tokens=100, arrival=server.now))
        server.engine.advance(server.now + 0.5)
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + "/sim/state") as r:
                state = await r.json()
    finally:
        await server.stop()
    assert state["running"] == 1 and state["block_size"] == 16
    assert state["internal_waste_slots"] == state["used_blocks"] * 16 - server.engine.running[0].kv_tokens
