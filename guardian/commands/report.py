"""``guardian report``: the last hours of a record file, in words and (``--plot``) pictures.

The record holds what every poll read, not a summary; the report plays the
samples through the same pipeline ``guardian run`` and ``guardian replay``
use (so the breaker levels, leak steps, tuner moves and costs are the ones
the daemon had), collects one row per poll, and tells per GPU and per
engine: memory and the leak steps held, time at each breaker level,
restarts, P99 against the SLO, throughput, the cost figures and the
marginal checks of larger batches, and what the tuner did.

With ``--plot DIR`` it draws four PNGs: ``memory.png`` (GPU memory with the
held steps marked), ``breaker.png`` (level timeline per engine),
``p99.png`` (P99 against the SLO) and ``tuning.png`` (batch, engine limit
and speculation).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from guardian import config as cfg
from guardian.analysis.cost import Marginal
from guardian.commands import replay
from guardian.commands.common import load_or_exit
from guardian.commands.plotting import PlotUnavailable, plain_log_axis, pyplot
from guardian.pipeline import Pipeline, tuner_move
from guardian.record import from_record

GiB = 2**30


class ReportError(ValueError):
    pass


@dataclass
class EngineRow:
    level: int
    p99: float | None
    tokens_per_second: float | None
    batch: int | None
    max_num_seqs: int | None
    speculation: bool | None
    memory_gb_seconds_per_1k_tokens: float | None
    tokens_per_joule: float | None


@dataclass
class Timeline:
    """One row per poll: what the report says and draws."""

    walls: list[float] = field(default_factory=list)
    gpus: dict[int, list[tuple[float | None, float | None]]] = field(default_factory=dict)  # used, total bytes
    gpu_names: dict[int, str | None] = field(default_factory=dict)
    engines: dict[str, list[EngineRow]] = field(default_factory=dict)
    steps: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # series -> (wall, bytes) of held steps
    found: dict[str, dict[float, tuple[float, float, str | None]]] = field(default_factory=dict)  # series -> t -> (wall, bytes, ended by)
    leak: dict[str, bool] = field(default_factory=dict)
    transitions: dict[str, list[tuple[float, int, int, str]]] = field(default_factory=dict)
    restarts: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    tuner_moves: dict[str, list[tuple[float, str, Any, Any, str]]] = field(default_factory=dict)
    marginals: dict[str, list[tuple[float, Marginal]]] = field(default_factory=dict)  # (wall, judgement)
    slo: dict[str, float] = field(default_factory=dict)  # engine -> the tuner's SLO at the record's end (configured or derived)


def build(config: cfg.Config, header: dict[str, Any] | None, records: list[dict[str, Any]], hours: float | None) -> Timeline:
    samples = [r for r in records if r.get("kind") == "sample"]
    if not samples:
        raise ReportError("no sample records in the input (record them with guardian run --record FILE)")
    start = samples[-1]["wall"] - hours * 3600 if hours else float("-inf")
    inputs = {r["t"]: r["finished"] for r in records if r.get("kind") == "decision" and not r.get("command")}
    pipeline = Pipeline(config, (header or {}).get("host_memory_bytes"))
    tl = Timeline()
    judged: dict[str, Marginal | None] = {}
    for record in records:  # the whole file feeds the detectors; only the last hours are reported
        if record.get("kind") == "decision" and record.get("command"):
            try:  # an operator's force or clear: the levels after it are the forced ones
                forced = replay.operator_command(pipeline, record)
            except KeyError:
                continue
            if forced.wall >= start:
                for name, tr in forced.transitions:
                    tl.transitions.setdefault(name, []).append((forced.wall, int(tr.source), int(tr.target), tr.rule))
            continue
        if record.get("kind") != "sample":
            continue
        sample = from_record(record)
        result = pipeline.step(sample, inputs.get(sample.t, {}))
        if sample.wall < start:
            continue
        tl.walls.append(sample.wall)
        for g in sample.nvml.gpus:
            tl.gpus.setdefault(g.index, []).append((g.memory_used_bytes, g.memory_total_bytes))
            tl.gpu_names[g.index] = g.name
        metric = config.tuner.slo.metric
        for name, sig in result.signals.items():
            q = sig.latency.get(metric)
            ts = pipeline.tuners.get(name)
            cost = result.costs.get(name)
            tl.engines.setdefault(name, []).append(EngineRow(
                level=int(pipeline.level(name)), p99=q.p99 if q and q.count else None,
                tokens_per_second=sig.generation_tokens_per_second,
                batch=ts.batch if ts else None, max_num_seqs=ts.max_num_seqs if ts else None,
                speculation=ts.speculation if ts else None,
                memory_gb_seconds_per_1k_tokens=cost.memory_gb_seconds_per_1k_tokens if cost else None,
                tokens_per_joule=cost.tokens_per_joule if cost else None,
            ))  # fmt: skip
            if (slo := pipeline.slo(name)) is not None:
                tl.slo[name] = slo.target
            m = pipeline.marginal(name)
            if m is not None and m is not judged.get(name):
                tl.marginals.setdefault(name, []).append((sample.wall_at(m.t), m))
                judged[name] = m
        for series, leak in result.memory.leaks.items():
            tl.steps[series] = [(sample.wall_at(s.t), s.size) for s in leak.held_steps]
            for s in leak.steps:  # every step of the window, also those a restart or a release gave back since
                if s.ended_by != "transient":
                    tl.found.setdefault(series, {})[s.t] = (sample.wall_at(s.t), s.size, s.ended_by)
            tl.leak[series] = leak.leak
        d = result.decision
        for name, tr in d.transitions:
            tl.transitions.setdefault(name, []).append((d.wall, int(tr.source), int(tr.target), tr.rule))
        for a in d.actions:
            if a.kind == "restart":
                tl.restarts.setdefault(a.engine, []).append((d.wall, a.reason))
            if (found := tuner_move(a)) is not None:
                move, numbers = found
                tl.tuner_moves.setdefault(a.engine, []).append((d.wall, move, numbers.get("was"), numbers.get("new"), a.reason))
    if not tl.walls:
        raise ReportError(f"no samples in the last {hours:g} hours of the input")
    return tl


def _pct(part: int, whole: int) -> str:
    return f"{part / whole * 100:.1f}%" if whole else "-"


def _ms(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s"


def _when(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def render(tl: Timeline, config: cfg.Config, source: str) -> str:
    hours = (tl.walls[-1] - tl.walls[0]) / 3600
    metric = config.tuner.slo.metric
    lines = [f"guardian report: {_when(tl.walls[0])} -> {_when(tl.walls[-1])} ({hours:.2f} h, {len(tl.walls)} polls) from {source}"]
    for index, readings in sorted(tl.gpus.items()):
        used = [u for u, _ in readings if u is not None]
        total = next((t for _, t in readings if t), None)
        series = f"gpu/{index}/used"
        held = tl.steps.get(series, [])
        found = list(tl.found.get(series, {}).values())
        ended = Counter(by for _, _, by in found if by is not None)
        text = f"GPU {index} ({tl.gpu_names.get(index) or 'unknown'}): memory "
        text += f"{used[0] / GiB:.1f} -> {used[-1] / GiB:.1f} GiB (peak {max(used) / GiB:.1f})" if used else "unknown"
        text += f" of {total / GiB:.1f} GiB" if total else ""
        text += f"; leak steps: {len(found)} found" + (f" (+{sum(s for _, s, _ in found) / GiB:.2f} GiB)" if found else "")
        text += f", {len(held)} held at the end" + "".join(f", {n} given back by {'a restart' if by == 'restart' else 'release'}"
                                                           for by, n in sorted(ended.items()))  # fmt: skip
        text += "; LEAK SUSPECTED" if tl.leak.get(series) else ""
        lines.append(text)
    for name, rows in tl.engines.items():
        n = len(rows)
        levels = Counter(r.level for r in rows)
        lines.append(f"engine {name}:")
        restarts = tl.restarts.get(name, [])
        why = Counter(w for _, w in restarts)
        lines.append("  breaker: " + ", ".join(f"L{lv} {_pct(levels[lv], n)}" for lv in range(4))
                     + f"; {len(tl.transitions.get(name, []))} transitions; {len(restarts)} restarts"
                     + (f" ({', '.join(f'{k} {v}' for k, v in why.items())})" if restarts else ""))  # fmt: skip
        p99s = sorted(r.p99 for r in rows if r.p99 is not None)
        if p99s:
            text = f"  P99 {metric}: median {_ms(p99s[len(p99s) // 2])}, worst {_ms(p99s[-1])}"
            if (slo := tl.slo.get(name)) is not None:
                over = sum(1 for p in p99s if p > slo)
                text += f"; over the {_ms(slo)} SLO in {_pct(over, len(p99s))} of polls with requests"
            lines.append(text)
        tps = [r.tokens_per_second for r in rows if r.tokens_per_second is not None]
        mem = [r.memory_gb_seconds_per_1k_tokens for r in rows if r.memory_gb_seconds_per_1k_tokens is not None]
        tpj = [r.tokens_per_joule for r in rows if r.tokens_per_joule is not None]
        cost = f"  throughput: {sum(tps) / len(tps):.0f} tok/s mean" if tps else "  throughput: unknown"
        if mem:
            cost += f"; GPU memory {sorted(mem)[len(mem) // 2]:.1f} GB·s per 1000 tokens (median of the 5-min figures)"
        if tpj:
            cost += f"; {sorted(tpj)[len(tpj) // 2]:.2f} tokens per joule"
        lines.append(cost)
        batches = [r.batch for r in rows if r.batch is not None]
        if batches:
            moves = tl.tuner_moves.get(name, [])
            spec = [r.speculation for r in rows if r.speculation is not None]
            seqs = [r.max_num_seqs for r in rows if r.max_num_seqs is not None]
            lines.append(f"  tuner: batch {batches[0]} -> {batches[-1]} (range {min(batches)}-{max(batches)}), "
                         + (f"--max-num-seqs {seqs[0]} -> {seqs[-1]}, " if seqs else "")
                         + f"speculation {'on' if spec and spec[-1] else 'off'}; {len(moves)} moves"
                         + (" (" + ", ".join(f"{k} {v}" for k, v in Counter(m[4] for m in moves).items()) + ")" if moves else ""))  # fmt: skip
        for wall, m in tl.marginals.get(name, []):
            lines.append(f"  larger batch {m.batch_before} -> {m.batch_after}, judged {_when(wall)}: KV in use "
                         f"{m.memory_growth_ratio * 100:+.0f}% for {m.throughput_gain_ratio * 100:+.0f}% tokens/s, P99 x"
                         f"{m.p99_swing_ratio if m.p99_swing_ratio is not None else '?'}: {'paid' if m.ok else 'DID NOT PAY'}")  # fmt: skip
    return "\n".join(lines)


def plot(tl: Timeline, config: cfg.Config, out: Path, inspect: Callable[[str, Any], None] | None = None) -> list[Path]:
    """PNGs of the record: every time plot marks guardian's restarts (and why); a plot with nothing to draw says so.

    ``inspect`` sees each figure before it is written (the tests read what was drawn from it).
    """
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    out.mkdir(parents=True, exist_ok=True)
    t0 = tl.walls[0]
    minutes = [(w - t0) / 60 for w in tl.walls]
    xlabel = f"minutes since {_when(t0)}"
    written = []

    def save(fig: Any, name: str) -> None:
        if inspect is not None:
            inspect(name, fig)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    def restarts(ax: Any) -> None:
        for name, done in tl.restarts.items():
            for wall, why in done:
                x = (wall - t0) / 60
                ax.axvline(x, color="#555555", ls="--", lw=0.9)
                ax.annotate(f"restart {name}: {why}", (x, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                            va="top", ha="right", fontsize=7, color="#555555")  # fmt: skip

    def no_data(ax: Any, why: str) -> None:
        ax.text(0.5, 0.5, f"no data: {why}", transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#555555")

    fig, ax = plt.subplots(figsize=(11, 4))
    for index, readings in sorted(tl.gpus.items()):
        ax.plot(minutes, [(u or float("nan")) / GiB for u, _ in readings], lw=1, label=f"GPU {index} used")
        total = next((t for _, t in readings if t), None)
        if total:
            ax.axhline(total / GiB, color="black", lw=0.8, ls=":")
        for wall, _size, _by in tl.found.get(f"gpu/{index}/used", {}).values():
            ax.axvline((wall - t0) / 60, color="#d62728", lw=1)
    if not tl.gpus:
        no_data(ax, "NVML gave no GPU in the record")
    restarts(ax)
    ax.set(title="GPU memory (red: leak steps found; grey dashed: restarts)", xlabel=xlabel, ylabel="GiB")
    if tl.gpus:
        ax.legend(fontsize=8)
    save(fig, "memory.png")

    fig, ax = plt.subplots(figsize=(11, 3.5))
    for name, rows in tl.engines.items():
        ax.step(minutes, [r.level for r in rows], where="post", label=name)
        for wall, _source, target, rule in tl.transitions.get(name, []):
            ax.annotate(rule, ((wall - t0) / 60, target), xytext=(3, 3), textcoords="offset points", fontsize=7)
    restarts(ax)
    ax.set(title="breaker level (the rule at each change; grey dashed: restarts)", xlabel=xlabel, ylabel="level",
           yticks=[0, 1, 2, 3], yticklabels=["L0", "L1", "L2", "L3"], ylim=(-0.2, 3.4))  # fmt: skip
    ax.legend(fontsize=8)
    save(fig, "breaker.png")

    fig, ax = plt.subplots(figsize=(11, 4))
    drawn = False
    for name, rows in tl.engines.items():
        p99 = [r.p99 * 1000 if r.p99 is not None else float("nan") for r in rows]
        drawn = drawn or any(v == v for v in p99)
        ax.plot(minutes, p99, lw=1, label=f"{name} P99")
    for slo in sorted(set(tl.slo.values())):
        ax.axhline(slo * 1000, color="black", ls="--", lw=1, label=f"SLO {slo * 1000:g} ms")
    restarts(ax)
    metric = config.tuner.slo.metric
    ax.set(title=f"P99 {metric} vs the SLO (grey dashed: restarts)", xlabel=xlabel, ylabel="ms")
    if drawn:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    else:
        no_data(ax, "no request finished in the record")
    ax.legend(fontsize=8)
    save(fig, "p99.png")

    fig, ax = plt.subplots(figsize=(11, 4))
    tuned = False
    for name, rows in tl.engines.items():
        batches = [r.batch if r.batch is not None else float("nan") for r in rows]
        tuned = tuned or any(b == b for b in batches)
        ax.step(minutes, batches, where="post", label=f"{name} batch")
        ax.step(minutes, [r.max_num_seqs if r.max_num_seqs is not None else float("nan") for r in rows], where="post",
                ls=":", label=f"{name} --max-num-seqs")  # fmt: skip
        for wall, kind, _old, new, _why in tl.tuner_moves.get(name, []):
            if kind == "speculation":
                ax.axvline((wall - t0) / 60, color="#2ca02c" if new else "#7f7f7f", lw=1)
    restarts(ax)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # sequences come whole
    ax.set(title="tuner: batch and engine limit (green/grey: speculation on/off)", xlabel=xlabel, ylabel="sequences")
    if tuned:
        ax.legend(fontsize=8)
    else:
        no_data(ax, "the tuner was not configured for this record")
    save(fig, "tuning.png")
    return written


def main(args: argparse.Namespace) -> int:
    if args.hours is not None and args.hours <= 0:
        print("guardian report: --hours must be above 0", file=sys.stderr)
        return 2
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"guardian report: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    override = load_or_exit(args.config) if args.config else None
    try:
        header, records, problems = replay.read(args.files)
        config = replay.config_from(header, override)
        timeline = build(config, header, records, args.hours)
    except (replay.ReplayError, ReportError) as exc:
        print(f"guardian report: {exc}", file=sys.stderr)
        return 2
    for problem in problems[:20]:
        print(f"skipped: {problem}", file=sys.stderr)
    print(render(timeline, config, ", ".join(str(f) for f in args.files)))
    if args.plot:
        try:
            for path in plot(timeline, config, args.plot):
                print(f"plot: {path}")
        except PlotUnavailable as exc:
            print(f"guardian report: {exc}", file=sys.stderr)
            return 2
    return 0
