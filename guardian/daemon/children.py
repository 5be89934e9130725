"""What a starting guardian does to the engines it finds: start its own, resume the paused, set restored gates again.

Each answers a way the previous guardian can have ended: killed with its
child engine gone, killed mid-drain with vLLM paused, or killed after a level
was saved but before its gates were set.
"""

from __future__ import annotations

from guardian import logs
from guardian.actions.executor import Executor
from guardian.actions.launcher import ChildLauncher
from guardian.pipeline import Pipeline
from guardian.policy import response
from guardian.policy.response import Action

log = logs.get("guardian.daemon")


async def start_children(executor: Executor, pipeline: Pipeline, dry_run: bool) -> None:
    """With the child launcher guardian owns the engine: start it unless it already runs (from an earlier guardian).

    An engine an earlier guardian started is adopted only when its identity
    checks out; its orphans (a server killed, its engine core left) are
    stopped by the start. With no identity kept, a process listening on the
    engine's port is adopted if it is the engine's command and otherwise
    left alone, and no second engine is started beside it.
    """
    for name, act in executor.engines.items():
        if not isinstance(act.launcher, ChildLauncher) or await act.launcher.alive() is not False:
            continue
        if act.launcher.identity() is None and (found := act.launcher.adopt_listener()) is not None:
            (log.info if found.ok else log.error)("engine_start_skipped", engine=name, outcome=found.status,
                                                  detail=found.detail)  # fmt: skip
            continue
        args = executor.args_for(name, response.restart_details(pipeline.states[name], response.Evidence()))
        if dry_run:
            log.warning("action_planned", dry_run=True, engine=name, kind="start", argv=act.launcher.command)
            continue
        outcome = await act.launcher.restart(args)
        (log.info if outcome.ok else log.error)("engine_started", engine=name, launcher=act.launcher.describe,
                                                outcome=outcome.status, detail=outcome.detail)  # fmt: skip


async def resume_paused(executor: Executor) -> None:
    """An engine left paused by a guardian that died mid-drain is resumed: nothing else ever would."""
    for name, act in executor.engines.items():
        if act.admin is None or name in executor.restarting:
            continue
        asked = await act.admin.is_paused()
        if asked.ok and isinstance(asked.body, dict) and asked.body.get("is_paused") is True:
            resumed = await act.admin.resume()
            (log.warning if resumed.ok else log.error)(
                "engine_resumed", engine=name, outcome=resumed.status, detail=resumed.detail,
                reason="found paused with no restart in progress (a guardian stopped during a drain?)",
            )  # fmt: skip


def reconcile(pipeline: Pipeline) -> list[Action]:
    """A restored level's gates, set again: the run that entered it may have died before they were."""
    return [Action("gates", name, int(s.breaker.level), "restored")
            for name, s in pipeline.states.items() if s.breaker.level > 0]  # fmt: skip
