"""Hardware profiles and engine presets: where the tuner starts and how far it may go.

The batch caps come from the field (an A100 holds P99 at about 12 concurrent
sequences of a 7–13B model, a 24 GB RTX 4090 at about 4, an H100/H200 at 24)
and are starting points to validate, not truths: every one can be overridden
in ``[tuner.hardware]``. An unknown GPU gets the smallest cap, because a
too-small batch costs throughput while a too-large one costs the P99 the
operator is paged for.

Presets are the three engine profiles the field starts from. They are kept as
plain values here and validated where the config is loaded (``PresetSection``),
so a preset that vLLM would refuse (block size 24 on CUDA backends) never
reaches a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# matched as case-insensitive substrings of the NVML name, most specific first
DEFAULT_BATCH_CAPS: tuple[tuple[str, int], ...] = (
    ("H200", 24),
    ("H100", 24),
    ("A100", 12),
    ("RTX 4090", 4),
)
UNKNOWN_GPU_BATCH_CAP = 4

# max_num_seqs, block_size, chunked prefill and swap space from DESIGN.md's table.
# "mixed" asks for block 24 in the field's notes; CUDA backends refuse it, so 16 is used.
BUILTIN_PRESETS: dict[str, dict[str, Any]] = {
    "high_throughput": {"max_num_seqs": 16, "block_size": 32, "enable_chunked_prefill": True, "swap_space_gb": 20},
    "low_latency": {"max_num_seqs": 4, "block_size": 16, "enable_chunked_prefill": False, "swap_space_gb": 0},
    "mixed": {"max_num_seqs": 8, "block_size": 16, "enable_chunked_prefill": True, "swap_space_gb": 8},
}


@dataclass(frozen=True)
class HardwareProfile:
    gpu_name: str | None
    batch_cap: int
    matched: str | None  # the pattern that matched; None: unknown GPU, conservative cap


def hardware_profile(gpu_name: str | None, overrides: Mapping[str, int] | None = None) -> HardwareProfile:
    """The batch cap for a GPU by its NVML name; configured patterns are tried before the defaults."""
    patterns = list((overrides or {}).items()) + list(DEFAULT_BATCH_CAPS)
    if gpu_name:
        lowered = gpu_name.lower()
        for pattern, cap in patterns:
            if pattern.lower() in lowered:
                return HardwareProfile(gpu_name, cap, pattern)
    return HardwareProfile(gpu_name, UNKNOWN_GPU_BATCH_CAP, None)


def preset_args(preset: Any) -> dict[str, Any]:
    """A validated preset as an engine-argument layer (flag names without dashes).

    ``swap_space_gb`` has no flag in vLLM's V1 engine; config loading warns
    that it is ignored, and it is left out here rather than passed through to
    a flag vLLM would refuse.
    """
    layer: dict[str, Any] = {
        "max-num-seqs": preset.max_num_seqs,
        "block-size": preset.block_size,
        "enable-chunked-prefill": preset.enable_chunked_prefill,
    }
    if preset.kv_cache_dtype != "auto":
        layer["kv-cache-dtype"] = preset.kv_cache_dtype
    if preset.gpu_memory_utilization is not None:
        layer["gpu-memory-utilization"] = preset.gpu_memory_utilization
    return layer
