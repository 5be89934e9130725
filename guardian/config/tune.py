"""``[tune]``: the offline search's request set and grid."""

from __future__ import annotations

from pydantic import Field, field_validator

from guardian.config.base import Problem, Section


class TuneSection(Section):
    """``guardian tune``, the offline search: its request set and grid (flags override the grid)."""

    prompt_tokens_median: int = Field(512, ge=1, le=1_000_000)
    prompt_tokens_sigma: float = Field(0.6, ge=0, le=5)  # lognormal spread
    prompt_tokens_max: int = Field(4096, ge=1, le=1_000_000)
    output_tokens_median: int = Field(128, ge=1, le=1_000_000)
    output_tokens_sigma: float = Field(0.5, ge=0, le=5)
    output_tokens_max: int = Field(512, ge=1, le=1_000_000)
    requests: int = Field(200, ge=1, le=100_000)  # the standardised set, reused round-robin
    seed: int = 0
    rates: list[float] = [1.0, 2.0, 4.0, 8.0, 16.0]  # requests per second, climbed until the SLO is missed
    seconds_per_rate: float = Field(30.0, gt=0, le=3600)
    block_sizes: list[int] = [16, 32]
    max_num_seqs: list[int] = [4, 8, 16, 24]
    speculation: list[bool] = [False]  # add true to try [tuner] speculative_config

    @field_validator("rates")
    @classmethod
    def _rates(cls, rates: list[float]) -> list[float]:
        if not rates or min(rates) <= 0:
            raise Problem("rates must be a non-empty list of requests per second above 0", "e.g. rates = [1, 2, 4, 8]")
        return sorted(rates)
