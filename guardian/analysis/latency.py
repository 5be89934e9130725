"""Quantiles from cumulative histogram buckets, with PromQL's ``histogram_quantile`` semantics.

Matching PromQL exactly matters: operators compare guardian's P99 with the
one their Grafana shows from the same vLLM histograms, and any difference
would be read as a bug in one of them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Sequence


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of ``buckets`` (upper bound, cumulative count), sorted by bound.

    Returns None where PromQL returns NaN or has no answer: no ``+Inf`` bucket,
    fewer than two buckets, or no observations.

    - linear interpolation inside the bucket the rank falls in;
    - the lowest bucket interpolates from 0 when its bound is positive;
    - a rank in the ``+Inf`` bucket answers the highest finite bound;
    - non-monotonic counts (a scrape racing an increment) are flattened
      upwards, as PromQL does since 2.25.
    """
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(qs: Sequence[float], buckets: Sequence[tuple[float, float]]) -> list[float | None]:
    """Several quantiles of one histogram, flattening the counts once."""
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return [None] * len(qs)
    counts = []
    highest = 0.0
    for _, count in buckets:
        if count > highest:
            highest = count
        counts.append(highest)
    total = counts[-1]
    return [_quantile(q, buckets, counts, total) for q in qs]


def _quantile(q: float, buckets: Sequence[tuple[float, float]], counts: list[float], total: float) -> float | None:
    if not 0.0 <= q <= 1.0:
        return -math.inf if q < 0 else math.inf
    if total <= 0:
        return None
    rank = q * total
    index = bisect_left(counts, rank)
    if index >= len(buckets) - 1:
        return buckets[-2][0]
    upper = buckets[index][0]
    if index == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = buckets[index - 1][0], counts[index - 1]
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket
