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


VLLM_UNIT = UNIT.parent / "vllm.service"


def test_the_example_vllm_unit_verifies_and_reads_the_arguments_guardian_writes(tmp_path: Path) -> None:
    from guardian import config as cfg
    from guardian.actions.engine_args import to_env_file

    analyze = require_tool("systemd-analyze")
    unit = tmp_path / "vllm.service"
    unit.write_text(VLLM_UNIT.read_text().replace("/opt/vllm/bin/vllm", shutil.which("true") or "/bin/true"))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stdout + result.stderr
    text = VLLM_UNIT.read_text()
    # the example config's restart table writes where this unit reads, under the variable it expands
    example = (UNIT.parent / "guardian.toml").read_text()
    env_file = re.search(r'^# env_file = "([^"]+)"', example, re.M)
    assert env_file and f"EnvironmentFile=-{env_file.group(1)}" in text
    assert "$VLLM_ARGS" in text and to_env_file({"max-num-seqs": 8}).splitlines()[-1].startswith("VLLM_ARGS=")
    assert "--host 127.0.0.1" in text and "Environment=VLLM_SERVER_DEV_MODE=1" in text
    assert cfg.EngineSection(name="llama-8b", url="http://127.0.0.1:8000").is_loopback


def test_the_polkit_rule_allows_guardians_user_to_restart_only_the_vllm_unit() -> None:
    rule = (UNIT.parent / "50-vllm-guardian.rules").read_text()
    user = re.search(r"^User=(.+)$", UNIT.read_text(), re.M)
    assert user and f'subject.user == "{user.group(1)}"' in rule
    assert 'action.lookup("unit") == "vllm.service"' in rule and 'action.lookup("verb") == "restart"' in rule


def test_each_credential_has_a_blank_fallback_that_guardian_reads_as_none(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A missing credential file must not stop the unit (243/CREDENTIALS): SetCredential= is its fallback."""
    from guardian import config as cfg
    from guardian.notify.sms import read_token

    text = UNIT.read_text()
    loaded = re.findall(r"^LoadCredential=([a-z-]+):/etc/vllm-guardian/\1$", text, re.M)
    assert sorted(loaded) == ["api-token", "twilio-auth-token"]
    for name in loaded:
        assert re.search(rf"^SetCredential={name}:\\n$", text, re.M), name
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-token").write_text("\n")  # what systemd writes from the fallback
    (creds / "twilio-auth-token").write_text("\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    monkeypatch.delenv("TWILIO_AUTH_TOKEN", raising=False)
    assert read_token() is None
    assert cfg.GuardianSection().read_api_token() is None
    token_file = tmp_path / "api-token"
    token_file.write_text("s3cret\n")
    assert cfg.GuardianSection(api_token_file=token_file).read_api_token() == "s3cret"  # the blank credential falls through
    (creds / "api-token").write_text("from-credential\n")
    assert cfg.GuardianSection(api_token_file=token_file).read_api_token() == "from-credential"
