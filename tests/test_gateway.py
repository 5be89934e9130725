"""The admission gateway: byte-exact streaming, cancellation, buckets, lanes, the queue, the breaker's gates, drain."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from guardian.actions.gateway import Gates
from guardian.gateway.metrics import GatewayMetrics
from guardian.gateway.proxy import GatewayServer, GatewaySettings
from guardian.policy.buckets import BadRequest, Bucket, choose, prompt_tokens

SSE = b"".join(f'data: {{"id":"cmpl-1","choices":[{{"text":" tok{i}"}}]}}\n\n'.encode() for i in range(20)) + b"data: [DONE]\n\n"


@dataclass
class Upstream:
    """A stand-in vLLM: records what it got, answers slowly when asked, streams a fixed SSE body."""

    name: str
    delay: float = 0.0
    got: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    cancelled: int = 0
    running: int = 0
    url: str = ""
    runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.got.append(body)
        self.headers.append(dict(request.headers))
        self.running += 1
        try:
            if body.get("stream"):
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": self.name})
                await resp.prepare(request)
                for i in range(0, len(SSE), 37):  # odd chunk sizes: frames split across writes
                    await resp.write(SSE[i : i + 37])
                    await asyncio.sleep(self.delay / 20)
                await resp.write_eof()
                return resp
            await asyncio.sleep(self.delay)
            if body.get("fail"):
                return web.json_response({"error": {"message": "boom", "type": "InternalServerError"}}, status=500)
            return web.json_response({"upstream": self.name, "priority": body.get("priority")})
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": self.name}]})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


BUCKETS = (Bucket("short", 4096, ("a",)), Bucket("long", 32768, ("b",)), Bucket("very-long", 128000, ("b",), preemptible=True))
SETTINGS = GatewaySettings(buckets=BUCKETS, concurrency=4, queue_size=8, queue_deadline_seconds=2.0)


@pytest.fixture
async def upstreams() -> AsyncIterator[dict[str, Upstream]]:
    ups = {"a": Upstream("a"), "b": Upstream("b")}
    for u in ups.values():
        await u.start()
    yield ups
    for u in ups.values():
        assert u.runner is not None
        await u.runner.cleanup()


async def _gateway(ups: dict[str, Upstream], settings: GatewaySettings = SETTINGS, **kw: Any) -> GatewayServer:
    gw = GatewayServer(settings, {n: u.url for n, u in ups.items()}, GatewayMetrics(CollectorRegistry()), **kw)
    await gw.start("127.0.0.1", 0)
    return gw


def _url(gw: GatewayServer, path: str = "/v1/completions") -> str:
    assert gw.address is not None
    return f"http://127.0.0.1:{gw.address[1]}{path}"


def _prompt(tokens: int) -> str:
    return "x" * (tokens * 4)


async def _post(http: aiohttp.ClientSession, gw: GatewayServer, body: dict[str, Any], **headers: str) -> tuple[int, Any, dict[str, str]]:
    async with http.post(_url(gw), json=body, headers=headers) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


# -- buckets (pure) -------------------------------------------------------------------------------


def test_buckets_take_the_estimate_and_refuse_nothing_they_cover() -> None:
    assert choose(BUCKETS, 4000).bucket == BUCKETS[0]
    assert choose(BUCKETS, 5000).bucket == BUCKETS[1]
    assert choose(BUCKETS, 100_000).bucket == BUCKETS[2]
    over = choose(BUCKETS, 130_001)
    assert over.bucket is None and over.tokens == 130_001


def test_every_prompt_shape_vllm_takes_is_estimated_and_batches_count_their_total() -> None:
    chat = {"messages": [{"role": "user", "content": "abcd" * 10}, {"role": "user", "content": [{"type": "text", "text": "ab"}]}]}
    assert prompt_tokens(chat, 4.0, chat=True) == 11
    assert prompt_tokens({"prompt": "abcd" * 100}, 4.0, chat=False) == 101
    assert prompt_tokens({"prompt": ["abcd" * 100, "abcd" * 100]}, 4.0, chat=False) == 201
    assert prompt_tokens({"prompt": [1, 2, 3]}, 4.0, chat=False) == 3  # token ids count exactly
    nested = {"prompt": [[7] * 40_000, [8] * 40_000]}
    assert prompt_tokens(nested, 4.0, chat=False) == 80_000  # not "one token": it passes no gate it should not
    assert prompt_tokens({"prompt": [[5] * 100] * 3}, 2.0, chat=False) == 300


@pytest.mark.parametrize(
    ("body", "chat", "says"),
    [
        ({"messages": "hello"}, True, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, True, "messages[0].content[0].text must be a string"),
        ({"messages": [{"role": "user", "content": 5}]}, True, "messages[0].content must be a string"),
        ({"messages": ["hi"]}, True, "messages[0] must be an object"),
        ({"prompt": None}, False, "'prompt' must be"),
        ({"prompt": [1, "a"]}, False, "'prompt' must be"),
        ({"prompt": [[1], [True]]}, False, "'prompt' must be"),
        ({"prompt": []}, False, "'prompt' must be"),
        ([1, 2], False, "must be a JSON object"),
    ],
)
def test_a_body_that_is_not_an_openai_request_says_what_is_wrong(body: Any, chat: bool, says: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(says)):
        prompt_tokens(body, 4.0, chat)


async def test_bad_bodies_get_400_or_413_with_a_json_reason_and_never_reach_vllm(upstreams: dict[str, Upstream]) -> None:
    gw = await _gateway(upstreams, replace(SETTINGS, max_body_bytes=64 * 1024))
    try:
        async with aiohttp.ClientSession() as http:
            answers = []
            for data in [b"{" * 100_000 + b"}" * 100_000, b'{"prompt": [' * 30_000 + b"]" * 30_000 + b"}",
                         b"x" * (65 * 1024), b'{"messages": [{"content": [{"text": 1}]}]}', b"\xff\xfe", b"[]"]:  # fmt: skip
                async with http.post(_url(gw, "/v1/chat/completions" if b"messages" in data else "/v1/completions"), data=data,
                                     headers={"Content-Type": "application/json"}) as resp:  # fmt: skip
                    answers.append((resp.status, (await resp.json())["error"]["message"]))
    finally:
        await gw.close()
    statuses = [a[0] for a in answers]
    assert statuses == [413, 413, 413, 400, 400, 400], answers
    assert "larger than this gateway takes (65536 bytes" in answers[0][1]
    assert upstreams["a"].got == [] and upstreams["b"].got == []


async def test_deep_json_inside_the_limit_is_a_400_not_a_500(upstreams: dict[str, Upstream]) -> None:
    gw = await _gateway(upstreams)
    try:
        async with aiohttp.ClientSession() as http:
            deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            async with http.post(_url(gw), data=deep, headers={"Content-Type": "application/json"}) as resp:
                status, doc = resp.status, await resp.json()
    finally:
        await gw.close()
    assert status == 400 and doc["error"]["message"] in ("The request body is nested too deeply.",
                                                         "'prompt' must be a non-empty string, a list of strings, a list "
                                                         "of token ids (integers) or a list of lists of token ids")  # fmt: skip


# -- the proxy ------------------------------------------------------------------------------------


async def test_a_streamed_answer_arrives_byte_for_byte_with_its_headers(upstreams: dict[str, Upstream]) -> None:
    gw = await _gateway(upstreams)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(_url(gw), json={"prompt": "hi", "stream": True}) as resp:
                body = await resp.read()
                assert resp.headers["Content-Type"] == "text/event-stream" and resp.headers["X-Upstream"] == "a"
            async with http.get(_url(gw, "/v1/models")) as resp:
                assert (await resp.json()) == {"data": [{"id": "a"}]}  # anything else passes through
    finally:
        await gw.close()
    assert body == SSE


async def test_a_client_that_goes_away_cancels_the_upstream_request(upstreams: dict[str, Upstream]) -> None:
    upstreams["a"].delay = 20.0
    gw = await _gateway(upstreams)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(_url(gw), json={"prompt": "hi", "stream": True}) as resp:
                await resp.content.readany()  # the first chunk, then hang up
        for _ in range(100):
            if upstreams["a"].cancelled:
                break
            await asyncio.sleep(0.02)
        assert upstreams["a"].cancelled == 1 and gw.admission["a"].in_flight == 0
    finally:
        await gw.close()


async def test_each_bucket_goes_to_its_pool_and_an_over_long_prompt_gets_400(upstreams: dict[str, Upstream]) -> None:
    gw = await _gateway(upstreams)
    try:
        async with aiohttp.ClientSession() as http:
            assert (await _post(http, gw, {"prompt": _prompt(100)}))[1]["upstream"] == "a"
            assert (await _post(http, gw, {"prompt": _prompt(20_000)}))[1]["upstream"] == "b"
            chat = {"messages": [{"role": "user", "content": _prompt(60_000)}]}
            assert (await http.post(_url(gw, "/v1/chat/completions"), json=chat)).status == 200
            status, doc, _ = await _post(http, gw, {"prompt": _prompt(200_000)})
            failing = await _post(http, gw, {"prompt": "x", "fail": True})
    finally:
        await gw.close()
    assert status == 400 and "longer than the largest bucket (128000 tokens)" in doc["error"]["message"]
    assert failing[0] == 500 and failing[1]["error"]["message"] == "boom"  # upstream errors pass through unchanged
    assert len(upstreams["b"].got) == 2


async def test_the_lane_becomes_vllms_priority_and_a_key_can_be_replaced(upstreams: dict[str, Upstream]) -> None:
    settings = replace(SETTINGS, inject_priority=True, high_priority_keys=frozenset({"vip-key"}))
    gw = await _gateway(upstreams, settings, api_keys={"a": "upstream-key"})
    try:
        async with aiohttp.ClientSession() as http:
            high = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "high"})
            low = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "low"})
            vip = await _post(http, gw, {"prompt": "x"}, Authorization="Bearer vip-key", **{"x-guardian-priority": ""})
    finally:
        await gw.close()
    assert (high[1]["priority"], low[1]["priority"], vip[1]["priority"]) == (0, 10, 0)
    assert {h["Authorization"] for h in upstreams["a"].headers} == {"Bearer upstream-key"}


async def test_the_high_lane_can_have_a_pool_of_its_own(upstreams: dict[str, Upstream]) -> None:
    gw = await _gateway(upstreams, replace(SETTINGS, high_priority_engines=("b",)))
    try:
        async with aiohttp.ClientSession() as http:
            high = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "high"})
            low = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "low"})
    finally:
        await gw.close()
    assert (high[1]["upstream"], low[1]["upstream"]) == ("b", "a")


async def test_a_burst_queues_then_gets_429_with_retry_after(upstreams: dict[str, Upstream]) -> None:
    upstreams["a"].delay = 1.0
    settings = replace(SETTINGS, concurrency=1, queue_size=1, queue_deadline_seconds=0.3)
    gw = await _gateway(upstreams, settings)
    try:
        async with aiohttp.ClientSession() as http:
            results = await asyncio.gather(*(_post(http, gw, {"prompt": "x"}) for _ in range(3)))
    finally:
        await gw.close()
    codes = sorted(code for code, _, _ in results)
    assert codes == [200, 429, 429]
    refused = [(doc, headers) for code, doc, headers in results if code == 429]
    assert {doc["error"]["message"].split(" (")[0].split(":")[0] for doc, _ in refused} == {
        "the queue in front of the engine is full", "the engine is busy"}  # fmt: skip
    assert all(int(h["Retry-After"]) >= 1 for _, h in refused)


async def test_the_breakers_gates(upstreams: dict[str, Upstream]) -> None:
    settings = replace(SETTINGS, long_context_tokens=8000, queue_deadline_seconds=0.5)
    gw = await _gateway(upstreams, settings)
    try:
        async with aiohttp.ClientSession() as http:
            await gw.set_gates("b", Gates.for_level(1, "fragmentation"))
            long = await _post(http, gw, {"prompt": _prompt(20_000)})
            short_on_b = await _post(http, gw, {"prompt": _prompt(5000)})
            await gw.set_gates("a", Gates.for_level(2, "kv_usage"))
            paused = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "low"})
            high_at_l2 = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "high"})
            await gw.set_gates("a", Gates.for_level(3, "engine_dead"))
            low_at_l3 = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "low"})
            high_at_l3 = await _post(http, gw, {"prompt": "x"})
            await gw.set_gates("a", Gates.for_level(0))
            low_again = await _post(http, gw, {"prompt": "x"}, **{"x-guardian-priority": "low"})
    finally:
        await gw.close()
    assert long[0] == 503 and "at breaker L1 (fragmentation)" in long[1]["error"]["message"] and long[2]["Retry-After"] == "60"
    assert short_on_b[0] == 200  # below the long-context line: admitted at L1
    assert paused[0] == 429 and "low-priority work is paused (breaker L2 (kv_usage))" in paused[1]["error"]["message"]
    assert high_at_l2[0] == 200 and high_at_l3[0] == 200 and low_again[0] == 200
    assert low_at_l3[0] == 503 and "only high-priority" in low_at_l3[1]["error"]["message"]
    assert "at breaker L3 (engine_dead)" in low_at_l3[1]["error"]["message"]  # the real level and rule, not L1's words


async def test_a_drain_lets_in_flight_finish_holds_new_ones_and_fails_none(upstreams: dict[str, Upstream]) -> None:
    upstreams["a"].delay = 0.5
    gw = await _gateway(upstreams, replace(SETTINGS, queue_deadline_seconds=10.0))
    try:
        async with aiohttp.ClientSession() as http:
            first = [asyncio.create_task(_post(http, gw, {"prompt": "x"})) for _ in range(3)]
            await asyncio.sleep(0.1)
            drained = asyncio.create_task(gw.drain("a", timeout=5))
            await asyncio.sleep(0.05)
            later = [asyncio.create_task(_post(http, gw, {"prompt": "x"})) for _ in range(3)]
            outcome = await drained
            assert outcome.status == "done" and upstreams["a"].running == 0 and len(upstreams["a"].got) == 3
            await asyncio.sleep(0.3)
            assert len(upstreams["a"].got) == 3  # the later ones wait in the gateway
            await gw.admit("a")
            results = await asyncio.gather(*first, *later)
    finally:
        await gw.close()
    assert [code for code, _, _ in results] == [200] * 6


async def test_low_priority_is_not_starved_by_a_stream_of_high(upstreams: dict[str, Upstream]) -> None:
    upstreams["a"].delay = 0.05
    gw = await _gateway(upstreams, replace(SETTINGS, concurrency=1, queue_size=100, queue_deadline_seconds=30.0))
    order: list[str] = []
    try:
        async with aiohttp.ClientSession() as http:

            async def one(lane: str) -> None:
                await _post(http, gw, {"prompt": lane}, **{"x-guardian-priority": lane})
                order.append(lane)

            highs = [asyncio.create_task(one("high")) for _ in range(12)]
            await asyncio.sleep(0.02)
            low = asyncio.create_task(one("low"))
            await asyncio.gather(*highs, low)
    finally:
        await gw.close()
    # one high was in flight when the low queued behind eleven more; every 5th slot goes to the low lane
    assert order.index("low") <= 6, order  # without the fairness it would be last (12)


async def test_requests_skip_a_dead_engine_and_with_none_left_get_503_with_retry_after_at_once(upstreams: dict[str, Upstream]) -> None:
    pool = GatewaySettings(buckets=(Bucket("all", 128000, ("a", "b")),), queue_deadline_seconds=30.0)
    gw = await _gateway(upstreams, pool)
    try:
        async with aiohttp.ClientSession() as http:
            gw.set_available("a", False, "dead")  # the daemon's lifecycle after a poll
            answers = [await _post(http, gw, {"prompt": "x"}) for _ in range(6)]
            assert [a[1]["upstream"] for a in answers] == ["b"] * 6  # least loaded would pick "a" first on ties
            gw.set_available("b", False, "starting")
            started = asyncio.get_running_loop().time()
            status, doc, headers = await _post(http, gw, {"prompt": "x"})
            waited = asyncio.get_running_loop().time() - started
            gw.set_available("a", True, "up")
            assert (await _post(http, gw, {"prompt": "x"}))[1]["upstream"] == "a"
    finally:
        await gw.close()
    assert status == 503 and "Retry-After" in headers and waited < 1.0  # not after the 30 s queue deadline
    assert "a: dead" in doc["error"]["message"] and "b: starting" in doc["error"]["message"]


async def test_a_refused_connection_takes_the_engine_out_of_the_pool_until_the_next_poll(upstreams: dict[str, Upstream]) -> None:
    pool = GatewaySettings(buckets=(Bucket("all", 128000, ("a", "b")),))
    assert upstreams["a"].runner is not None
    await upstreams["a"].runner.cleanup()  # "a" is gone: nothing listens there
    gw = await _gateway(upstreams, pool)
    try:
        async with aiohttp.ClientSession() as http:
            first = await _post(http, gw, {"prompt": "x"})
            rest = [await _post(http, gw, {"prompt": "x"}) for _ in range(4)]
    finally:
        await gw.close()
    assert first[0] == 502 and gw.down == {"a": "refused"}
    assert [r[1]["upstream"] for r in rest] == ["b"] * 4


async def test_only_the_route_table_is_proxied_and_vllms_admin_paths_never_are(upstreams: dict[str, Upstream]) -> None:
    hits: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        hits.append(f"{request.method} {request.path} {request.headers.get('Authorization')}")
        return web.json_response({"ok": True})

    extra = Upstream("x")
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    extra.runner = web.AppRunner(app)
    await extra.runner.setup()
    site = web.TCPSite(extra.runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    settings = GatewaySettings(buckets=(Bucket("all", 128000, ("x",)),), extra_paths=("/v1/embeddings", "/tokenize"))
    gw = GatewayServer(settings, {"x": url}, GatewayMetrics(CollectorRegistry()), {"x": "engine-key"})
    await gw.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            answers = {}
            for method, path in [("POST", "/pause?mode=abort"), ("POST", "/sleep?level=1"), ("POST", "/reset_prefix_cache"),
                                 ("GET", "/server_info"), ("GET", "/metrics"), ("POST", "/v1/nope"), ("GET", "/v1/models"),
                                 ("POST", "/v1/embeddings"), ("POST", "/tokenize")]:  # fmt: skip
                async with http.request(method, _url(gw, path), json={"input": "x"}, headers={"Authorization": "Bearer client"}) as resp:
                    answers[path] = (resp.status, await resp.json())
    finally:
        await gw.close()
        await extra.runner.cleanup()
    for path in ("/pause?mode=abort", "/sleep?level=1", "/reset_prefix_cache", "/server_info", "/metrics"):
        status, doc = answers[path]
        assert status == 404 and "admin endpoints, never proxied" in doc["error"]["message"], path
    assert answers["/v1/nope"][0] == 404 and "not proxied" in answers["/v1/nope"][1]["error"]["message"]
    assert hits == ["GET /v1/models Bearer engine-key", "POST /v1/embeddings Bearer engine-key",
                    "POST /tokenize Bearer client"]  # the engine's key only where vLLM asks for one  # fmt: skip


def _malformed(rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    """One generated bad request: broken JSON, wrong shapes, odd headers, odd methods and paths."""
    path = rng.choice(["/v1/completions", "/v1/chat/completions", "/v1/models", "/pause", "/x", "/v1/completions?x=%ff"])
    method = rng.choice(["POST", "POST", "POST", "GET", "PUT", "DELETE"])
    values: list[Any] = [None, True, 3, -1, 1.5, "s", [], {}, [1, "a"], [[1], "b"], {"a": 1}, "x" * 50, [[-1]], [True]]
    body: Any = rng.choice([
        {"prompt": rng.choice(values)}, {"messages": rng.choice(values)},
        {"messages": [{"role": "user", "content": rng.choice(values)}]},
        {"messages": [{"content": [{"type": "text", "text": rng.choice(values)}]}]}, rng.choice(values),
    ])  # fmt: skip
    raw = json.dumps(body).encode()
    cut = rng.random()
    if cut < 0.2:
        raw = raw[: rng.randrange(len(raw) + 1)]  # cut off
    elif cut < 0.3:
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))  # noise
    elif cut < 0.35:
        raw = b"[" * rng.randrange(500, 5000)
    headers = {"Content-Type": rng.choice(["application/json", "text/plain", "application/x-www-form-urlencoded"])}
    if rng.random() < 0.2:
        headers[rng.choice(["Authorization", "x-guardian-priority"])] = rng.choice(["Bearer \u00e9\u00e8", "high", "???", "Bearer "])
    return method, path, raw, headers


async def test_thousands_of_malformed_requests_get_no_500_and_log_no_traceback(
    upstreams: dict[str, Upstream], capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(14)
    gw = await _gateway(upstreams, replace(SETTINGS, max_body_bytes=16 * 1024))
    statuses: Counter[int] = Counter()
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(2000):
                method, path, raw, headers = _malformed(rng)
                async with http.request(method, _url(gw, path), data=raw, headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] += 1
    finally:
        await gw.close()
    out = capsys.readouterr()
    assert statuses[500] == 0 and not any(s >= 500 and s != 503 for s in statuses), statuses
    assert "Traceback" not in out.out + out.err
    assert statuses[400] > 300 and statuses[404] > 100  # the generator does reach both kinds


async def test_both_listeners_of_a_running_guardian_take_a_fuzz_without_a_5xx_a_traceback_or_a_missed_poll(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import psutil

    from guardian.daemon import Daemon
    from guardian.commands.demo import demo_config
    from guardian.sdnotify import Notifier
    from guardian.sim import scenarios
    from guardian.sim.cluster import SimCluster

    cluster = SimCluster(scenarios.get("steady"), engines=1, seed=14)
    await cluster.start()
    config = demo_config(cluster, 0, 0.5, tmp_path / "state")  # a poll held past half a second would count as missed
    (tmp_path / "token").write_text("t\n")
    config = config.model_copy(update={"guardian": config.guardian.model_copy(update={"api_token_file": tmp_path / "token"})})
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""))
    await daemon.start()
    rng = random.Random(15)
    statuses: Counter[int] = Counter()
    rss0 = psutil.Process().memory_info().rss
    try:
        assert daemon.gateway is not None and daemon.gateway.address and daemon.http_address
        bases = [f"http://127.0.0.1:{daemon.gateway.address[1]}", f"http://127.0.0.1:{daemon.http_address[1]}"]
        polls0 = daemon.metrics.polls._value.get()
        async with aiohttp.ClientSession() as http:
            for i in range(1500):
                method, path, raw, headers = _malformed(rng)
                if i % 3 == 2:  # the API listener: its paths, the same garbage
                    path = rng.choice(["/api/v1/breaker/sim0", "/api/v1/alerts/ack", "/api/v1/alertmanager", "/status", "/nope"])
                base = bases[i % 3 == 2]
                timeout = aiohttp.ClientTimeout(total=0.05 if i % 50 == 0 else 10)  # now and then a client hangs up
                try:
                    async with http.request(method, base + path, data=raw, headers=headers, timeout=timeout) as resp:
                        await resp.read()
                        statuses[resp.status] += 1
                except asyncio.TimeoutError:
                    statuses[0] += 1
        await asyncio.sleep(0.5)
        polls = daemon.metrics.polls._value.get() - polls0
        missed = daemon.metrics.polls_missed._value.get()
    finally:
        await daemon.close()
        await cluster.stop()
    out = capsys.readouterr()
    assert not any(s >= 500 and s != 503 for s in statuses), statuses
    assert "Traceback" not in out.out + out.err
    assert polls >= 3 and missed == 0
    assert psutil.Process().memory_info().rss - rss0 < 200 * 2**20
