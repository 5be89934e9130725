from __future__ import annotations

import re
import subprocess
from pathlib import Path

from guardian import config as cfg
from guardian.daemon import Daemon
from guardian.sdnotify import Notifier
from guardian.sim import scenarios
from guardian.sim.cluster import SimCluster
from tests.helpers import require_tool

ALERTS = Path(__file__).resolve().parent.parent / "alerts"


def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", "guardian-rules.yml"], cwd=ALERTS, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "guardian-rules.test.yml"], cwd=ALERTS, capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr


async def test_every_metric_the_rules_use_is_exported() -> None:
    cluster = SimCluster(scenarios.get("steady"))
    await cluster.start()
    config = cfg.Config(
        guardian=cfg.GuardianSection(listen="127.0.0.1:0"),
        engines=[cfg.EngineSection(name="sim0", url=cluster.urls[0])],
    )
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""))
    await daemon.start()
    try:
        await daemon.poll_once()
        page = daemon.metrics.render().decode()
    finally:
        await daemon.close()
        await cluster.stop()
    exported = {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}
    exported |= {name + "_total" for name in exported}
    used = set(re.findall(r"\b(guardian_[a-z0-9_]+)", (ALERTS / "guardian-rules.yml").read_text()))
    assert used and used <= exported, used - exported
