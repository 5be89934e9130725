"""guardian's /metrics as a real Prometheus server and promtool see it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.helpers import free_port, require_tool
from tests.test_cli import _get, _scrape_when_up

GUARDIAN = [sys.executable, "-m", "guardian"]


def _demo(port: int, seconds: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*GUARDIAN, "demo", "--duration", str(seconds), "--port", str(port), "--interval", "0.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_metrics_page_passes_promtool_lint() -> None:
    promtool = require_tool("promtool")
    port = free_port()
    demo = _demo(port, 8)
    try:
        _scrape_when_up(port)
        time.sleep(2)  # latency windows filled
        page = _get(port, "/metrics")
    finally:
        demo.kill()
    result = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_real_prometheus_scrapes_guardian(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: guardian\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    demo = _demo(port, 40)
    prom = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _scrape_when_up(port)
        up = _query_until(prom_port, 'up{job="guardian"}', lambda v: v == 1.0)
        engine_up = _query_until(prom_port, 'guardian_engine_up{engine="sim0"}', lambda v: v == 1.0)
        used = _query_until(prom_port, 'guardian_gpu_memory_used_bytes{gpu="0"}', lambda v: v > 0)
        polls = _query_until(prom_port, "rate(guardian_polls_total[10s])", lambda v: 1.0 < v < 3.0)
    finally:
        prom.kill()
        demo.kill()
        prom.wait()
        demo.wait()
    assert up == engine_up == 1.0
    assert used > 70 * 2**30  # vLLM's pre-allocated budget on the simulated H100
    assert 1.0 < polls < 3.0  # polled every 0.5 s


def _query_until(port: int, query: str, ok, timeout: float = 40) -> float:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
            with urllib.request.urlopen(url, timeout=5) as resp:
                result = json.load(resp)["data"]["result"]
            if result:
                last = float(result[0]["value"][1])
                if ok(last):
                    return last
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{query}: last value {last}")
