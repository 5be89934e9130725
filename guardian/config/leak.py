"""``[leak]``, ``[fragmentation]`` and ``[breaker]``: the detectors' and the breaker's parameters.

The leak detector's and the breaker's parameters are their own dataclasses (the
pure core knows no pydantic); as config sections they are validated like the others.
"""

from __future__ import annotations

import dataclasses

from pydantic import ConfigDict, Field

from guardian.analysis.leak_rule import LeakParams
from guardian.config.base import Problem, Section, all_positive, refuse
from guardian.policy.breaker import BreakerParams

LeakParams.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]
BreakerParams.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]


class FragmentationSection(Section):
    # share of the engine's memory that is KV pool, when vLLM does not report kv_cache_memory_bytes
    kv_pool_share: float = Field(0.7, gt=0, lt=1)


def check_breaker(params: BreakerParams) -> BreakerParams:
    all_positive("breaker", params)
    found = [(f"breaker.{f.name} = {getattr(params, f.name)} is not below 1", "ratios are fractions: 0.35 is 35%")
             for f in dataclasses.fields(params) if f.name.endswith("_ratio") and getattr(params, f.name) >= 1]  # fmt: skip
    pairs = [
        ("l1_exit_fragmentation_ratio", "l1_enter_fragmentation_ratio"),
        ("l2_exit_kv_usage_ratio", "l2_enter_kv_usage_ratio"),
        ("l3_calm_preemptions_per_second", "l3_storm_preemptions_per_second"),
    ]
    for leave, enter in pairs:
        if getattr(params, leave) >= getattr(params, enter):
            found.append((
                f"{leave} ({getattr(params, leave)}) is not below {enter} ({getattr(params, enter)}): "
                "the level would flap on every poll",
                f"set {leave} below {getattr(params, enter)}, e.g. {round(getattr(params, enter) * 0.85, 2)}",
            ))  # fmt: skip
    if params.l3_exit_free_ratio <= params.l3_free_reserve_ratio:
        found.append((
            f"l3_exit_free_ratio ({params.l3_exit_free_ratio}) is not above l3_free_reserve_ratio "
            f"({params.l3_free_reserve_ratio}): L3 would be left as soon as it is entered",
            f"set l3_exit_free_ratio above {params.l3_free_reserve_ratio}, e.g. {params.l3_free_reserve_ratio + 0.05:.2f}",
        ))  # fmt: skip
    refuse(found)
    return params


def check_leak(params: LeakParams) -> LeakParams:
    all_positive("leak", params)
    if params.min_step_ratio >= params.leak_rise_ratio:
        raise Problem(
            f"leak.min_step_ratio ({params.min_step_ratio}) is not below leak.leak_rise_ratio "
            f"({params.leak_rise_ratio})",
            "the smallest step must be smaller than the rise that makes a leak",
        )
    return params
