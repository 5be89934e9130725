"""The latency objective the tuner steers by, and the service classes behind the gateway's lanes.

One metric, one quantile, one target: the tuner compares the engine's P99 of
``metric`` (TTFT by default: vLLM's e2e histogram starts at 0.3 s, so a 200 ms
e2e target could not even be measured) with ``target_seconds`` through a
tolerance band, so that a P99 wandering a few percent around the target never
moves anything.

Service classes are the gateway's lanes (``high`` and ``low``) with what each
may be given: its vLLM ``priority`` (lower is served first under
``--scheduling-policy priority``) and whether its requests may run on an
engine with speculative decoding. Speculation is a start-up setting of the
whole engine in vLLM, so an engine gets it only when every class it serves
allows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

LatencyMetric = Literal["ttft", "e2e", "itl"]


@dataclass(frozen=True)
class ServiceClass:
    priority: int  # vLLM's request priority: lower is served first
    speculation: bool  # may run on an engine with speculative decoding
    preemptible: bool  # may be preempted (and paused at breaker L2) for the other class


DEFAULT_CLASSES: Mapping[str, ServiceClass] = {
    "high": ServiceClass(priority=0, speculation=False, preemptible=False),
    "low": ServiceClass(priority=10, speculation=True, preemptible=True),
}


@dataclass(frozen=True)
class Slo:
    metric: LatencyMetric = "ttft"
    target_seconds: float = 0.2
    band_ratio: float = 0.1  # no move while P99 is within ±10% of the target
    classes: Mapping[str, ServiceClass] = field(default_factory=lambda: dict(DEFAULT_CLASSES))

    @property
    def above(self) -> float:
        """P99 above this is over the objective."""
        return self.target_seconds * (1 + self.band_ratio)

    @property
    def below(self) -> float:
        """P99 below this is inside the objective with room to spare."""
        return self.target_seconds * (1 - self.band_ratio)

    def priority(self, lane: str) -> int:
        return self.classes[lane].priority

    def speculation_allowed(self, lanes: Iterable[str]) -> bool:
        return all(self.classes[lane].speculation for lane in lanes)


def lanes_served(engine: str, high_priority_engines: Iterable[str], gateway: bool) -> tuple[str, ...]:
    """The classes an engine serves: a dedicated high-priority pool takes the high lane away from the others."""
    dedicated = tuple(high_priority_engines)
    if gateway and dedicated and engine not in dedicated:
        return ("low",)
    return ("high", "low")
