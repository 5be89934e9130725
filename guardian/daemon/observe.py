"""What the daemon says about each poll: failing sources, engine restarts, leak steps, breaker transitions, tuner moves.

The pure core decides; this is where its decisions and the readings behind
them become the log events and counters an operator reads, with the numbers
behind each one. A source that keeps failing is logged when it starts, when
its reason changes, every ``REPEAT_FAILURE_LOG_EVERY`` polls and on recovery,
so an engine down for a night is a handful of lines, not 30,000.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from guardian import logs
from guardian.analysis.memory import MemoryReport
from guardian.exporter import Metrics
from guardian.pipeline import Decision, tuner_move
from guardian.sample import EngineReading, Sample

log = logs.get("guardian.daemon")

REPEAT_FAILURE_LOG_EVERY = 60  # polls: a persisting failure is logged again this often


class FailureLog:
    """Logs a failing source when it starts failing, changes reason, every N polls, and on recovery."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.kind: str | None = None
        self.count = 0

    def observe(self, kind: str | None, reason: str | None, **fields: Any) -> None:
        if kind is None:
            if self.kind is not None:
                log.info("source_recovered", source=self.source, failed_polls=self.count, **fields)
            self.kind, self.count = None, 0
            return
        self.count += 1
        if kind != self.kind or self.count % REPEAT_FAILURE_LOG_EVERY == 0:
            log.warning("source_failed", source=self.source, kind=kind, reason=reason, failed_polls=self.count, **fields)
        self.kind = kind


def observe_engine(metrics: Metrics, failures: FailureLog, url: str, reading: EngineReading,
                   restarts_before: int, restarts: int) -> None:  # fmt: skip
    if reading.error_kind:
        metrics.scrape_errors.labels(reading.name, reading.error_kind).inc()
    failures.observe(reading.error_kind, reading.error, url=url)
    if restarts > restarts_before:
        log.warning("engine_restart_detected", engine=reading.name, restarts=restarts)


def observe_decision(metrics: Metrics, decision: Decision, dry_run: bool) -> None:
    """Each breaker transition and tuner move as an event with its numbers, and counted."""
    for name, tr in decision.transitions:
        metrics.transitions.labels(name, f"L{int(tr.source)}", f"L{int(tr.target)}", _reason(tr.rule)).inc()
        (log.warning if tr.target > tr.source else log.info)(
            "breaker_transition", engine=name, source=f"L{int(tr.source)}", target=f"L{int(tr.target)}",
            rule=tr.rule, forced=tr.forced, dry_run=dry_run,
            **{k: (round(v, 4) + 0.0 if isinstance(v, float) else v) for k, v in tr.numbers.items()},  # + 0.0: no -0.0
        )  # fmt: skip
    for action in decision.actions:
        if action.kind == "restart" and not dry_run:
            metrics.restarts.labels(action.engine, action.reason).inc()
        if (found := tuner_move(action)) is not None:
            move, numbers = found
            metrics.tuner_moves.labels(action.engine, move, action.reason).inc()
            log.info("tuner_move", engine=action.engine, kind=move, reason=action.reason,
                     restart=action.kind == "restart", dry_run=dry_run,
                     **{k: v for k, v in numbers.items() if k != "move"})  # fmt: skip


class MemoryLog:
    """One event per step found or given back, and when a series starts or stops looking like a leak."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._leaking: dict[str, bool] = {}

    def observe(self, sample: Sample, memory: MemoryReport) -> None:
        for series, report in memory.leaks.items():
            for step in report.new_steps:
                self._metrics.leak_steps.labels(series).inc()
                log.info(
                    "leak_step_detected",
                    series=series,
                    at=_wall(sample, step.t),
                    size_bytes=round(step.size),
                    level_bytes=round(report.level or 0),
                    overhang_bytes=round(report.overhang),
                    held_steps=len(report.held_steps),
                    confidence=round(report.confidence, 2),
                    time_to_exhaustion_seconds=_round(report.time_to_exhaustion),
                )
            for step in report.given_back:
                self._metrics.leak_steps_given_back.labels(series).inc()
                log.info(
                    "leak_step_given_back",
                    series=series,
                    at=_wall(sample, step.t),
                    size_bytes=round(step.size),
                    held_for_seconds=round((step.given_back_at or sample.t) - step.found_at, 1),
                )
            was = self._leaking.get(series, False)
            if report.leak != was:
                self._leaking[series] = report.leak
                (log.warning if report.leak else log.info)(
                    "leak_suspected" if report.leak else "leak_cleared",
                    series=series,
                    held_steps=len(report.held_steps),
                    steps=[(_wall(sample, s.t), round(s.size)) for s in report.held_steps][-10:],
                    overhang_bytes=round(report.overhang),
                    slope_bytes_per_second=round(report.slope, 1),
                    time_to_exhaustion_seconds=_round(report.time_to_exhaustion),
                    confidence=round(report.confidence, 2),
                )


def _reason(rule: str) -> str:
    """A bounded label value: operators' names stay in the log, not in metric labels."""
    return rule.split(" ", 1)[0] if rule.startswith(("forced", "cleared", "recovered")) else rule


def _wall(sample: Sample, t: float) -> str:
    """A monotonic time of this run as ISO wall-clock time."""
    return datetime.fromtimestamp(sample.wall_at(t), timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
