"""bench/efficacy.py's scoring: what one run counted, the table per scenario and mode, and the verdict per target.

``order`` is the scenarios' order in the table (bench/efficacy.py's ``CASES``).
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from guardian.commands import tune_search as tune  # noqa: E402

Mode = Literal["unguarded", "guarded"]


# -- results ------------------------------------------------------------------------------------


@dataclass
class Result:
    case: str
    mode: Mode
    calm: bool
    seed: int
    sent: int = 0
    good: int = 0
    late_sent: int = 0  # requests sent after the first ten minutes, and the good ones among them
    late_good: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # ok, failed, cut, refused_429, refused_503, bad_request
    retries: Counter[str] = field(default_factory=Counter)  # attempts retried, by what the client heard
    ttft: dict[str, list[float]] = field(default_factory=lambda: {"high": [], "low": []})
    short_ttft: list[float] = field(default_factory=list)  # prompts of the default short bucket (<= 4096 tokens)
    late_short_ttft: list[float] = field(default_factory=list)  # of those, the ones sent after the first ten minutes
    e2e: list[float] = field(default_factory=list)
    exits: Counter[str] = field(default_factory=Counter)  # oom, refused_to_start, restarted
    cut_by_restart: int = 0  # requests in flight when guardian's restart stopped the engine
    restarts: Counter[str] = field(default_factory=Counter)  # guardian's, by reason
    pages: int = 0
    warnings: int = 0
    max_level: int = 0
    page_texts: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0


def quantile(values: list[float], q: float) -> float:
    """``guardian tune``'s quantile, NaN for none (the table prints "-")."""
    found = tune.quantile(values, q)
    return float("nan") if found is None else found


# -- the table ----------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def table(results: list[Result], seeds: int, order: list[str]) -> list[str]:
    by: dict[tuple[str, Mode, bool], list[Result]] = {}
    for r in results:
        by.setdefault((r.case, r.mode, r.calm), []).append(r)
    lines = [
        "| scenario | mode | OOM deaths | failed | cut | refused 429 / 503 | retried | goodput | TTFT P50 / P99 ms | high P99 ms "
        "| short P99 ms | e2e P99 ms | P99 swing (high, short) | restarts (why) | pages |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in order:
        for mode in ("unguarded", "guarded"):
            runs = by.get((name, mode, False))
            if not runs:
                continue
            calm = by.get((name, mode, True), [])
            sent = sum(r.sent for r in runs)
            out: Counter[str] = sum((r.outcomes for r in runs), Counter())
            ttft = [x for r in runs for lane in r.ttft.values() for x in lane]
            high = [x for r in runs for x in r.ttft["high"]]
            short = [x for r in runs for x in r.short_ttft]
            swing = [quantile(ours, 0.99) / quantile(twin, 0.99) if twin else float("nan") for ours, twin in (
                (ttft, [x for r in calm for lane in r.ttft.values() for x in lane]),
                (high, [x for r in calm for x in r.ttft["high"]]),
                (short, [x for r in calm for x in r.short_ttft]),
            )]  # fmt: skip
            restarts: Counter[str] = sum((r.restarts for r in runs), Counter())
            exits: Counter[str] = sum((r.exits for r in runs), Counter())
            systemd = exits["oom"] + exits["refused_to_start"]
            why = ", ".join(f"{n} {k}" for k, n in sorted(restarts.items()))
            why = "; ".join(x for x in (why, f"systemd {systemd}" if systemd else "") if x) or "0"
            lines.append(
                f"| {name} | {mode} | {exits['oom']} | {out['failed']} | {out['cut']} | {out['refused_429']} / {out['refused_503']} "
                f"| {sum(sum(r.retries.values()) for r in runs)} | {sum(r.good for r in runs) / max(1, sent) * 100:.0f}% "
                f"| {_ms(quantile(ttft, 0.5))} / {_ms(quantile(ttft, 0.99))} | {_ms(quantile(high, 0.99))} "
                f"| {_ms(quantile(short, 0.99))} | {_ms(quantile([x for r in runs for x in r.e2e], 0.99))} "
                f"| {swing[0]:.1f}x ({swing[1]:.1f}x, {swing[2]:.1f}x) | {why} | {sum(r.pages for r in runs)} |"
            )  # fmt: skip
    lines.append("")
    lines.append(f"Counts are totals over {seeds} seed(s); latencies over all requests of all seeds.")
    return lines


def verdicts(results: list[Result], order: list[str]) -> list[str]:
    """The issue's targets, each with the figures behind it and MET or NOT MET."""

    def runs(name: str, mode: Mode, calm: bool = False) -> list[Result]:
        return [r for r in results if (r.case, r.mode, r.calm) == (name, mode, calm)]

    def lost(rs: list[Result]) -> int:
        return sum(r.outcomes["failed"] + r.outcomes["cut"] for r in rs)

    def refused(rs: list[Result]) -> int:
        return sum(r.outcomes["refused_429"] + r.outcomes["refused_503"] for r in rs)

    def p99(rs: list[Result], pick: Callable[[Result], list[float]]) -> float:
        return quantile([x for r in rs for x in pick(r)], 0.99)

    out = []
    names = sorted({r.case for r in results}, key=order.index)
    for name in names:
        g, u = runs(name, "guarded"), runs(name, "unguarded")
        if not g or not u:
            continue
        cut_by_restart = sum(r.cut_by_restart for r in g)
        ok = lost(g) <= lost(u) and cut_by_restart == 0
        out.append(f"{name}: failed + cut guarded {lost(g)} vs unguarded {lost(u)} (refused after retries {refused(g)} vs "
                   f"{refused(u)}), cut by guardian's restarts {cut_by_restart}: {'MET' if ok else 'NOT MET'}")  # fmt: skip
    g = [r for r in results if r.mode == "guarded" and not r.calm]
    ooms = sum(r.exits["oom"] for r in g)
    out.append(f"OOM deaths in guarded runs: {ooms}: {'MET' if ooms == 0 else 'NOT MET'}")
    if f := runs("foreign-leak", "guarded"):
        named = all(any("other processes hold" in t and "pid " in t for t in r.page_texts) for r in f)
        restarts = max(sum(r.restarts.values()) for r in f)
        out.append(f"foreign-leak: paged naming the process in every run: {named}, guardian's restarts per run at most "
                   f"{restarts}: {'MET' if named and restarts <= 2 else 'NOT MET'}")  # fmt: skip
    if s := runs("leak-stops-short", "guarded"):
        restarts, warned = sum(sum(r.restarts.values()) for r in s), all(r.warnings for r in s)
        out.append(f"leak-stops-short: {restarts} restarts, warned in every run: {warned}: "
                   f"{'MET' if restarts == 0 and warned else 'NOT MET'}")  # fmt: skip
    if b := runs("burst", "guarded"):
        high, twin = p99(b, lambda r: r.ttft["high"]), p99(runs("burst", "guarded", True), lambda r: r.ttft["high"])
        pages = sum(r.pages for r in b)
        out.append(f"burst: high-priority P99 TTFT {high * 1000:.0f} ms vs calm twin {twin * 1000:.0f} ms "
                   f"({high / twin:.2f}x, target <= 2x), pages {pages}: {'MET' if high <= 2 * twin and pages == 0 else 'NOT MET'}")  # fmt: skip
    if f := runs("flood", "guarded"):
        short, twin = p99(f, lambda r: r.short_ttft), p99(runs("flood", "guarded", True), lambda r: r.short_ttft)
        good = sum(r.good for r in f) / max(1, sum(r.sent for r in f))
        unguarded = sum(r.good for r in runs("flood", "unguarded")) / max(1, sum(r.sent for r in runs("flood", "unguarded")))
        ok = short <= 2 * twin and good >= 3 * unguarded
        late = p99(f, lambda r: r.late_short_ttft)
        out.append(f"flood: short-prompt P99 TTFT {short * 1000:.0f} ms vs calm twin {twin * 1000:.0f} ms ({short / twin:.2f}x, "
                   f"target <= 2x; after the first 10 minutes {late * 1000:.0f} ms, {late / twin:.2f}x), "
                   f"goodput {good * 100:.0f}% vs unguarded {unguarded * 100:.0f}%: {'MET' if ok else 'NOT MET'}")  # fmt: skip
    if t := runs("too-small", "guarded"):
        late = sum(r.late_good for r in t) / max(1, sum(r.late_sent for r in t))
        out.append(f"too-small: goodput after the first 10 minutes {late * 100:.0f}% (target >= 90%): {'MET' if late >= 0.9 else 'NOT MET'}")
    return out
