"""``guardian status`` against a daemon on the simulator: one 80-column screen that says what an operator needs first."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from guardian import config as cfg
from guardian.daemon import Daemon
from guardian.policy.response import Command
from guardian.sdnotify import Notifier
from guardian.sim.cluster import SimCluster
from guardian.commands.status_view import render


async def _daemon(cluster: SimCluster, tmp_path) -> Daemon:  # type: ignore[no-untyped-def]
    config = cfg.Config(
        guardian=cfg.GuardianSection(listen="127.0.0.1:0", state_dir=tmp_path),
        gateway=cfg.GatewaySection(listen="127.0.0.1:0"),
        engines=[cfg.EngineSection(name="sim0", url=cluster.urls[0], process=cfg.ProcessSection(pid_file=cluster.pid_file))],
    )
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""))
    await daemon.start()
    daemon.poller.pause()
    return daemon


async def test_status_shows_engines_gpus_gateway_alerts_and_actions_in_80_columns(cluster: SimCluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    daemon = await _daemon(cluster, tmp_path)
    try:
        await daemon.poll_once()
        calm = render(_status(daemon))
        decision = daemon.pipeline.command(Command("force", "sim0", "alice", 3), time.monotonic(), time.time())
        daemon.carry_out(decision)
        await asyncio.sleep(0.1)  # the gates and the page are carried out
        await daemon.poll_once()
        forced = render(_status(daemon))
        url = f"http://127.0.0.1:{daemon.http_address[1]}"  # type: ignore[index]
        cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "guardian", "status", "--url", url],
                                      capture_output=True, text=True, timeout=30)  # fmt: skip
        alerts = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "guardian", "alerts", "--url", url],
                                         capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        await daemon.close()
    for screen in (calm, forced, cli.stdout):
        assert all(len(line) <= 80 for line in screen.splitlines()), screen
    rows = calm.splitlines()
    assert rows[0].startswith("guardian ") and "last poll" in rows[0]
    assert any(r.startswith("sim0") and " up " in r and "L0" in r and "0 (3 left)" in r for r in rows), calm
    assert any(r.startswith("0 ") and "GiB" in r for r in rows)  # the GPU
    assert any(r.startswith("sim0") and r.rstrip().endswith("open") for r in rows)  # the gateway: routed, gates open
    assert "ALERTS: none firing" in calm
    assert any("L3 forced (alice)" in r for r in forced.splitlines()), forced
    assert "high priority only: L3 (forced by alice)" in forced
    assert "PAGE    breaker/sim0 since" in forced and "NOT ACKED" in forced and "ack: guardian ack breaker/sim0" in forced
    assert "LAST ACTIONS" in forced and "sim0 gates (forced by alice): done" in forced
    assert cli.returncode == 0 and "sim0" in cli.stdout and "L3 forced (alice)" in cli.stdout
    page = alerts.stdout.splitlines()[1]
    assert alerts.returncode == 0 and page.startswith("PAGE     firing") and "breaker/sim0" in page and " no (not sent yet)" in page  # group_wait has not passed
    assert "sim0 L3 forced by alice: L0 -> L3" in alerts.stdout and "ack: guardian ack breaker/sim0" in alerts.stdout


def test_status_says_where_it_looked_when_no_guardian_answers() -> None:
    out = subprocess.run([sys.executable, "-m", "guardian", "status", "--url", "http://127.0.0.1:9"], capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    assert out.returncode == 1 and "no guardian answers at http://127.0.0.1:9/status" in out.stderr


def _status(daemon: Daemon) -> dict:  # type: ignore[type-arg]
    from guardian.status_json import status

    return status(daemon.snapshot, time.time() - 60, daemon.config.guardian.poll_interval_seconds)


async def test_guardian_run_on_a_terminal_prints_a_line_of_what_moved(cluster: SimCluster, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io

    from guardian.daemon import loop as daemon_module

    monkeypatch.setattr(daemon_module, "SUMMARY_EVERY_SECONDS", 0.5)
    out = io.StringIO()
    config = cfg.Config(guardian=cfg.GuardianSection(listen="127.0.0.1:0", state_dir=tmp_path),
                        engines=[cfg.EngineSection(name="sim0", url=cluster.urls[0])])  # fmt: skip
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""), summary_to=out)
    running = asyncio.create_task(daemon.run())
    await asyncio.sleep(1.8)
    daemon.request_stop("test")
    await running
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and any("sim0: L0" in line and "GPU0:" in line for line in lines), lines


def test_the_readme_names_the_status_fields_guardian_serves() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme[readme.index("### Reading `/status`"):readme.index("To let guardian restart vLLM")]
    for key in ("steps_held", "steps_given_back", "gates_shut_as", "`gateway`", "`alerts`", "`last_actions`", "`rule`"):
        assert key in table, key
