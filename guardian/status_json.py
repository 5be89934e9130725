"""``/status``: the latest poll as a JSON document in the words and units a person reads (GiB, percent, ms).

``guardian status`` renders this document; a scraper that wants numbers to
compute with reads ``/metrics`` instead.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from guardian import __version__
from guardian.sample import GatewayLoad
from guardian.snapshot import GatewayView, Snapshot


def status(snap: Snapshot | None, started_wall: float, interval: float) -> dict[str, Any]:
    """The latest poll in words and units a person reads: GiB, percent, milliseconds."""
    out: dict[str, Any] = {"version": __version__, "uptime_seconds": round(time.time() - started_wall, 1)}
    if snap is None:
        out["state"] = "starting: no poll has completed yet"
        return out
    s = snap.sample
    out["last_poll"] = {
        "at": _iso(s.wall),
        "age_seconds": round(time.time() - s.wall, 2),
        "duration_seconds": round(snap.poll_seconds, 4),
        "interval_seconds": interval,
    }
    out["nvml"] = {
        "ok": s.nvml.ok,
        "error": s.nvml.error,
        "telemetry_lost": snap.nvml_lost,
        "driver_version": s.nvml.driver_version,
    }
    out["gpus"] = [
        {
            "index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "memory_used_gib": _gib(g.memory_used_bytes),
            "memory_total_gib": _gib(g.memory_total_bytes),
            "memory_free_gib": _gib(g.memory_free_bytes),
            "utilization_percent": _pct(g.utilization_gpu_ratio),
            "power_watts": g.power_watts,
            "temperature_celsius": g.temperature_celsius,
            "processes": [{"pid": p.pid, "memory_gib": _gib(p.used_bytes)} for p in g.processes or ()],
            "mig": [asdict(m) for m in g.mig],
            "error": g.error,
        }
        for g in s.nvml.gpus
    ]
    out["engines"] = [_engine_status(snap, r.name) for r in s.engines]
    if snap.policy is not None:
        out["breaker"] = {
            name: {
                "level": int(st.breaker.level),
                "since": None if st.breaker.since is None else _iso(s.wall_at(st.breaker.since)),
                "rule": st.breaker.rule or None,
                "forced_by": st.breaker.forced_by if st.breaker.forced else None,
                "gates_shut_as": f"L{int(st.breaker.shut)}",
                "restarts_in_window": len(st.restarts),
                "restart_budget_left": snap.policy.budget_left.get(name),
                "restart_in_progress": name in snap.policy.restarting,
                "profile": "degraded" if st.degraded else "base",
                "gpu_memory_utilization_override": st.gpu_memory_utilization,
                "dry_run": snap.policy.dry_run,
            }
            for name, st in snap.policy.states.items()
        }
    if snap.gateway:
        out["gateway"] = {name: _gateway_status(v, s.gateway_load(name)) for name, v in snap.gateway.items()}
    out["alerts"] = [
        {"key": a.key, "severity": a.severity, "firing": a.firing, "since": _iso(a.since), "acked_by": a.acked_by,
         "told": a.told, "summary": a.summary}
        for a in snap.alerts
    ]  # fmt: skip
    out["last_actions"] = [
        {"at": _iso(a.at), "engine": a.engine, "kind": a.kind, "reason": a.reason, "outcome": a.outcome, "detail": a.detail}
        for a in snap.actions
    ]
    if snap.costs:
        out["cost"] = {
            name: {
                "gpu_memory_gb_seconds_per_1k_tokens": None if c.memory_gb_seconds_per_1k_tokens is None else round(c.memory_gb_seconds_per_1k_tokens, 2),
                "tokens_per_joule": None if c.tokens_per_joule is None else round(c.tokens_per_joule, 3),
                "last_larger_batch": None if (m := snap.marginals.get(name)) is None else {
                    "batch": f"{m.batch_before} -> {m.batch_after}", "kv_in_use_growth_percent": round(m.memory_growth_ratio * 100, 1),
                    "throughput_gain_percent": round(m.throughput_gain_ratio * 100, 1), "p99_swing": m.p99_swing_ratio, "paid": m.ok,
                },
            }
            for name, c in snap.costs.items()
        }  # fmt: skip
    if snap.policy is not None and snap.policy.tuners:
        out["tuner"] = {
            name: {
                "batch": s.batch,
                "max_num_seqs": s.max_num_seqs,
                "hardware_batch_cap": getattr(snap.policy.tuner_limits.get(name), "hardware_cap", None),
                "speculation": s.speculation,
                "long_prefill_token_threshold": s.long_prefill,  # null: vLLM's default (long prefills not capped) or not known
                "last_move": None if s.last_move is None else _iso(snap.sample.wall_at(s.last_move)),
                "tuning_restarts_today": len(s.restarts),
                "slo_seconds": snap.policy.tuner_slo.get(name),  # configured, or derived from the engine; null: still learnt
                "holding": snap.policy.tuner_holds.get(name),
            }
            for name, s in snap.policy.tuners.items()
        }
    if snap.memory is not None:
        out["memory"] = {
            series: {
                "warming_up": r.warming_up,
                "level_gib": _gib(r.level),
                "overhang_gib": _gib(r.overhang),
                "leak_suspected": r.leak,
                "confidence": round(r.confidence, 2),
                "steps_held": [
                    {"at": _iso(s.wall_at(st.t)), "size_gib": _gib(st.size)} for st in r.held_steps
                ][-10:],
                "steps_given_back": sum(1 for st in r.steps if st.given_back_at is not None),
                "time_to_exhaustion_hours": None if r.time_to_exhaustion is None else round(r.time_to_exhaustion / 3600, 2),
            }
            for series, r in snap.memory.leaks.items()
        }
        out["fragmentation"] = {
            name: {
                "ratio_percent": _pct(f.ratio),
                "kv_internal_percent": _pct(f.kv_internal_ratio),
                "kv_internal_waste_gib": _gib(f.kv_internal_waste_bytes),
                "overhang_gib": _gib(f.overhang_bytes),
            }
            for name, f in snap.memory.fragmentation.items()
        }
    return out


def _gateway_status(view: GatewayView, load: GatewayLoad | None) -> dict[str, Any]:
    counts = {"in_flight": load.in_flight, "queued": load.queued, "cap": load.cap} if load else dict.fromkeys(("in_flight", "queued", "cap"))
    return {**counts, "gates": view.gates, "routed": view.routed, "why_not": view.why_not, "refused": view.refused,
            "long_prompt_flood": view.long_prompt_flood}


def _engine_status(snap: Snapshot, name: str) -> dict[str, Any]:
    reading = snap.sample.engine(name)
    assert reading is not None
    sig = snap.engines.get(name)
    doc: dict[str, Any] = {
        "name": name,
        "url": snap.urls.get(name),
        "phase": snap.policy.phases.get(name) if snap.policy else None,
        "up": reading.up,
        "healthy": reading.healthy,
        "error": reading.error,
    }
    if sig is not None:
        doc.update(
            telemetry_lost=sig.telemetry_lost,
            failed_polls_in_a_row=sig.failures_in_a_row,
            kv_cache_usage_percent=_pct(sig.kv_cache_usage),
            requests_running=sig.running,
            requests_waiting=sig.waiting,
            block_size=sig.block_size,
            num_gpu_blocks=sig.num_gpu_blocks,
            latency_ms={
                kind: ({"p50": _ms(q.p50), "p90": _ms(q.p90), "p99": _ms(q.p99), "observations": q.count} if q else None)
                for kind, q in sig.latency.items()
            },
            prompt_tokens_per_second=_round(sig.prompt_tokens_per_second),
            generation_tokens_per_second=_round(sig.generation_tokens_per_second),
            requests_finished_per_second=_round(sig.requests_per_second),
            preemptions_per_second=_round(sig.preemptions_per_second),
            spec_decode_acceptance_percent=_pct(sig.spec_acceptance_ratio),
            restarts=sig.restarts_total,
            processes_alive=sig.processes_alive,
            resident_memory_gib=_gib(sig.rss_bytes),
            gpu_memory_gib=_gib(sig.gpu_memory_bytes),
        )
    doc["cores"] = [
        {"core": c.core, "model": c.model_name, "kv_cache_usage_percent": _pct(c.kv_cache_usage),
         "running": c.running, "waiting": c.waiting, "sleeping": c.sleeping}  # fmt: skip
        for c in reading.cores
    ]
    if reading.processes is not None:
        doc["processes"] = [
            {"pid": p.pid, "name": p.name, "alive": p.alive, "rss_gib": _gib(p.rss_bytes)} for p in reading.processes
        ]
    elif reading.process_error:
        doc["processes_error"] = reading.process_error
    return doc


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value / 2**30, 3)


def _pct(value: float | None) -> float | None:
    return None if value is None else round(value * 100, 2)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
