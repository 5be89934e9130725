"""``guardian replay FILE``: run the whole policy offline over recorded samples and print its decisions.

The record file (``guardian run --record``) holds every sample, every
decision the live run made with the restart outcomes and operator commands
it took in, and a header with the parameters it ran with. Replay feeds the
same samples and the same outside inputs through the same ``Pipeline``, so
with the recorded parameters it must decide exactly what the live run
decided; with ``--config`` it shows what other thresholds would have done.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from guardian import config as cfg
from guardian.commands.common import load_or_exit
from guardian.pipeline import Decision, Pipeline
from guardian.policy.response import Command, restart_text
from guardian.record import from_record


class ReplayError(Exception):
    """Nothing replayable in the input (the message says why)."""


@dataclass(frozen=True)
class Replay:
    decisions: list[Decision]
    recorded: list[dict[str, Any]]  # the live run's decision records, in order
    samples: int
    problems: list[str]

    @property
    def matches(self) -> bool:
        return [d.to_record() for d in self.decisions] == self.recorded

    def first_difference(self) -> str | None:
        mine = [d.to_record() for d in self.decisions]
        for i, (a, b) in enumerate(zip(mine, self.recorded)):
            if a != b:
                return f"decision {i + 1} at {_when(b['wall'])}: replay {_brief(a)} / recorded {_brief(b)}"
        if len(mine) != len(self.recorded):
            return f"replay made {len(mine)} decisions, the live run {len(self.recorded)}"
        return None


def read(paths: Iterable[Path]) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    """The first header, every record in order, and the lines that could not be read."""
    header = None
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{path}: cannot read: {exc}")
            continue
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{path}:{lineno}: not JSON ({exc.msg}); a line cut off by a crash is skipped")
                continue
            kind = record.get("kind") if isinstance(record, dict) else None
            if kind == "header":
                header = header or record
            elif kind in ("sample", "decision"):
                records.append(record)
            else:
                problems.append(f"{path}:{lineno}: not a guardian record (kind={kind!r})")
    return header, records, problems


def config_from(header: dict[str, Any] | None, override: cfg.Config | None) -> cfg.Config:
    if override is not None:
        return override
    if header is None or "config" not in header:
        raise ReplayError("the record has no header with the live run's parameters: pass --config")
    try:
        return cfg.Config.model_validate(header["config"])
    except Exception as exc:  # a header from another version
        raise ReplayError(f"the record's header does not validate as a config ({exc}): pass --config") from None


def replay(config: cfg.Config, header: dict[str, Any] | None, records: list[dict[str, Any]], problems: list[str]) -> Replay:
    pipeline = Pipeline(config, (header or {}).get("host_memory_bytes"))
    inputs = {r["t"]: r["finished"] for r in records if r["kind"] == "decision" and not r.get("command")}
    decisions: list[Decision] = []
    samples = 0
    for record in records:
        if record["kind"] == "sample":
            try:
                sample = from_record(record)
            except (KeyError, TypeError, ValueError) as exc:
                problems.append(f"a sample at t={record.get('t')} has another shape ({type(exc).__name__}: {exc})")
                continue
            samples += 1
            decision = pipeline.step(sample, inputs.get(sample.t, {})).decision
        elif record.get("command"):
            try:
                decision = operator_command(pipeline, record)
            except KeyError:
                problems.append(f"a command for engine {record['command'].get('engine')!r}, which this config does not have")
                continue
        else:
            continue
        if not decision.empty:
            decisions.append(decision)
    recorded = [r for r in records if r["kind"] == "decision"]
    if samples == 0:
        raise ReplayError("no sample records in the input (record them with guardian run --record FILE)")
    return Replay(decisions, recorded, samples, problems)


def render(result: Replay) -> str:
    lines = []
    for d in result.decisions:
        when = _when(d.wall)
        for name, ok in d.finished.items():
            lines.append(f"{when}  {name:<12} restart finished: {'ok' if ok else 'FAILED'}")
        if d.command is not None:
            lines.append(f"{when}  {d.command.engine:<12} operator {d.command.who}: {d.command.kind}"
                         + (f" L{d.command.level}" if d.command.level is not None else ""))  # fmt: skip
        for name, tr in d.transitions:
            numbers = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in tr.numbers.items() if v is not None)
            lines.append(f"{when}  {name:<12} L{int(tr.source)} -> L{int(tr.target)}  {tr.rule}" + (f"  ({numbers})" if numbers else ""))
        for a in d.actions:
            what: str = a.kind
            if a.kind == "notify":
                what = f"notify {a.details.get('severity')}: {a.details.get('text')}"
            elif a.kind == "restart":
                what = restart_text(a)
            elif a.kind == "gates":
                shut = a.details.get("shut")
                what = f"gates for L{a.level}" + (f" (shut as at L{shut}: the request path's rules)" if shut not in (None, a.level) else "")
            elif a.kind == "tune":
                who = "tuner: batch" if a.details.get("move") else "gateway cap (follows the KV pool)"
                what = f"{who} {a.details.get('was') or '-'} -> {a.details.get('batch')} ({a.reason})"
            lines.append(f"{when}  {a.engine:<12}   action: {what}")
    return "\n".join(lines) if lines else "no decisions: the breaker stayed at L0 and nothing was done"


def operator_command(pipeline: Pipeline, record: dict[str, Any]) -> Decision:
    """A recorded force or clear, applied as the live run did; KeyError for an engine the config does not have."""
    c = record["command"]
    return pipeline.command(Command(c["kind"], c["engine"], c["who"], c["level"]), record["t"], record["wall"])


def _when(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _brief(record: dict[str, Any]) -> str:
    moves = [f"{t['engine']} L{t['from']}->L{t['to']} {t['rule']}" for t in record["transitions"]]
    acts = [f"{a['engine']} {a['kind']}" for a in record["actions"]]
    return "; ".join(moves + acts) or "(nothing)"


def main(args: argparse.Namespace) -> int:
    override = load_or_exit(args.config) if args.config else None
    header, records, problems = read(args.files)
    for problem in problems[:50]:
        print(f"skipped: {problem}", file=sys.stderr)
    try:
        config = config_from(header, override)
        result = replay(config, header, records, problems)
    except ReplayError as exc:
        print(f"guardian replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for decision in result.decisions:
            print(json.dumps(decision.to_record()))
    else:
        print(render(result))
    print(f"{result.samples} samples, {len(result.decisions)} decisions", file=sys.stderr)
    if override is not None:
        return 0
    difference = result.first_difference()
    if difference is None:
        print("identical to the decisions the live run recorded", file=sys.stderr)
        return 0
    print(f"differs from the live run: {difference}", file=sys.stderr)
    return 1
