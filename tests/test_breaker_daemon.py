"""The breaker inside the daemon: the authenticated force/clear API, and its state across kill -9 and corruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from guardian import config as cfg
from guardian.daemon import STATE_FILE, Daemon
from guardian.sdnotify import Notifier
from guardian.sim.cluster import SimCluster
from guardian.state import StateFile
from tests.helpers import free_port

GUARDIAN = [sys.executable, "-m", "guardian"]
TOKEN = "s3cret-t0ken"


def _config(cluster: SimCluster, state_dir: Path, token_file: Path | None) -> cfg.Config:
    return cfg.Config(
        guardian=cfg.GuardianSection(listen="127.0.0.1:0", state_dir=state_dir, api_token_file=token_file),
        engines=[cfg.EngineSection(name="sim0", url=cluster.urls[0], dev_mode=True)],
    )


async def _daemon(config: cfg.Config, cluster: SimCluster) -> Daemon:
    daemon = Daemon(config, nvml_module=cluster.nvml, notifier=Notifier(address=""))
    await daemon.start()
    daemon.poller.pause()  # type: ignore[union-attr]  # the test drives the polls
    await daemon.poll_once()
    return daemon


async def _post(http: aiohttp.ClientSession, daemon: Daemon, engine: str, body: object, token: str | None) -> tuple[int, dict]:  # type: ignore[type-arg]
    assert daemon.http_address is not None
    url = f"http://127.0.0.1:{daemon.http_address[1]}/api/v1/breaker/{engine}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_force_and_clear_over_http_need_the_token_and_act_like_a_transition(cluster: SimCluster, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    daemon = await _daemon(_config(cluster, tmp_path / "state", token_file), cluster)
    try:
        async with aiohttp.ClientSession() as http:
            force = {"action": "force", "level": 2, "who": "alice"}
            assert (await _post(http, daemon, "sim0", force, None))[0] == 401
            assert (await _post(http, daemon, "sim0", force, "wrong"))[0] == 401
            assert (await _post(http, daemon, "nope", force, TOKEN))[0] == 404
            code, doc = await _post(http, daemon, "sim0", {"action": "force", "level": 7}, TOKEN)
            assert code == 400 and "0 to 3" in doc["error"]
            code, doc = await _post(http, daemon, "sim0", force, TOKEN)
            assert code == 200 and doc == {"engine": "sim0", "level": 2, "forced": True, "forced_by": "alice", "dry_run": False}
            await daemon.poll_once()  # the rules do not move a forced level
            page = daemon.metrics.render().decode()
            assert 'guardian_breaker_level{engine="sim0"} 2.0' in page and 'guardian_breaker_forced{engine="sim0"} 1.0' in page
            assert 'guardian_breaker_transitions_total{engine="sim0",from="L0",reason="forced",to="L2"} 1.0' in page
            saved = StateFile(tmp_path / "state" / STATE_FILE).load().data
            assert saved is not None and saved["engines"]["sim0"]["level"] == 2 and saved["engines"]["sim0"]["forced_by"] == "alice"
            async with http.get(f"http://127.0.0.1:{daemon.http_address[1]}/status") as resp:  # type: ignore[index]
                status = await resp.text()
            assert TOKEN not in json.dumps(saved) and TOKEN not in status and '"forced_by": "alice"' in status
            code, doc = await _post(http, daemon, "sim0", {"action": "clear", "who": "alice"}, TOKEN)
            assert code == 200 and doc["level"] == 0 and doc["forced"] is False
    finally:
        await daemon.close()


async def test_without_a_configured_token_the_api_is_off(cluster: SimCluster, tmp_path: Path) -> None:
    daemon = await _daemon(_config(cluster, tmp_path / "state", None), cluster)
    try:
        async with aiohttp.ClientSession() as http:
            code, doc = await _post(http, daemon, "sim0", {"action": "clear"}, "anything")
        assert code == 403 and "api_token_file" in doc["error"]
    finally:
        await daemon.close()


async def test_a_truncated_state_file_is_set_aside_and_guardian_starts_with_the_budget_spent(cluster: SimCluster, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / STATE_FILE).write_text('{"data": {"engines": {"sim0": {"level": 3')
    daemon = await _daemon(_config(cluster, state_dir, None), cluster)
    try:
        assert [p.name.startswith(f"{STATE_FILE}.corrupt-") for p in state_dir.iterdir()] == [True]
        assert daemon.pipeline.level("sim0") == 0 and daemon.pipeline.budget_left("sim0") == 0
        assert 'guardian_restart_budget_remaining{engine="sim0"} 0.0' in daemon.metrics.render().decode()
    finally:
        await daemon.close()


async def test_with_the_child_launcher_guardian_starts_the_engine_once(cluster: SimCluster, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    program = f"import sys, time; open({str(marker)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n'); time.sleep(60)"
    restart = cfg.RestartSection(launcher="child", command=[sys.executable, "-c", program], args={"max-num-seqs": 16})
    config = _config(cluster, tmp_path / "state", None)
    url = f"http://127.0.0.1:{free_port()}"  # the stand-in engine listens nowhere: the port is free
    config = config.model_copy(update={"engines": [config.engines[0].model_copy(update={"restart": restart, "url": url})]})
    first = await _daemon(config, cluster)
    await first.close()
    pid = json.loads((tmp_path / "state" / "sim0.pid").read_text())["pid"]
    second = await _daemon(config, cluster)  # a restarted guardian adopts the engine through its identity file
    await second.close()
    try:
        assert json.loads((tmp_path / "state" / "sim0.pid").read_text())["pid"] == pid
        deadline = time.monotonic() + 30  # a loaded machine starts Python slowly
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:  # created, then written
            time.sleep(0.05)
        assert marker.read_text() == "--max-num-seqs 16\n"
    finally:
        os.killpg(pid, signal.SIGKILL)


# -- a real guardian process, killed with SIGKILL -------------------------------------------------


def _status(port: int) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as resp:
                doc = json.loads(resp.read())
            if "breaker" in doc:
                return doc  # type: ignore[no-any-return]
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    raise AssertionError("guardian never served /status")


@pytest.mark.slow
def test_kill_9_right_after_a_forced_transition_restores_the_level_and_the_restart_budget(tmp_path: Path, sim_url: str) -> None:
    port = free_port()
    state_dir = tmp_path / "state"
    (tmp_path / "token").write_text(TOKEN)
    config = tmp_path / "guardian.toml"
    config.write_text(
        f'[guardian]\nlisten = "127.0.0.1:{port}"\npoll_interval_seconds = 0.2\nstate_dir = "{state_dir}"\n'
        f'api_token_file = "{tmp_path / "token"}"\n[[engines]]\nname = "sim0"\nurl = "{sim_url}"\n'
    )
    now = time.time()  # two restarts earlier this hour, from a previous life
    StateFile(state_dir / STATE_FILE).save({"engines": {"sim0": {
        "level": 0, "since": now - 600, "forced_by": None, "restarts": [now - 300, now - 200], "restarting": None,
        "degraded": False, "gpu_memory_utilization": None}}})  # fmt: skip
    run = [*GUARDIAN, "run", "--config", str(config)]
    first = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert _status(port)["breaker"]["sim0"]["restart_budget_left"] == 1
        forced = subprocess.run([*GUARDIAN, "breaker", "force", "sim0", "3", "--who", "alice", "--config", str(config)],
                                capture_output=True, text=True, timeout=30)  # fmt: skip
        assert forced.returncode == 0 and forced.stdout.strip() == "sim0: L3 (pinned by alice)", forced.stderr
        first.send_signal(signal.SIGKILL)  # mid-transition: the gates and the page may not have gone out
        first.wait(timeout=10)
    finally:
        first.kill()
    second = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        breaker = _status(port)["breaker"]["sim0"]
    finally:
        second.send_signal(signal.SIGTERM)
        _, log = second.communicate(timeout=20)
    assert breaker["level"] == 3 and breaker["forced_by"] == "alice" and breaker["restart_budget_left"] == 1
    assert '"event": "state_restored"' in log and TOKEN not in log
    assert '"kind": "gates", "breaker_level": 3' in log  # the restored level's gates are shut again
    assert second.returncode == 0


async def test_the_api_answers_a_token_of_raw_bytes_and_deep_json_with_4xx_not_a_crash(cluster: SimCluster, tmp_path: Path) -> None:
    import asyncio

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    daemon = await _daemon(_config(cluster, tmp_path / "state", token_file), cluster)
    try:
        assert daemon.http_address is not None
        port = daemon.http_address[1]

        async def raw(request: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            answer = await reader.read(4096)
            writer.close()
            return answer

        body = b'{"action": "clear"}'
        bad_token = await raw(b"POST /api/v1/breaker/sim0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xfa\r\n"
                              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        deep = b"[" * 50_000 + b"]" * 50_000
        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{port}/api/v1/breaker/sim0", data=deep,
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}) as resp:  # fmt: skip
                deep_status = resp.status
    finally:
        await daemon.close()
    assert bad_token.startswith(b"HTTP/1.1 401") and deep_status == 400
