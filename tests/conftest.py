from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def vllm_page() -> str:
    """A real vLLM 0.33.0 /metrics page (one engine, speculative decoding on)."""
    return (FIXTURES / "vllm-0.33-metrics.txt").read_text()
