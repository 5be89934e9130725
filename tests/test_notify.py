"""SMS through the real twilio library against a local fake Twilio; the outbox; Alertmanager's webhook; nothing lost."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from guardian.notify.alerts import Alert, AlertParams, Contact
from guardian.notify.outbox import Outbox
from guardian.notify.service import POSSIBLY_DUPLICATE, Notifications, Settings, SmsDeliverer
from guardian.notify.sms import TwilioSender, mask
from guardian.notify.sms_text import encode, fit
from guardian.policy.response import Action
from guardian.state import StateFile
from tests.fake_twilio import FROM, SID, TOKEN, fake_twilio
from tests.helpers import free_port, require_tool

GUARDIAN = [sys.executable, "-m", "guardian"]
ALERTS = Path(__file__).resolve().parent.parent / "alerts"
ALICE = Contact("alice", "+4915100000001")
NUMBER = ALICE.number


def _sender(url: str, timeout: float = 2.0, **kw: str) -> TwilioSender:
    return TwilioSender(SID, kw.pop("token", TOKEN), kw.pop("from_number", FROM), timeout=timeout, api_url=url, **kw)


# -- the sender: each answer Twilio can give -------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "result", "code"),
    [
        (201, "sent", None),
        ((429, 20429), "retry", 20429),
        (500, "retry", None),
        (503, "retry", None),
        ((400, 21211), "permanent", 21211),
        ((400, 21610), "permanent", 21610),
        ((400, 21617), "too_long", 21617),
        ((401, 20003), "auth", 20003),
        ("hang", "uncertain", None),
        ("reset", "uncertain", None),
    ],
)
def test_each_twilio_answer_is_told_apart(answer: object, result: str, code: int | None) -> None:
    with fake_twilio() as fake:
        fake.script = [answer]  # type: ignore[list-item]
        sent = _sender(fake.url, timeout=1.0).send(NUMBER, "PAGE sim0 L3")
    assert (sent.result, sent.code) == (result, code), sent.detail
    assert fake.received == [{"To": NUMBER, "Body": "PAGE sim0 L3", "From": FROM}]
    if result == "sent":
        assert sent.sid is not None and sent.sid.startswith("SM")
    assert TOKEN not in sent.detail


def test_twilio_that_cannot_be_reached_is_a_retry_not_a_duplicate() -> None:
    sent = _sender(f"http://127.0.0.1:{free_port()}").send(NUMBER, "x")
    assert sent.result == "retry" and "cannot connect" in sent.detail


def test_a_wrong_token_is_an_auth_failure_and_a_messaging_service_replaces_from() -> None:
    with fake_twilio() as fake:
        assert _sender(fake.url, token="wrong").send(NUMBER, "x").result == "auth"
        sender = TwilioSender(SID, TOKEN, messaging_service_sid="MG" + "0" * 32, status_callback="https://example.com/cb",
                              api_url=fake.url)  # fmt: skip
        assert sender.send(NUMBER, "x").result == "sent"
    assert fake.received[-1] == {"To": NUMBER, "Body": "x", "MessagingServiceSid": "MG" + "0" * 32,
                                 "StatusCallback": "https://example.com/cb"}  # fmt: skip


# -- bodies ----------------------------------------------------------------------------------------


def test_bodies_fit_the_segment_budget_with_the_most_important_facts_first() -> None:
    facts = ["PAGE sim0 L3 free_reserve: free 5.4%", "action: drained restart (--gpu-memory-utilization 0.65)"] + [
        f"detail {i}: " + "x" * 60 for i in range(20)
    ]
    one = fit(facts, 1)
    assert one.startswith("PAGE sim0 L3") and encode(one).segments == 1 and len(one) <= 160
    three = fit(facts, 3)
    assert three.startswith(one) and encode(three).segments == 3
    assert len(fit(facts, 10)) <= 1600
    folded = fit(["L2 → L3 … ≥ 90%"], 1)  # one arrow would make it UCS-2: 70 characters instead of 160
    assert folded == "L2 -> L3 ... >= 90%" and encode(folded).encoding == "GSM-7"
    assert encode("Störung 🔥").encoding == "UCS-2"
    cut = fit(["y" * 400], 1)
    assert cut.endswith("...") and len(cut) == 160


def test_numbers_are_masked() -> None:
    assert mask("+4915112345678") == "+49*********78"


# -- the outbox and the service on a fake clock -------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_790_000_000.0

    def __call__(self) -> float:
        return self.now


def _service(tmp_path: Path, url: str, clock: Clock, timeout: float = 1.0) -> tuple[Notifications, list[tuple[str, str, str]]]:
    results: list[tuple[str, str, str]] = []
    settings = Settings(AlertParams(group_wait_seconds=0), (ALICE,), 3, {"page": 3600.0, "warning": 3600.0})
    n = Notifications(settings, StateFile(tmp_path / "alerts.json"), Outbox(tmp_path / "outbox"),
                      {"sms": SmsDeliverer(_sender(url, timeout), 3)}, on_result=lambda *r: results.append(r), clock=clock)  # fmt: skip
    n.start()
    return n, results


async def _until_empty(n: Notifications, clock: Clock, rounds: int = 40) -> None:
    for _ in range(rounds):
        await n.drain()
        if not n.outbox.all():
            return
        clock.now = min(e.next_try for e in n.outbox.all()) + 0.01


def _page(n: Notifications) -> None:
    n.record(Action("notify", "sim0", 3, "free_reserve", {"severity": "page", "text": "free 5.4%; action: drained restart"}))
    n.tick()


@pytest.mark.parametrize(
    ("script", "outcomes"),
    [
        ([(429, 20429), 500, 503], ["retry", "retry", "retry", "ok"]),
        (["reset"], ["uncertain", "duplicate"]),
        (["hang"], ["uncertain", "duplicate"]),
        ([(401, 20003), (401, 20003)], ["auth", "auth", "ok"]),
    ],
    ids=["throttled-then-5xx", "reset", "hang", "auth"],
)
async def test_retryable_failures_end_in_one_delivered_message(tmp_path: Path, script: list[object], outcomes: list[str]) -> None:
    clock = Clock()
    with fake_twilio() as fake:
        fake.script = script  # type: ignore[assignment]
        n, results = _service(tmp_path, fake.url, clock)
        _page(n)
        await _until_empty(n, clock)
    assert [reason for _, _, reason in results] == outcomes
    assert n.outbox.all() == []
    last = fake.delivered[-1]["Body"]
    assert last.startswith(POSSIBLY_DUPLICATE) == (outcomes[-1] == "duplicate")
    assert "PAGE 14:13 UTC sim0 L3 free_reserve: free 5.4%" in last and "ack: guardian ack breaker/sim0" in last


async def test_auth_failures_wait_at_least_a_minute_between_tries(tmp_path: Path) -> None:
    clock = Clock()
    with fake_twilio() as fake:
        fake.script = [(401, 20003)]
        n, _ = _service(tmp_path, fake.url, clock)
        _page(n)
        await n.drain()
    (env,) = n.outbox.all()
    assert env.next_try - clock.now >= 60 and "20003" in (env.last_error or "")


@pytest.mark.parametrize("code", [21211, 21610])
async def test_permanent_refusals_are_dropped_with_their_reason(tmp_path: Path, code: int) -> None:
    clock = Clock()
    with fake_twilio() as fake:
        fake.script = [(400, code)]
        n, results = _service(tmp_path, fake.url, clock)
        _page(n)
        await _until_empty(n, clock)
    assert results == [("sms", "dropped", f"code_{code}")] and n.outbox.all() == [] and len(fake.received) == 1


async def test_a_body_refused_as_too_long_is_sent_again_in_one_segment(tmp_path: Path) -> None:
    clock = Clock()
    with fake_twilio() as fake:
        fake.script = [(400, 21617)]
        n, results = _service(tmp_path, fake.url, clock)
        n.record(Action("notify", "sim0", 3, "oom", {"severity": "page", "text": "z" * 600}))
        n.tick()
        await _until_empty(n, clock)
    first, second = (r["Body"] for r in fake.received)
    assert encode(first).segments == 3 and encode(second).segments == 1 and second.startswith("PAGE 14:13 UTC sim0 L3 oom")
    assert [r[2] for r in results] == ["too_long", "ok"]


async def test_a_message_past_its_validity_is_dropped_loudly_not_sent(tmp_path: Path) -> None:
    clock = Clock()
    with fake_twilio() as fake:
        fake.script = [500] * 100
        n, results = _service(tmp_path, fake.url, clock)
        _page(n)
        for _ in range(30):
            await n.drain()
            clock.now += 300
    assert ("sms", "dropped", "expired") in results and n.outbox.all() == []
    assert len(fake.received) < 30


async def test_a_message_stays_due_while_the_outbox_cannot_be_written(tmp_path: Path) -> None:
    clock = Clock()
    (tmp_path / "outbox").write_text("a file where the directory should be")
    with fake_twilio() as fake:
        n, results = _service(tmp_path, fake.url, clock)
        _page(n)
        assert ("outbox", "failed", "unwritable") in results and fake.received == []
        (tmp_path / "outbox").unlink()
        n.tick()  # the same message, asked for again
        await _until_empty(n, clock)
    assert len(fake.delivered) == 1


# -- a real guardian: Alertmanager's webhook, kill -9, the CLI --------------------------------------

AM_PAYLOAD = {
    "version": "4", "groupKey": "{}:{alertname=\"GuardianEngineUnhealthy\"}", "status": "firing", "receiver": "guardian",
    "groupLabels": {"alertname": "GuardianEngineUnhealthy"}, "commonLabels": {}, "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093", "truncatedAlerts": 0,
    "alerts": [{
        "status": "firing", "fingerprint": "a1b2",
        "labels": {"alertname": "GuardianEngineUnhealthy", "severity": "page", "engine": "llama", "instance": "gpu1:9400"},
        "annotations": {"summary": "vLLM engine llama on gpu1:9400 fails /health"},
        "startsAt": "2026-12-02T03:00:00Z", "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom/graph",
    }],
}  # fmt: skip


def _config(tmp_path: Path, port: int, twilio_url: str, engine_url: str = "http://127.0.0.1:9") -> Path:
    """guardian run needs an engine to watch: give it a healthy one (``sim_url``), so only the test's alerts page."""
    (tmp_path / "api-token").write_text("api-secret")
    path = tmp_path / "guardian.toml"
    path.write_text(
        f'[guardian]\nlisten = "127.0.0.1:{port}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'api_token_file = "{tmp_path / "api-token"}"\nlog_format = "json"\n'
        f'[[engines]]\nname = "sim"\nurl = "{engine_url}"\n'
        f'[notify]\nchannels = ["sms"]\n[[notify.oncall]]\nname = "alice"\nnumber = "{NUMBER}"\n'
        f'[notify.sms]\naccount_sid = "{SID}"\nfrom_number = "{FROM}"\napi_url = "{twilio_url}"\ntimeout_seconds = 20\n'
    )
    return path


def _post(port: int, path: str, body: object, token: str | None = "api-secret") -> tuple[int, dict]:  # type: ignore[type-arg]
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _guardian(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*GUARDIAN, "run", "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TWILIO_AUTH_TOKEN": TOKEN})  # fmt: skip


def _wait(predicate, seconds: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def _up(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
        return True
    except (OSError, urllib.error.URLError):
        return False


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, log = proc.communicate(timeout=20)
    return log


@pytest.mark.slow
def test_kill_9_mid_send_resends_the_page_marked_possibly_duplicate(tmp_path: Path, sim_url: str) -> None:
    port = free_port()
    with fake_twilio() as fake:
        fake.script, fake.hang_seconds = ["hang"], 2.0
        config = _config(tmp_path, port, fake.url, sim_url)
        first = _guardian(config)
        try:
            _wait(lambda: _up(port))
            assert _post(port, "alertmanager", AM_PAYLOAD, token=None)[0] == 401
            assert _post(port, "alertmanager", AM_PAYLOAD) == (200, {"alerts": 1})
            _wait(lambda: len(fake.received) == 1)  # Twilio has it; guardian waits for the answer
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        finally:
            first.kill()
        second = _guardian(config)
        try:
            _wait(lambda: len(fake.delivered) == 2, 30)
            time.sleep(0.5)
        finally:
            log = _stop(second)
    bodies = [r["Body"] for r in fake.received]
    assert len(bodies) == 2 and bodies[1] == f"{POSSIBLY_DUPLICATE} | {bodies[0]}"
    assert re.match(r"PAGE \d\d:\d\d UTC vLLM engine llama on gpu1:9400 fails /health", bodies[0])
    assert "ack: guardian ack GuardianEngineUnhealthy/llama" in bodies[0]
    assert '"event": "notification_outcome_unknown"' in log and '"event": "notification_sent"' in log
    assert TOKEN not in log and NUMBER not in log and mask(NUMBER) in log
    assert list((tmp_path / "state" / "outbox").iterdir()) == []


@pytest.mark.slow
def test_kill_9_before_twilio_could_be_reached_sends_the_page_once_after_restart(tmp_path: Path, sim_url: str) -> None:
    port, twilio_port = free_port(), free_port()
    config = _config(tmp_path, port, f"http://127.0.0.1:{twilio_port}", sim_url)  # nothing listens there yet
    first = _guardian(config)
    try:
        _wait(lambda: _up(port))
        assert _post(port, "alertmanager", AM_PAYLOAD) == (200, {"alerts": 1})
        time.sleep(1.5)  # it tries, and Twilio is not there
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        first.kill()
    assert len(list((tmp_path / "state" / "outbox").iterdir())) == 1  # written before any try
    with fake_twilio(twilio_port) as fake:
        second = _guardian(config)
        try:
            _wait(lambda: len(fake.delivered) == 1, 30)
            time.sleep(1.5)  # and no second copy
            acked = subprocess.run([*GUARDIAN, "ack", "GuardianEngineUnhealthy/llama", "--who", "alice", "--config", str(config)],
                                   capture_output=True, text=True, timeout=30)  # fmt: skip
            unknown = subprocess.run([*GUARDIAN, "ack", "breaker/none", "--config", str(config)], capture_output=True,
                                     text=True, timeout=30)  # fmt: skip
        finally:
            _stop(second)
    assert len(fake.received) == 1
    assert acked.returncode == 0 and acked.stdout.startswith("GuardianEngineUnhealthy/llama: acknowledged by alice"), acked.stderr
    assert unknown.returncode == 1 and "firing: GuardianEngineUnhealthy/llama" in unknown.stderr


async def test_alertmanager_gets_a_5xx_while_the_outbox_cannot_be_written(tmp_path: Path) -> None:
    from guardian import config as cfg
    from guardian.daemon import Daemon
    from guardian.sdnotify import Notifier

    with fake_twilio() as fake:
        config = cfg.load(_config(tmp_path, 0, fake.url))
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "outbox").write_text("not a directory")
        os.environ["TWILIO_AUTH_TOKEN"] = TOKEN
        try:
            daemon = Daemon(config, notifier=Notifier(address=""), nvml_module=None)
            await daemon.start()
            try:
                code, doc = await daemon.api("api-secret", "alertmanager", AM_PAYLOAD)
                assert code == 503 and "send them again" in doc["error"]
                assert (await daemon.api("api-secret", "alertmanager", {"nope": 1}))[0] == 400
                (tmp_path / "state" / "outbox").unlink()
                assert await daemon.api("api-secret", "alertmanager", AM_PAYLOAD) == (200, {"alerts": 1})
                assert len(list((tmp_path / "state" / "outbox").iterdir())) == 1
            finally:
                await daemon.close()
        finally:
            del os.environ["TWILIO_AUTH_TOKEN"]


def test_test_alert_sends_one_sms_or_prints_it(tmp_path: Path) -> None:
    with fake_twilio() as fake:
        config = _config(tmp_path, free_port(), fake.url)
        dry = subprocess.run([*GUARDIAN, "test-alert", "--to", NUMBER, "--config", str(config), "--dry-run"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        assert dry.returncode == 0 and "TEST from vllm-guardian" in dry.stdout and fake.received == []
        assert NUMBER not in dry.stdout
        real = subprocess.run([*GUARDIAN, "test-alert", "--to", NUMBER, "--config", str(config)], capture_output=True,
                              text=True, timeout=30, env={**os.environ, "TWILIO_AUTH_TOKEN": TOKEN})  # fmt: skip
        missing = subprocess.run([*GUARDIAN, "test-alert", "--to", NUMBER, "--config", str(config)], capture_output=True,
                                 text=True, timeout=30, env={k: v for k, v in os.environ.items() if k != "TWILIO_AUTH_TOKEN"})  # fmt: skip
    assert real.returncode == 0 and real.stdout.splitlines()[-1].startswith("sent: accepted as SM"), real.stderr
    assert fake.delivered[0]["To"] == NUMBER and fake.delivered[0]["Body"].startswith("TEST from vllm-guardian")
    assert missing.returncode == 2 and "TWILIO_AUTH_TOKEN" in missing.stderr


def test_alertmanager_payloads_become_alerts() -> None:
    from guardian.notify.alertmanager import PayloadError, parse

    ((alert, firing),) = parse(AM_PAYLOAD)
    assert firing and alert == Alert("GuardianEngineUnhealthy", "llama", "page",
                                     "vLLM engine llama on gpu1:9400 fails /health", "alertmanager")  # fmt: skip
    resolved = {**AM_PAYLOAD, "status": "resolved", "alerts": [{**AM_PAYLOAD["alerts"][0], "status": "resolved"}]}  # type: ignore[dict-item]
    assert parse(resolved)[0][1] is False
    for bad in ({}, {"alerts": [{}]}, {"version": "3", "alerts": []}, {"alerts": [{"labels": {}}]}):
        with pytest.raises(PayloadError):
            parse(bad)


def test_the_example_alertmanager_config_is_valid_and_points_at_guardians_receiver() -> None:
    amtool = require_tool("amtool")
    example = ALERTS / "alertmanager.yml"
    check = subprocess.run([amtool, "check-config", str(example)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "url: http://127.0.0.1:9400/api/v1/alertmanager" in example.read_text()


@pytest.mark.slow
async def test_a_real_alertmanager_pages_through_guardian(tmp_path: Path) -> None:
    import asyncio

    from guardian import config as cfg
    from guardian.daemon import Daemon
    from guardian.sdnotify import Notifier

    binary = require_tool("prometheus-alertmanager")
    am_port = free_port()
    with fake_twilio() as fake:
        config = cfg.load(_config(tmp_path, 0, fake.url))
        os.environ["TWILIO_AUTH_TOKEN"] = TOKEN
        daemon = Daemon(config, notifier=Notifier(address=""))
        await daemon.start()
        am = None
        try:
            assert daemon.http_address is not None
            example = (ALERTS / "alertmanager.yml").read_text()
            am_config = tmp_path / "am.yml"
            am_config.write_text(
                example.replace("127.0.0.1:9400", f"127.0.0.1:{daemon.http_address[1]}")
                .replace("/etc/alertmanager/guardian-api-token", str(tmp_path / "api-token"))
                .replace("group_wait: 30s", "group_wait: 1s")
            )
            am = subprocess.Popen([binary, f"--config.file={am_config}", f"--storage.path={tmp_path / 'am-data'}",
                                   f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            alert = [{"labels": {"alertname": "GuardianBreakerEmergency", "severity": "page", "engine": "llama",
                                 "instance": "gpu1:9400"},
                      "annotations": {"summary": "vLLM engine llama on gpu1:9400 has been at breaker level 3 for a minute"}}]  # fmt: skip
            posted = False
            for _ in range(300):
                if not posted:
                    try:
                        request = urllib.request.Request(f"http://127.0.0.1:{am_port}/api/v2/alerts", method="POST",
                                                         data=json.dumps(alert).encode(),
                                                         headers={"Content-Type": "application/json"})  # fmt: skip
                        await asyncio.to_thread(urllib.request.urlopen, request, None, 2)
                        posted = True
                    except (OSError, urllib.error.URLError):
                        pass
                await daemon._notify_job()
                if fake.delivered:
                    break
                await asyncio.sleep(0.1)
        finally:
            if am is not None:
                am.kill()
                am.wait()
            await daemon.close()
            del os.environ["TWILIO_AUTH_TOKEN"]
    (sms,) = fake.delivered
    assert sms["To"] == NUMBER
    assert re.match(r"PAGE \d\d:\d\d UTC vLLM engine llama on gpu1:9400 has been at breaker level 3 for a minute", sms["Body"])


async def test_the_webhook_channel_posts_json_and_tells_retry_from_refusal() -> None:
    from aiohttp import ClientSession, web

    from guardian.notify.service import WebhookDeliverer

    got: list[dict] = []  # type: ignore[type-arg]
    answers = [200, 503, 400]

    async def hook(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == "Bearer hook-token"
        got.append(await request.json())
        return web.Response(status=answers.pop(0))

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with ClientSession() as session:
            hook_channel = WebhookDeliverer(f"http://127.0.0.1:{port}/hook", session, token="hook-token")
            env = Outbox(Path("/nonexistent")).new(channel="webhook", to="alice", severity="page", facts=("PAGE sim0 L3",),
                                                  keys=("breaker/sim0",), kind="firing", valid_until=2e9)  # fmt: skip
            results = [(await hook_channel.deliver(env)).result for _ in range(3)]
    finally:
        await runner.cleanup()
    assert results == ["sent", "retry", "permanent"]
    assert got[0] == {"to": "alice", "severity": "page", "kind": "firing", "alerts": ["breaker/sim0"], "text": "PAGE sim0 L3",
                      "possibly_duplicate": False, "id": env.id}  # fmt: skip


def test_an_outbox_file_of_the_wrong_shape_is_set_aside_loudly_and_the_rest_still_go(tmp_path: Path) -> None:
    quarantined: list[int] = []
    box = Outbox(tmp_path / "outbox", on_quarantine=lambda: quarantined.append(1))
    good = box.new(channel="sms", to="+15550100", severity="page", facts=("PAGE sim0 L3",), keys=("breaker/sim0",),
                   kind="firing", valid_until=time.time() + 3600)  # fmt: skip
    box.put(good)
    bad = json.loads((tmp_path / "outbox" / good.name).read_text())
    bad.update(id="0000000000000001-bad", attempts="three")  # valid JSON, a field of the wrong type
    (tmp_path / "outbox" / "0000000000000001-bad.json").write_text(json.dumps(bad))
    (tmp_path / "outbox" / "0000000000000002-cut.json").write_text('{"id": "0000000000000002-cut", "chan')
    assert [e.id for e in box.all()] == [good.id]
    assert len(quarantined) == 2
    assert sorted(p.name.split(".json")[0] for p in (tmp_path / "outbox").glob("*.corrupt-*")) == [
        "0000000000000001-bad", "0000000000000002-cut"]  # fmt: skip
