"""``guardian run --record FILE``: every Sample as one JSON line, in bounded rotating files.

The file is what ``guardian analyze`` (and later ``replay``) reads: real
readings from the host, not a summary. When the file passes ``max_bytes`` it
becomes ``FILE.1`` (``FILE.1`` becomes ``FILE.2``, …) and at most
``backups`` old files are kept, so recording can stay on for weeks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import IO, Any

from guardian.sample import Sample


class SampleRecorder:
    def __init__(self, path: Path, max_bytes: int = 256 * 2**20, backups: int = 3) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._file: IO[str] | None = None

    def write(self, sample: Sample) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        try:
            self._file.write(json.dumps(to_record(sample), separators=(",", ":")) + "\n")
            self._file.flush()
        except OSError:
            self.close()  # reopened next time: the disk may have room again
            raise
        if self._file.tell() >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def to_record(sample: Sample) -> dict[str, Any]:
    record = dataclasses.asdict(sample)
    record["kind"] = "sample"
    return record
