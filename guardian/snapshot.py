"""What the daemon knows after its latest poll: the one value the exporter and ``/status`` read."""

from __future__ import annotations

from dataclasses import dataclass, field

from guardian.analysis.cost import Cost, Marginal
from guardian.analysis.engine_stats import EngineSignals
from guardian.analysis.memory import MemoryReport
from guardian.policy.response import EngineState
from guardian.policy.tuner import Limits, TunerState
from guardian.sample import NvmlReading, Sample


@dataclass(frozen=True, slots=True)
class PolicyView:
    """The breaker and its actions after the poll: levels, restart budget, what is under way."""

    states: dict[str, EngineState]
    budget: int  # restarts allowed per window
    budget_left: dict[str, int]
    dry_run: bool
    restarting: list[str]  # engines with a drained restart under way
    tuners: dict[str, TunerState] = field(default_factory=dict)
    tuner_limits: dict[str, Limits] = field(default_factory=dict)
    tuner_holds: dict[str, str | None] = field(default_factory=dict)
    tuner_slo: dict[str, float | None] = field(default_factory=dict)  # the objective in force (None: still learnt)
    phases: dict[str, str | None] = field(default_factory=dict)  # lifecycle: starting, up, unresponsive, dead


@dataclass(frozen=True, slots=True)
class AlertView:
    """An alert of the lifecycle as an operator needs it at a glance."""

    key: str
    severity: str
    firing: bool
    since: float  # unix seconds
    acked_by: str | None
    told: bool  # a message has gone out
    summary: str


@dataclass(frozen=True, slots=True)
class ActionView:
    """One action carried out (or refused), with its outcome."""

    at: float  # unix seconds
    engine: str
    kind: str
    reason: str
    outcome: str
    detail: str


@dataclass(frozen=True, slots=True)
class GatewayView:
    """The gateway in front of one engine: its gates and whether it routes there."""

    gates: str  # open, long contexts refused, low lane paused, high priority only
    routed: bool
    why_not: str | None
    refused: int  # requests answered 429/503 by the gateway since start
    long_prompt_flood: bool = False  # a flood of long prompts keeps to its share of the engine's time


@dataclass(frozen=True, slots=True)
class Snapshot:
    sample: Sample
    engines: dict[str, EngineSignals]
    nvml_lost: bool  # NVML failed for telemetry_lost_after_polls polls in a row
    poll_seconds: float  # how long the poll took (wall)
    memory: MemoryReport | None = None  # leak detectors and fragmentation
    urls: dict[str, str] = field(default_factory=dict)  # engine name -> base URL
    policy: PolicyView | None = None
    costs: dict[str, Cost] = field(default_factory=dict)
    marginals: dict[str, Marginal] = field(default_factory=dict)  # the latest judgement of a larger batch, per engine
    gateway: dict[str, GatewayView] = field(default_factory=dict)  # per engine; empty without a gateway
    alerts: tuple[AlertView, ...] = ()
    actions: tuple[ActionView, ...] = ()  # the latest, oldest first

    @property
    def nvml(self) -> NvmlReading:
        return self.sample.nvml


def gpu_memory_by_pid(nvml: NvmlReading) -> dict[int, int]:
    """NVML used memory per pid, summed over GPUs and MIG slices (tensor parallel spans several)."""
    used: dict[int, int] = {}
    for gpu in nvml.gpus:
        groups = [gpu.processes or ()] + [m.processes or () for m in gpu.mig]
        for procs in groups:
            for proc in procs:
                if proc.used_bytes is not None:
                    used[proc.pid] = used.get(proc.pid, 0) + proc.used_bytes
    return used
