"""Durable state: a JSON document written so that ``kill -9`` at any moment leaves the old or the new one.

Write: a temp file in the same directory, fsync, rename over the target,
fsync the directory (so the rename itself survives a power cut). Read: a file
that does not parse, or parses to something other than the expected shape,
is renamed aside (``NAME.corrupt-<unix time>``) and reported, and the caller
starts from its conservative default instead of crashing or trusting it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Loaded:
    data: dict[str, Any] | None  # None: no state yet, or it was set aside
    quarantined: Path | None = None  # where a corrupt file was moved
    reason: str | None = None  # why it was set aside
    value: Any = None  # what ``parse`` made of ``data``


class StateFile:
    def __init__(self, path: Path, version: int = 1) -> None:
        self.path = path
        self.version = version

    def save(self, data: dict[str, Any]) -> None:
        atomic_write(self.path, json.dumps({"version": self.version, "data": data}, sort_keys=True).encode())

    def load(self, parse: Callable[[dict[str, Any]], Any] | None = None) -> Loaded:
        """The saved document; ``parse`` turns it into the caller's value, and a document it cannot read is set aside too."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Loaded(None)
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return self._quarantine(f"not JSON ({exc})")
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            return self._quarantine("not a guardian state document")
        if doc.get("version") != self.version:
            return self._quarantine(f"version {doc.get('version')!r}, expected {self.version}")
        if parse is None:
            return Loaded(doc["data"])
        try:
            return Loaded(doc["data"], value=parse(doc["data"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            return self._quarantine(f"unexpected content ({type(exc).__name__}: {exc})")

    def _quarantine(self, reason: str) -> Loaded:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        os.replace(self.path, aside)
        _fsync_dir(self.path.parent)
        return Loaded(None, quarantined=aside, reason=reason)


def atomic_write(path: Path, payload: bytes, mode: int = 0o600) -> None:
    """Temp file beside ``path``, fsync, rename over it, fsync the directory: the old or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
