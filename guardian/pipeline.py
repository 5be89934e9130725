"""One path from a poll's Sample to its signals, memory report and Decision: the daemon's and replay's.

``guardian run`` feeds it live samples, ``guardian replay`` recorded ones;
both hand it the same extra inputs (restart outcomes, operator commands), so
both decide the same. Nothing here touches the world: the daemon carries the
decision out, replay prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from guardian import config as cfg
from guardian.actions.engine_args import overlay
from guardian.analysis.cost import Cost, CostWindow, Marginal, MarginalWatch
from guardian.analysis.engine_stats import EngineSignals, EngineTracker
from guardian.analysis.memory import MemoryReport, MemoryWatch
from guardian.policy import concurrency, response, tuner
from guardian.policy.breaker import Evidence, Level, Transition
from guardian.policy.evidence import EvidenceMemory, evidence
from guardian.policy.lifecycle import LifecycleParams
from guardian.policy.profiles import hardware_profile
from guardian.policy.response import Action, Command, EngineState
from guardian.policy.slo import Slo, lanes_served
from guardian.sample import GpuReading, Sample
from guardian.snapshot import gpu_memory_by_pid

COST_WINDOW_SECONDS = 300.0  # the cost figures' sliding window

# An engine that dies while its GPUs had less than this share free the poll
# before died of an OOM: restart it with less memory, not just again.
OOM_FREE_RATIO = 0.02


@dataclass(frozen=True)
class Decision:
    t: float
    wall: float
    transitions: tuple[tuple[str, Transition], ...] = ()
    actions: tuple[Action, ...] = ()
    finished: Mapping[str, bool] = field(default_factory=dict)  # restart outcomes this decision took in
    command: Command | None = None  # the operator's, when this decision answers one

    @property
    def empty(self) -> bool:
        return not (self.transitions or self.actions or self.finished or self.command)

    def to_record(self) -> dict[str, Any]:
        """One line of the decision log (and of a record file): what replay reads back and compares."""
        return {
            "kind": "decision",
            "t": self.t,
            "wall": self.wall,
            "finished": dict(self.finished),
            "command": self.command.to_json() if self.command else None,
            "transitions": [
                {"engine": name, "from": int(tr.source), "to": int(tr.target), "rule": tr.rule, "numbers": tr.numbers}
                for name, tr in self.transitions
            ],
            "actions": [a.to_json() for a in self.actions],
        }


def tuner_move(a: Action) -> tuple[str, Mapping[str, Any]] | None:
    """The tuner's move an action records, with its numbers; once per move (a slow move's restart, not the cap after it)."""
    move = a.details.get("move")
    if move is None or (a.kind != "restart" and move != "batch"):
        return None
    return move, a.details.get("tuner", a.details)  # a restart carries the move's numbers apart from its own


def engine_gpus(sample: Sample, memory: MemoryReport, name: str) -> list[GpuReading]:
    """The GPUs the engine's processes hold memory on (none when guardian cannot place it)."""
    place = memory.placement.get(name)
    return [g for g in sample.nvml.gpus if place is not None and g.index in place.gpus]


@dataclass(frozen=True)
class PollResult:
    signals: dict[str, EngineSignals]
    memory: MemoryReport
    evidence: dict[str, Evidence]
    decision: Decision
    costs: dict[str, Cost] = field(default_factory=dict)


class Pipeline:
    def __init__(self, config: cfg.Config, host_memory_bytes: float | None) -> None:
        self.host_memory = host_memory_bytes
        self.trackers: dict[str, EngineTracker] = {}
        self.states: dict[str, EngineState] = {}
        self.tuners: dict[str, tuner.TunerState] = {}  # restored ones are set by the daemon before the first poll
        self.tuner_limits: dict[str, tuner.Limits] = {}
        self.tuner_holds: dict[str, str | None] = {}  # why the tuner did not move, when it wanted to
        self.costs: dict[str, CostWindow] = {}
        self.marginals: dict[str, MarginalWatch] = {}
        self.caps: dict[str, concurrency.CapState] = {}  # the gateway's cap per engine: the KV pool's measure, under the tuner's batch
        self.config = config
        self._past = EvidenceMemory()
        self._memory = MemoryWatch(config.leak, config.fragmentation.kv_pool_share, host_memory_bytes)
        self.reconfigure(config)

    def reconfigure(self, config: cfg.Config) -> None:
        """A reloaded config: windows and detectors start over only where their parameters changed."""
        g = config.guardian
        trackers = {}
        for section in config.engines:
            old = self.trackers.get(section.name)
            same = old is not None and (old.window, old.lost_after) == (g.latency_window_seconds, g.telemetry_lost_after_polls)
            trackers[section.name] = old if same and old is not None else EngineTracker(
                section.name, g.latency_window_seconds, g.telemetry_lost_after_polls
            )  # fmt: skip
            self.states.setdefault(section.name, EngineState())
        self.trackers = trackers
        self.states = {name: self.states[name] for name in trackers}
        self._tuner_params = config.tuner.params if config.tuner.enabled else None  # built once per config, read every poll
        self._base_args = {e.name: config.base_args(e) for e in config.engines}  # presets validated once, not per poll
        self._cap_params = concurrency.CapParams(
            config.gateway.concurrency, full_kv_usage_ratio=config.breaker.l2_enter_kv_usage_ratio,
            calm_preemptions_per_second=config.breaker.l3_calm_preemptions_per_second,
        ) if config.gateway else None  # fmt: skip
        self._life = LifecycleParams(config.breaker.l3_dead_after_polls, config.actions.start_timeout_seconds)
        if (config.leak, config.fragmentation) != (self.config.leak, self.config.fragmentation):
            self._memory = MemoryWatch(config.leak, config.fragmentation.kv_pool_share, self.host_memory)
        self.config = config

    def step(self, sample: Sample, finished: Mapping[str, bool] | None = None) -> PollResult:
        by_pid = gpu_memory_by_pid(sample.nvml)
        signals = {
            r.name: self.trackers[r.name].update(sample.t, r, by_pid) for r in sample.engines if r.name in self.trackers
        }
        memory = self._memory.update(sample, signals)
        finished = dict(finished or {})
        seen: dict[str, Evidence] = {}
        transitions: list[tuple[str, Transition]] = []
        actions: list[Action] = []
        for name, sig in signals.items():
            e = seen[name] = evidence(name, sample, sig, memory, self._past, OOM_FREE_RATIO, self._life)
            out = response.respond(
                name, self.states[name], e, sample.t, self.config.breaker, self.config.actions.params, finished.get(name)
            )
            self.states[name] = out.state
            transitions += [(name, tr) for tr in out.transitions]
            actions += out.actions
            tuned = self._tune(name, sample, sig, e, memory) if self.config.tuned(name) else []
            raised = any(a.kind == "tune" and (a.details.get("was") or 0) < a.details["batch"] for a in tuned)
            capped = self._cap(name, sample, sig, raised)
            if any(a.kind == "tune" for a in tuned):  # the tuner's move carries the cap the pool allows under its batch
                actions += [self._with_cap(a) for a in tuned]
            else:
                actions += tuned + capped
        costs = {name: self._cost(name, sample, sig, memory) for name, sig in signals.items()}
        decision = Decision(sample.t, sample.wall, tuple(transitions), tuple(actions), finished)
        return PollResult(signals, memory, seen, decision, costs)

    def _cap(self, name: str, sample: Sample, sig: EngineSignals, raised: bool = False) -> list[Action]:
        """The gateway's cap follows what the engine's KV pool holds (``policy/concurrency.py``), under the tuner's batch.

        The tuner's batch is a ceiling, not the cap: a batch the P99 allows can still overflow
        the pool when prompts grow (a burst of long ones), and then the pool's measure is the
        smaller. (The tuner alone at the cap let a burst preempt the high lane to 10x its P99:
        ``bench/efficacy.py``'s burst.) A batch the tuner ``raised`` (a queue held back with P99
        inside and nothing preempted) lifts the cap with it at once; a full pool cuts it again.
        """
        params, load = self._cap_params, sample.gateway_load(name)
        if params is None or load is None:
            return []
        ts = self.tuners.get(name)
        if ts is not None:
            params = replace(params, ceiling=ts.batch)
        was = self.caps.get(name) or concurrency.CapState(load.cap)
        before = was.cap
        if was.cap > params.ceiling or raised:  # the tuner's batch moved: the cap with it, at once
            was = concurrency.CapState(params.ceiling, sample.t)
        pressure = concurrency.Pressure(sig.running, sig.waiting, sig.kv_cache_usage, sig.preemptions_per_second,
                                        load.in_flight, load.queued)  # fmt: skip
        now, why = concurrency.step(was, pressure, sample.t, params)
        self.caps[name] = now
        if now.cap == before:
            return []
        return [Action("tune", name, int(self.states[name].breaker.level), why or "tuner_batch", {"batch": now.cap, "was": before})]

    def _with_cap(self, a: Action) -> Action:
        """A tuner's batch move sets the gateway's cap to what the pool allows under it (``cap``)."""
        cap = self.caps.get(a.engine)
        if a.kind != "tune" or cap is None:
            return a
        return replace(a, details={**a.details, "cap": cap.cap})

    def _cost(self, name: str, sample: Sample, sig: EngineSignals, memory: MemoryReport) -> Cost:
        """GPU memory per token and tokens per joule over the last minutes; a larger batch judged once it settled."""
        gpus = engine_gpus(sample, memory, name)
        held = sig.gpu_memory_bytes
        if held is None and gpus and all(g.memory_used_bytes is not None for g in gpus):
            held = sum(g.memory_used_bytes or 0 for g in gpus)
        energies = [g.energy_joules for g in gpus]
        reading = sample.engine(name)
        tokens = [c.generation_tokens_total for c in reading.cores] if reading is not None and reading.up else []
        window = self.costs.setdefault(name, CostWindow(COST_WINDOW_SECONDS))
        cost = window.update(sample.t, held, sum(tokens) if tokens and None not in tokens else None,  # type: ignore[arg-type]
                             sum(energies) if energies and None not in energies else None)  # type: ignore[arg-type]  # fmt: skip
        ts = self.tuners.get(name)
        if ts is not None:
            q = sig.latency.get(self.config.tuner.slo.metric)
            self.marginals.setdefault(name, MarginalWatch()).update(
                sample.t, ts.batch, sig.kv_cache_usage, sig.generation_tokens_per_second, q.p99 if q else None)
        return cost

    def phase(self, name: str) -> str | None:
        """The engine's lifecycle phase at the last poll (starting, up, unresponsive, dead); None before the first."""
        life = self._past.lifecycles.get(name)
        return life.phase if life else None

    def marginal(self, name: str) -> Marginal | None:
        watch = self.marginals.get(name)
        return watch.last if watch else None

    def _tune(self, name: str, sample: Sample, sig: EngineSignals, e: Evidence, memory: MemoryReport) -> list[Action]:
        """The tuner's poll for one engine: a fast move is a ``tune`` action (the gateway's cap), a slow one a restart."""
        tc = self.config.tuner
        state = self.states[name]
        gpus = engine_gpus(sample, memory, name) or list(sample.nvml.gpus[:1])
        gpu_name = gpus[0].name if gpus else None
        utils = [g.utilization_gpu_ratio for g in gpus if g.utilization_gpu_ratio is not None]
        params = self._tuner_params
        assert params is not None
        gw = self.config.gateway
        base = self._base_args[name]
        limits = tuner.Limits(
            hardware_cap=hardware_profile(gpu_name, tc.hardware).batch_cap,
            fast=gw is not None,
            speculation_allowed=params.slo.speculation_allowed(lanes_served(name, gw.high_priority_engines if gw else (), gw is not None)),
            speculative_config=tc.speculative_config or base.get("speculative-config"),  # type: ignore[arg-type]
        )  # fmt: skip
        self.tuner_limits[name] = limits
        actions: list[Action] = []
        ts = self.tuners.get(name)
        if ts is None:  # first poll (or restored): the gateway's cap becomes the tuner's batch
            running = overlay(base, state.tuned)  # what the engine was started with, as far as guardian knows
            seqs, chunk = running.get("max-num-seqs"), running.get("long-prefill-token-threshold")
            ts = tuner.initial(seqs if isinstance(seqs, int) else None, "speculative-config" in running, limits,
                               gw.concurrency if gw else None, chunk if isinstance(chunk, int) else None)  # fmt: skip
        if name not in self.tuner_holds and limits.fast:
            actions.append(Action("tune", name, int(state.breaker.level), "start", {"batch": ts.batch, "was": None}))
        load = sample.gateway_load(name)
        reading = tuner.reading_from(
            sig, params.slo, min(utils) if utils else None, float(load.queued) if load else 0.0,
            breaker_level=int(state.breaker.level), restarting=state.restarting is not None, degraded=state.degraded,
            long_in_flight=load is not None and load.long_in_flight > 0,
            short_in_flight=load is None or load.in_flight > load.long_in_flight,
            window_open=tc.restarts_open(sample.wall),
            restart_budget_ok=len(state.restarts) < self.config.actions.restart_budget - 1,  # one kept for the breaker
        )  # fmt: skip
        out = tuner.step(ts, reading, sample.t, params, limits)
        self.tuners[name] = out.state
        self.tuner_holds[name] = out.hold
        m = out.move
        if m is None:
            return actions
        details = {**m.numbers, "move": m.kind, "batch": out.state.batch, "was": m.old, "new": m.new}
        if not m.restart:
            return actions + [Action("tune", name, int(state.breaker.level), m.reason, details)]
        self.states[name], restart = response.tuner_restart(name, state, e, sample.t, out.state.engine_args(limits), f"tune_{m.kind}")
        restart = replace(restart, details={**restart.details, "move": m.kind, "tuner": details})
        if limits.fast and out.state.batch != ts.batch:  # the cap follows; the drain holds requests until the restart ends
            actions.append(Action("tune", name, int(state.breaker.level), m.reason, details))
        return actions + [restart]

    def slo(self, name: str) -> Slo | None:
        """The SLO the tuner steers this engine by: configured, or derived from its unloaded P99; None without one."""
        ts, params, limits = self.tuners.get(name), self._tuner_params, self.tuner_limits.get(name)
        return tuner.slo_in_force(ts, params, limits)[0] if ts is not None and params is not None and limits is not None else None

    def command(self, cmd: Command, t: float, wall: float) -> Decision:
        """Raises KeyError for an engine guardian does not watch."""
        out = response.command(self.states[cmd.engine], cmd, t)
        self.states[cmd.engine] = out.state
        return Decision(t, wall, tuple((cmd.engine, tr) for tr in out.transitions), out.actions, command=cmd)

    def level(self, name: str) -> Level:
        return self.states[name].breaker.level

    def budget_left(self, name: str) -> int:
        return max(0, self.config.actions.restart_budget - len(self.states[name].restarts))
