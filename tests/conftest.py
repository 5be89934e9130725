from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from guardian.sim import scenarios
from guardian.sim.cluster import SimCluster

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """guardian.state_dir defaults to $STATE_DIRECTORY: no test writes to /var/lib."""
    path = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", str(path))
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    return path


@pytest.fixture
def vllm_page() -> str:
    """A real vLLM 0.33.0 /metrics page (one engine, speculative decoding on)."""
    return (FIXTURES / "vllm-0.33-metrics.txt").read_text()


@pytest.fixture
async def cluster() -> AsyncIterator[SimCluster]:
    """One simulated engine on one simulated GPU, in this process, with no load."""
    c = SimCluster(scenarios.get("steady"), engines=1, seed=3)
    await c.start()
    yield c
    await c.stop()


@pytest.fixture
def sim_url(tmp_path: Path) -> Iterator[str]:
    """A simulated vLLM server in its own process (``guardian sim``), for guardian processes to watch."""
    ports = tmp_path / "urls"
    sim = subprocess.Popen([sys.executable, "-m", "guardian", "sim", "--port", "0", "--no-load", "--ports-file", str(ports)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (ports.exists() and ports.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield ports.read_text().split()[0]
    finally:
        sim.kill()
        sim.wait()
