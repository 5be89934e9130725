"""``guardian run --record FILE``: every Sample as one JSON line, in bounded rotating files.

The file is what ``guardian analyze`` and ``guardian replay`` read: real
readings from the host, not a summary. Beside the samples it holds the
policy's decisions (``"kind": "decision"``: transitions, actions, and the
restart outcomes and operator commands the policy took in), and each file
opens with a header naming the policy's parameters, so replay decides with
what the live run decided with. When the file passes ``max_bytes`` it
becomes ``FILE.1`` (``FILE.1`` becomes ``FILE.2``, …) and at most
``backups`` old files are kept, so recording can stay on for weeks.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import IO, Any

from guardian.pipeline import Decision
from guardian.sample import (
    CoreReading, EngineReading, GatewayLoad, GpuProcess, GpuReading, Histogram, MigReading, NvmlReading, ProcReading, Sample,
)  # fmt: skip


class SampleRecorder:
    def __init__(self, path: Path, max_bytes: int = 256 * 2**20, backups: int = 3) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.header: dict[str, Any] | None = None  # written at the top of every new file
        self._file: IO[str] | None = None

    def write(self, item: Sample | Decision) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
            if self.header is not None and self._file.tell() == 0:
                self._file.write(json.dumps({"kind": "header", **self.header}, separators=(",", ":")) + "\n")
        record = item.to_record() if isinstance(item, Decision) else to_record(item)
        try:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
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


def from_record(record: dict[str, Any]) -> Sample:
    """A sample record back into a Sample (raises KeyError/TypeError on a record of another shape)."""
    nvml = record["nvml"]
    gpus = tuple(
        GpuReading(
            **{
                **g,
                "processes": _procs(g["processes"]),
                "mig": tuple(MigReading(**{**m, "processes": _procs(m["processes"])}) for m in g["mig"]),
            }
        )
        for g in nvml["gpus"]
    )
    engines = tuple(
        EngineReading(
            **{
                **e,
                "cores": tuple(
                    CoreReading(
                        **{
                            **c,
                            "histograms": {
                                k: Histogram(**{**h, "buckets": tuple(tuple(b) for b in h["buckets"])})
                                for k, h in c["histograms"].items()
                            },
                        }
                    )
                    for c in e["cores"]
                ),
                "processes": None if e["processes"] is None else tuple(ProcReading(**p) for p in e["processes"]),
            }
        )
        for e in record["engines"]
    )
    return Sample(
        t=record["t"],
        wall=record["wall"],
        nvml=NvmlReading(gpus=gpus, driver_version=nvml["driver_version"], error=nvml["error"]),
        engines=engines,
        gateway=tuple(GatewayLoad(**g) for g in record.get("gateway", ())),  # absent in records before the tuner
    )


def _procs(items: list[dict[str, Any]] | None) -> tuple[GpuProcess, ...] | None:
    return None if items is None else tuple(GpuProcess(**p) for p in items)
