"""``guardian analyze``: the leak detector over logs operators already have (``memory_logs`` reads them),
a verdict per GPU over the whole log, as text, JSON or a plot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from guardian.analysis.leak import LeakDetector
from guardian.analysis.leak_rule import Episode, LeakParams, LeakReport, Step, episodes
from guardian.commands.memory_logs import GiB, Series, read
from guardian.commands.plotting import PlotUnavailable, pyplot

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
