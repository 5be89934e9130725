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
  good: removed, with a log event and a metric, never silently.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from guardian.state import atomic_write


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
    def __init__(self, directory: Path) -> None:
        self.dir = directory

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
                yield Envelope(**doc)
            except FileNotFoundError:
                continue
            except (ValueError, TypeError, KeyError):
                os.replace(path, path.with_name(f"{name}.corrupt-{int(time.time())}"))  # not retried forever

    def depth_and_oldest(self, now: float) -> tuple[int, float | None]:
        envs = self.all()
        return len(envs), (now - min(e.created for e in envs)) if envs else None
