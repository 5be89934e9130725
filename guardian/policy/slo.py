"""The latency objective the tuner steers by, and the service classes behind the gateway's lanes.

One metric, one quantile, one target: the tuner compares the engine's P99 of
``metric`` (TTFT by default: vLLM's e2e histogram starts at 0.3 s, so a 200 ms
e2e target could not even be measured) with ``target_seconds`` through a
tolerance band, so that a P99 wandering a few percent around the target never
moves anything.

A fixed default target is a guess about hardware and model that is wrong
somewhere: 200 ms is more than an H100 needs for a short prompt and less than
a large model's prefill takes with nothing else running, and a target below
what the engine does unloaded holds the tuner at "overloaded" for ever. So
without a configured target the objective is ``unloaded_factor`` times the
engine's own P99 with nothing waiting in it (learnt live, see
``policy/tuner.py``), and a configured target below that P99 is refused with
the reason and replaced the same way (``objective``) once no smaller batch
can reach it (``tuner.slo_in_force``).

Service classes are the gateway's lanes (``high`` and ``low``) with what each
may be given: its vLLM ``priority`` (lower is served first under
``--scheduling-policy priority``) and whether its requests may run on an
engine with speculative decoding. Speculation is a start-up setting of the
whole engine in vLLM, so an engine gets it only when every class it serves
allows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    target_seconds: float | None = None  # None: derived from the engine's unloaded P99 (``objective``)
    band_ratio: float = 0.1  # no move while P99 is within ±10% of the target
    classes: Mapping[str, ServiceClass] = field(default_factory=lambda: dict(DEFAULT_CLASSES))

    @property
    def target(self) -> float:
        """The target in force; only an ``objective`` (or a configured ``Slo``) is steered by."""
        assert self.target_seconds is not None, "a derived SLO before the engine's unloaded P99 was learnt"
        return self.target_seconds

    @property
    def above(self) -> float:
        """P99 above this is over the objective."""
        return self.target * (1 + self.band_ratio)

    @property
    def below(self) -> float:
        """P99 below this is inside the objective with room to spare."""
        return self.target * (1 - self.band_ratio)

    def priority(self, lane: str) -> int:
        return self.classes[lane].priority

    def speculation_allowed(self, lanes: Iterable[str]) -> bool:
        return all(self.classes[lane].speculation for lane in lanes)


def objective(slo: Slo, unloaded: float | None, factor: float) -> tuple[Slo | None, str | None]:
    """The SLO to steer by, and why the configured one was refused (None: it was not).

    ``unloaded`` is the engine's P99 with nothing waiting in it; None until
    learnt, and then a derived SLO is not known yet either.
    """
    derived = None if unloaded is None else replace(slo, target_seconds=round(unloaded * factor, 4))
    if slo.target_seconds is None:
        return derived, None
    if unloaded is not None and derived is not None and slo.target_seconds < unloaded:
        return derived, (
            f"SLO refused: its {slo.target_seconds * 1000:g} ms is below this engine's P99 {slo.metric} with nothing "
            f"waiting ({unloaded * 1000:.0f} ms), so no batch could meet it; steering by {derived.target * 1000:.0f} ms "
            f"({factor:g}x that) instead. Set [tuner.slo] target_seconds above {unloaded:.3g}, or leave it out"
        )  # fmt: skip
    return slo, None


def lanes_served(engine: str, high_priority_engines: Iterable[str], gateway: bool) -> tuple[str, ...]:
    """The classes an engine serves: a dedicated high-priority pool takes the high lane away from the others."""
    dedicated = tuple(high_priority_engines)
    if gateway and dedicated and engine not in dedicated:
        return ("low",)
    return ("high", "low")
