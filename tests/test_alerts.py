from __future__ import annotations

import re
import subprocess
from pathlib import Path

from guardian import config as cfg
from guardian.daemon import Daemon
from guardian.sdnotify import Notifier
from guardian.sim import scenarios
from guardian.sim.cluster import SimCluster
from tests.helpers import check_promql, require_tool

ALERTS = Path(__file__).resolve().parent.parent / "alerts"


def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", "guardian-rules.yml"], cwd=ALERTS, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "guardian-rules.test.yml"], cwd=ALERTS, capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr


async def exported_metrics(config_extra: dict[str, object]) -> set[str]:
    """The series names a polled daemon exports: each family, plus the suffixes of its type (_total, _bucket, …)."""
    cluster = SimCluster(scenarios.get("steady"))
    await cluster.start()
    config = cfg.Config(
        guardian=cfg.GuardianSection(listen="127.0.0.1:0"),
        engines=[cfg.EngineSection(name="sim0", url=cluster.urls[0])],
        **config_extra,  # type: ignore[arg-type]
    )
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""))
    await daemon.start()
    try:
        await daemon.poll_once()
        page = daemon.metrics.render().decode()
    finally:
        await daemon.close()
        await cluster.stop()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    exported = set()
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            exported |= {name} | {name + s for s in suffixes.get(kind, ())}
    return exported


async def test_every_metric_the_rules_use_is_exported() -> None:
    exported = await exported_metrics({"gateway": cfg.GatewaySection(listen="127.0.0.1:0"), "tuner": cfg.TunerSection()})
    used = set(re.findall(r"\b(guardian_[a-z0-9_]+)", (ALERTS / "guardian-rules.yml").read_text()))
    assert used and used <= exported, used - exported


async def test_every_metric_the_dashboard_plots_is_exported() -> None:
    import json

    exported = await exported_metrics({"gateway": cfg.GatewaySection(listen="127.0.0.1:0"), "tuner": cfg.TunerSection()})
    dashboard = json.loads((ALERTS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(guardian_[a-z0-9_]+)", e)}
    assert len(dashboard["panels"]) >= 10 and len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert used and used <= exported, used - exported


def test_every_dashboard_expression_is_valid_promql(tmp_path: Path) -> None:
    import json

    dashboard = json.loads((ALERTS / "grafana-dashboard.json").read_text())
    check_promql([t["expr"].replace("$instance", ".*") for p in dashboard["panels"] for t in p["targets"]], tmp_path)
