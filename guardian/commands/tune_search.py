"""``guardian tune``: the offline search operators run before go-live.

A grid over ``--block-size`` × ``--max-num-seqs`` × speculation on/off. Each
point is a drained restart of the engine with those arguments (the same
``DrainedRestart`` the breaker uses, so a point vLLM would refuse is refused
before anything stops), then a fixed-seed, standardised request set sent at
increasing rates: open-loop Poisson arrivals, streamed, ``ignore_eos`` so
every request generates exactly its ``max_tokens``, prompts as token ids so
their length does not depend on the tokenizer. Per rate: P99 TTFT as the
client sees it, finished requests and tokens per second. A point stops
climbing once it misses the SLO (the next rate would only miss it more).

The best point is the one that finishes the most requests per second with
P99 inside the SLO and nothing failed. Results go to a JSON-lines file as
they are measured: a second run with the same file skips what is done, so an
interrupted search resumes where it stopped. At the end the engine is
restarted with its own arguments again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

import aiohttp

from guardian.actions.engine_args import EngineArgs, block_size_ok, overlay, valid_block_sizes
from guardian.commands.plotting import plain_log_axis, pyplot


class TuneError(ValueError):
    """Bad input to the search: said before any engine is restarted."""


@dataclass(frozen=True)
class Point:
    block_size: int
    max_num_seqs: int
    speculation: bool

    @property
    def key(self) -> str:
        return f"block{self.block_size}-seqs{self.max_num_seqs}-spec{'on' if self.speculation else 'off'}"

    def args(self, speculative_config: dict[str, Any] | None) -> dict[str, Any]:
        """The layer over the engine's own arguments (None removes --speculative-config)."""
        return {"block-size": self.block_size, "max-num-seqs": self.max_num_seqs,
                "speculative-config": speculative_config if self.speculation else None}  # fmt: skip

    def __str__(self) -> str:
        return f"block {self.block_size}, max-num-seqs {self.max_num_seqs}, speculation {'on' if self.speculation else 'off'}"


@dataclass(frozen=True)
class Request:
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Measurement:
    point: str
    rate: float
    seconds: float
    sent: int
    finished: int
    failed: int
    p50_ttft_seconds: float | None
    p99_ttft_seconds: float | None
    requests_per_second: float  # finished over the time from the first arrival to the last answer, as vLLM's benchmarks count
    tokens_per_second: float
    error: str | None = None  # the point could not be measured (vLLM refused its arguments, did not start)
    failure: str | None = None  # why the first failed request failed (HTTP status and vLLM's message, or the error)

    def meets(self, slo_seconds: float) -> bool:
        return self.error is None and self.failed == 0 and self.p99_ttft_seconds is not None and self.p99_ttft_seconds <= slo_seconds


# -- pure: the grid, the request set, the verdict ------------------------------------------------


def grid(block_sizes: Iterable[int], max_num_seqs: Iterable[int], speculation: Iterable[bool], backend: str,
         speculative_config: dict[str, Any] | None) -> list[Point]:  # fmt: skip
    blocks = sorted(set(block_sizes))
    bad = [b for b in blocks if not block_size_ok(b, backend)]
    if bad:
        raise TuneError(f"block size {', '.join(map(str, bad))} is refused by vLLM's {backend} backend: use {valid_block_sizes(backend)}")
    seqs = sorted(set(max_num_seqs))
    if not seqs or min(seqs) < 1:
        raise TuneError("max_num_seqs values must be 1 or more")
    spec = sorted(set(speculation))
    if True in spec and not speculative_config:
        raise TuneError("speculation on needs [tuner] speculative_config (e.g. {method = \"ngram\", num_speculative_tokens = 3})")
    return [Point(b, n, s) for b in blocks for n in seqs for s in spec]


def requests(n: int, seed: int, prompt_median: int, prompt_sigma: float, prompt_max: int, output_median: int,
             output_sigma: float, output_max: int) -> list[Request]:  # fmt: skip
    """The standardised set: the same lengths for every point and every run with this seed."""
    rng = random.Random(seed)

    def draw(median: int, sigma: float, top: int) -> int:
        return max(1, min(top, int(rng.lognormvariate(math.log(median), sigma))))

    return [Request(draw(prompt_median, prompt_sigma, prompt_max), draw(output_median, output_sigma, output_max)) for _ in range(n)]


def best(results: Iterable[Measurement], slo_seconds: float) -> Measurement | None:
    inside = [m for m in results if m.meets(slo_seconds)]
    return max(inside, key=lambda m: (m.requests_per_second, -(m.p99_ttft_seconds or 0))) if inside else None


def table(results: list[Measurement], slo_seconds: float, chosen: Measurement | None) -> str:
    lines = [f"{'point':<28} {'rate':>6} {'p50 ttft':>9} {'p99 ttft':>9} {'req/s':>7} {'tok/s':>8} {'failed':>6}  SLO"]
    for m in results:
        if m.error is not None:
            lines.append(f"{m.point:<28} {'-':>6} {'':>9} {'':>9} {'':>7} {'':>8} {'':>6}  not measured: {m.error}")
            continue
        mark = "ok" if m.meets(slo_seconds) else "missed"
        if m is chosen:
            mark += "  <- best"
        lines.append(f"{m.point:<28} {m.rate:>6g} {_ms(m.p50_ttft_seconds):>9} {_ms(m.p99_ttft_seconds):>9} "
                     f"{m.requests_per_second:>7.2f} {m.tokens_per_second:>8.0f} {m.failed:>6}  {mark}")  # fmt: skip
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# -- the results file: what makes the search resumable ---------------------------------------------


def load_results(path: Path) -> list[Measurement]:
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if n == 1 and isinstance(doc, dict) and "settings" in doc:
                continue
            out.append(Measurement(**doc))
        except (json.JSONDecodeError, TypeError) as exc:
            raise TuneError(f"{path}:{n}: not a result line of guardian tune ({exc}); move the file away to start over") from None
    return out


def settings(search: Search) -> dict[str, Any]:
    """What makes two runs' measurements comparable: a results file is resumed only by a run with the same."""
    lengths = hashlib.sha256(json.dumps([(r.prompt_tokens, r.max_tokens) for r in search.reqs]).encode()).hexdigest()[:16]
    return {"base_args": dict(search.base_args), "seconds": search.seconds, "seed": search.seed,
            "requests": len(search.reqs), "request_lengths": lengths, "speculative_config": search.speculative_config}  # fmt: skip


def check_settings(path: Path, ours: dict[str, Any]) -> None:
    """Start the file with ours, or refuse one made with others: its numbers would not compare with ours."""
    if not path.exists() or not path.read_text(encoding="utf-8").strip():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"settings": ours}) + "\n", encoding="utf-8")
        return
    first = path.read_text(encoding="utf-8").splitlines()[0]
    try:
        theirs = json.loads(first).get("settings")
    except (json.JSONDecodeError, AttributeError):
        theirs = None
    if theirs != json.loads(json.dumps(ours)):
        differ = sorted(k for k in ours if not isinstance(theirs, dict) or theirs.get(k) != json.loads(json.dumps(ours[k])))
        raise TuneError(f"{path} holds results measured with other settings ({', '.join(differ) or 'none recorded'}): "
                        "move it away (or pass --results) to start over")  # fmt: skip


def append_result(path: Path, m: Measurement) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(m)) + "\n")
        f.flush()


# -- the load: one rate against one engine ----------------------------------------------------------


async def measure(session: aiohttp.ClientSession, url: str, served: Served, api_key: str | None, reqs: list[Request],
                  rate: float, seconds: float, seed: int, point: str, finish_seconds: float = 120.0) -> Measurement:  # fmt: skip
    """Open-loop Poisson arrivals at ``rate`` for ``seconds``; then wait for the stragglers (at most ``finish_seconds``)."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    ttfts: list[float] = []
    tokens = 0
    failed = 0
    failure: str | None = None
    tasks: list[asyncio.Task[None]] = []
    rng_ids = random.Random(seed + 1)  # the prompt's token ids: drawn from the model's own, the same every run

    def failing(why: str) -> None:
        nonlocal failed, failure
        failed += 1
        failure = failure or why

    async def one(req: Request) -> None:
        nonlocal tokens
        req = served.fit(req)
        body = {"model": served.model, "prompt": [rng_ids.choice(served.token_ids) for _ in range(req.prompt_tokens)],
                "max_tokens": req.max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        sent = time.monotonic()
        first: float | None = None
        usage = None
        try:
            async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
                if resp.status != 200:
                    failing(f"HTTP {resp.status}: {_message(await resp.text())}")
                    return
                async for raw in resp.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if first is None and any(c.get("text") for c in chunk.get("choices") or ()):
                        first = time.monotonic()
                    usage = chunk.get("usage") or usage
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
            failing(f"{type(exc).__name__}: {exc}"[:200])
            return
        if first is None:
            failing("the stream ended without a token")
            return
        ttfts.append(first - sent)
        tokens += int(usage["completion_tokens"]) if usage else req.max_tokens

    started = time.monotonic()
    i = 0
    while True:
        await asyncio.sleep(rng.expovariate(rate))
        if time.monotonic() - started >= seconds:
            break
        tasks.append(asyncio.create_task(one(reqs[i % len(reqs)])))
        i += 1
    done, pending = await asyncio.wait(tasks, timeout=finish_seconds) if tasks else (set(), set())
    if pending:
        failure = failure or f"{len(pending)} requests unfinished {finish_seconds:g}s after the last arrival"
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    elapsed = time.monotonic() - started
    finished = len(ttfts)
    return Measurement(
        point=point, rate=rate, seconds=round(elapsed, 2), sent=len(tasks), finished=finished, failed=failed + len(pending),
        p50_ttft_seconds=quantile(ttfts, 0.5), p99_ttft_seconds=quantile(ttfts, 0.99),
        requests_per_second=round(finished / elapsed, 3), tokens_per_second=round(tokens / elapsed, 1),
        failure=failure,
    )  # fmt: skip


def _message(body: str) -> str:
    """vLLM's own error message out of its JSON error body, else the body's start."""
    try:
        doc = json.loads(body)
        error = doc.get("error", doc) if isinstance(doc, dict) else doc
        text = error.get("message") if isinstance(error, dict) else None
        return str(text or body)[:200]
    except ValueError:
        return body[:200]


# seeded pseudo-text: its token ids are ids the served tokenizer really produces, whatever its vocabulary
VOCABULARY_TEXT = " ".join(
    "".join(random.Random(i).choices("etaoinshrdlcumwfgypbvkjxqz", k=3 + i % 7)) for i in range(600)
) + " The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?()[]{}"


@dataclass(frozen=True)
class Served:
    """What the engine serves: the model's name, token ids its tokenizer produces, and its context length."""

    model: str
    token_ids: list[int]
    max_model_len: int | None

    def fit(self, req: Request) -> Request:
        """The request shortened to fit the model's context (vLLM refuses one that does not)."""
        if self.max_model_len is None or req.prompt_tokens + req.max_tokens <= self.max_model_len:
            return req
        out = min(req.max_tokens, self.max_model_len // 4)
        return Request(max(1, self.max_model_len - out - 1), out)


async def served_by(session: aiohttp.ClientSession, url: str, api_key: str | None) -> Served:
    """The served model (``/v1/models``) and its tokenizer's ids (``/tokenize``): prompts only of ids the model has."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with session.get(url + "/v1/models", headers=headers) as resp:
        if resp.status != 200:
            raise TuneError(f"GET {url}/v1/models answered HTTP {resp.status}")
        data = await resp.json()
    models = data.get("data") or []
    if not models:
        raise TuneError(f"{url} serves no model")
    model = str(models[0].get("id"))
    async with session.post(url + "/tokenize", json={"model": model, "prompt": VOCABULARY_TEXT}, headers=headers) as resp:
        if resp.status != 200:
            raise TuneError(f"POST {url}/tokenize answered HTTP {resp.status}: guardian tune draws its prompts from the "
                            "ids the served tokenizer gives, so that every id exists in the model's vocabulary")  # fmt: skip
        tokenized = await resp.json()
    ids = sorted({int(t) for t in tokenized.get("tokens") or ()})
    if not ids:
        raise TuneError(f"POST {url}/tokenize gave no token ids")
    length = tokenized.get("max_model_len") or models[0].get("max_model_len")
    return Served(model, ids, int(length) if length else None)


# -- the search --------------------------------------------------------------------------------------


Restart = Callable[[EngineArgs], Any]  # awaitable Outcome


@dataclass(frozen=True)
class Search:
    url: str
    api_key: str | None
    base_args: EngineArgs
    points: list[Point]
    rates: list[float]
    seconds: float
    reqs: list[Request]
    slo_seconds: float
    seed: int
    speculative_config: dict[str, Any] | None
    results_path: Path


async def run(search: Search, restart: Restart, out: TextIO | None = None) -> list[Measurement]:
    """Every point not yet in the results file, measured; returns all results (old and new) in grid order."""
    out = out or sys.stdout
    check_settings(search.results_path, settings(search))
    done = load_results(search.results_path)
    have = {(m.point, m.rate) for m in done}
    stopped = {m.point for m in done if m.error or not m.meets(search.slo_seconds)}
    todo = [p for p in search.points if p.key not in stopped and any((p.key, r) not in have for r in search.rates)]
    print(f"guardian tune: {len(search.points)} points × {len(search.rates)} rates, {search.seconds:g} s each; "
          f"{len(search.points) - len(todo)} already in {search.results_path}", file=out, flush=True)  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        for n, point in enumerate(todo, 1):
            print(f"[{n}/{len(todo)}] {point}: restarting the engine", file=out, flush=True)
            args = overlay(search.base_args, point.args(search.speculative_config))
            outcome = await restart(args)
            if not outcome.ok:
                m = Measurement(point.key, 0, 0, 0, 0, 0, None, None, 0, 0, error=f"{outcome.status}: {outcome.detail}")
                append_result(search.results_path, m)
                print(f"    not measured: {m.error}", file=out, flush=True)
                continue
            served = await served_by(session, search.url, search.api_key)
            for rate in search.rates:
                if (point.key, rate) in have:
                    continue
                m = await measure(session, search.url, served, search.api_key, search.reqs, rate, search.seconds,
                                  search.seed, point.key)  # fmt: skip
                append_result(search.results_path, m)
                verdict = "ok" if m.meets(search.slo_seconds) else (
                    f"failed ({m.failure})" if m.failed else "missed the SLO")  # fmt: skip
                print(f"    {rate:g} req/s: p99 ttft {_ms(m.p99_ttft_seconds)}, {m.requests_per_second:.2f} req/s, "
                      f"{m.tokens_per_second:.0f} tok/s, {m.failed} failed: {verdict}", file=out, flush=True)  # fmt: skip
                if not m.meets(search.slo_seconds):
                    break  # a higher rate would only miss it more
    results = load_results(search.results_path)
    order = {p.key: i for i, p in enumerate(search.points)}
    return sorted((m for m in results if m.point in order), key=lambda m: (order[m.point], m.rate))


def plot(results: list[Measurement], slo_seconds: float, path: Path, inspect: Callable[[Any], None] | None = None) -> None:
    """P99 and throughput against offered load, per point; the SLO a black line, the best point a star on both."""
    plt = pyplot()
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(13, 4.8))
    for key in dict.fromkeys(m.point for m in results if m.error is None):
        ms = [m for m in results if m.point == key and m.error is None]
        lat.plot([m.rate for m in ms], [(m.p99_ttft_seconds or 0) * 1000 for m in ms], marker="o", lw=1, label=key)
        thr.plot([m.rate for m in ms], [m.requests_per_second for m in ms], marker="o", lw=1, label=key)
    lat.axhline(slo_seconds * 1000, color="black", ls="--", lw=1, label=f"SLO {slo_seconds * 1000:g} ms")
    chosen = best(results, slo_seconds)
    if chosen is not None:
        lat.plot([chosen.rate], [(chosen.p99_ttft_seconds or 0) * 1000], marker="*", ms=16, color="black", ls="none",
                 label=f"best: {chosen.point}")  # fmt: skip
        thr.plot([chosen.rate], [chosen.requests_per_second], marker="*", ms=16, color="black", ls="none")
    lat.set(xlabel="offered load (req/s)", ylabel="P99 TTFT (ms)", title="P99 time to first token", yscale="log")
    plain_log_axis(lat.yaxis)
    thr.set(xlabel="offered load (req/s)", ylabel="finished (req/s)", title="throughput")
    lat.legend(fontsize=7)
    if inspect is not None:
        inspect(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
