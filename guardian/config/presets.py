"""``[presets.NAME]``: engine profiles, checked against vLLM's own rules before any restart uses them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from guardian.actions.engine_args import block_size_ok, valid_block_sizes
from guardian.config.base import Attention, Problem, Section


class PresetSection(Section):
    """An engine profile (vLLM start-up arguments), checked against vLLM's own rules."""

    max_num_seqs: int = Field(ge=1, le=65536)
    block_size: int = 16
    enable_chunked_prefill: bool = True
    swap_space_gb: float | None = Field(None, ge=0)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"] = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    attention_backend: Attention = "flash_attn"

    @model_validator(mode="after")
    def _block_size(self) -> PresetSection:
        if not block_size_ok(self.block_size, self.attention_backend):
            lower = 16
            while lower * 2 <= self.block_size and (self.attention_backend != "flashinfer" or lower < 32):
                lower *= 2
            raise Problem(
                f"block_size = {self.block_size} is refused by vLLM's {self.attention_backend} attention backend, "
                f"which needs {valid_block_sizes(self.attention_backend)}",
                f"use block_size = {lower} or {lower * 2}",
            )
        return self
