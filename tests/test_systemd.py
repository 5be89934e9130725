from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import require_tool

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "guardian.service"


def test_unit_verifies_with_systemd_analyze(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    guardian = shutil.which("guardian", path=str(Path(sys.executable).parent))
    assert guardian, "the guardian console script is installed next to this Python"
    unit = tmp_path / "guardian.service"
    unit.write_text(UNIT.read_text().replace("/opt/vllm-guardian/bin/guardian", guardian))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_unit_exposure_score_is_at_most_2() -> None:
    analyze = require_tool("systemd-analyze")
    result = subprocess.run([analyze, "security", "--offline=yes", str(UNIT)], capture_output=True, text=True)
    match = re.search(r"Overall exposure level for guardian.service: ([0-9.]+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.0, result.stdout


def test_unit_keeps_the_nvidia_devices_reachable() -> None:
    text = UNIT.read_text()
    assert not re.search(r"^PrivateDevices=yes", text, re.M)
    for device in ("/dev/nvidiactl", "/dev/nvidia-uvm", "char-nvidia-frontend"):
        assert f"DeviceAllow={device} rw" in text
    assert "Type=notify" in text and "WatchdogSec=" in text and "ExecReload=/bin/kill -HUP $MAINPID" in text
