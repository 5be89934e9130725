"""Memory logs operators already have, read into one series per GPU.

Three kinds, told apart by their first lines:

- ``nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total[,…] --format=csv[,noheader][,nounits] -l N``
  (with or without the header, with or without units, headers repeated where logs were concatenated; the GPU
  named by ``index``, ``uuid`` or ``pci.bus_id``, or by its place among the rows of one timestamp where the
  query named none);
- plain ``nvidia-smi -l N`` (the table it prints every N seconds), which is what most people leave running;
- guardian's own record files (``guardian run --record``).

A row that cannot be read is reported with its file and line and skipped; it never ends the run.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

MiB = 2**20
GiB = 2**30
_QUERY_ORDER = ("timestamp", "index", "memory.used", "memory.total", "utilization.gpu")
_UNITS: dict[str, float] = {"mib": MiB, "gib": GiB, "kib": 1024, "b": 1, "mb": 10**6, "gb": 10**9}
# the columns that name a GPU, best first (nvidia-smi takes gpu_uuid and gpu_bus_id for uuid and pci.bus_id)
_GPU_NAMES = ("index", "uuid", "gpu_uuid", "pci.bus_id", "gpu_bus_id")


@dataclass
class Series:
    gpu: str
    source: str
    times: list[float] = field(default_factory=list)  # unix seconds
    used: list[float] = field(default_factory=list)  # bytes
    totals: Counter[float] = field(default_factory=Counter)  # memory.total as the rows give it

    @property
    def total(self) -> float | None:
        """The card's memory: the value most rows agree on (a row cut while written gives another)."""
        return self.totals.most_common(1)[0][0] if self.totals else None

    def add(self, t: float, used: float, total: float | None) -> None:
        self.times.append(t)
        self.used.append(used)
        if total is not None:
            self.totals[total] += 1


def read(paths: list[Path]) -> tuple[list[Series], list[str]]:
    """All GPUs' series from all files, and the problems met on the way (file:line: why)."""
    series: dict[tuple[str, str], Series] = {}
    problems: list[str] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            problems.append(f"{path}: cannot read: {exc.strerror or exc}")
            continue
        first = next((line for line in text.splitlines() if line.strip()), "")
        if first.lstrip().startswith("{"):
            _read_jsonl(path, text, series, problems)
        elif _TABLE_BANNER.search(text[:8192]):
            _read_table(path, _whole_lines(path, text, problems), series, problems)
        else:
            _read_csv(path, _whole_lines(path, text, problems), series, problems)
    for s in series.values():  # a log may be unsorted when files were concatenated
        order = sorted(range(len(s.times)), key=s.times.__getitem__)
        s.times = [s.times[i] for i in order]
        s.used = [s.used[i] for i in order]
    return [s for s in series.values() if s.times], problems


def _whole_lines(path: Path, text: str, problems: list[str]) -> list[str]:
    """The file's lines, less a last one cut off mid-write (nvidia-smi writes a line and its newline at once)."""
    lines = text.splitlines()
    if lines and not text.endswith(("\n", "\r")):
        problems.append(f"{path}:{len(lines)}: last line cut off mid-write, skipped: {lines[-1][:80]!r}")
        lines.pop()
    return lines


def _series(series: dict[tuple[str, str], Series], path: Path, gpu: str) -> Series:
    return series.setdefault((str(path), gpu), Series(gpu=gpu, source=str(path)))


# -- nvidia-smi --query-gpu=… --format=csv ------------------------------------------------


def _read_csv(path: Path, lines: list[str], series: dict[tuple[str, str], Series], problems: list[str]) -> None:
    columns: list[str] | None = None
    units: list[float | None] = []
    gpu_column: str | None = "index"
    # without a column naming the GPU, nvidia-smi still lists the GPUs in index order each time it polls: the
    # rows of one timestamp are GPU 0, 1, … in turn
    stamp, place = "", 0
    for lineno, row in enumerate(csv.reader(lines, skipinitialspace=True), 1):
        if not row or not "".join(row).strip():
            continue
        if row[0].strip().lower().startswith("timestamp") or _is_header(row):
            columns, units = _header(row)
            gpu_column = next((name for name in _GPU_NAMES if name in columns), None)
            missing = {"timestamp", "memory.used"} - set(columns)
            if missing:
                problems.append(f"{path}:{lineno}: header lacks {', '.join(sorted(missing))}; rows skipped until the next header")
                columns = []
            elif gpu_column is None:
                problems.append(
                    f"{path}:{lineno}: no column names the GPU (index, uuid or pci.bus_id): "
                    "GPUs are told apart by their order among the rows of each timestamp"
                )
            continue
        if columns is None:  # no header: the query's order, as wide as the first row
            columns = list(_QUERY_ORDER[: len(row)])
        names = columns
        if not names:
            continue
        if len(row) != len(names):
            problems.append(f"{path}:{lineno}: {len(row)} fields, expected {len(names)}: {','.join(row)[:80]!r}")
            continue
        try:
            values = dict(zip(names, row))
            t = _timestamp(values["timestamp"])
            unit = units[names.index("memory.used")] if units else None
            used = _bytes(values["memory.used"], unit)
            total = _bytes(values["memory.total"], units[names.index("memory.total")] if units else None) if "memory.total" in values else None
        except (ValueError, KeyError) as exc:
            problems.append(f"{path}:{lineno}: {exc}")
            continue
        if gpu_column is not None:
            gpu = values[gpu_column].strip()
        else:
            place = place + 1 if values["timestamp"] == stamp else 0
            stamp, gpu = values["timestamp"], str(place)
        _series(series, path, gpu).add(t, used, total)


def _is_header(row: list[str]) -> bool:
    """A header whose first column is not the timestamp (``--query-gpu=index,timestamp,…``)."""
    return "timestamp" in (cell.strip().lower() for cell in row) and "memory.used" in (
        cell.strip().lower().partition(" [")[0] for cell in row
    )


def _header(row: list[str]) -> tuple[list[str], list[float | None]]:
    names: list[str] = []
    units: list[float | None] = []
    for cell in row:
        cell = cell.strip()
        name, _, unit = cell.partition(" [")
        names.append(name.strip().lower())
        units.append(_UNITS.get(unit.rstrip("]").strip().lower()) if unit else None)
    return names, units


_DAYS: dict[str, float] = {}


def _timestamp(text: str) -> float:
    text = text.strip()
    # nvidia-smi's own "2024/05/01 12:34:56.789", a million times: the day parsed once
    if len(text) >= 19 and text[4] == "/" and text[10] == " " and text[13] == ":" and text[16] == ":":
        day = _DAYS.get(text[:10])
        if day is None:
            try:
                day = _DAYS[text[:10]] = datetime.strptime(text[:10], "%Y/%m/%d").replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                day = None
        if day is not None and text[11:13].isdigit() and text[14:16].isdigit() and text[17:19].isdigit():
            h, m, sec = int(text[11:13]), int(text[14:16]), int(text[17:19])
            frac = text[19:]
            if h < 24 and m < 60 and sec < 61 and (not frac or (frac[0] == "." and frac[1:].isdigit())):
                return day + h * 3600 + m * 60 + sec + (float(frac) if frac else 0.0)
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S.%f"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise ValueError(f"timestamp {text[:40]!r} is not like 2024/05/01 12:34:56.789")


def _bytes(text: str, header_unit: float | None) -> float:
    """'12345 MiB' or '12345' (nounits: the header's unit, MiB when there is none)."""
    text = text.strip()
    number, _, unit = text.partition(" ")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"memory value {text[:40]!r} is not a number") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"memory value {text[:40]!r} is not a size")
    scale = _UNITS.get(unit.strip().lower()) if unit else header_unit
    if unit and scale is None:
        raise ValueError(f"unknown unit {unit!r}")
    return value * (scale or MiB)


# -- plain nvidia-smi -l N -------------------------------------------------------------------

_TABLE_BANNER = re.compile(r"^\|\s*NVIDIA-SMI\s+\d", re.MULTILINE)
# "Mon Dec  7 03:27:19 2026": the line nvidia-smi prints over each table (local time, to the second)
_TABLE_TIME = re.compile(r"^\s*[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\s*$")
# "|   0  NVIDIA H100 80GB HBM3          On  | 00000000:18:00.0 Off |": a GPU's first line, its index first
_TABLE_GPU = re.compile(r"^\|\s+(\d+)\s+\S.*\|.*\|")
# "| N/A   34C    P0    69W / 700W |   4321MiB / 81559MiB |": its memory, used and total, on a line after it
_TABLE_MEMORY = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|")
# the sections after the GPUs': a MIG instance's memory and a process's are not the card's
_TABLE_END = re.compile(r"^\|\s*(MIG devices|Processes):")


def _read_table(path: Path, lines: list[str], series: dict[tuple[str, str], Series], problems: list[str]) -> None:
    """Each table's GPUs, at the time printed over it. A GPU whose memory line the table lacks (cut off, or
    ``[N/A]``) is reported; a table before any time (a file that begins mid-table) is skipped whole: its GPU lines
    are read only after a time line."""
    t: float | None = None
    gpu: tuple[int, str] | None = None  # a GPU's first line, its memory line not read yet: (line number, index)
    in_gpus = False
    for lineno, line in enumerate(lines, 1):
        if _TABLE_TIME.match(line):
            if gpu is not None:
                problems.append(f"{path}:{gpu[0]}: GPU {gpu[1]} has no memory line")
            t = datetime.strptime(" ".join(line.split()), "%a %b %d %H:%M:%S %Y").replace(tzinfo=timezone.utc).timestamp()
            gpu, in_gpus = None, True
            continue
        if not in_gpus:
            continue
        if _TABLE_END.match(line):
            in_gpus = False
            continue
        if gpu is not None and (memory := _TABLE_MEMORY.search(line)):
            used, total = (float(n) * MiB for n in memory.groups())
            assert t is not None
            _series(series, path, gpu[1]).add(t, used, total)
            gpu = None
            continue
        if first := _TABLE_GPU.match(line):
            if gpu is not None:
                problems.append(f"{path}:{gpu[0]}: GPU {gpu[1]} has no memory line")
            gpu = (lineno, first.group(1))
    if gpu is not None:
        problems.append(f"{path}:{gpu[0]}: GPU {gpu[1]} has no memory line")


# -- guardian run --record ----------------------------------------------------------------------


def _read_jsonl(path: Path, text: str, series: dict[tuple[str, str], Series], problems: list[str]) -> None:
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{lineno}: not JSON ({exc.msg})")
            continue
        if isinstance(record, dict) and record.get("kind") in ("header", "decision"):
            continue  # the policy's lines in a record file: replay reads them, the leak analysis needs none
        if not isinstance(record, dict) or record.get("kind") != "sample":
            kind = record.get("kind") if isinstance(record, dict) else type(record).__name__
            problems.append(f"{path}:{lineno}: not a guardian sample record (kind={kind!r})")
            continue
        try:
            wall = float(record["wall"])
            gpus = record["nvml"]["gpus"]
        except (KeyError, TypeError, ValueError):
            problems.append(f"{path}:{lineno}: sample record without wall time or nvml.gpus")
            continue
        for gpu in gpus:
            used = gpu.get("memory_used_bytes") if isinstance(gpu, dict) else None
            if used is None:
                continue  # unknown in that poll: a gap, not a zero
            total = gpu.get("memory_total_bytes")
            _series(series, path, str(gpu.get("index"))).add(wall, float(used), float(total) if total else None)
