"""guardian's own listener: ``/metrics``, ``/healthz``, ``/status``, ``/`` and the authenticated API.

The API (breaker force/clear, alert acknowledgement, Alertmanager's webhook)
needs the bearer token in ``guardian.api_token_file`` or systemd's
``api-token`` credential; without one it is off, never open. The token is
read at each call, so rotating the file needs no restart.
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any, Awaitable, Callable

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from guardian import __version__
from guardian import config as cfg
from guardian import logs
from guardian.exporter import Metrics
from guardian.notify import alertmanager
from guardian.notify.service import Notifications
from guardian.pipeline import Decision, Pipeline
from guardian.policy.response import Command
from guardian.snapshot import Snapshot
from guardian.status_json import status

log = logs.get("guardian.daemon")

Reply = tuple[int, dict[str, Any]]
Api = Callable[[str | None, str, Any], Awaitable[Reply]]

ENDPOINTS = {
    "GET /metrics": "Prometheus scrape target (guardian_* metrics)",
    "GET /healthz": "200 while polls complete on time, 503 otherwise",
    "GET /status": "the last poll as JSON: engines, GPUs, leaks, breaker levels, tuner, gateway",
    "POST /api/v1/breaker/ENGINE": "force or clear a breaker level (bearer token)",
    "POST /api/v1/alerts/ack": "acknowledge an alert (bearer token)",
    "POST /api/v1/alertmanager": "Alertmanager webhook receiver (bearer token)",
}


class ControlApi:
    """What an operator holding the API token may ask of the running guardian."""

    def __init__(self, config: Callable[[], cfg.Config], pipeline: Pipeline, notifications: Callable[[], Notifications | None],
                 carry_out: Callable[[Decision], None], dry_run: Callable[[], bool]) -> None:  # fmt: skip
        self._config = config
        self._pipeline = pipeline
        self._notifications = notifications
        self._carry_out = carry_out
        self._dry_run = dry_run

    async def __call__(self, token: str | None, path: str, body: Any) -> Reply:
        refused = self._refused(token)
        if refused is not None:
            return refused
        if path.startswith("breaker/"):
            return self._breaker(path.removeprefix("breaker/"), body)
        if path == "alerts/ack":
            return self._ack(body)
        if path == "alertmanager":
            return self._alertmanager(body)
        return 404, {"error": f"no API at /api/v1/{path}"}

    def _refused(self, token: str | None) -> Reply | None:
        """None when ``token`` is the API token; else the answer for the caller."""
        try:
            expected = self._config().guardian.read_api_token()
        except OSError as exc:
            log.error("api_token_unreadable", reason=exc.strerror or str(exc))
            return 503, {"error": "guardian cannot read its API token"}
        if expected is None:
            return 403, {"error": "the API is off: set guardian.api_token_file (or LoadCredential=api-token)"}
        # a header of bytes that are not UTF-8 arrives as surrogate escapes: compared as the bytes sent, never a crash
        if token is None or not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), expected.encode()):
            return 401, {"error": "missing or wrong bearer token"}
        return None

    def _ack(self, body: Any) -> Reply:
        notifications = self._notifications()
        assert notifications is not None
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            return 400, {"error": 'send {"key": "breaker/ENGINE", "who": "..."}'}
        who = str(body.get("who") or "api")[:64]
        if not notifications.ack(body["key"], who):
            firing = sorted(k for k, t in notifications.state.alerts.items() if t.firing)
            return 404, {"error": f"no firing alert {body['key']!r}", "firing": firing}
        return 200, {"key": body["key"], "acknowledged_by": who}

    def _alertmanager(self, body: Any) -> Reply:
        notifications = self._notifications()
        assert notifications is not None
        try:
            count = notifications.alertmanager(body)
        except alertmanager.PayloadError as exc:
            return 400, {"error": str(exc)}
        except OSError as exc:  # not stored: Alertmanager retries on 5xx, never on 4xx
            log.error("alertmanager_not_queued", reason=exc.strerror or str(exc))
            return 503, {"error": "guardian could not store the alerts durably; send them again"}
        return 200, {"alerts": count}

    def _breaker(self, engine: str, body: Any) -> Reply:
        """``POST /api/v1/breaker/ENGINE``: force or clear, for an operator holding the API token."""
        states = self._pipeline.states
        if engine not in states:
            return 404, {"error": f"no engine {engine!r}; known: {', '.join(sorted(states)) or 'none'}"}
        if not isinstance(body, dict) or body.get("action") not in ("force", "clear"):
            return 400, {"error": 'send {"action": "force", "level": 0-3, "who": "..."} or {"action": "clear", "who": "..."}'}
        level = body.get("level")
        if body["action"] == "force" and (not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 3):
            return 400, {"error": "force needs an integer level from 0 to 3"}
        who = str(body.get("who") or "api")[:64]
        cmd = Command(body["action"], engine, who, level if body["action"] == "force" else None)
        self._carry_out(self._pipeline.command(cmd, time.monotonic(), time.time()))
        state = states[engine]
        return 200, {"engine": engine, "level": int(state.breaker.level), "forced": state.breaker.forced,
                     "forced_by": state.breaker.forced_by, "dry_run": self._dry_run()}  # fmt: skip


def make_app(
    metrics: Metrics,
    snapshot: Callable[[], Snapshot | None],
    last_poll_monotonic: Callable[[], float | None],
    interval: Callable[[], float],
    started_wall: float,
    api: Api | None = None,
) -> web.Application:
    async def get_metrics(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_healthz(_: web.Request) -> web.Response:
        last = last_poll_monotonic()
        limit = 3 * interval()
        if last is None:
            return web.json_response({"ok": False, "reason": "no poll has completed yet"}, status=503)
        age = time.monotonic() - last
        if age > limit:
            return web.json_response(
                {"ok": False, "reason": f"the last poll finished {age:.1f}s ago (limit {limit:g}s)"}, status=503
            )
        return web.json_response({"ok": True, "last_poll_age_seconds": round(age, 3)})

    async def get_status(_: web.Request) -> web.Response:
        return web.json_response(status(snapshot(), started_wall, interval()), dumps=_dumps)

    async def post_api(request: web.Request) -> web.Response:
        assert api is not None
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer "):].strip() if auth.startswith("Bearer ") else None
        try:
            body = await request.json() if request.can_read_body else None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return web.json_response({"error": "the body is not JSON (or is nested too deeply)"}, status=400)
        code, doc = await api(token, request.match_info["path"], body)
        return web.json_response(doc, status=code)

    async def get_index(_: web.Request) -> web.Response:
        """What this listener serves, for whoever opens it in a browser or curls it first."""
        served = dict(ENDPOINTS) if api is not None else {k: v for k, v in ENDPOINTS.items() if not k.startswith("POST")}
        return web.json_response({"service": "vllm-guardian", "version": __version__, "endpoints": served}, dumps=_dumps)

    app = web.Application(client_max_size=1024 * 1024)  # Alertmanager batches alerts
    app.router.add_get("/", get_index)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_healthz)
    app.router.add_get("/status", get_status)
    if api is not None:
        app.router.add_post("/api/v1/{path:.+}", post_api)
    return app


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)
