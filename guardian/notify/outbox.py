"""The durable outbox: a message is on disk before it is sent and leaves only when it was delivered or dropped.

One file per message in ``state_dir/outbox`` (written like the state file:
temp, fsync, rename, fsync the directory), so ``kill -9`` at any point
leaves every message either waiting or done:

- ``put``: written as ``pending`` before anything is sent;
- before each try the file says ``sending`` (and the try count);
- delivered: the file is removed (the provider's id is logged);
- a retryable failure: back to ``pending`` with the time of the next try;
- an uncertain outcome (timeout, reset after the request went out), or a
  file still saying ``sending`` when guardian starts (it died mid-send):
  ``pending`` and ``possibly_duplicate``, so the text says so when resent;
- past its validity (a page from last night is noise today) or refused for
  good: removed, with a log event and a metric, never silently;
- a file that cannot be read back as a message (not JSON, a field missing or
  of the wrong type) is set aside as ``NAME.corrupt-TIME`` with a log event
  and a metric, and every other message goes on being sent.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from guardian import logs
from guardian.state import atomic_write

log = logs.get("guardian.outbox")

# each field's type as it must come back from disk; a file that disagrees is quarantined, not sent
_TYPES: dict[str, type | tuple[type, ...]] = {
    "id": str, "channel": str, "to": str, "severity": str, "facts": tuple, "keys": tuple, "kind": str,
    "created": (int, float), "valid_until": (int, float), "state": str, "attempts": int, "next_try": (int, float),
    "possibly_duplicate": bool, "max_segments": (int, type(None)), "last_error": (str, type(None)), "extra": dict,
}  # fmt: skip


@dataclass(frozen=True)
class Envelope:
    id: str
    channel: str  # sms, webhook
    to: str  # a phone number, or the webhook's contact name
    severity: str
    facts: tuple[str, ...]  # the body, most important first; fitted to the channel when sent
    keys: tuple[str, ...]  # the alerts it tells of
    kind: str
    created: float  # unix seconds
    valid_until: float
    state: str = "pending"  # pending, sending
    attempts: int = 0
    next_try: float = 0.0
    possibly_duplicate: bool = False
    max_segments: int | None = None  # lowered after Twilio refused the body as too long
    last_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.id}.json"


class Outbox:
    def __init__(self, directory: Path, on_quarantine: Callable[[], None] = lambda: None) -> None:
        self.dir = directory
        self._on_quarantine = on_quarantine  # counted: guardian_outbox_quarantined_total

    def new(self, **fields: Any) -> Envelope:
        now = fields.pop("created", time.time())
        return Envelope(id=f"{int(now * 1e6):016d}-{uuid.uuid4().hex[:8]}", created=now, **fields)

    def put(self, env: Envelope) -> None:
        """Raises OSError when the message cannot be stored durably (the caller must not say it was queued)."""
        atomic_write(self.dir / env.name, json.dumps(asdict(env), sort_keys=True).encode())

    def remove(self, env: Envelope) -> None:
        try:
            os.unlink(self.dir / env.name)
        except FileNotFoundError:
            pass

    def recover(self) -> list[Envelope]:
        """At start: messages a dead guardian was sending have an unknown outcome; resend them marked as such."""
        recovered = []
        for env in self.all():
            if env.state == "sending":
                env = replace(env, state="pending", possibly_duplicate=True, next_try=0.0,
                              last_error="guardian stopped while sending it")  # fmt: skip
                self.put(env)
                recovered.append(env)
        return recovered

    def all(self) -> list[Envelope]:
        return sorted(self._read(), key=lambda e: e.id)

    def _read(self) -> Iterator[Envelope]:
        try:
            names = [n for n in os.listdir(self.dir) if n.endswith(".json") and not n.startswith(".")]
        except FileNotFoundError:
            return
        for name in names:
            path = self.dir / name
            try:
                doc = json.loads(path.read_bytes())
                doc["facts"], doc["keys"] = tuple(doc["facts"]), tuple(doc["keys"])
                env = Envelope(**doc)
                wrong = [k for k, kind in _TYPES.items() if not _typed(getattr(env, k), kind)]
                if wrong or not all(isinstance(f, str) for f in env.facts + env.keys):
                    raise TypeError(f"wrong type in {', '.join(wrong) or 'facts or keys'}")
            except FileNotFoundError:
                continue
            except (ValueError, TypeError, KeyError) as exc:
                self._quarantine(path, f"{type(exc).__name__}: {exc}")
                continue
            yield env

    def _quarantine(self, path: Path, reason: str) -> None:
        """Set aside where an operator can read it; never retried, never blocking the others."""
        moved = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        try:
            os.replace(path, moved)
        except OSError as exc:
            reason += f"; could not be moved aside: {exc.strerror or exc}"
        log.error("outbox_message_quarantined", file=str(path), moved_to=str(moved), reason=reason[:300],
                  detail="not sent; the other messages go on")  # fmt: skip
        self._on_quarantine()

    def depth_and_oldest(self, now: float) -> tuple[int, float | None]:
        envs = self.all()
        return len(envs), (now - min(e.created for e in envs)) if envs else None


def _typed(value: Any, kind: type | tuple[type, ...]) -> bool:
    """isinstance, except that true and false are not numbers here."""
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
