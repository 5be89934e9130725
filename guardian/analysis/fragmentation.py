"""KV-cache internal fragmentation and the memory overhang, combined into ``fragmentation_ratio``.

The estimator (vLLM does not export the waste itself):
    each running sequence holds ceil(tokens / block_size) blocks, and its
    last block is on average half empty: (block_size - 1) / 2 wasted slots.
    used_blocks = kv_cache_usage x num_gpu_blocks, so
        kv_internal ≈ running x (block_size - 1) / 2 / (used_blocks x block_size)
It assumes sequence lengths are spread evenly over a block (true for any
realistic mix) and that every used block belongs to one running sequence.
It over-estimates when prefix caching shares blocks between sequences (one
shared tail is counted per sequence) and when cached-but-free blocks are
counted as used; it is noisy with very few running sequences (the truth is
then anywhere between 0 and block_size - 1 slots per sequence).

fragmentation_ratio = (KV internal waste + overhang) / memory held by vLLM,
where the waste in bytes needs the KV pool's size: ``kv_cache_memory_bytes``
from ``vllm:cache_config_info`` when the server reports it, otherwise
``kv_pool_share`` x the memory the engine held at the end of warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fragmentation:
    kv_internal_ratio: float | None  # empty slots / used slots in the KV pool
    kv_internal_waste_bytes: float | None
    overhang_bytes: float | None  # memory above the level at warm-up (the leak detector's floor)
    ratio: float | None  # (waste + overhang) / held


def kv_internal_fragmentation(
    running: float | None, kv_usage: float | None, num_gpu_blocks: int | None, block_size: int | None
) -> float | None:
    if None in (running, kv_usage, num_gpu_blocks, block_size):
        return None
    assert running is not None and kv_usage is not None and num_gpu_blocks and block_size
    used_blocks = kv_usage * num_gpu_blocks
    if running <= 0 or used_blocks <= 0:
        return 0.0
    sequences = min(running, used_blocks)  # a sequence holds at least one block
    return min(1.0, sequences * (block_size - 1) / 2 / (used_blocks * block_size))


def fragmentation(
    kv_internal_ratio: float | None,
    kv_usage: float | None,
    kv_pool_bytes: float | None,
    overhang_bytes: float | None,
    held_bytes: float | None,
) -> Fragmentation:
    waste = None
    if kv_internal_ratio is not None and kv_usage is not None and kv_pool_bytes:
        waste = kv_internal_ratio * kv_usage * kv_pool_bytes
    ratio = None
    if held_bytes and (waste is not None or overhang_bytes is not None):
        ratio = ((waste or 0.0) + max(0.0, overhang_bytes or 0.0)) / held_bytes
    return Fragmentation(kv_internal_ratio, waste, overhang_bytes, ratio)
