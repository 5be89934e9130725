"""CPU cost of one guardian poll, and of parsing one vLLM /metrics page.

    python bench/poll_cost.py [--polls 200] [--engines 8] [--gpus 8] [--tuner] [--instructions]

Set-up: a separate process serves the real vLLM 0.33 page from
tests/fixtures on one port per engine (so the servers' CPU is not counted),
chunked as vLLM's server sends it;
this process runs the real daemon's poll against them (on the event loop
``guardian run`` uses: uvloop where it is installed), with the fake NVML
over simulated GPUs and a pid-file process source per engine. CPU time is
``time.process_time()`` of this process (all threads: the event loop, the
NVML and /proc workers), divided by the number of polls.

With ``--instructions`` (and valgrind installed) it also counts the
user-space instructions of a poll, the repeatable figure on a shared
machine: the polls run under ``valgrind --tool=callgrind`` twice, 10 and 40
polls after the same warm-up, and the difference is divided by 30 (start-up
and shutdown cancel out; the page servers run outside valgrind).

Targets (issues 2 and 17): <= 5 ms CPU and <= 18 M instructions per poll;
parsing >= 3x faster than prometheus_client.parser.text_string_to_metric_families.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PAGE = ROOT / "tests" / "fixtures" / "vllm-0.33-metrics.txt"

from guardian.commands.run import run_loop  # noqa: E402


def serve(count: int, ports_file: Path) -> None:
    """The page servers: run in a child process."""
    from aiohttp import web

    body = PAGE.read_bytes()

    async def metrics(request: web.Request) -> web.StreamResponse:
        # as vLLM's uvicorn answers it: prometheus_client's ASGI app gives no length, so the page comes chunked
        resp = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(body)
        await resp.write_eof()
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ports = []
        for _ in range(count):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        ports_file.write_text("\n".join(map(str, ports)))
        await asyncio.Event().wait()

    asyncio.run(main())


async def measure_polls(ports: list[int], gpus: int, polls: int, pid_file: Path, tuner: bool = False) -> tuple[list[float], list[float], float]:
    """``polls`` polls after ten of warm-up, each one's CPU and wall time; and the CPU of one /metrics render."""
    from guardian import config as cfg
    from guardian import logs
    from guardian.daemon import Daemon
    from guardian.sdnotify import Notifier
    from guardian.sim.engine import EngineModel
    from guardian.sim.fake_nvml import FakeNvml, SimGpu

    logs.configure("json", "error")
    nvml = FakeNvml([SimGpu(index=i, uuid=f"GPU-bench-{i}", engine=EngineModel(), pid=1000 + i) for i in range(gpus)])
    config = cfg.Config(
        guardian=cfg.GuardianSection(listen="127.0.0.1:0", state_dir=pid_file.parent / "state"),
        engines=[
            cfg.EngineSection(name=f"e{i}", url=f"http://127.0.0.1:{p}", process=cfg.ProcessSection(pid_file=pid_file))
            for i, p in enumerate(ports)
        ],
        tuner=cfg.TunerSection(enabled=tuner),  # the tuner's stage (and the cost model's, always on)
    )
    daemon = Daemon(config, nvml_module=nvml, notifier=Notifier(address=""))
    await daemon.start()
    assert daemon.poller is not None
    daemon.poller.pause()  # polls driven here, back to back
    try:
        for _ in range(10):  # warm-up: connections, parser caches, windows
            await daemon.poll_once()
        cpu, wall = [], []
        for _ in range(polls):
            c0, w0 = time.process_time(), time.perf_counter()
            await daemon.poll_once()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        c0 = time.process_time()
        for _ in range(50):
            daemon.metrics.render()
        render = (time.process_time() - c0) / 50
    finally:
        await daemon.close()
    return cpu, wall, render


def measure_parse(repeat: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from guardian.sources import promtext, vllm_page

    text = PAGE.read_text()

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        best = []
        for _ in range(5):
            t0 = time.process_time()
            for _ in range(repeat):
                fn()
            best.append((time.process_time() - t0) / repeat)
        return min(best)

    warm = promtext.Parser()
    return {
        "prometheus_client": timed(lambda: list(text_string_to_metric_families(text))),
        "guardian cold (new parser each page)": timed(lambda: promtext.parse(text)),
        "guardian warm (parser of a known target)": timed(lambda: warm.parse(text)),
        "guardian warm + vLLM extraction": timed(lambda: vllm_page.cores_from_page(warm.parse(text))),
    }


def instructions_per_poll(ports_file: Path, pid_file: Path, gpus: int, tuner: bool) -> float | None:
    """User-space instructions of one poll under callgrind: (40 polls - 10 polls) / 30; None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    counts = []
    for polls in (10, 40):
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
                "--polls", str(polls), "--gpus", str(gpus), "--polls-against", str(ports_file), "--pid-file", str(pid_file)]
        argv += ["--tuner"] if tuner else []
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        found = re.search(r"refs:\s*([\d,]+)", done.stderr)
        if found is None:
            raise SystemExit(f"bench: no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
        counts.append(int(found.group(1).replace(",", "")))
    return (counts[1] - counts[0]) / 30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--parse-repeat", type=int, default=50)
    parser.add_argument("--tuner", action="store_true", help="with [tuner] on every engine")
    parser.add_argument("--instructions", action="store_true", help="also count instructions per poll under valgrind (about 3 minutes)")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--polls-against", type=Path, help=argparse.SUPPRESS)  # the polls alone, under valgrind
    parser.add_argument("--pid-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.engines, args.serve)
        return 0
    if args.polls_against:
        ports = [int(p) for p in args.polls_against.read_text().split()]
        run_loop(measure_polls(ports, args.gpus, args.polls, args.pid_file, args.tuner))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        ports_file = Path(tmp) / "ports"
        server = subprocess.Popen([sys.executable, __file__, "--engines", str(args.engines), "--serve", str(ports_file)])
        try:
            deadline = time.monotonic() + 30
            while not ports_file.exists() or not ports_file.read_text():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("bench: the page server did not start")
                time.sleep(0.1)
            ports = [int(p) for p in ports_file.read_text().split()]
            pid_file = Path(tmp) / "vllm.pid"
            pid_file.write_text(str(server.pid))
            print(f"poll: {args.gpus} GPUs (fake NVML), {args.engines} engines (real vLLM 0.33 page, "
                  f"{PAGE.stat().st_size} bytes, {sum(1 for _ in PAGE.open())} lines), pid-file processes, {args.polls} polls")  # fmt: skip
            cpu, wall, render = run_loop(measure_polls(ports, args.gpus, args.polls, pid_file, args.tuner))
            instructions = instructions_per_poll(ports_file, pid_file, args.gpus, args.tuner) if args.instructions else None
        finally:
            server.kill()
            server.wait()

    ms = lambda v: v * 1000  # noqa: E731
    cpu_sorted = sorted(cpu)
    print(f"  CPU per poll   median {ms(statistics.median(cpu)):6.2f} ms   p95 {ms(cpu_sorted[int(0.95 * len(cpu)) - 1]):6.2f} ms"
          f"   mean {ms(statistics.fmean(cpu)):6.2f} ms   (target <= 5 ms)")  # fmt: skip
    print(f"  wall per poll  median {ms(statistics.median(wall)):6.2f} ms")
    if args.instructions:
        print(f"  instructions per poll {instructions / 1e6:6.1f} M   (target <= 18 M)" if instructions is not None
              else "  instructions per poll: valgrind is not installed (apt-get install valgrind)")  # fmt: skip
    print(f"  /metrics render (per Prometheus scrape, not per poll): {ms(render):.2f} ms CPU")

    parse = measure_parse(args.parse_repeat)
    base = parse["prometheus_client"]
    print("parse of one vLLM page (best of 5, CPU):")
    for name, seconds in parse.items():
        ratio = "" if name == "prometheus_client" else f"   {base / seconds:5.1f}x faster than prometheus_client"
        print(f"  {name:<42} {ms(seconds):7.3f} ms{ratio}")
    print("  (target: >= 3x faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
