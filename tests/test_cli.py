from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from pathlib import Path

import pytest

from guardian import __version__
from tests.conftest import FIXTURES
from tests.helpers import free_port

GUARDIAN = [sys.executable, "-m", "guardian"]


@pytest.fixture
def fixture_server() -> Iterator[str]:
    """A static vLLM 0.33 server: the real /metrics page and /health 200."""
    page = (FIXTURES / "vllm-0.33-metrics.txt").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = page if self.path == "/metrics" else b""
            self.send_response(200 if self.path in ("/metrics", "/health") else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_version() -> None:
    out = subprocess.run([*GUARDIAN, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"vllm-guardian {__version__}"


def test_probe_json_on_a_real_vllm_page_prints_its_values(fixture_server: str) -> None:
    result = subprocess.run(
        [*GUARDIAN, "probe", "--vllm", fixture_server, "--json", "--no-nvml"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["up"] and doc["healthy"]
    (core,) = doc["cores"]
    assert core["kv_cache_usage"] == 0.4375
    assert (core["running"], core["waiting"]) == (12, 4)
    assert (core["block_size"], core["num_gpu_blocks"]) == (16, 27000)
    # one request took between 2.5 s and 5 s: PromQL interpolates 2.5 + 2.5 * 0.99
    assert core["latency_since_start"]["e2e"]["p99_seconds"] == pytest.approx(4.975)
    assert core["latency_since_start"]["e2e"]["count"] == 1
    assert doc["dev_endpoints"] == {"available": False, "detail": "start vLLM with VLLM_SERVER_DEV_MODE=1 to enable this action"}


def test_probe_text_reports_nvml_missing_instead_of_failing(fixture_server: str) -> None:
    result = subprocess.run([*GUARDIAN, "probe", "--vllm", fixture_server], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "KV cache usage 43.8%, running 12, waiting 4" in result.stdout
    assert "block size 16, GPU blocks 27000" in result.stdout
    assert "NVML:" in result.stdout  # "not available (…)" here; the GPUs on a GPU host


def test_probe_of_a_down_server_exits_1_with_the_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run([*GUARDIAN, "probe", "--vllm", url, "--no-nvml"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "unreachable or unreadable: cannot connect" in result.stdout


def test_probe_refuses_a_bad_url() -> None:
    result = subprocess.run([*GUARDIAN, "probe", "--vllm", "localhost:8000"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "is not an http(s) base URL" in result.stderr


def test_demo_serves_metrics_that_move_and_status_json() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*GUARDIAN, "demo", "--duration", "9", "--port", str(port), "--interval", "0.5", "--scenario", "burst"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = _scrape_when_up(port)
        time.sleep(3)
        second = _get(port, "/metrics")
        status = json.loads(_get(port, "/status"))
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert _value(second, "guardian_polls_total") > _value(first, "guardian_polls_total")
    assert _value(second, 'guardian_gpu_energy_joules_total{gpu="0"}') > _value(first, 'guardian_gpu_energy_joules_total{gpu="0"}')
    assert 'guardian_engine_latency_p99_seconds{engine="sim0",latency="ttft"}' in second
    assert status["engines"][0]["up"] is True and status["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert f"guardian metrics  http://127.0.0.1:{port}/metrics" in out
    assert "sim0: L0 kv" in out and "guardian demo: done" in out
    done = re.search(r"guardian demo: done; (\d+) requests by outcome: (\{.*\}); (\d+) retries", out)
    assert done is not None, out  # requests counted once each, retries apart, those still in flight at the end included
    counted = eval(done.group(2))  # noqa: S307 (our own dict's repr)
    assert "retried" not in counted and sum(counted.values()) == int(done.group(1)) > 0
    assert status["breaker"]["sim0"]["level"] == 0 and status["breaker"]["sim0"]["restart_budget_left"] == 3


def _scrape_when_up(port: int) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            text = _get(port, "/metrics")
            if "guardian_polls_total" in text and "guardian_engine_up" in text:
                return text
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("guardian demo never served /metrics")


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode()


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in the page")


def test_demo_staircase_leak_is_reported_at_the_injected_times() -> None:
    from guardian.sim.scenarios import STAIRCASE_STEPS

    port = free_port()
    proc = subprocess.run(
        [*GUARDIAN, "demo", "--scenario", "staircase-leak", "--interval", "0.5", "--duration", "64", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    started = re.search(r"^(\S+Z) \[info\s*\] guardian_started", out, re.M)
    assert started, out
    t0 = datetime.fromisoformat(started.group(1).replace("Z", "+00:00"))
    steps = [
        datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
        for m in re.finditer(r"leak_step_detected\s+at=(\S+Z).*series=engine/sim0/gpu", out)
    ]
    assert len(steps) == 2, out  # the steps at 10 s and 40 s; the one at 70 s comes after the run
    for found, injected in zip(steps, STAIRCASE_STEPS):
        assert abs((found - t0).total_seconds() - injected) <= 3
    assert "leak_suspected" in out and "LEAK SUSPECTED" in out
    assert out.count("leak_step_detected") == 4  # two steps, each on gpu/0/used and engine/sim0/gpu: the spike is not one


def test_sim_serves_a_vllm_server_that_probe_reads(sim_url: str) -> None:
    result = subprocess.run([*GUARDIAN, "probe", "--vllm", sim_url, "--json", "--no-nvml"], capture_output=True, text=True, timeout=30)
    doc = json.loads(result.stdout)
    assert doc["up"] and doc["cores"][0]["block_size"] == 16 and doc["cores"][0]["running"] == 0
    assert doc["dev_endpoints"]["available"] is True  # the simulator runs in dev mode


def test_run_on_a_busy_port_says_so_and_exits_1(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "g.toml"
        config.write_text(f'[guardian]\nlisten = "127.0.0.1:{port}"\nstate_dir = "{tmp_path}"\n'
                          '[[engines]]\nname = "a"\nurl = "http://127.0.0.1:9"\n')  # fmt: skip
        result = subprocess.run([*GUARDIAN, "run", "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port} (guardian.listen): address already in use" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["analyze", "--plot", "x.png", "smi.csv"], ["tune", "--engine", "sim", "--plot", "x.png"],
                                     ["report", "record.jsonl", "--plot", "plots"]])  # fmt: skip
def test_plot_without_matplotlib_is_refused_before_any_work_with_how_to_install_it(tmp_path: Path, command: list[str]) -> None:
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "guardian", *command], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "--plot needs matplotlib: pip install matplotlib" in result.stderr
    assert time.monotonic() - started < 30 and not (tmp_path / "x.png").exists()
