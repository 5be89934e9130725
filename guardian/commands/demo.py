"""``guardian demo``: the simulator, its load and the real daemon in one process.

The daemon here is exactly the one ``guardian run`` starts; only its seams
differ: NVML is the fake over simulated GPUs and the engines are simulated
vLLM servers on loopback ports. What you see on ``/metrics`` and ``/status``
is what guardian would show on a GPU host.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TextIO

from guardian import config as cfg
from guardian import logs
from guardian.analysis.leak_rule import LeakParams
from guardian.daemon import Daemon, StartupError
from guardian.policy.breaker import BreakerParams
from guardian.record import SampleRecorder
from guardian.sim import scenarios
from guardian.sim.cluster import SimCluster
from guardian.sim.launcher import SimLauncher
from guardian.summary_line import summary

# A simulated engine loads in seconds and its memory has no background: the
# detector's times in seconds instead of minutes. Two steps make a leak here and
# a step counts once held for 12 s and settled for 5 s, so the staircase is
# called one within the demo's 90 s (a real host keeps the defaults: three
# steps inside six hours, each held three minutes and settled for thirty).
DEMO_LEAK = dataclasses.replace(
    LeakParams(), warmup_seconds=2.0, settle_seconds=3.0, envelope_seconds=3.0, max_envelope_seconds=30.0,
    hold_seconds=12.0, leak_steps=2, regret_seconds=5.0,
)  # fmt: skip
# Likewise the breaker: seconds instead of minutes, so a level is entered and
# left while you watch. The thresholds are the defaults unless the scenario
# names its own (breaker-staircase does).
DEMO_BREAKER = dataclasses.replace(
    BreakerParams(),
    l1_sustain_seconds=3.0, l2_sustain_seconds=5.0, l3_sustain_seconds=2.0,
    l1_exit_hold_seconds=5.0, l2_exit_hold_seconds=5.0, l3_exit_hold_seconds=5.0,
)  # fmt: skip
DEMO_ACTIONS = cfg.ActionsSection(drain_timeout_seconds=30.0, start_timeout_seconds=60.0)
DEMO_LOAD_SECONDS = 2.0  # a simulated engine's model load


def demo_config(cluster: SimCluster, port: int, interval: float, state_dir: Path) -> cfg.Config:
    return cfg.Config(
        guardian=cfg.GuardianSection(
            poll_interval_seconds=interval, listen=f"127.0.0.1:{port}", latency_window_seconds=max(2 * interval, 20.0),
            state_dir=state_dir,
        ),  # fmt: skip
        leak=DEMO_LEAK,
        breaker=dataclasses.replace(DEMO_BREAKER, **cluster.scenario.breaker),  # type: ignore[arg-type]
        actions=DEMO_ACTIONS,
        gateway=cfg.GatewaySection(listen="127.0.0.1:0", queue_deadline_seconds=60.0),
        # a scenario without a tuner shows its own story: the tuner's restarts would be another one
        tuner=cfg.TunerSection.model_validate(cluster.scenario.tuner if cluster.scenario.tuner is not None else {"enabled": False}),
        engines=[
            cfg.EngineSection(
                name=f"sim{i}",
                url=url,
                dev_mode=True,
                preset=cluster.scenario.preset,
                process=cfg.ProcessSection(pid_file=cluster.pid_file) if i < cluster.process_engines else None,
            )
            for i, url in enumerate(cluster.urls)
        ],
    )


async def run_demo(
    scenario_name: str,
    duration: float,
    port: int,
    engines: int,
    seed: int,
    interval: float,
    summary_every: float = 5.0,
    out: TextIO = sys.stdout,
    record: Path | None = None,
) -> int:
    scenario = scenarios.get(scenario_name)
    cluster = SimCluster(scenario, engines=engines, seed=seed)
    await cluster.start()
    recorder = SampleRecorder(record) if record is not None else None
    state = tempfile.TemporaryDirectory(prefix="guardian-demo-state-")
    config = demo_config(cluster, port, interval, Path(state.name))
    launchers = {e.name: SimLauncher(s, DEMO_LOAD_SECONDS, seed=seed) for e, s in zip(config.engines, cluster.servers)}
    daemon = Daemon(config, nvml_module=cluster.nvml, record=recorder, launchers=launchers)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await daemon.start()
        assert daemon.http_address is not None
        base = f"http://{daemon.http_address[0]}:{daemon.http_address[1]}"
        print(f"guardian demo: scenario {scenario.name!r}: {scenario.description}", file=out)
        print(f"  guardian metrics  {base}/metrics", file=out)
        print(f"  guardian status   {base}/status", file=out)
        print(f"  guardian health   {base}/healthz", file=out)
        assert daemon.gateway is not None and daemon.gateway.address is not None
        via = f"http://{daemon.gateway.address[0]}:{daemon.gateway.address[1]}"
        print(f"  guardian gateway  {via}/v1/completions   (the load goes through it)", file=out)
        for i, url in enumerate(cluster.urls):
            print(f"  simulated vLLM sim{i}  {url}   (try: guardian probe --vllm {url})", file=out)
        until = "Ctrl-C to stop" if duration <= 0 else f"running for {duration:g}s, Ctrl-C to stop early"
        print(f"  {until}; a summary every {summary_every:g}s", file=out, flush=True)
        load = asyncio.create_task(cluster.run_load(None if duration <= 0 else duration, via=via))
        started = time.monotonic()
        while not stop.is_set() and (duration <= 0 or time.monotonic() - started < duration):
            left = summary_every if duration <= 0 else min(summary_every, duration - (time.monotonic() - started))
            try:
                await asyncio.wait_for(stop.wait(), max(left, 0.01))
            except asyncio.TimeoutError:
                pass
            print(summary(daemon.snapshot, time.monotonic() - started) + _gateway_text(daemon), file=out, flush=True)
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        outcomes: Counter[str] = Counter()
        for generator in cluster.loadgens:
            outcomes.update(generator.outcomes)
        retried = outcomes.pop("retried", 0)  # attempts, not requests
        print(f"guardian demo: done; {sum(outcomes.values())} requests by outcome: {dict(outcomes)}; "
              f"{retried} retries after 503 or a refused connection", file=out, flush=True)  # fmt: skip
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await daemon.close()
        await cluster.stop()
        state.cleanup()
    return 0


def _gateway_text(daemon: Daemon) -> str:
    """The gateway's queues and what its gates refused so far, when the breaker has shut any."""
    gw = daemon.gateway
    if gw is None:
        return ""
    refused: Counter[str] = Counter()
    for metric in gw.metrics.requests.collect():
        for sample in metric.samples:
            outcome = sample.labels.get("outcome", "")
            if sample.name.endswith("_total") and outcome.startswith("refused"):
                refused[outcome.removeprefix("refused_")] += int(sample.value)
    queues = " ".join(f"{name} {a.in_flight}/{a.queued} cap {a.cap}" for name, a in gw.admission.items())
    shut = [f"{name}: " + ",".join(g for g, on in (("long", gates.refuse_long_context), ("low", gates.pause_low_priority),
                                                   ("high-only", gates.high_priority_only)) if on)
            for name, gates in gw.gates.items() if gates.refuse_long_context or gates.pause_low_priority]  # fmt: skip
    text = f" | gateway in flight/queued {queues}"
    snap = daemon.snapshot
    if snap is not None and snap.policy is not None and snap.policy.tuners:
        text += " | tuner " + "; ".join(
            f"{name} batch {s.batch} max-num-seqs {s.max_num_seqs or 'default'}" + (" spec" if s.speculation else "")
            + (f" ({hold})" if (hold := snap.policy.tuner_holds.get(name)) and hold != "cooldown" else "")
            for name, s in snap.policy.tuners.items()
        )  # fmt: skip
    if shut:
        text += " gates " + "; ".join(shut)
    if refused:
        text += " refused " + " ".join(f"{k} {v}" for k, v in sorted(refused.items()))
    return text


def main(args: argparse.Namespace) -> int:
    if args.engines < 1 or args.interval <= 0:
        print("guardian demo: --engines must be at least 1 and --interval above 0", file=sys.stderr)
        return 2
    logs.configure("console", "info")

    duration = args.duration if args.duration is not None else scenarios.get(args.scenario).demo_seconds
    try:
        return asyncio.run(
            run_demo(args.scenario, duration, args.port, args.engines, args.seed, args.interval, record=args.record)
        )
    except StartupError as exc:
        print(f"guardian demo: {str(exc).replace('(guardian.listen)', '(--port)')}", file=sys.stderr)
        return 1
