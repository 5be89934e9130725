"""Helpers shared by tests."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_tool(name: str) -> str:
    """The tool's path; skip when missing, except under CI=true where a missing tool fails."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is required in CI but not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed (apt-get install prometheus prometheus-alertmanager)")
    return path


def check_promql(exprs: list[str], tmp_path: Path) -> None:
    """Fail unless promtool parses every expression (as recording rules: promtool checks their PromQL)."""
    promtool = require_tool("promtool")
    rules = tmp_path / "exprs.yml"
    rules.write_text("groups:\n  - name: exprs\n    rules:\n" + "".join(
        f"      - record: check:expr_{i}\n        expr: {json.dumps(e)}\n" for i, e in enumerate(exprs)))  # fmt: skip
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@asynccontextmanager
async def load_through_gateway(daemon: Any, cluster: Any) -> AsyncIterator[None]:
    """The cluster's load sent through the daemon's gateway while the block runs; then load, daemon and cluster stop."""
    assert daemon.gateway is not None and daemon.gateway.address is not None
    load = asyncio.create_task(cluster.run_load(None, via=f"http://127.0.0.1:{daemon.gateway.address[1]}"))
    try:
        yield
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        await daemon.close()
        await cluster.stop()


async def wait_until(done: Callable[[], bool], seconds: float, every: float = 0.25) -> bool:
    """Whether ``done()`` came true (checked every ``every`` seconds) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(every)
        if done():
            return True
    return False


def client_outcomes(cluster: Any) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    for generator in cluster.loadgens:
        outcomes.update(generator.outcomes)
    return outcomes


def recorded_decisions(path: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "decision"]
