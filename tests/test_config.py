from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from guardian import config as cfg
from guardian.config import loading

ROOT = Path(__file__).resolve().parent.parent
ENGINE = '[[engines]]\nname = "a"\nurl = "http://127.0.0.1:8000"\n'


def _refusal(text: str) -> cfg.ConfigError:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.loads(text, "guardian.toml")
    return info.value


def _only(text: str) -> cfg.ConfigIssue:
    error = _refusal(text)
    assert len(error.issues) == 1, error.issues
    return error.issues[0]


def test_example_config_is_valid_and_defaults_hold() -> None:
    config = cfg.load(ROOT / "systemd" / "guardian.toml")
    assert config.guardian.poll_interval_seconds == 1.0
    assert config.guardian.listen == "127.0.0.1:9400"
    assert config.engines[0].process.systemd_unit == "vllm.service"
    assert config.presets["mixed"].block_size == 16


def test_empty_config_gets_the_documented_defaults() -> None:
    config = cfg.loads("")
    assert config.guardian.poll_interval_seconds == 1.0
    assert config.guardian.listen == "127.0.0.1:9400"
    assert config.guardian.scrape_timeout == pytest.approx(0.8)
    assert config.gpus.select == "all"


def test_unknown_key_names_the_key_and_suggests_the_right_one() -> None:
    issue = _only("[guardian]\npoll_intervall = 2\n")
    assert issue.key == "guardian.poll_intervall"
    assert issue.message == "unknown key"
    assert issue.fix == "did you mean 'poll_interval_seconds'?"


def test_unknown_section_lists_what_is_known() -> None:
    issue = _only("[guardain]\n")
    assert issue.key == "guardain" and "guardian" in issue.fix


def test_wrong_type_is_refused_with_the_value_shown() -> None:
    issue = _only('[guardian]\npoll_interval_seconds = "fast"\n')
    assert issue.key == "guardian.poll_interval_seconds"
    assert "wrong type (got 'fast')" in issue.message


def test_out_of_range_value_says_the_bound() -> None:
    issue = _only("[guardian]\npoll_interval_seconds = 0\n")
    assert issue.fix == "use a value greater than 0.0"


def test_block_size_24_in_a_preset_is_refused_with_valid_choices() -> None:
    issue = _only("[presets.mixed]\nmax_num_seqs = 8\nblock_size = 24\n")
    assert issue.key == "presets.mixed"
    assert "block_size = 24 is refused" in issue.message and "a power of two from 16" in issue.message
    assert issue.fix == "use block_size = 16 or 32"


def test_flashinfer_accepts_only_16_32_64() -> None:
    assert cfg.loads('[presets.p]\nmax_num_seqs = 4\nblock_size = 64\nattention_backend = "flashinfer"\n')
    issue = _only('[presets.p]\nmax_num_seqs = 4\nblock_size = 48\nattention_backend = "flashinfer"\n')
    assert "16, 32 or 64" in issue.message and issue.fix == "use block_size = 32 or 64"
    issue = _only('[presets.p]\nmax_num_seqs = 4\nblock_size = 48\n')
    assert issue.fix == "use block_size = 32 or 64"  # a multiple of 16 but not a power of two


def test_exit_threshold_above_enter_is_refused() -> None:
    issue = _only("[breaker]\nl1_exit_fragmentation_ratio = 0.4\n")
    assert "l1_exit_fragmentation_ratio (0.4) is not below l1_enter_fragmentation_ratio (0.35)" in issue.message
    assert "below 0.35" in issue.fix


def test_scrape_timeout_not_below_interval_is_refused() -> None:
    issue = _only("[guardian]\npoll_interval_seconds = 1\nscrape_timeout_seconds = 1\n")
    assert "every poll overrun" in issue.message


def test_engine_problems_name_the_engine_by_position() -> None:
    error = _refusal(ENGINE + '[[engines]]\nname = "b"\nurl = "htp://x"\n')
    assert [i.key for i in error.issues] == ["engines[1].url"]
    assert "http://127.0.0.1:8000" in error.issues[0].fix


def test_duplicate_engine_names_are_refused() -> None:
    issue = _only(ENGINE + ENGINE)
    assert "'a' is used twice" in issue.message


def test_process_must_be_found_exactly_one_way() -> None:
    issue = _only(ENGINE + '[engines.process]\nsystemd_unit = "v.service"\nmatch = "vllm"\n')
    assert issue.key == "engines[0].process" and "got systemd_unit, match" in issue.message
    issue = _only(ENGINE + '[engines.process]\npid_file = "run/vllm.pid"\n')
    assert "not an absolute path" in issue.message


def test_several_problems_are_all_reported_at_once() -> None:
    error = _refusal("[guardian]\npoll_interval_seconds = -1\nlisten = 'nowhere'\n[gpus]\nselect = ['x']\n")
    assert {i.key for i in error.issues} == {"guardian.poll_interval_seconds", "guardian.listen", "gpus.select"}
    assert str(error).startswith("guardian.toml: 3 problems")


def test_invalid_toml_points_at_the_line() -> None:
    issue = _only("[guardian]\npoll_interval_seconds = \n")
    assert "line 2" in issue.message


def test_api_key_is_never_shown() -> None:
    config = cfg.loads(ENGINE + 'api_key = "sk-secret-123"\n')
    assert "sk-secret-123" not in repr(config) and "sk-secret-123" not in str(config.model_dump())
    assert config.engines[0].read_api_key() == "sk-secret-123"


def test_dev_mode_on_a_remote_engine_is_warned_about() -> None:
    config = cfg.loads('[[engines]]\nname = "a"\nurl = "http://10.1.2.3:8000"\ndev_mode = true\n')
    assert any("not a loopback address" in w for w in config.warnings())
    assert cfg.loads(ENGINE + "dev_mode = true\n").warnings() == []


def test_swap_space_is_reported_as_ignored() -> None:
    config = cfg.loads("[presets.p]\nmax_num_seqs = 4\nswap_space_gb = 20\n")
    assert any("--swap-space no longer exists" in w for w in config.warnings())


def test_check_config_exits_2_with_file_key_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text("[presets.mixed]\nmax_num_seqs = 8\nblock_size = 24\n")
    result = subprocess.run([sys.executable, "-m", "guardian", "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 2
    assert f"{path}: presets.mixed: block_size = 24 is refused" in result.stderr
    assert "fix: use block_size = 16 or 32" in result.stderr


def test_check_config_on_a_missing_file_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "guardian", "check-config", str(tmp_path / "nope.toml")], capture_output=True, text=True
    )
    assert result.returncode == 2 and "file not found" in result.stderr


def test_run_refuses_a_bad_config_before_starting(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text("[guardian]\nlisten = 'x'\n")
    result = subprocess.run(
        [sys.executable, "-m", "guardian", "run", "--config", str(path)], capture_output=True, text=True, timeout=20
    )
    assert result.returncode == 2 and "guardian.listen" in result.stderr


def test_api_key_file_is_read_and_its_absence_is_reported(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-from-file\n")
    config = cfg.loads(ENGINE + f'api_key_file = "{key}"\n')
    assert config.engines[0].read_api_key() == "sk-from-file"
    issue = _only(ENGINE + f'api_key = "a"\napi_key_file = "{key}"\n')
    assert "both api_key and api_key_file" in issue.message


@pytest.mark.parametrize(
    ("table", "key", "says"),
    [
        ('launcher = "systemd"\nunit = "vllm.service"', "engines[0].restart", "needs unit and env_file"),
        ('launcher = "systemd"\nunit = "v.service"\nenv_file = "args.env"', "engines[0].restart", "not an absolute path"),
        ('launcher = "child"', "engines[0].restart", "needs command"),
        ('launcher = "child"\ncommand = ["vllm"]\nargs = { block-size = 24 }', "engines[0].restart", "--block-size 24 is refused"),
        ('launcher = "child"\ncommand = ["vllm"]\nargs = { swap-space = 4 }', "engines[0].restart", "--swap-space no longer exists"),
        ('launcher = "docker"', "engines[0].restart.launcher", "Input should be"),
    ],
)
def test_restart_tables_vllm_would_refuse_are_refused_with_the_key(table: str, key: str, says: str) -> None:
    issue = _only(f"{ENGINE}[engines.restart]\n{table}\n")
    assert issue.key == key and says in issue.message


def test_example_restart_table_validates_once_uncommented() -> None:
    text = (ROOT / "systemd" / "guardian.toml").read_text()
    for key in ("[engines.restart]", "launcher = ", "unit = ", "env_file = ", "attention_backend", "args = "):
        text = text.replace(f"# {key}", key)
    restart = cfg.loads(text).engines[0].restart
    assert restart is not None and restart.launcher == "systemd" and restart.args["max-num-seqs"] == 64


def test_actions_defaults_and_the_degraded_profile_as_engine_arguments() -> None:
    actions = cfg.loads("").actions
    assert (actions.restart_budget, actions.restart_budget_window_seconds, actions.dry_run) == (3, 3600.0, False)
    assert actions.degraded.layer() == {"kv-cache-dtype": "fp8", "speculative-config": None}
    custom = cfg.loads("[actions.degraded]\nkv_cache_dtype = \"fp8_e5m2\"\nmax_num_seqs = 8\nspeculation = true\n")
    assert custom.actions.degraded.layer() == {"kv-cache-dtype": "fp8_e5m2", "max-num-seqs": 8}
    assert _only("[actions.degraded]\nkv_cache_dtype = \"int3\"\n").key == "actions.degraded.kv_cache_dtype"


SMS = '[notify.sms]\naccount_sid = "AC0123456789abcdef0123456789abcdef"\nfrom_number = "+15017122661"\n'
ONCALL = '[[notify.oncall]]\nname = "alice"\nnumber = "+4915112345678"\n'


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ('[notify]\nchannels = ["sms"]\n' + ONCALL, "notify", "no [notify.sms]"),
        ('[notify]\nchannels = ["sms"]\n' + SMS, "notify", "names nobody"),
        ("[[notify.oncall]]\nname = \"bob\"\nnumber = \"015112345678\"\n", "notify.oncall[0].number", "invalid value"),
        (SMS.replace('from_number = "+15017122661"\n', ""), "notify.sms", "exactly one of from_number and messaging_service_sid"),
        (SMS + 'api_url = "http://twilio.example.com"\n', "notify.sms", "unencrypted"),
        ('[notify]\ntimezone = "Mars/Olympus"\n', "notify.timezone", "unknown time zone"),
        ("[notify]\nquiet_hours = { warning = [7, 7] }\n", "notify.quiet_hours", "two different hours"),
        ("[notify]\nquiet_hours = { page = [22, 7] }\n", "notify.quiet_hours.page", "Input should be"),
    ],
)
def test_notify_settings_that_would_lose_pages_are_refused(text: str, key: str, says: str) -> None:
    issue = _only(text)
    assert issue.key == key and says in issue.message, issue


def test_a_bad_phone_number_gets_an_e164_fix() -> None:
    issue = _only('[[notify.oncall]]\nname = "bob"\nnumber = "0151 12345678"\n')
    assert "E.164" in issue.fix and "+4915112345678" in issue.fix


def test_check_config_warns_when_sms_has_no_token(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(ENGINE + '[notify]\nchannels = ["sms"]\n' + ONCALL + SMS)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("TWILIO_AUTH_TOKEN", "CREDENTIALS_DIRECTORY")}
    result = subprocess.run([sys.executable, "-m", "guardian", "check-config", str(path)], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and "no Twilio auth token" in result.stdout


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("[gateway]\n", "", "has no engine"),
        (ENGINE + '[gateway]\n[[gateway.buckets]]\nname = "a"\nmax_tokens = 100\nengines = ["nope"]\n', "", "not configured: nope"),
        (ENGINE + '[gateway]\n[[gateway.buckets]]\nname = "a"\nmax_tokens = 100\n[[gateway.buckets]]\nname = "b"\nmax_tokens = 50\n',
         "gateway.buckets", "does not come after"),
        (ENGINE + "[gateway]\nbuckets = []\n", "gateway.buckets", "every request would be refused"),
        (ENGINE + '[gateway]\nlisten = "9401"\n', "gateway.listen", "not HOST:PORT"),
        (ENGINE + '[gateway]\nextra_paths = ["/v1/embeddings", "/pause"]\n', "gateway.extra_paths", "vLLM's admin endpoints"),
        (ENGINE + '[gateway]\nextra_paths = ["/server_info/x"]\n', "gateway.extra_paths", "never proxies"),
        (ENGINE + '[gateway]\nextra_paths = ["v1/embeddings"]\n', "gateway.extra_paths", "not a literal path"),
    ],
)
def test_gateway_settings_that_cannot_route_are_refused(text: str, key: str, says: str) -> None:
    issue = _only(text)
    assert issue.key == key and says in issue.message, issue


def test_example_gateway_table_validates_once_uncommented() -> None:
    lines = (ROOT / "systemd" / "guardian.toml").read_text().splitlines()
    start = lines.index("# [gateway]")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#"))
    text = "\n".join(lines[:start] + [line.removeprefix("# ") for line in lines[start:end]] + lines[end:])
    text = text.replace('high_priority_keys_file = "/etc/vllm-guardian/high-priority-keys"', "")
    gateway = cfg.loads(text).gateway
    assert gateway is not None and [b.max_tokens for b in gateway.buckets] == [4096, 32768, 128000]
    assert gateway.buckets[0].engines == ["llama-8b"] and gateway.buckets[2].preemptible


def test_the_tuner_is_on_by_default_and_off_with_enabled_false() -> None:
    engines = '[[engines]]\nname = "a"\nurl = "http://127.0.0.1:8000"\n'
    assert cfg.loads(engines).tuned("a")
    assert not cfg.loads(engines + "[tuner]\nenabled = false\n").tuned("a")


def test_example_tuner_table_validates_once_uncommented() -> None:
    lines = (ROOT / "systemd" / "guardian.toml").read_text().splitlines()
    start = lines.index("# [tuner]")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("#"))
    text = "\n".join(lines[:start] + [line.removeprefix("# ") for line in lines[start:end]] + lines[end:])
    tuner = cfg.loads(text).tuner
    assert tuner is not None and tuner.hardware == {"L40S": 8} and tuner.params.slo.target_seconds == 0.5
    assert tuner.params.slo.speculation_allowed(["low"]) and not tuner.params.slo.speculation_allowed(["high", "low"])
    assert not tuner.restarts_open(1_798_761_600.0)  # 2027-01-01 00:00 UTC: outside 02:00-05:00


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ('[tuner]\nwindows = [{ cron = "0 2 * *", duration_minutes = 60 }]\n', "tuner.windows[0].cron", "not a crontab expression"),
        ('[tuner]\ntimezone = "Moon/Base"\n', "tuner.timezone", "unknown time zone"),
        ('[tuner]\nengines = ["nope"]\n', "", "not configured: nope"),
        (ENGINE.replace("\n", '\npreset = "fast"\n', 1), "", "is not a preset"),
        ("[tune]\nrates = []\n", "tune.rates", "non-empty"),
    ],
)
def test_tuner_settings_that_cannot_work_are_refused(text: str, key: str, says: str) -> None:
    issue = _only(text)
    assert issue.key == key and says in issue.message, issue


def test_an_engine_preset_is_a_layer_under_its_own_restart_arguments() -> None:
    text = ENGINE.replace("\n", '\npreset = "high_throughput"\n', 1) + '[engines.restart]\nlauncher = "child"\ncommand = ["vllm"]\nargs = { max-num-seqs = 24 }\n'
    config = cfg.loads(text)
    assert config.base_args(config.engines[0]) == {"max-num-seqs": 24, "block-size": 32, "enable-chunked-prefill": True}


def test_every_config_key_is_in_the_example_config() -> None:
    """systemd/guardian.toml documents every key guardian reads (commented where it has no default to show)."""
    import dataclasses
    import re

    text = (ROOT / "systemd" / "guardian.toml").read_text()
    headers = {part for h in re.findall(r"^#?\s*\[+([^\]]+)\]+", text, re.M) for part in h.split(".")}

    def fields(model: object) -> dict[str, object]:
        if dataclasses.is_dataclass(model):
            return {f.name: f.type for f in dataclasses.fields(model)}
        return {n: f.annotation for n, f in model.model_fields.items()}  # type: ignore[attr-defined]

    missing = []

    def walk(model: object, prefix: str) -> None:
        for name, annotation in fields(model).items():
            key = f"{prefix}.{name}" if prefix else name
            sub = None if isinstance(annotation, str) else loading._model_in(annotation)
            if sub is not None and getattr(annotation, "__origin__", None) is not dict:
                walk(sub, key)
            elif name not in headers and not re.search(rf"\b{re.escape(name)}\s*=", text):
                missing.append(key)

    walk(cfg.Config, "")
    assert not missing, f"not in systemd/guardian.toml: {missing}"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('[[engines]]\nname = "a"\nurl = "http://admin:hunter22@127.0.0.1:8000"\n', "hunter22"),
        ('[[engines]]\nname = "a"\nurl = "gopher://admin:hunter22@x/y"\n', "hunter22"),
        ('[notify.sms]\naccount_sid = "0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d"\n', "0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d"),  # the auth token, misplaced
        ('[[notify.oncall]]\nname = "bob"\nnumber = "0049 151 1234567"\n', "151 1234567"),
        ('[notify.webhook]\nurl = "hooks.example.com/T000/B000/XXXXsecretXXXX"\n', "XXXXsecretXXXX"),
    ],
)
def test_config_errors_never_echo_a_secret_or_a_phone_number(text: str, secret: str, tmp_path: Path) -> None:
    path = tmp_path / "guardian.toml"
    path.write_text(text)
    result = subprocess.run([sys.executable, "-m", "guardian", "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 2 and "problem" in result.stdout + result.stderr
    assert secret not in result.stdout + result.stderr


def test_check_config_wants_every_secret_file_present_and_private(tmp_path: Path) -> None:
    token, keyfile = tmp_path / "api-token", tmp_path / "vllm-key"
    token.write_text("t0ken\n")
    token.chmod(0o644)  # world-readable
    path = tmp_path / "guardian.toml"
    path.write_text(f'[guardian]\napi_token_file = "{token}"\n[[engines]]\nname = "a"\nurl = "http://127.0.0.1:8000"\n'
                    f'api_key_file = "{keyfile}"\n')  # fmt: skip
    run = lambda: subprocess.run([sys.executable, "-m", "guardian", "check-config", str(path)], capture_output=True, text=True)  # noqa: E731
    result = run()
    assert result.returncode == 2 and "2 problems" in result.stdout
    assert f"guardian.api_token_file: {token} is readable by every user" in result.stdout
    assert f"engines[0].api_key_file: {keyfile} does not exist" in result.stdout and "t0ken" not in result.stdout
    token.chmod(0o600)
    keyfile.write_text("k\n")
    keyfile.chmod(0o640)
    assert run().returncode == 0


def test_check_config_lists_every_problem_of_a_section_at_once_each_with_a_fix_naming_the_default(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(
        '[guardian]\npoll_interval_seconds = "fast"\n'
        "[breaker]\nl1_exit_fragmentation_ratio = 0.5\nl2_exit_kv_usage_ratio = 0.95\nl3_exit_free_ratio = 0.05\n"
        '[notify]\nchannels = ["sms", "webhook"]\n'
        '[[engines]]\nname = "a"\nurl = "http://127.0.0.1:8000"\n'
    )
    result = subprocess.run([sys.executable, "-m", "guardian", "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 2
    out = result.stdout + result.stderr
    assert f"{path}: 7 problems" in out
    assert "fix: write it like its default: poll_interval_seconds = 1.0" in out
    for flapping in ("l1_exit_fragmentation_ratio (0.5)", "l2_exit_kv_usage_ratio (0.95)", "l3_exit_free_ratio (0.05)"):
        assert f"{path}: breaker: {flapping}" in out  # all three, not the first
    assert out.count(f"{path}: notify: ") == 3


def test_a_config_with_no_engines_is_refused_by_check_config_and_run(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[guardian]\nlisten = "127.0.0.1:0"\n')
    for command in (["check-config", str(path)], ["run", "--config", str(path)]):
        result = subprocess.run([sys.executable, "-m", "guardian", *command], capture_output=True, text=True, timeout=30)
        assert result.returncode == 2 and "no [[engines]]: guardian would watch nothing" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("", "tuner on for a (the default; [tuner] enabled = false turns it off); it restarts none of them (no [engines.restart])"),
        ('[engines.restart]\nlauncher = "systemd"\nunit = "vllm.service"\nenv_file = "/var/lib/g/a.env"\n',
         "it may restart a to tune them (at most 3 a day"),
        ("[tuner]\nenabled = false\n", "tuner off"),
    ],
)
def test_check_config_says_whether_the_tuner_is_on_and_what_it_may_restart(tmp_path: Path, extra: str, says: str) -> None:
    path = tmp_path / "g.toml"
    path.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:8000"\n' + extra)
    result = subprocess.run([sys.executable, "-m", "guardian", "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and says in result.stdout, result.stdout + result.stderr
