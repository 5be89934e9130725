"""Helpers shared by tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

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
