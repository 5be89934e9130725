"""guardian's gateway beside nginx (and vllm-router, where it installs): what relaying costs per request and per SSE chunk.

    python bench/proxies.py [--requests 3000] [--streams 96] [--in-flight 32] [--chunks 200] [--pace-ms 2] [--no-valgrind]
                            [--rate 40000] [--rate-seconds 10]

Set-up, in one run: a fixed-cost upstream in its own process (canned
completions; a stream of N server-sent events written one by one, back to
back or paced), and each proxy in front of it in turn: guardian (`guardian run` with
`[gateway]`, its poll slowed to once an hour so that only the relay is
measured), nginx (Debian's package: one worker, `proxy_buffering off`,
upstream keep-alive) and vllm-router when `vllm-router` is on PATH. The
client (this process, aiohttp) also goes direct, to check the upstream.

Figures per proxy:
- CPU per plain request and per SSE chunk: the proxy's processes' user +
  system CPU over the load, less their idle CPU over as long, divided by
  the requests (chunks: paced streams, 32 at once, an event every 2 ms
  each, less the streams' per-request share);
- instructions per request and per chunk (valgrind's callgrind, counters
  zeroed after a warm-up and dumped after the load, less an idle stretch as
  long): the repeatable figure on a shared machine;
- chunks merged in the paced streams (an HTTP chunk carrying more than
  one event, at the rate they were offered) and streams broken (an event
  lost or cut, or no `[DONE]`);
- the ratio of each to nginx's;
- at ``--rate`` events/s (40k: an 8-GPU host's streams), beyond what the
  Python upstream and client produce: ``bench/sse_load.c`` (compiled with
  the system's ``cc``; left out without one) serves and reads 64 paced
  streams natively, and each proxy's CPU over the run is its share of one
  core, with the events that arrived, merged and late (the run's wall time
  over the pacing's).

Targets (issue 17): per SSE chunk <= 1.3x nginx's CPU; per plain request
<= 2x vllm-router's; no chunk merged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import free_port  # noqa: E402

PAGE = ROOT / "tests" / "fixtures" / "vllm-0.33-metrics.txt"
BODY = {"model": "m", "prompt": "Say hello to the proxy.", "max_tokens": 16, "stream": False}


# -- the upstream -------------------------------------------------------------------------------


def serve_upstream(port: int) -> None:
    """A fixed-cost vLLM stand-in: the same answer every time, events written one by one (run in a child process)."""
    from aiohttp import web

    page = PAGE.read_bytes()
    answer = json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                         "choices": [{"index": 0, "text": " hello" * 16, "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 6, "completion_tokens": 16, "total_tokens": 22}}).encode()  # fmt: skip
    event = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hello"}]}\n\n'

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=answer, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        pace = body.get("pace_ms", 0) / 1000
        for _ in range(int(body["max_tokens"])):
            await response.write(event)  # one HTTP chunk per event, as vLLM writes them
            if pace:
                await asyncio.sleep(pace)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the proxies --------------------------------------------------------------------------------


@dataclass
class Proxy:
    name: str
    url: str
    process: subprocess.Popen[bytes] | None  # None: direct

    def pids(self) -> list[int]:
        if self.process is None:
            return []
        root = psutil.Process(self.process.pid)
        return [root.pid] + [c.pid for c in root.children(recursive=True)]

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_guardian(tmp: Path, upstream: str, prefix: list[str]) -> Proxy:
    port, api = free_port(), free_port()
    config = tmp / "guardian.toml"
    config.write_text(
        f'[guardian]\nlisten = "127.0.0.1:{api}"\nstate_dir = "{tmp / "state"}"\nlog_level = "error"\n'
        "poll_interval_seconds = 3600\nlatency_window_seconds = 7200\n"
        f'[gateway]\nlisten = "127.0.0.1:{port}"\nconcurrency = 4096\nqueue_size = 100000\n'
        f'[[engines]]\nname = "up"\nurl = "{upstream}"\n'
    )
    process = subprocess.Popen([*prefix, sys.executable, "-m", "guardian", "run", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return Proxy("guardian", f"http://127.0.0.1:{port}", process)


def start_nginx(tmp: Path, upstream: str, prefix: list[str]) -> Proxy:
    port = free_port()
    conf = tmp / "nginx.conf"
    single = "master_process off;\n" if prefix else ""  # under valgrind: one process, the one measured
    conf.write_text(
        f"{single}daemon off;\nworker_processes 1;\nuser root;\npid {tmp}/nginx.pid;\nerror_log {tmp}/nginx.err warn;\n"
        "events { worker_connections 4096; }\n"
        "http {\n access_log off;\n"
        f" upstream up {{ server {upstream.removeprefix('http://')}; keepalive 64; }}\n"
        f" server {{ listen 127.0.0.1:{port};\n"
        "  location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";\n"
        "               proxy_buffering off; proxy_request_buffering off; }\n }\n}\n"
    )
    process = subprocess.Popen([*prefix, "nginx", "-p", str(tmp), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Proxy("nginx", f"http://127.0.0.1:{port}", process)


def start_router(tmp: Path, upstream: str, prefix: list[str]) -> Proxy:
    port = free_port()
    process = subprocess.Popen([*prefix, "vllm-router", "--worker-urls", upstream, "--host", "127.0.0.1", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return Proxy("vllm-router", f"http://127.0.0.1:{port}", process)


async def ready(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(url + "/v1/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)
    raise SystemExit(f"bench: nothing answered at {url} within {seconds:g}s")


# -- the loads ----------------------------------------------------------------------------------


@dataclass
class Load:
    requests: int = 0
    chunks: int = 0
    merged: int = 0  # HTTP chunks that carried more than one event
    broken: int = 0  # streams missing events or [DONE], or answers not 200
    wall: float = 0.0


async def plain(url: str, requests: int, concurrency: int) -> Load:
    load = Load()
    queue = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        for _ in queue:
            async with session.post(url + "/v1/completions", json=BODY) as resp:
                data = await resp.read()
                if resp.status != 200 or json.loads(data)["usage"]["completion_tokens"] != 16:
                    load.broken += 1
            load.requests += 1

    return await _drive(worker, concurrency, load)


async def _drive(worker: Callable[[aiohttp.ClientSession], Awaitable[None]], concurrency: int, load: Load) -> Load:
    """``concurrency`` workers on one session until their queue is empty; the wall time into ``load``."""
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    load.wall = time.perf_counter() - started
    return load


async def streams(url: str, count: int, chunks: int, concurrency: int, pace_ms: float = 0.0) -> Load:
    """``count`` streams of ``chunks`` events, back to back or one every ``pace_ms`` per stream."""
    load = Load()
    queue = iter(range(count))
    body = {**BODY, "stream": True, "max_tokens": chunks, "pace_ms": pace_ms}

    async def worker(session: aiohttp.ClientSession) -> None:
        for _ in queue:
            events = 0
            done = False
            async with session.post(url + "/v1/completions", json=body) as resp:
                pending = b""
                async for data, end in resp.content.iter_chunks():
                    pending += data
                    if not end:
                        continue  # an HTTP chunk read in parts: judge it whole
                    found = pending.count(b"\n\n")
                    load.merged += max(0, found - 1)
                    events += found
                    done = done or pending.endswith(b"data: [DONE]\n\n")
                    pending = b""
            load.requests += 1
            load.chunks += chunks
            if resp.status != 200 or events != chunks + 1 or not done:
                load.broken += 1

    return await _drive(worker, concurrency, load)


# -- at a rate Python cannot offer: bench/sse_load.c -------------------------------------------------------


@dataclass
class Rate:
    name: str
    offered: float  # events/s asked for
    events: int = 0
    merged: int = 0
    broken: int = 0
    wall: float = 0.0
    ideal: float = 0.0  # the pacing's own duration
    core_share: float = float("nan")  # the proxy's CPU over the run, of one core


def build_sse_load(tmp: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("rate: no C compiler (apt-get install gcc): the 40k events/s check is left out", flush=True)
        return None
    out = tmp / "sse_load"
    subprocess.run([cc, "-O2", "-o", str(out), str(ROOT / "bench" / "sse_load.c")], check=True)
    return out


def drive_rate(tool: Path, proxy: Proxy, port: int, rate: float, seconds: float, streams: int = 64) -> Rate:
    """``streams`` streams paced to ``rate`` events/s together for ``seconds``, through ``proxy`` (its port)."""
    pace_us = round(streams / rate * 1e6)
    events = max(1, round(seconds * 1e6 / pace_us))
    pids = proxy.pids()
    idle0 = cpu(pids)
    time.sleep(1.0)
    idle_rate = cpu(pids) - idle0
    c0 = cpu(pids)
    out = subprocess.run([str(tool), "drive", "127.0.0.1", str(port), str(streams), str(events), str(pace_us)],
                         stdout=subprocess.PIPE, text=True, check=True, timeout=seconds * 10 + 60)  # fmt: skip
    got = json.loads(out.stdout)
    used = cpu(pids) - c0 - idle_rate * got["wall"]
    return Rate(proxy.name, streams * 1e6 / pace_us, got["events"], got["merged"], got["broken"], got["wall"],
                events * pace_us / 1e6, used / got["wall"] if pids else float("nan"))  # fmt: skip


def run_rate(args: argparse.Namespace, starters: dict[str, Callable[[Path, str, list[str]], Proxy]]) -> list[Rate]:
    with tempfile.TemporaryDirectory() as tmp:
        tool = build_sse_load(Path(tmp))
        if tool is None:
            return []
        port = free_port()
        upstream = subprocess.Popen([str(tool), "serve", str(port)])
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(ready(url, 30))
            out = [drive_rate(tool, Proxy("direct", url, None), port, args.rate, args.rate_seconds)]
            for name, start in starters.items():
                with tempfile.TemporaryDirectory() as ptmp:
                    proxy = start(Path(ptmp), url, [])
                    try:
                        asyncio.run(ready(proxy.url, 60))
                        if proxy.process is not None and proxy.process.poll() is not None:  # something else answered there
                            raise SystemExit(f"bench: {name} exited at start (exit {proxy.process.returncode}); run again")
                        print(f"{name}: {args.rate:.0f} events/s for {args.rate_seconds:g} s ...", flush=True)
                        out.append(drive_rate(tool, proxy, int(proxy.url.rsplit(":", 1)[1]), args.rate, args.rate_seconds))
                    finally:
                        proxy.stop()
        finally:
            upstream.terminate()
            upstream.wait()
    return out


# -- measuring ----------------------------------------------------------------------------------


def cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class Figures:
    name: str
    request_us: float = float("nan")
    chunk_us: float = float("nan")
    request_instructions: float = float("nan")
    chunk_instructions: float = float("nan")
    merged: int = 0  # in paced streams
    paced_chunks_per_second: float = 0.0
    broken: int = 0


async def measure_cpu(proxy: Proxy, args: argparse.Namespace) -> Figures:
    figures = Figures(proxy.name)
    pids = proxy.pids()
    await plain(proxy.url, 200, 8)  # warm-up: connections, caches
    await streams(proxy.url, 4, args.chunks, 4, args.pace_ms)
    idle0 = cpu(pids)
    await asyncio.sleep(3.0)
    idle_rate = (cpu(pids) - idle0) / 3.0
    c0 = cpu(pids)
    p = await plain(proxy.url, args.requests, args.concurrency)
    per_request = (cpu(pids) - c0 - idle_rate * p.wall) / p.requests
    c0 = cpu(pids)
    s = await streams(proxy.url, args.streams, args.chunks, args.in_flight, args.pace_ms)
    per_chunk = (cpu(pids) - c0 - idle_rate * s.wall - per_request * s.requests) / s.chunks
    figures.request_us, figures.chunk_us = per_request * 1e6, per_chunk * 1e6
    figures.merged, figures.paced_chunks_per_second = s.merged, s.chunks / s.wall
    figures.broken = p.broken + s.broken
    return figures


def callgrind(pid: int, command: str, out: Path) -> int:
    """Zero (``-z``) or dump (``-d``) the counters of a process under callgrind; after a dump, the instructions since the zero."""
    before = set(out.parent.glob(out.name + "*"))
    subprocess.run(["callgrind_control", command, str(pid)], check=True, capture_output=True)
    if command == "-z":
        return 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(out.parent.glob(out.name + "*")) - before
        for path in new:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("totals:") or line.startswith("summary:"):
                    return int(line.split()[1])
        time.sleep(0.2)
    raise SystemExit(f"bench: callgrind wrote no dump for {pid}")


async def measure_instructions(start: Callable[[Path, str, list[str]], Proxy], upstream: str, args: argparse.Namespace,
                               figures: Figures) -> None:  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        out = tmp / "callgrind.out"
        proxy = start(tmp, upstream, ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"])
        try:
            await ready(proxy.url, 300)
            pid = proxy.process.pid  # type: ignore[union-attr]
            await plain(proxy.url, 50, 4)
            await streams(proxy.url, 2, args.chunks, 2)

            async def counted(run: Callable[[], object]) -> tuple[int, float]:
                callgrind(pid, "-z", out)
                started = time.perf_counter()
                await run()  # type: ignore[misc]
                wall = time.perf_counter() - started
                return callgrind(pid, "-d", out), wall

            requests = max(50, args.requests // 10)
            count, wall = await counted(lambda: plain(proxy.url, requests, 4))
            idle, _ = await counted(lambda: asyncio.sleep(wall))
            per_request = (count - idle) / requests
            # paced slowly enough for a proxy under valgrind to take each event as it comes
            count, wall = await counted(lambda: streams(proxy.url, 8, args.chunks, 8, pace_ms=20.0))
            idle, _ = await counted(lambda: asyncio.sleep(wall))
            figures.request_instructions = per_request
            figures.chunk_instructions = (count - idle - per_request * 8) / (8 * args.chunks)
        finally:
            proxy.stop()


# -- the run ------------------------------------------------------------------------------------


def ratio(value: float, reference: float) -> str:
    return "-" if reference != reference or value != value or reference <= 0 else f"{value / reference:.2f}x"


def proxies() -> dict[str, Callable[[Path, str, list[str]], Proxy]]:
    """The proxies to measure: guardian, and nginx and vllm-router where they are installed."""
    starters: dict[str, Callable[[Path, str, list[str]], Proxy]] = {"guardian": start_guardian, "nginx": start_nginx}
    if shutil.which("vllm-router"):
        starters["vllm-router"] = start_router
    else:
        print("vllm-router: not on PATH (pip install vllm-router): left out", flush=True)
    if shutil.which("nginx") is None:
        del starters["nginx"]
        print("nginx: not installed (apt-get install nginx-light): left out", flush=True)
    return starters


async def run(args: argparse.Namespace, upstream: str, starters: dict[str, Callable[[Path, str, list[str]], Proxy]]) -> list[Figures]:
    direct = Proxy("direct", upstream, None)
    check = await streams(direct.url, args.streams, args.chunks, args.in_flight, args.pace_ms)
    if check.broken:
        raise SystemExit("bench: the upstream's own streams are broken")
    print(f"direct: paced streams at {check.chunks / check.wall:.0f} events/s, {check.merged} merged by the upstream "
          "and client themselves", flush=True)  # fmt: skip
    results = []
    for name, start in starters.items():
        with tempfile.TemporaryDirectory() as tmp:
            proxy = start(Path(tmp), upstream, [])
            try:
                await ready(proxy.url, 60)
                print(f"{name}: CPU ...", flush=True)
                figures = await measure_cpu(proxy, args)
            finally:
                proxy.stop()
        if args.valgrind:
            print(f"{name}: instructions under callgrind ...", flush=True)
            await measure_instructions(start, upstream, args, figures)
        results.append(figures)
    return results


def print_rates(args: argparse.Namespace, rates: list[Rate]) -> None:
    if not rates:
        return
    print()
    print(f"at {args.rate:.0f} events/s: 64 streams paced by bench/sse_load.c for {args.rate_seconds:g} s, read natively")
    print("| proxy | events/s arrived | events | merged | broken | late (wall over pacing) | CPU, share of one core |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for x in rates:
        share = "-" if x.core_share != x.core_share else f"{x.core_share * 100:.0f}%"
        print(f"| {x.name} | {x.events / x.wall:.0f} | {x.events} | {x.merged} | {x.broken} | {(x.wall / x.ideal - 1) * 100:+.1f}% | {share} |")
    g = next((x for x in rates if x.name == "guardian"), None)
    if g is not None:
        ok = g.merged == 0 and g.broken == 0 and g.core_share < 1
        print(f"target: no chunk merged at {args.rate:.0f} events/s on one core: merged {g.merged}, broken {g.broken}, "
              f"{g.core_share * 100:.0f}% of a core: {'MET' if ok else 'NOT MET'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="plain requests per proxy (default 3000)")
    parser.add_argument("--concurrency", type=int, default=8, help="plain requests in flight (default 8)")
    parser.add_argument("--streams", type=int, default=96, help="SSE streams per proxy (default 96)")
    parser.add_argument("--in-flight", type=int, default=32, help="streams at once (default 32)")
    parser.add_argument("--chunks", type=int, default=200, help="events per stream (default 200)")
    parser.add_argument("--pace-ms", type=float, default=2.0, help="milliseconds between a stream's events (default 2: 500/s each)")
    parser.add_argument("--no-valgrind", dest="valgrind", action="store_false", help="skip the instruction counts")
    parser.add_argument("--rate", type=float, default=40000.0, help="events/s of the native check (default 40000; 0: none)")
    parser.add_argument("--rate-seconds", type=float, default=10.0, help="how long the native check runs (default 10)")
    parser.add_argument("--rate-only", action="store_true", help="only the native check at --rate")
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        serve_upstream(args.upstream)
        return 0
    if args.valgrind and shutil.which("valgrind") is None:
        print("valgrind: not installed (apt-get install valgrind): instruction counts left out", flush=True)
        args.valgrind = False
    starters = proxies()
    results: list[Figures] = []
    if not args.rate_only:
        port = free_port()
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(port)])
        try:
            asyncio.run(ready(f"http://127.0.0.1:{port}", 30))
            results = asyncio.run(run(args, f"http://127.0.0.1:{port}", starters))
        finally:
            upstream.terminate()
            upstream.wait()
    rates = run_rate(args, starters) if args.rate > 0 else []
    if not results:
        print_rates(args, rates)
        return 0
    ref = next((r for r in results if r.name == "nginx"), None)
    router = next((r for r in results if r.name == "vllm-router"), None)
    print()
    print(f"{args.requests} plain requests ({args.concurrency} in flight), {args.streams} streams of {args.chunks} events "
          f"({args.in_flight} at once, one every {args.pace_ms:g} ms each); "
          "CPU from /proc (noisy on a shared machine), instructions from callgrind (repeatable)")  # fmt: skip
    print("| proxy | CPU µs / request | CPU µs / chunk | instructions / request | instructions / chunk | merged (paced) "
          "| broken | vs nginx: request, chunk (CPU; instructions) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        vs = "-" if ref is None else (f"{ratio(r.request_us, ref.request_us)}, {ratio(r.chunk_us, ref.chunk_us)}; "
                                      f"{ratio(r.request_instructions, ref.request_instructions)}, "
                                      f"{ratio(r.chunk_instructions, ref.chunk_instructions)}")  # fmt: skip
        print(f"| {r.name} | {r.request_us:.0f} | {r.chunk_us:.1f} | {r.request_instructions / 1e3:.0f} k "
              f"| {r.chunk_instructions / 1e3:.1f} k | {r.merged} at {r.paced_chunks_per_second:.0f}/s | {r.broken} | {vs} |")  # fmt: skip
    guardian = next((r for r in results if r.name == "guardian"), None)
    if guardian is not None and ref is not None:
        print(f"target: per SSE chunk <= 1.3x nginx's CPU: {ratio(guardian.chunk_us, ref.chunk_us)}; no chunk merged: {guardian.merged == 0}")
    if guardian is not None and router is not None:
        print(f"target: per plain request <= 2x vllm-router's CPU: {ratio(guardian.request_us, router.request_us)}")
    print_rates(args, rates)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
