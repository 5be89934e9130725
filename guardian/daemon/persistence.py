"""The breaker's levels, restart history and tuner state on disk, so a restarted guardian carries on where it was.

Saved write-ahead (before the actions a decision starts) and only when it
changed; restored at start with monotonic times rebased onto this run. A file
that cannot be parsed is set aside and the restart budget counts as spent for
one window: a guardian that forgot its restarts must not restart again at once.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from guardian import logs
from guardian.daemon.observe import FailureLog
from guardian.pipeline import Pipeline
from guardian.policy import response, tuner
from guardian.state import StateFile

log = logs.get("guardian.daemon")

STATE_FILE = "state.json"


class PolicyStore:
    def __init__(self, state_dir: Path) -> None:
        self.file = StateFile(state_dir / STATE_FILE)
        self._failures = FailureLog("state")
        self._saved: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return self.file.path

    def restore(self, pipeline: Pipeline) -> None:
        """Start from the saved level and restart history; a corrupt file is set aside and spends the budget."""
        offset = time.time() - time.monotonic()
        try:
            loaded = self.file.load(lambda data: (
                {name: response.from_disk(doc, offset) for name, doc in data["engines"].items()},
                {name: tuner.from_disk(doc, offset) for name, doc in data.get("tuner", {}).items()},
            ))  # fmt: skip
        except OSError as exc:
            log.error("state_unreadable", file=str(self.path), reason=exc.strerror or str(exc),
                      detail="starting at L0 with no restart history")  # fmt: skip
            return
        if loaded.quarantined is not None:
            log.error("state_quarantined", file=str(self.path), moved_to=str(loaded.quarantined),
                      reason=loaded.reason, detail="starting conservatively: the restart budget counts as spent for one window")  # fmt: skip
            spend_budget(pipeline)
            return
        if loaded.value is None:
            return
        engines: dict[str, response.EngineState] = loaded.value[0]
        for name, tuned in loaded.value[1].items():
            if pipeline.config.tuned(name):
                pipeline.tuners[name] = tuned
                log.info("tuner_restored", engine=name, batch=tuned.batch, max_num_seqs=tuned.max_num_seqs,
                         speculation=tuned.speculation, tuning_restarts_today=len(tuned.restarts))  # fmt: skip
        for name, state in engines.items():
            if name in pipeline.states:
                pipeline.states[name] = state
                log.info("state_restored", engine=name, breaker_level=f"L{int(state.breaker.level)}",
                         forced_by=state.breaker.forced_by, restarts_in_window=len(state.restarts),
                         degraded=state.degraded, gpu_memory_utilization=state.gpu_memory_utilization)  # fmt: skip
        self._saved = loaded.data

    def save(self, pipeline: Pipeline, wall_offset: float) -> None:
        data: dict[str, Any] = {"engines": {name: response.to_disk(s, wall_offset) for name, s in pipeline.states.items()}}
        if pipeline.tuners:
            data["tuner"] = {name: tuner.to_disk(s, wall_offset) for name, s in pipeline.tuners.items()}
        if data == self._saved:
            return
        try:
            self.file.save(data)
        except OSError as exc:
            self._failures.observe("state", f"{self.path}: {exc.strerror or exc}")
            return
        self._failures.observe(None, None)
        self._saved = data


def spend_budget(pipeline: Pipeline) -> None:
    now = time.monotonic()
    budget = pipeline.config.actions.restart_budget
    for name, state in pipeline.states.items():
        pipeline.states[name] = replace(state, restarts=(now,) * budget)
