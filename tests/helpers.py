"""Helpers shared by tests."""

from __future__ import annotations

import os
import shutil
import socket

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
