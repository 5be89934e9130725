"""What the running parts look like from outside, built once per poll for /status, /metrics and systemd's STATUS=."""

from __future__ import annotations

from guardian.notify.service import Notifications
from guardian.pipeline import Pipeline
from guardian.snapshot import AlertView, PolicyView, Snapshot


def alert_views(notifications: Notifications | None) -> tuple[AlertView, ...]:
    if notifications is None:
        return ()
    return tuple(AlertView(t.alert.key, t.alert.severity, t.firing, t.first_seen, t.acked_by, t.notified_at is not None, t.alert.summary)
                 for t in notifications.state.alerts.values())  # fmt: skip


def policy_view(pipeline: Pipeline, dry_run: bool, restarting: list[str]) -> PolicyView:
    return PolicyView(
        states=dict(pipeline.states),
        budget=pipeline.config.actions.restart_budget,
        budget_left={name: pipeline.budget_left(name) for name in pipeline.states},
        dry_run=dry_run,
        restarting=restarting,
        tuners=dict(pipeline.tuners),
        tuner_limits=dict(pipeline.tuner_limits),
        tuner_holds=dict(pipeline.tuner_holds),
        tuner_slo={name: slo.target if (slo := pipeline.slo(name)) else None for name in pipeline.tuners},
        phases={name: pipeline.phase(name) for name in pipeline.states},
    )


def status_line(snap: Snapshot | None, pipeline: Pipeline) -> str:
    """One line for systemd's STATUS= (``systemctl status`` shows it): GPUs, then each engine's level and signals."""
    if snap is None:
        return "starting"
    parts = [f"{len(snap.nvml.gpus)} GPU" + ("" if snap.nvml.ok else " (NVML lost)")]
    parts += [f"{name}: L{int(pipeline.level(name))} {sig.brief()}" for name, sig in snap.engines.items()]
    return "; ".join(parts)
