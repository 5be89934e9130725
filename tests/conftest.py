from __future__ import annotations

from pathlib import Path

import pytest

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
