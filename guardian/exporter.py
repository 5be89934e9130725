"""guardian's Prometheus metrics: what ``/metrics`` serves.

Readings and derived signals are rendered from the latest ``Snapshot`` at
scrape time by a custom collector, so an unknown value is simply absent from
the page (Prometheus then shows a gap, not a fake 0). Counters that outlive a
poll (errors, polls, reloads) are ordinary prometheus_client metrics.
"""

from __future__ import annotations

import math
import platform
from typing import Callable, Iterable, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from guardian import __version__
from guardian.listener import ListenerMetrics
from guardian.policy.lifecycle import Phase
from guardian.snapshot import PolicyView, Snapshot


class Metrics:
    """The counters and histograms the daemon updates as things happen."""

    def __init__(self, snapshot: Callable[[], Snapshot | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.listener = ListenerMetrics(r)  # the API's and the gateway's connections
        Gauge("guardian_build_info", "guardian version and Python it runs on.", ["version", "python"], registry=r).labels(
            __version__, platform.python_version()
        ).set(1)
        self.poll_duration = Histogram(
            "guardian_poll_duration_seconds",
            "Wall time of one poll (all sources, analysis, export).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.polls = Counter("guardian_polls", "Polls completed.", registry=r)
        self.polls_missed = Counter(
            "guardian_polls_missed", "Polls skipped because the previous one was still running.", registry=r
        )
        self.scrape_errors = Counter(
            "guardian_scrape_errors", "Failed scrapes of a vLLM server, by reason.", ["engine", "reason"], registry=r
        )
        self.nvml_errors = Counter("guardian_nvml_errors", "Failed NVML reads, by reason.", ["reason"], registry=r)
        self.leak_steps = Counter(
            "guardian_leak_steps", "Memory steps found by the leak detector, by series.", ["series"], registry=r
        )
        self.leak_steps_given_back = Counter(
            "guardian_leak_steps_given_back",
            "Steps later given back (spikes, sawtooth, memory freed), by series.",
            ["series"],
            registry=r,
        )
        self.reloads = Counter("guardian_config_reloads", "Config reloads (SIGHUP), by outcome.", ["outcome"], registry=r)
        self.transitions = Counter(
            "guardian_breaker_transitions", "Breaker level changes, by engine, from, to and the rule behind them.",
            ["engine", "from", "to", "reason"], registry=r,
        )  # fmt: skip
        self.actions = Counter(
            "guardian_actions", "Actions carried out (or planned, under --dry-run), by kind and outcome.",
            ["engine", "kind", "outcome"], registry=r,
        )  # fmt: skip
        self.tuner_moves = Counter(
            "guardian_tuner_moves", "The tuner's moves, by what moved and why.", ["engine", "kind", "reason"], registry=r
        )
        self.restarts = Counter(
            "guardian_restarts", "Drained restarts guardian began, by why.", ["engine", "why"], registry=r
        )
        self.notifications = Counter(
            "guardian_notifications", "Messages to people, by channel and outcome (sent, retried, dropped, failed) and reason.",
            ["channel", "outcome", "reason"], registry=r,
        )  # fmt: skip
        self.outbox_quarantined = Counter(
            "guardian_outbox_quarantined", "Outbox files set aside because they could not be read back as a message.", registry=r
        )
        self.notify_overruns = Counter(
            "guardian_notify_overruns", "Notification runs skipped because the previous one (a slow provider) still ran.",
            registry=r,
        )
        self.outbox_depth = Gauge("guardian_outbox_messages", "Messages in the durable outbox, not yet delivered.", registry=r)
        self.outbox_oldest = Gauge(
            "guardian_outbox_oldest_age_seconds", "Age of the oldest message in the outbox (0 when empty).", registry=r
        )
        self.last_poll = Gauge(
            "guardian_last_poll_timestamp_seconds", "Unix time the latest poll finished.", registry=r
        )
        r.register(_SnapshotCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(_WithoutCreated(self.registry))


class _WithoutCreated:
    """The registry's families without their ``*_created`` samples.

    prometheus_client adds a creation timestamp to every counter and
    histogram child: dozens of series no dashboard reads, which only cost
    storage. Its switch for that is process-wide and would take them off the
    simulator's vLLM page too, which keeps them because vLLM does.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class _SnapshotCollector:
    def __init__(self, snapshot: Callable[[], Snapshot | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        if snap is None:
            return []
        return [*_gpu_metrics(snap), *_engine_metrics(snap), *_memory_metrics(snap), *_policy_metrics(snap), *_cost_metrics(snap)]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _put(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | int | bool | None) -> None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return
    family.add_metric(labels, float(value))


def _gpu_metrics(snap: Snapshot) -> list[Metric]:
    g = ["gpu"]
    lost = _gauge("guardian_nvml_telemetry_lost", "1 when NVML has failed for several polls in a row.", [])
    lost.add_metric([], 1.0 if snap.nvml_lost else 0.0)
    info = _gauge("guardian_gpu_info", "GPU identity (value is always 1).", ["gpu", "uuid", "name", "driver"])
    up = _gauge("guardian_gpu_up", "1 when every NVML field of this GPU could be read this poll.", g)
    total = _gauge("guardian_gpu_memory_total_bytes", "GPU memory size.", g)
    used = _gauge("guardian_gpu_memory_used_bytes", "GPU memory in use (NVML; vLLM pre-allocates most of it).", g)
    free = _gauge("guardian_gpu_memory_free_bytes", "GPU memory free (NVML).", g)
    reserved = _gauge("guardian_gpu_memory_reserved_bytes", "GPU memory reserved by the driver (NVML v2).", g)
    util = _gauge("guardian_gpu_utilization_ratio", "Fraction of time a kernel was running (NVML).", g)
    mem_util = _gauge("guardian_gpu_memory_busy_ratio", "Fraction of time device memory was read or written.", g)
    power = _gauge("guardian_gpu_power_watts", "Power draw.", g)
    energy = CounterMetricFamily("guardian_gpu_energy_joules", "Energy used since the driver loaded.", labels=g)
    temp = _gauge("guardian_gpu_temperature_celsius", "GPU core temperature.", g)
    proc = _gauge("guardian_gpu_process_memory_used_bytes", "GPU memory used by one compute process.", ["gpu", "pid"])
    mig_used = _gauge("guardian_mig_memory_used_bytes", "Memory used in one MIG slice.", ["gpu", "mig", "uuid"])
    mig_total = _gauge("guardian_mig_memory_total_bytes", "Memory size of one MIG slice.", ["gpu", "mig", "uuid"])
    driver = snap.nvml.driver_version or ""
    for gpu in snap.nvml.gpus:
        lab = [str(gpu.index)]
        info.add_metric([lab[0], gpu.uuid or "", gpu.name or "", driver], 1.0)
        up.add_metric(lab, 0.0 if gpu.error else 1.0)
        _put(total, lab, gpu.memory_total_bytes)
        _put(used, lab, gpu.memory_used_bytes)
        _put(free, lab, gpu.memory_free_bytes)
        _put(reserved, lab, gpu.memory_reserved_bytes)
        _put(util, lab, gpu.utilization_gpu_ratio)
        _put(mem_util, lab, gpu.utilization_memory_ratio)
        _put(power, lab, gpu.power_watts)
        _put(energy, lab, gpu.energy_joules)
        _put(temp, lab, gpu.temperature_celsius)
        for p in gpu.processes or ():
            _put(proc, [lab[0], str(p.pid)], p.used_bytes)
        for m in gpu.mig:
            _put(mig_used, [lab[0], str(m.index), m.uuid or ""], m.memory_used_bytes)
            _put(mig_total, [lab[0], str(m.index), m.uuid or ""], m.memory_total_bytes)
    return [lost, info, up, total, used, free, reserved, util, mem_util, power, energy, temp, proc, mig_used, mig_total]


def _engine_metrics(snap: Snapshot) -> list[Metric]:
    e = ["engine"]
    ec = ["engine", "core", "model"]
    up = _gauge("guardian_engine_up", "1 when the engine's /metrics page was scraped and parsed.", e)
    healthy = _gauge("guardian_engine_healthy", "1 when /health answered 200, 0 when it answered otherwise.", e)
    lost = _gauge("guardian_engine_telemetry_lost", "1 when the engine has been unreadable for several polls.", e)
    fails = _gauge("guardian_engine_failed_polls", "Polls in a row the engine could not be read.", e)
    scrape = _gauge("guardian_engine_scrape_duration_seconds", "Time the latest scrape took.", e)
    kv = _gauge("guardian_engine_kv_cache_usage_ratio", "vLLM KV-cache usage (0..1) per engine core.", ec)
    running = _gauge("guardian_engine_requests_running", "Requests in the running batch per engine core.", ec)
    waiting = _gauge("guardian_engine_requests_waiting", "Requests queued per engine core.", ec)
    block = _gauge("guardian_engine_kv_block_size_tokens", "KV-cache block size (from cache_config_info).", ec)
    blocks = _gauge("guardian_engine_kv_gpu_blocks", "KV-cache blocks on the GPU (from cache_config_info).", ec)
    latency = {
        q: _gauge(
            f"guardian_engine_latency_{q}_seconds",
            f"{q.upper()} latency over the latency window, from vLLM histogram deltas (latency: e2e, ttft, itl, queue).",
            ["engine", "latency"],
        )
        for q in ("p50", "p90", "p99")
    }
    observed = _gauge(
        "guardian_engine_latency_window_observations", "Observations the latency quantiles rest on.", ["engine", "latency"]
    )
    prompt = _gauge("guardian_engine_prompt_tokens_per_second", "Prefill tokens per second over the window.", e)
    gen = _gauge("guardian_engine_generation_tokens_per_second", "Generated tokens per second over the window.", e)
    reqs = _gauge("guardian_engine_requests_finished_per_second", "Finished requests per second over the window.", e)
    preempt = _gauge("guardian_engine_preemptions_per_second", "Preemptions per second over the window.", e)
    spec = _gauge("guardian_engine_spec_decode_acceptance_ratio", "Accepted / drafted speculative tokens.", e)
    restarts = CounterMetricFamily("guardian_engine_restarts", "Restarts seen in the engine's process tree.", labels=e)
    procs = _gauge("guardian_engine_processes", "Live processes in the engine's tree.", e)
    rss = _gauge("guardian_engine_resident_memory_bytes", "Host RSS of the engine's process tree.", e)
    gpu_mem = _gauge("guardian_engine_gpu_memory_used_bytes", "NVML memory used by the engine's processes.", e)
    cpu = CounterMetricFamily("guardian_engine_cpu_seconds", "CPU time of the engine's live processes.", labels=e)
    phase = _gauge("guardian_engine_phase", "1 for the engine's lifecycle phase: starting, up, unresponsive or dead.", ["engine", "phase"])
    for reading in snap.sample.engines:
        name = reading.name
        sig = snap.engines.get(name)
        lab = [name]
        now = snap.policy.phases.get(name) if snap.policy else None
        if now is not None:
            for each in get_args(Phase):
                phase.add_metric([name, each], 1.0 if each == now else 0.0)
        up.add_metric(lab, 1.0 if reading.up else 0.0)
        _put(healthy, lab, reading.healthy)
        _put(scrape, lab, reading.scrape_seconds)
        for core in reading.cores:
            cl = [name, core.core, core.model_name or ""]
            _put(kv, cl, core.kv_cache_usage)
            _put(running, cl, core.running)
            _put(waiting, cl, core.waiting)
            _put(block, cl, core.block_size)
            _put(blocks, cl, core.num_gpu_blocks)
        if sig is None:
            continue
        lost.add_metric(lab, 1.0 if sig.telemetry_lost else 0.0)
        fails.add_metric(lab, float(sig.failures_in_a_row))
        for kind, q in sig.latency.items():
            if q is None:
                continue
            observed.add_metric([name, kind], q.count)
            for label, value in (("p50", q.p50), ("p90", q.p90), ("p99", q.p99)):
                _put(latency[label], [name, kind], value)
        _put(prompt, lab, sig.prompt_tokens_per_second)
        _put(gen, lab, sig.generation_tokens_per_second)
        _put(reqs, lab, sig.requests_per_second)
        _put(preempt, lab, sig.preemptions_per_second)
        _put(spec, lab, sig.spec_acceptance_ratio)
        restarts.add_metric(lab, float(sig.restarts_total))
        _put(procs, lab, sig.processes_alive)
        _put(rss, lab, sig.rss_bytes)
        _put(gpu_mem, lab, sig.gpu_memory_bytes)
        _put(cpu, lab, sig.cpu_seconds)
    return [up, healthy, lost, fails, scrape, kv, running, waiting, block, blocks, *latency.values(), observed,
            prompt, gen, reqs, preempt, spec, restarts, procs, rss, gpu_mem, cpu, phase]  # fmt: skip


def _memory_metrics(snap: Snapshot) -> list[Metric]:
    if snap.memory is None:
        return []
    s = ["series"]
    suspected = _gauge("guardian_leak_suspected", "1 when the series looks like a stepwise leak.", s)
    confidence = _gauge("guardian_leak_confidence_ratio", "How far along the leak rule the series is (0..1).", s)
    held = _gauge("guardian_leak_steps_held", "Steps found and not given back.", s)
    overhang = _gauge(
        "guardian_memory_overhang_bytes", "Rise of the series' floor since the end of warm-up.", s
    )
    level = _gauge("guardian_memory_level_bytes", "The detector's robust level of the series.", s)
    slope = _gauge("guardian_leak_slope_bytes_per_second", "Held rise per second since the first held step.", s)
    tte = _gauge(
        "guardian_memory_exhaustion_seconds", "Projected time until the series reaches its capacity at that slope.", s
    )
    for series, report in snap.memory.leaks.items():
        lab = [series]
        suspected.add_metric(lab, 1.0 if report.leak else 0.0)
        confidence.add_metric(lab, report.confidence)
        held.add_metric(lab, float(len(report.held_steps)))
        if not report.warming_up:
            overhang.add_metric(lab, report.overhang)
        _put(level, lab, report.level)
        slope.add_metric(lab, report.slope)
        _put(tte, lab, report.time_to_exhaustion)
    e = ["engine"]
    frag = _gauge(
        "guardian_fragmentation_ratio", "(KV internal waste + overhang) / memory held by the engine.", e
    )
    kv = _gauge("guardian_kv_internal_fragmentation_ratio", "Estimated empty share of the used KV slots.", e)
    waste = _gauge("guardian_kv_internal_waste_bytes", "Estimated bytes of empty slots in used KV blocks.", e)
    for name, f in snap.memory.fragmentation.items():
        _put(frag, [name], f.ratio)
        _put(kv, [name], f.kv_internal_ratio)
        _put(waste, [name], f.kv_internal_waste_bytes)
    return [suspected, confidence, held, overhang, level, slope, tte, frag, kv, waste]


def _policy_metrics(snap: Snapshot) -> list[Metric]:
    if snap.policy is None:
        return []
    e = ["engine"]
    level = _gauge("guardian_breaker_level", "The breaker's level: 0 normal, 1 fragmentation, 2 pressure, 3 emergency.", e)
    forced = _gauge("guardian_breaker_forced", "1 while the level is pinned (by an operator or the restart budget).", e)
    left = _gauge("guardian_restart_budget_remaining", "Restarts guardian may still begin inside the budget window.", e)
    restarting = _gauge("guardian_restart_in_progress", "1 while a drained restart of the engine is under way.", e)
    dry = _gauge("guardian_dry_run", "1 when actions are only planned and logged (--dry-run).", [])
    dry.add_metric([], 1.0 if snap.policy.dry_run else 0.0)
    for name, state in snap.policy.states.items():
        level.add_metric([name], float(state.breaker.level))
        forced.add_metric([name], 1.0 if state.breaker.forced else 0.0)
        left.add_metric([name], float(snap.policy.budget_left.get(name, 0)))
        restarting.add_metric([name], 1.0 if name in snap.policy.restarting else 0.0)
    return [level, forced, left, restarting, dry, *_tuner_metrics(snap.policy)]


def _cost_metrics(snap: Snapshot) -> list[Metric]:
    e = ["engine"]
    memory = _gauge("guardian_cost_gpu_memory_byte_seconds_per_token",
                    "GPU memory the engine holds, integrated over the last 5 min, per token it generated in them.", e)  # fmt: skip
    energy = _gauge("guardian_cost_tokens_per_joule", "Tokens generated per joule its GPUs used (NVML energy), last 5 min.", e)
    ok = _gauge("guardian_cost_marginal_ok", "1 when the latest larger batch grew KV in use by < 70% of its throughput gain and P99 < 2x.", e)
    growth = _gauge("guardian_cost_memory_growth_ratio", "KV cache in use after the latest larger batch, relative to before, minus 1.", e)
    gain = _gauge("guardian_cost_throughput_gain_ratio", "Tokens/s after the latest larger batch, relative to before, minus 1.", e)
    swing = _gauge("guardian_cost_p99_swing_ratio", "P99 after the latest larger batch over P99 before.", e)
    for name, cost in snap.costs.items():
        if cost.memory_gb_seconds_per_1k_tokens is not None:
            memory.add_metric([name], cost.memory_gb_seconds_per_1k_tokens * 1e9 / 1000)
        if cost.tokens_per_joule is not None:
            energy.add_metric([name], cost.tokens_per_joule)
    for name, m in snap.marginals.items():
        ok.add_metric([name], 1.0 if m.ok else 0.0)
        growth.add_metric([name], m.memory_growth_ratio)
        gain.add_metric([name], m.throughput_gain_ratio)
        if m.p99_swing_ratio is not None:
            swing.add_metric([name], m.p99_swing_ratio)
    return [memory, energy, ok, growth, gain, swing]


def _tuner_metrics(policy: PolicyView) -> list[Metric]:
    e = ["engine"]
    batch = _gauge("guardian_tuner_target_batch", "The tuner's effective batch: the ceiling of the gateway's concurrency cap for the engine.", e)
    seqs = _gauge("guardian_tuner_max_num_seqs", "--max-num-seqs the tuner keeps the engine at (absent: vLLM's default).", e)
    chunk = _gauge("guardian_tuner_long_prefill_tokens",
                   "--long-prefill-token-threshold the tuner keeps the engine at (absent: vLLM's default, no cap).", e)
    cap = _gauge("guardian_tuner_hardware_batch_cap", "The batch the tuner may reach on the engine's GPU (hardware profile).", e)
    spec = _gauge("guardian_speculation_enabled", "1 while the tuner keeps speculative decoding on for the engine.", e)
    overload = _gauge(
        "guardian_tuner_overloaded", "1 while P99 is over the objective with requests queued: more replicas would help.", e
    )
    for name, s in policy.tuners.items():
        batch.add_metric([name], float(s.batch))
        if s.max_num_seqs is not None:
            seqs.add_metric([name], float(s.max_num_seqs))
        if s.long_prefill is not None:
            chunk.add_metric([name], float(s.long_prefill))
        spec.add_metric([name], 1.0 if s.speculation else 0.0)
        hold = policy.tuner_holds.get(name) or ""
        overload.add_metric([name], 1.0 if hold.startswith("overloaded") else 0.0)
        limits = policy.tuner_limits.get(name)
        if limits is not None:
            cap.add_metric([name], float(limits.hardware_cap))
    return [batch, seqs, chunk, cap, spec, overload] if policy.tuners else []
