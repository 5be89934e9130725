"""The breaker end to end on the simulator: a staircase leak walks it up, a drained restart brings it down.

The demo's breaker-staircase scenario, four times faster: polls every 0.25 s,
the leak's steps 7.5 s apart, the breaker's sustain and hold times divided
by four. Real daemon, real HTTP, real simulated vLLM, real load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from guardian import config as cfg
from guardian.commands import replay, report
from guardian.daemon import Daemon
from guardian.commands.demo import DEMO_ACTIONS, DEMO_LEAK, demo_config
from guardian.record import SampleRecorder
from guardian.sdnotify import Notifier
from guardian.sim import scenarios
from guardian.sim.cluster import SimCluster
from guardian.sim.launcher import SimLauncher
from tests.helpers import client_outcomes, load_through_gateway, recorded_decisions, wait_until

pytestmark = pytest.mark.slow

SCALE = 0.25
GUARDIAN = [sys.executable, "-m", "guardian"]


def _fast(cluster: SimCluster, state_dir: Path, dry_run: bool) -> cfg.Config:
    config = demo_config(cluster, 0, SCALE, state_dir)
    b = config.breaker
    breaker = dataclasses.replace(
        b, **{f.name: getattr(b, f.name) * SCALE for f in dataclasses.fields(b) if f.name.endswith(("_sustain_seconds", "_hold_seconds"))}
    )
    leak = dataclasses.replace(
        DEMO_LEAK, warmup_seconds=0.5, settle_seconds=1.0, envelope_seconds=1.0, regret_seconds=5 * SCALE, hold_seconds=3.0
    )
    actions = DEMO_ACTIONS.model_copy(update={"dry_run": dry_run})
    return config.model_copy(update={"breaker": breaker, "leak": leak, "actions": actions})


async def _play(tmp_path: Path, dry_run: bool, until_level_back: bool) -> tuple[Daemon, SimCluster, SimLauncher, list[dict], Counter[str]]:  # type: ignore[type-arg]
    base = scenarios.get("breaker-staircase")
    scenario = dataclasses.replace(base, faults=tuple(dataclasses.replace(f, at=f.at * SCALE) for f in base.faults))
    cluster = SimCluster(scenario, engines=1, seed=7)
    await cluster.start()
    config = _fast(cluster, tmp_path / "state", dry_run)
    launcher = SimLauncher(cluster.servers[0], load_seconds=0.5, seed=7)
    recorder = SampleRecorder(tmp_path / "record.jsonl")
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""), record=recorder,
                    launchers={"sim0": launcher})  # fmt: skip
    await daemon.start()
    reached_l3 = False

    def done() -> bool:
        nonlocal reached_l3
        level = daemon.pipeline.level("sim0")
        reached_l3 = reached_l3 or level == 3
        return reached_l3 and (not until_level_back or (level == 0 and not daemon.executor.restarting))  # type: ignore[union-attr]

    async with load_through_gateway(daemon, cluster):
        await wait_until(done, 60)
    return daemon, cluster, launcher, recorded_decisions(tmp_path / "record.jsonl"), client_outcomes(cluster)


def _moves(decisions: list[dict]) -> list[tuple[int, int, str]]:  # type: ignore[type-arg]
    return [(t["from"], t["to"], t["rule"]) for d in decisions for t in d["transitions"]]


def _actions(decisions: list[dict]) -> list[str]:  # type: ignore[type-arg]
    return [a["kind"] + (f":{a['details']['severity']}" if a["kind"] == "notify" else "") for d in decisions for a in d["actions"]]


def _replayed(path: Path) -> replay.Replay:
    header, records, problems = replay.read([path])
    return replay.replay(replay.config_from(header, None), header, records, problems)


async def test_a_staircase_leak_walks_the_breaker_up_and_a_drained_restart_brings_it_down(tmp_path: Path) -> None:
    daemon, cluster, launcher, decisions, outcomes = await _play(tmp_path, dry_run=False, until_level_back=True)
    assert _moves(decisions) == [
        (0, 1, "fragmentation"), (1, 2, "over_budget"), (2, 3, "free_reserve"),
        (3, 2, "recovered"), (2, 1, "recovered"), (1, 0, "recovered"),
    ]  # fmt: skip
    assert _actions(decisions) == [
        "gates", "reset_prefix_cache", "notify:warning",  # L1
        "gates", "notify:warning",  # L2
        "gates", "notify:warning", "restart",  # L3: vLLM's own memory, which the restart frees: a warning, not a page
        "gates", "gates", "gates", "notify:info",  # back down, one level at a time
    ]  # fmt: skip
    # the restart: once, at the same utilisation (the leak is the engine's own: it dies with the process), drained:
    # the load goes through guardian's gateway, which held new requests while the engine drained and restarted, so
    # none failed, was cut, or even had to be retried
    (finished,) = [d["finished"] for d in decisions if d["finished"]]
    assert finished == {"sim0": True} and cluster.servers[0].restarts == 1
    assert "gpu-memory-utilization" not in launcher.started_with[0]
    assert cluster.loadgens[0].failures == 0 and outcomes["200"] > 50 and outcomes["retried"] == 0, outcomes
    snap = daemon.snapshot
    assert snap is not None and snap.engines["sim0"].healthy and snap.engines["sim0"].up
    assert snap.engines["sim0"].restarts_total == 1  # guardian's own restart counts (guardian_engine_restarts_total)
    assert cluster.gpus[0].overhang_bytes == 0  # the leak died with the old process
    # offline, the same samples and outcomes give the same decisions
    again = _replayed(tmp_path / "record.jsonl")
    assert again.matches, again.first_difference()
    # and the report says the steps were there, though the restart gave them back
    told = subprocess.run([*GUARDIAN, "report", str(tmp_path / "record.jsonl")], capture_output=True, text=True, timeout=60)
    steps = re.search(r"GPU 0 .*leak steps: (\d+) found .*0 held at the end, (\d+) given back by a restart", told.stdout)
    assert told.returncode == 0 and steps is not None and int(steps.group(1)) >= 2, told.stdout
    # its pictures tell the same: steps marked though given back, the restart and its reason on every time plot
    header, records, _ = replay.read([tmp_path / "record.jsonl"])
    config = replay.config_from(header, None)
    drawn: dict[str, Any] = {}
    report.plot(report.build(config, header, records, None), config, tmp_path / "plots", lambda name, fig: drawn.update({name: fig}))
    texts = {name: [t.get_text() for ax in fig.axes for t in ax.texts] for name, fig in drawn.items()}
    assert all("restart sim0: free_reserve" in texts[name] for name in ("memory.png", "breaker.png", "p99.png", "tuning.png"))
    red = [line for line in drawn["memory.png"].axes[0].lines if line.get_color() == "#d62728"]
    assert len(red) == int(steps.group(1))  # every step found, also those the restart gave back
    assert {"fragmentation", "over_budget", "free_reserve"} <= set(texts["breaker.png"])  # the rule at each change
    assert "no data: the tuner was not configured for this record" in texts["tuning.png"]  # not a blank plot


async def test_dry_run_plans_the_same_walk_without_touching_the_engine_and_replay_agrees(tmp_path: Path) -> None:
    daemon, cluster, launcher, decisions, outcomes = await _play(tmp_path, dry_run=True, until_level_back=False)
    assert _moves(decisions)[:3] == [(0, 1, "fragmentation"), (1, 2, "over_budget"), (2, 3, "free_reserve")]
    assert "restart" in _actions(decisions)
    assert cluster.servers[0].restarts == 0 and launcher.started_with == []
    assert cluster.gpus[0].overhang_bytes > 0  # nothing was done about it
    assert daemon.metrics.actions.labels("sim0", "restart", "dry_run")._value.get() == 1
    again = _replayed(tmp_path / "record.jsonl")
    assert again.matches, again.first_difference()
    # the same through the command line, and with other thresholds on the same samples
    record = str(tmp_path / "record.jsonl")
    same = subprocess.run([*GUARDIAN, "replay", record], capture_output=True, text=True, timeout=60)
    assert same.returncode == 0 and "identical to the decisions the live run recorded" in same.stderr, same.stderr
    assert "L2 -> L3  free_reserve" in same.stdout and "action: drained restart (free_reserve" in same.stdout
    defaults = tmp_path / "defaults.toml"  # what the default thresholds and times would have done with these samples
    defaults.write_text('[[engines]]\nname = "sim0"\nurl = "http://127.0.0.1:1"\n')
    what_if = subprocess.run([*GUARDIAN, "replay", record, "--config", str(defaults)], capture_output=True, text=True, timeout=60)
    assert what_if.returncode == 0 and "drained restart" not in what_if.stdout and " samples, " in what_if.stderr


async def test_a_crash_loop_on_the_simulator_stops_at_the_restart_budget_and_holds_l3(tmp_path: Path) -> None:
    cluster = SimCluster(scenarios.get("steady"), engines=1, seed=5)
    await cluster.start()
    server = cluster.servers[0]
    config = _fast(cluster, tmp_path / "state", dry_run=False)
    config = config.model_copy(update={"actions": config.actions.model_copy(update={"restart_budget": 2})})
    launcher = SimLauncher(server, load_seconds=0.3, crash_on_start=True)
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""), launchers={"sim0": launcher})
    await daemon.start()
    try:
        server.crash()  # the engine core died: /health 503, then the server exits
        await wait_until(lambda: daemon.pipeline.states["sim0"].breaker.forced, 30)
        await asyncio.sleep(3)  # and it stays put: no third restart
        state = daemon.pipeline.states["sim0"]
        page = daemon.metrics.render().decode()
    finally:
        await daemon.close()
        await cluster.stop()
    assert state.breaker.level == 3 and state.breaker.forced_by == "restart budget"
    assert server.restarts == 2 and len(launcher.started_with) == 2
    assert 'guardian_restarts_total{engine="sim0",why="engine_dead"} 2.0' in page
    assert 'guardian_actions_total{engine="sim0",kind="restart",outcome="failed"} 2.0' in page
    assert 'guardian_restart_budget_remaining{engine="sim0"} 0.0' in page


async def test_a_crashed_engine_is_noticed_restarted_and_paged_though_its_telemetry_is_lost(tmp_path: Path) -> None:
    # the default three failed scrapes mark telemetry lost long before engine_dead's sustain: dead still wins
    cluster = SimCluster(scenarios.get("steady"), engines=1, seed=9)
    await cluster.start()
    server = cluster.servers[0]
    config = _fast(cluster, tmp_path / "state", dry_run=False)
    assert config.guardian.telemetry_lost_after_polls == 3
    launcher = SimLauncher(server, load_seconds=1.0, seed=9)
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""), launchers={"sim0": launcher})
    await daemon.start()
    try:
        await wait_until(lambda: daemon.pipeline.phase("sim0") == "up", 10)
        server.crash()  # /health 503 for a moment, then the server exits: refused from then on
        assert await wait_until(lambda: daemon.pipeline.states["sim0"].restarting is not None, 30)
        phases_seen = {daemon.pipeline.phase("sim0")}
        assert await wait_until(lambda: daemon.pipeline.phase("sim0") == "up" and server.restarts == 1, 30)
        page = daemon.metrics.render().decode()
    finally:
        await daemon.close()
        await cluster.stop()
    assert phases_seen <= {"dead", "unresponsive", "starting"}
    # /health 503 while the process lives is a hang; the process gone, dead: which comes first depends on the poll
    why = "engine_dead" if 'why="engine_dead"' in page else "engine_unresponsive"
    assert f'guardian_restarts_total{{engine="sim0",why="{why}"}} 1.0' in page
    assert 'guardian_actions_total{engine="sim0",kind="notify",outcome="done"}' in page  # the L3 page
    assert f'guardian_breaker_transitions_total{{engine="sim0",from="L0",reason="{why}",to="L3"}} 1.0' in page


async def test_an_engine_left_paused_is_resumed_when_guardian_starts(tmp_path: Path) -> None:
    cluster = SimCluster(scenarios.get("steady"), engines=1, seed=4)
    await cluster.start()
    server = cluster.servers[0]
    async with aiohttp.ClientSession() as http:  # as a guardian killed during a drain leaves it
        async with http.post(server.url + "/pause?mode=wait") as resp:
            assert resp.status == 200
    daemon = Daemon(_fast(cluster, tmp_path / "state", dry_run=False), nvml_module=cluster.nvml, notifier=Notifier(address=""))
    await daemon.start()
    try:
        resumed = await wait_until(lambda: server.engine.paused is None, 10)
    finally:
        await daemon.close()
        await cluster.stop()
    assert resumed


class _HangingSms:
    """Twilio that never answers: the notification run hangs in it."""

    channel = "sms"

    async def deliver(self, env: object) -> object:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_hanging_sms_provider_is_counted_as_notify_overruns_never_as_missed_polls(tmp_path: Path) -> None:
    import time as clock

    from guardian.policy.response import Command

    cluster = SimCluster(scenarios.get("steady"), engines=1, seed=2)
    await cluster.start()
    config = _fast(cluster, tmp_path / "state", dry_run=False)
    notify = config.notify.model_copy(update={"oncall": [cfg.ContactSection(name="alice", number="+15550100")],
                                              "group_wait_seconds": 0.0})  # fmt: skip
    config = config.model_copy(update={"notify": notify})
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""), deliverers={"sms": _HangingSms()})
    await daemon.start()
    try:
        daemon.carry_out(daemon.pipeline.command(Command("force", "sim0", "test", 3), clock.monotonic(), clock.time()))
        await asyncio.sleep(4)
        page = daemon.metrics.render().decode()
    finally:
        await daemon.close()
        await cluster.stop()
    overruns = float(page.split("\nguardian_notify_overruns_total ")[1].split()[0])
    assert overruns >= 2 and "guardian_polls_missed_total 0.0" in page
