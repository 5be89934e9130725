"""The fleet examples in deploy/: Prometheus config, Kubernetes sidecar and autoscaling, checked as far as CI can."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from guardian import config as cfg
from tests.helpers import check_promql, require_tool
from tests.test_alerts import exported_metrics

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _docs(name: str) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


def test_the_fleet_prometheus_config_and_its_rules_are_valid() -> None:
    promtool = require_tool("promtool")
    result = subprocess.run([promtool, "check", "config", str(DEPLOY / "prometheus.yml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_the_sidecar_config_is_a_valid_guardian_config_next_to_the_vllm_container() -> None:
    config_map, deployment, service = _docs("vllm-with-guardian.yaml")
    config = cfg.loads(config_map["data"]["guardian.toml"], "deploy/k8s ConfigMap")
    engine = config.engines[0]
    assert engine.is_loopback and engine.dev_mode and engine.restart is None  # a sidecar cannot restart its neighbour
    assert config.gateway is not None and config.tuner is not None
    pod = deployment["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    vllm, guardian = containers["vllm"], containers["guardian"]
    assert pod["spec"]["shareProcessNamespace"] is True  # guardian sees vLLM's processes
    assert "127.0.0.1" in vllm["args"] and engine.url.endswith(vllm["args"][vllm["args"].index("--port") + 1])
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in vllm["env"]
    assert guardian["command"][:2] == ["guardian", "run"] and "/etc/vllm-guardian/guardian.toml" in guardian["command"]
    ports = {p["name"]: p["containerPort"] for p in guardian["ports"]}
    assert config.guardian.listen.endswith(f":{ports['metrics']}") and config.gateway.listen.endswith(f":{ports['openai']}")
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"openai", "metrics"}


async def test_autoscaling_queries_are_promql_over_metrics_guardian_exports(tmp_path: Path) -> None:
    scaled, hpa = _docs("autoscaling.yaml")
    assert scaled["kind"] == "ScaledObject" and hpa["kind"] == "HorizontalPodAutoscaler"
    queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]
    check_promql(queries, tmp_path)
    used = {m for q in queries for m in re.findall(r"\b(guardian_[a-z0-9_]+)", q)}
    used |= {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    exported = await exported_metrics({"gateway": cfg.GatewaySection(listen="127.0.0.1:0"), "tuner": cfg.TunerSection()})
    assert used and used <= exported, used - exported
    assert scaled["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"] == "vllm-llama-8b"
