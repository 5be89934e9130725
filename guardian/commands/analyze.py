"""``guardian analyze``: the leak detector over logs operators already have.

Reads ``nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total[,utilization.gpu]
--format=csv[,noheader][,nounits] -l 1`` output (with or without the header,
with or without units, headers repeated where logs were concatenated) and
guardian's own record files (``guardian run --record``). A row that cannot be
read is reported with its file and line and skipped; it never ends the run.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from guardian.analysis.leak import LeakDetector
from guardian.analysis.leak_rule import Episode, LeakParams, LeakReport, Step, episodes
from guardian.commands.plotting import PlotUnavailable, pyplot

MiB = 2**20
GiB = 2**30
_QUERY_ORDER = ("timestamp", "index", "memory.used", "memory.total", "utilization.gpu")
_UNITS: dict[str, float] = {"mib": MiB, "gib": GiB, "kib": 1024, "b": 1, "mb": 10**6, "gb": 10**9}


@dataclass
class Series:
    gpu: str
    source: str
    times: list[float] = field(default_factory=list)  # unix seconds
    used: list[float] = field(default_factory=list)  # bytes
    totals: Counter[float] = field(default_factory=Counter)  # memory.total as the rows give it

    @property
    def total(self) -> float | None:
        """The card's memory: the value most rows agree on (a row cut while written gives another)."""
        return self.totals.most_common(1)[0][0] if self.totals else None


@dataclass(frozen=True)
class Verdict:
    series: Series
    report: LeakReport  # the state at the log's end; its steps are every step over the whole log
    samples: int
    episodes: list[Episode]  # the leaks over the whole log, in hindsight
    alarms: list[tuple[float, float | None]]  # when guardian run's live leak verdict would have been on

    @property
    def leak(self) -> bool:
        return bool(self.episodes) or self.report.leak

    @property
    def found(self) -> list[Step]:
        """The steps, less the transients the detector took back (long spikes, sawtooth teeth)."""
        return [s for s in self.report.steps if s.ended_by != "transient"]


class InputError(ValueError):
    """Nothing in the input could be used."""


# -- reading ---------------------------------------------------------------------


def read(paths: list[Path]) -> tuple[list[Series], list[str]]:
    """All GPUs' series from all files, and the problems met on the way (file:line: why)."""
    series: dict[tuple[str, str], Series] = {}
    problems: list[str] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            problems.append(f"{path}: cannot read: {exc.strerror or exc}")
            continue
        first = next((line for line in text.splitlines() if line.strip()), "")
        reader = _read_jsonl if first.lstrip().startswith("{") else _read_csv
        reader(path, text, series, problems)
    for s in series.values():  # a log may be unsorted when files were concatenated
        order = sorted(range(len(s.times)), key=s.times.__getitem__)
        s.times = [s.times[i] for i in order]
        s.used = [s.used[i] for i in order]
    return [s for s in series.values() if s.times], problems


def _read_csv(path: Path, text: str, series: dict[tuple[str, str], Series], problems: list[str]) -> None:
    columns: list[str] | None = None
    units: list[float | None] = []
    lines = text.splitlines()
    if lines and not text.endswith(("\n", "\r")):
        # nvidia-smi writes a row and its newline at once: a last line without one was cut off mid-write
        problems.append(f"{path}:{len(lines)}: last line cut off mid-write, skipped: {lines[-1][:80]!r}")
        lines.pop()
    for lineno, row in enumerate(csv.reader(lines, skipinitialspace=True), 1):
        if not row or not "".join(row).strip():
            continue
        if row[0].strip().lower().startswith("timestamp"):
            columns, units = _header(row)
            missing = {"timestamp", "index", "memory.used"} - set(columns)
            if missing:
                problems.append(f"{path}:{lineno}: header lacks {', '.join(sorted(missing))}; rows skipped until the next header")
                columns = []
            continue
        if columns is None:  # no header: the query's order, as wide as the first row
            columns = list(_QUERY_ORDER[: len(row)])
        names = columns
        if not names:
            continue
        if len(row) != len(names):
            problems.append(f"{path}:{lineno}: {len(row)} fields, expected {len(names)}: {','.join(row)[:80]!r}")
            continue
        try:
            values = dict(zip(names, row))
            t = _timestamp(values["timestamp"])
            gpu = values["index"].strip()
            unit = units[names.index("memory.used")] if units else None
            used = _bytes(values["memory.used"], unit)
            total = _bytes(values["memory.total"], units[names.index("memory.total")] if units else None) if "memory.total" in values else None
        except (ValueError, KeyError) as exc:
            problems.append(f"{path}:{lineno}: {exc}")
            continue
        s = series.setdefault((str(path), gpu), Series(gpu=gpu, source=str(path)))
        s.times.append(t)
        s.used.append(used)
        if total is not None:
            s.totals[total] += 1


def _header(row: list[str]) -> tuple[list[str], list[float | None]]:
    names: list[str] = []
    units: list[float | None] = []
    for cell in row:
        cell = cell.strip()
        name, _, unit = cell.partition(" [")
        names.append(name.strip().lower())
        units.append(_UNITS.get(unit.rstrip("]").strip().lower()) if unit else None)
    return names, units


_DAYS: dict[str, float] = {}


def _timestamp(text: str) -> float:
    text = text.strip()
    # nvidia-smi's own "2024/05/01 12:34:56.789", a million times: the day parsed once
    if len(text) >= 19 and text[4] == "/" and text[10] == " " and text[13] == ":" and text[16] == ":":
        day = _DAYS.get(text[:10])
        if day is None:
            try:
                day = _DAYS[text[:10]] = datetime.strptime(text[:10], "%Y/%m/%d").replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                day = None
        if day is not None and text[11:13].isdigit() and text[14:16].isdigit() and text[17:19].isdigit():
            h, m, sec = int(text[11:13]), int(text[14:16]), int(text[17:19])
            frac = text[19:]
            if h < 24 and m < 60 and sec < 61 and (not frac or (frac[0] == "." and frac[1:].isdigit())):
                return day + h * 3600 + m * 60 + sec + (float(frac) if frac else 0.0)
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise ValueError(f"timestamp {text[:40]!r} is not like 2024/05/01 12:34:56.789")


def _bytes(text: str, header_unit: float | None) -> float:
    """'12345 MiB' or '12345' (nounits: the header's unit, MiB when there is none)."""
    text = text.strip()
    number, _, unit = text.partition(" ")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"memory value {text[:40]!r} is not a number") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"memory value {text[:40]!r} is not a size")
    scale = _UNITS.get(unit.strip().lower()) if unit else header_unit
    if unit and scale is None:
        raise ValueError(f"unknown unit {unit!r}")
    return value * (scale or MiB)


def _read_jsonl(path: Path, text: str, series: dict[tuple[str, str], Series], problems: list[str]) -> None:
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{lineno}: not JSON ({exc.msg})")
            continue
        if isinstance(record, dict) and record.get("kind") in ("header", "decision"):
            continue  # the policy's lines in a record file: replay reads them, the leak analysis needs none
        if not isinstance(record, dict) or record.get("kind") != "sample":
            kind = record.get("kind") if isinstance(record, dict) else type(record).__name__
            problems.append(f"{path}:{lineno}: not a guardian sample record (kind={kind!r})")
            continue
        try:
            wall = float(record["wall"])
            gpus = record["nvml"]["gpus"]
        except (KeyError, TypeError, ValueError):
            problems.append(f"{path}:{lineno}: sample record without wall time or nvml.gpus")
            continue
        for gpu in gpus:
            used = gpu.get("memory_used_bytes") if isinstance(gpu, dict) else None
            if used is None:
                continue  # unknown in that poll: a gap, not a zero
            key = str(gpu.get("index"))
            s = series.setdefault((str(path), key), Series(gpu=key, source=str(path)))
            s.times.append(wall)
            s.used.append(float(used))
            if gpu.get("memory_total_bytes"):
                s.totals[float(gpu["memory_total_bytes"])] += 1


# -- analysing ----------------------------------------------------------------------


def analyze(series: list[Series], params: LeakParams) -> list[Verdict]:
    verdicts = []
    for s in series:
        total = s.total or max(s.used)
        det = LeakDetector(budget=total, capacity=s.total, params=params)
        report = None
        alarms: list[tuple[float, float | None]] = []
        for t, value in zip(s.times, s.used):
            report = det.update(t, value)
            if report.leak and (not alarms or alarms[-1][1] is not None):
                alarms.append((t, None))
            elif not report.leak and alarms and alarms[-1][1] is None:
                alarms[-1] = (alarms[-1][0], t)
        assert report is not None
        report = det.finish(s.times[-1])
        verdicts.append(Verdict(s, report, len(s.times), episodes(report.steps, params), alarms))
    return verdicts


def render(verdicts: list[Verdict]) -> str:
    out = []
    for v in verdicts:
        s, r = v.series, v.report
        total = f", total {s.total / GiB:.1f} GiB" if s.total else ""
        out.append(f"GPU {s.gpu} ({s.source}: {v.samples} samples, {_when(s.times[0])} → {_when(s.times[-1])}{total})")
        real = v.found
        held = [step for step in real if step.given_back_at is None]
        out.append(f"  steps: {len(real)} found, {len(held)} still held at the end")
        for step in real:
            fate = "" if step.ended_by is None else f"  (given back {_how(step)} at {_when(step.given_back_at or 0)})"
            out.append(f"    {_when(step.t)}  {step.size / GiB:+.2f} GiB{fate}")
        transients = len(r.steps) - len(real)
        if transients:
            out.append(f"  transients taken back (long spikes, sawtooth teeth): {transients}")
        for e in v.episodes:
            sizes = f"{len(e.steps)} steps, {e.rise / GiB:+.2f} GiB"
            if e.end is None:
                out.append(f"  leak: from {_when(e.start)} to the end of the log ({sizes}, still held)")
            else:
                out.append(f"  leak: {_when(e.start)} → {_when(e.end)} ({sizes}, then {_ended(e)} at {_when(e.end)})")
        if r.warming_up:
            out.append("  at the end: a model load is still under way (memory still rising)")
        elif r.level is not None:
            of = f" of {s.total / GiB:.1f} GiB" if s.total else ""
            state = "a leak" if r.leak else "no leak"
            out.append(f"  at the end: {state}; floor {r.level / GiB:.2f} GiB{of}, {r.overhang / GiB:+.2f} GiB since the load")
        if r.time_to_exhaustion is not None and r.held_steps:
            end = s.times[-1] + r.time_to_exhaustion
            out.append(f"  projected exhaustion: in {r.time_to_exhaustion / 3600:.1f} h at the current step rate (around {_when(end)})")
        if v.leak:
            out.append(f"  verdict: LEAK ({_episodes_brief(v)})")
        elif r.warming_up and not r.steps:
            out.append("  verdict: too short to judge (the log ends inside a model load)")
        else:
            out.append(f"  verdict: no leak (confidence of a leak at the end {r.confidence:.2f})")
    return "\n".join(out)


def _how(step: Step) -> str:
    return {"restart": "by a restart", "freed": "as memory was freed"}.get(step.ended_by or "", "")


def _ended(e: Episode) -> str:
    return "restarted" if e.ended_by == "restart" else "freed"


def _episodes_brief(v: Verdict) -> str:
    if not v.episodes:
        return f"the floor rose {v.report.overhang / GiB:+.2f} GiB"
    return "; ".join(
        f"{len(e.steps)} steps from {_when(e.start)}" + ("" if e.end is None else f", {_ended(e)} at {_when(e.end)}")
        for e in v.episodes
    )


def to_json(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    return [
        {
            "gpu": v.series.gpu,
            "source": v.series.source,
            "samples": v.samples,
            "total_bytes": v.series.total,
            "leak": v.leak,
            "episodes": [
                {
                    "start": _when(e.start),
                    "end": None if e.end is None else _when(e.end),
                    "ended_by": e.ended_by,
                    "steps": len(e.steps),
                    "rise_bytes": e.rise,
                }
                for e in v.episodes
            ],
            "at_end": {
                "leak": v.report.leak,
                "warming_up": v.report.warming_up,
                "floor_bytes": v.report.level,
                "overhang_bytes": v.report.overhang,
                "confidence": v.report.confidence,
                "held_steps": len(v.report.held_steps),
                "time_to_exhaustion_seconds": v.report.time_to_exhaustion,
            },
            "live_alarms": [{"start": _when(a), "end": None if b is None else _when(b)} for a, b in v.alarms],
            "steps": [
                {
                    "at": _when(s.t),
                    "size_bytes": s.size,
                    "given_back": s.given_back_at is not None,
                    "ended_by": s.ended_by,
                    "given_back_at": None if s.given_back_at is None else _when(s.given_back_at),
                }
                for s in v.found
            ],
            "transients": len(v.report.steps) - len(v.found),
        }
        for v in verdicts
    ]


def plot(verdicts: list[Verdict], out: Path) -> None:
    try:
        plt = pyplot()
    except PlotUnavailable as exc:
        raise InputError(str(exc)) from None
    fig, axes = plt.subplots(len(verdicts), 1, figsize=(11, 3.2 * len(verdicts)), squeeze=False)
    for ax, v in zip(axes[:, 0], verdicts):
        s = v.series
        t0 = s.times[0]
        hours = [(t - t0) / 3600 for t in s.times]
        ax.plot(hours, [u / GiB for u in s.used], lw=0.8, color="#1f77b4", label="memory used")
        if s.total:
            ax.axhline(s.total / GiB, color="black", lw=0.8, ls=":", label="total")
        # zoom on the steady part: a start-up ramp from zero would flatten the staircase
        low = sorted(s.used)[len(s.used) // 50] / GiB
        high = max(max(s.used), s.total or 0) / GiB
        ax.set_ylim(max(0.0, low - 0.05 * (high - low) - 0.5), high + 0.05 * (high - low) + 0.5)
        found = v.found
        for step in found:
            ax.axvline((step.t - t0) / 3600, color="#d62728", lw=1.2)
        for e in v.episodes:
            ax.axvspan((e.start - t0) / 3600, ((e.end or s.times[-1]) - t0) / 3600, color="#d62728", alpha=0.08)
        verdict = "LEAK" if v.leak else "no leak"
        ax.set_title(f"GPU {s.gpu}: {len(found)} steps ({verdict}); red lines = steps, shaded = leak present")
        ax.set_xlabel(f"hours since {_when(t0)}")
        ax.set_ylabel("GiB")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def main(args: argparse.Namespace) -> int:
    if args.warmup < 0:
        print("guardian analyze: --warmup must be 0 or more", file=sys.stderr)
        return 2
    series, problems = read(args.files)
    for problem in problems[:50]:
        print(f"skipped: {problem}", file=sys.stderr)
    if len(problems) > 50:
        print(f"skipped: … and {len(problems) - 50} more rows", file=sys.stderr)
    if not series:
        print("guardian analyze: no usable memory readings in the input", file=sys.stderr)
        return 2

    params = dataclasses.replace(LeakParams(), warmup_seconds=max(args.warmup, 1e-9))
    verdicts = analyze(series, params)
    print(json.dumps(to_json(verdicts), indent=2) if args.json else render(verdicts))
    if args.plot:
        try:
            plot(verdicts, args.plot)
        except InputError as exc:
            print(f"guardian analyze: {exc}", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 1 if any(v.leak for v in verdicts) else 0
