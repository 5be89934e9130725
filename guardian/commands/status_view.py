"""``guardian status``: the running daemon's ``/status`` on one screen of 80 columns.

The JSON is the daemon's own (``exporter.status``); this only chooses what
an operator woken at night reads first: each engine's phase, breaker level
and why, restarts left, KV and P99; the GPUs; the gateway's gates and
queues; what is firing and who has acknowledged it; the last actions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any

from guardian.commands.common import base_url, load_or_exit

WIDTH = 80


class Unreachable(Exception):
    """No guardian answered at the URL."""


def fetch(url: str, timeout: float = 5.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout) as resp:  # noqa: S310 (operator-given URL)
            doc: dict[str, Any] = json.loads(resp.read())
            return doc
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(f"no guardian answers at {url}/status ({reason}): is `guardian run` running, and is this its "
                          "[guardian] listen address?") from None  # fmt: skip


def render(doc: dict[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = [_header(doc)]
    if "last_poll" not in doc:
        lines.append(doc.get("state", "no poll yet"))
        return "\n".join(_fit(line) for line in lines)
    breaker = doc.get("breaker", {})
    tuner = doc.get("tuner", {})
    lines += ["", f"{'ENGINE':<12} {'PHASE':<12} {'LEVEL':<24} {'RESTARTS':<9} {'KV':>4} {'P99 TTFT':>9}"]
    for e in doc.get("engines", []):
        b = breaker.get(e["name"], {})
        level = f"L{b['level']} {b.get('rule') or ''}".strip() if b else "-"
        if b.get("forced_by"):
            level = f"L{b['level']} forced ({b['forced_by']})"
        since = _ago(b.get("since"), now)
        level = f"{level} {since}" if since and b.get("level") else level
        restarts = f"{b.get('restarts_in_window', 0)} ({b.get('restart_budget_left', '?')} left)" if b else "-"
        if b.get("restart_in_progress"):
            restarts = "restarting"
        ttft = ((e.get("latency_ms") or {}).get("ttft") or {}).get("p99")
        phase = e.get("phase") or ("up" if e.get("up") else "down")
        kv, p99 = _shown(e.get("kv_cache_usage_percent"), "{:.0f}%"), _shown(ttft, "{:.0f} ms")
        lines.append(f"{e['name']:<12.12} {phase:<12} {level:<24.24} {restarts:<9} {kv:>4} {p99:>9}")
        if e["name"] in tuner:
            t = tuner[e["name"]]
            held = f", holding: {t['holding']}" if t.get("holding") else ""
            lines.append(f"  tuner: batch {t.get('batch')}, --max-num-seqs {t.get('max_num_seqs')}{held}")
        if e.get("error") and not e.get("up"):
            lines.append(f"  {e['error']}")
    lines += ["", f"{'GPU':<4} {'MEMORY USED / TOTAL':<22} {'UTIL':>5} {'TEMP':>6}  NOTE"]
    for g in doc.get("gpus", []):
        memory = f"{_shown(g.get('memory_used_gib'), '{:.1f}')} / {_shown(g.get('memory_total_gib'), '{:.1f}')} GiB"
        temp = f"{g['temperature_celsius']:.0f} C" if g.get("temperature_celsius") is not None else "-"
        util = _shown(g.get("utilization_percent"), "{:.0f}%")
        lines.append(f"{g['index']:<4} {memory:<22} {util:>5} {temp:>6}  {g.get('error') or ''}")
    leaks = [(series, m) for series, m in (doc.get("memory") or {}).items() if m.get("leak_suspected") or m.get("steps_held")]
    for series, m in leaks:
        steps = len(m.get("steps_held") or [])
        verdict = "LEAK suspected" if m.get("leak_suspected") else "steps held"
        lines.append(f"  {series}: {verdict}, {steps} step(s), overhang {_shown(m.get('overhang_gib'), '{:.1f}')} GiB")
    if "gateway" in doc:
        lines += ["", f"{'GATEWAY':<10} {'FLIGHT':>6} {'QUEUE':>5} {'CAP':>4} {'REFUSED':>7}  GATES"]
        for name, g in doc["gateway"].items():
            gates = g["gates"] if g.get("routed", True) else f"not routed: {g.get('why_not')}"
            gates += "; long-prompt flood held to its share" if g.get("long_prompt_flood") else ""
            counts = [_shown(g.get(k), '{}') for k in ("in_flight", "queued", "cap", "refused")]
            lines.append(f"{name:<10.10} {counts[0]:>6} {counts[1]:>5} {counts[2]:>4} {counts[3]:>7}  {gates}")
    firing = [a for a in doc.get("alerts", []) if a.get("firing")]
    lines += ["", "ALERTS: " + ("none firing" if not firing else f"{len(firing)} firing")]
    for a in sorted(firing, key=lambda a: (a["severity"] != "page", a["since"])):
        who = f"acked by {a['acked_by']}" if a.get("acked_by") else ("NOT ACKED" if a["severity"] == "page" else "")
        lines.append(f"  {a['severity'].upper():<7} {a['key']} since {_clock(a['since'])} {who}".rstrip())
        lines.append(f"    {a['summary']}")
    unacked = [a["key"] for a in firing if a["severity"] == "page" and not a.get("acked_by")]
    if unacked:
        lines.append("  ack: " + "; ".join(f"guardian ack {key}" for key in unacked))
    actions = doc.get("last_actions", [])
    if actions:
        lines += ["", "LAST ACTIONS"]
        for a in actions[-5:]:
            lines.append(f"  {_clock(a['at'])} {a['engine']} {a['kind']} ({a['reason']}): {a['outcome']}")
    return "\n".join(_fit(line) for line in lines)


def render_alerts(alerts: list[dict[str, Any]]) -> str:
    """``guardian alerts``: every tracked alert, firing pages first, with who acknowledged it."""
    if not alerts:
        return "no alerts"
    lines = [f"{'SEVERITY':<8} {'STATE':<9} {'SINCE':<9} {'KEY':<28} ACK"]
    order = sorted(alerts, key=lambda a: (not a.get("firing"), a["severity"] != "page", a["since"]))
    for a in order:
        state = "firing" if a.get("firing") else "resolved"
        ack = f"by {a['acked_by']}" if a.get("acked_by") else ("no" if a.get("firing") else "-")
        told = "" if a.get("told") else " (not sent yet)"
        lines.append(f"{a['severity'].upper():<8} {state:<9} {_clock(a['since']):<9} {a['key']:<28.28} {ack}{told}")
        lines.append(f"  {a['summary']}")
    pages = [a["key"] for a in order if a.get("firing") and a["severity"] == "page" and not a.get("acked_by")]
    if pages:
        lines.append("ack: " + "; ".join(f"guardian ack {key}" for key in pages))
    return "\n".join(_fit(line) for line in lines)


def _header(doc: dict[str, Any]) -> str:
    parts = [f"guardian {doc.get('version', '?')}", f"up {_span(doc.get('uptime_seconds'))}"]
    poll = doc.get("last_poll")
    if poll:
        parts.append(f"last poll {poll['age_seconds']:.1f}s ago (every {poll['interval_seconds']:g}s)")
    if any(b.get("dry_run") for b in doc.get("breaker", {}).values()):
        parts.append("DRY RUN")
    if (doc.get("nvml") or {}).get("telemetry_lost"):
        parts.append("NVML LOST")
    return " - ".join(parts)


def _fit(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "~"


def _when(iso: str | None) -> float | None:
    if not iso:
        return None
    return datetime.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def _ago(iso: str | None, now: float) -> str:
    at = _when(iso)
    return "" if at is None else f"{_span(max(0.0, now - at))} ago"


def _clock(iso: str) -> str:
    return iso[11:19] + "Z" if len(iso) >= 19 else iso


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _shown(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def status(args: argparse.Namespace) -> int:
    url = args.url or base_url(load_or_exit(args.config))
    while True:
        doc = _running_status("status", url)
        if doc is None and not args.watch:
            return 1
        if doc is not None:
            text = json.dumps(doc, indent=2) if args.json else render(doc)
            print(("\x1b[H\x1b[2J" if args.watch and sys.stdout.isatty() else "") + text, flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


def alerts(args: argparse.Namespace) -> int:
    doc = _running_status("alerts", args.url or base_url(load_or_exit(args.config)))
    if doc is None:
        return 1
    alerts = doc.get("alerts", [])
    print(json.dumps(alerts, indent=2) if args.json else render_alerts(alerts))
    return 0


def _running_status(command: str, url: str) -> dict[str, Any] | None:
    """The running guardian's /status; None, said on stderr, when it does not answer."""

    try:
        return fetch(url)
    except Unreachable as exc:
        print(f"guardian {command}: {exc}", file=sys.stderr)
        return None
