"""A strict, fast parser for the Prometheus text exposition format (0.0.4).

Why not ``prometheus_client.parser``: it walks label strings character by
character and builds a ``Metric`` object per family, which costs several
milliseconds per vLLM page; guardian parses one page per engine every second.
This parser leaves label splitting to one compiled regex and keeps samples as
plain tuples grouped by sample name, which is the shape the vLLM extractor
looks things up by.

Why strict: a page that is cut off or contains a line that is not a sample is
refused whole (``ParseError`` with the line number). Guardian then treats the
engine as unknown for that poll instead of acting on half a page, where a
missing ``+Inf`` bucket or a vanished gauge would look like a real change.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

Labels = dict[str, str]
HELP_SLACK_BYTES = 4096  # a HELP line is looked for this far around its last place (values change length)
ABSENT_RECHECK_PARSES = 60  # a family missing from a target's page is looked for again every this many parses
_T = TypeVar("_T")

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# Label values use the "unrolled loop" form, which is several times faster
# than an alternation per character. The strict form (no whitespace, as every
# Prometheus client writes it) is tried first; the tolerant one only if it fails.
_VALUE = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
_LABEL_RE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)=" + _VALUE + ",?")
_LABELS_STRICT_RE = re.compile(r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*(?:\\.[^"\\]*)*",?)*\Z')
_LABEL_LOOSE_RE = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*" + _VALUE + r"\s*,?")
_LABELS_LOOSE_RE = re.compile(
    r'(?:\s*[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"[^"\\]*(?:\\.[^"\\]*)*"\s*(?:,|\Z))*\s*\Z'
)
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


class ParseError(ValueError):
    """The page is not valid Prometheus text; ``line`` is 1-based (0: the whole page)."""

    def __init__(self, message: str, line: int = 0, truncated: bool = False) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.message = message
        self.line = line
        self.truncated = truncated


@dataclass(slots=True)
class Page:
    """Samples grouped by sample name (``foo_bucket`` and ``foo_sum`` are separate keys)."""

    samples: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> list[tuple[Labels, float]]:
        return self.samples.get(name, [])

    def family_type(self, sample_name: str) -> str | None:
        """The declared TYPE of the family a sample belongs to, or None if undeclared."""
        declared = self.types.get(sample_name)
        if declared is not None:
            return declared
        for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_info"):
            if sample_name.endswith(suffix):
                declared = self.types.get(sample_name[: -len(suffix)])
                if declared is not None:
                    return declared
        return None


class Parser:
    """Parses pages from one target, remembering the series it has seen.

    A vLLM page carries the same few hundred series every poll, so the
    series key (name and label set, the text before the value) is looked up
    in a dict and only new keys pay for validation and label splitting. The
    returned label dicts are shared between pages: treat them as read-only.
    """

    def __init__(self, max_series: int = 20_000) -> None:
        self._series: dict[str, tuple[str, Labels]] = {}
        self._max_series = max_series
        self._layouts: dict[str, _Layout | None] = {}
        self._offsets: dict[str, int | None] = {}  # per family: where its HELP line was last time (None: missing)
        self._absent_checks: dict[str, int] = {}  # per family missing from the page: parses since it went missing

    def parse(self, text: str, families: frozenset[str] | None = None) -> Page:
        """Parse a page; with ``families``, only those families' samples are read.

        Filtering works on the ``# HELP`` blocks prometheus_client writes (one
        per family, the family named as in its samples: ``x_total``, ``x``
        for histograms, ``x_created``): blocks of other families are skipped
        whole, unread and unchecked. A page without HELP lines is read whole.
        """
        if not text.strip():
            raise ParseError("empty page")
        if not text.endswith("\n"):
            raise ParseError("page is truncated: the last line has no newline", truncated=True)
        if len(self._series) > self._max_series:
            self._series.clear()  # a target with churning labels: start over rather than grow
            self._layouts.clear()
            self._offsets.clear()
        page = Page()
        if families is None or not text.startswith("# HELP "):
            self._lines(text, 0, len(text), page)
            return page
        # the wanted blocks are found by their HELP lines, near where they were last time: the page is
        # never split, copied or walked whole, and only the blocks read are sliced
        found = []
        for family in families:
            start = self._help_line(text, family)
            if start >= 0:
                found.append((start, family))
        found.sort()
        for start, family in found:
            eol = text.find("\n", start)
            following = text.find("\n# HELP ", eol)
            if self._block(family, text, eol + 1, len(text) if following < 0 else following + 1, page):
                break
        return page

    def forget(self) -> None:
        """The target went away (a restart may bring another version's page): look for every family afresh."""
        self._offsets.clear()
        self._absent_checks.clear()

    def _help_line(self, text: str, family: str) -> int:
        """Where ``family``'s HELP line starts, or -1; looked for near its last place, a missing one now and then."""
        header = f"# HELP {family} "
        last = self._offsets.get(family)
        if last is None and family in self._offsets:  # missing last time: look again only now and then
            self._absent_checks[family] = checks = self._absent_checks.get(family, 0) + 1
            if checks % ABSENT_RECHECK_PARSES:
                return -1
        at = -1
        if last is not None:
            if text.startswith(header, last) and (last == 0 or text[last - 1] == "\n"):
                return last  # where it was: nothing before it changed length
            for slack in (256, HELP_SLACK_BYTES):
                at = text.find(header, max(0, last - slack), last + slack + len(header))
                if at >= 0:
                    break
        if at < 0:
            at = text.find(header)
        while at > 0 and text[at - 1] != "\n":  # the name inside another line, not a HELP line of its own
            at = text.find(header, at + 1)
        self._offsets[family] = at if at >= 0 else None
        return at

    def _block(self, family: str, text: str, start: int, stop: int, page: Page) -> bool:
        """A family's block (after its HELP line); True when ``# EOF`` was reached.

        A target's blocks carry the same series poll after poll: when the
        block's series are the ones it had last time (compared as a list,
        in C), only the values are read and the samples are built by
        slices; anything else is read line by line (``_lines``) and its
        layout remembered for the next poll.
        """
        lines = text[start:stop].split("\n")
        if lines[-1] == "":
            lines.pop()
        layout = self._layouts.get(family)
        if layout is not None and lines and lines[0] == layout.type_line:
            parts = [line.rpartition(" ") for line in lines[1:]]
            if [p[0] for p in parts] == layout.keys:
                try:
                    values = list(map(float, [p[2] for p in parts]))
                except ValueError:
                    values = None  # read line by line: the error (or a timestamp) is found there
                if values is not None:
                    _type_line(layout.type_line, page)
                    samples = page.samples
                    for name, low, high, labels in layout.segments:
                        found = samples.get(name)
                        if found is None:
                            samples[name] = list(zip(labels, values[low:high]))
                        else:
                            found.extend(zip(labels, values[low:high]))
                    return False
        if self._lines(text, start, stop, page):
            return True
        self._layouts[family] = _Layout.of(lines, self._series)
        return False

    def _sample(self, line: str) -> tuple[tuple[str, Labels], float]:
        """A line whose series is not known yet (or carries a timestamp): checked, and its series remembered."""
        close = line.rfind("}")
        if close >= 0:
            key, rest = line[: close + 1], line[close + 1 :]
        else:
            space = line.find(" ")
            if space < 0:
                raise ParseError(f"sample without a value: {line[:80]!r}")
            key, rest = line[:space], line[space:]
        known = self._series.get(key)
        if known is None:
            known = self._series[key] = _series_key(key)
        try:
            return known, float(rest)
        except ValueError:
            return known, _value_with_timestamp(rest, line)

    @staticmethod
    def _checked(read: Callable[..., _T], text: str, start: int, line: str, *more: Any) -> _T:
        """``read(line, *more)``, its ``ParseError`` given the line's number in ``text`` (counted only then)."""
        try:
            return read(line, *more)
        except ParseError as exc:
            raise ParseError(exc.message, text.count("\n", 0, text.find(line, start)) + 1) from None

    def _lines(self, text: str, start: int, stop: int, page: Page) -> bool:
        """Read the sample and TYPE lines of ``text[start:stop]`` into ``page``; True when ``# EOF`` was reached.

        Lines are not counted as they are read: an error's line number is worked out when there is one.
        """
        samples = page.samples
        series = self._series
        name: str | None = None  # the sample name of the line before, and its list: a family's samples come together
        entries: list[tuple[Labels, float]] = []
        for line in text[start:stop].split("\n"):
            if not line:
                continue
            if line[0] == "#":
                if line.startswith("# TYPE "):
                    self._checked(_type_line, text, start, line, page)
                elif line.startswith("# EOF"):
                    return True
                continue
            # the series is the text before the last space (the value after it), looked up whole: a known
            # series costs one split and one lookup; anything else (new, a timestamp, odd spacing) is read slowly
            key, _, rest = line.rpartition(" ")
            known = series.get(key)
            try:
                value = float(rest)
            except ValueError:
                known = None
            if known is None:
                known, value = self._checked(self._sample, text, start, line)
            if known[0] is not name:  # names are interned: one comparison per line, one lookup per sample name
                name = known[0]
                found = samples.get(name)
                if found is None:
                    found = samples[name] = []
                entries = found
            entries.append((known[1], value))
        return False


@dataclass(slots=True)
class _Layout:
    """A family block's TYPE line, its sample lines' series keys, and the runs of one sample name among them."""

    type_line: str
    keys: list[str]
    segments: list[tuple[str, int, int, list[Labels]]]  # (sample name, first line, past the last, their labels)

    @classmethod
    def of(cls, lines: list[str], series: dict[str, tuple[str, Labels]]) -> _Layout | None:
        """None when the block is not a TYPE line and plain samples of known series (comments, timestamps, odd spacing)."""
        if not lines or not lines[0].startswith("# TYPE "):
            return None
        keys = [line.rpartition(" ")[0] for line in lines[1:]]
        known = [series.get(key) for key in keys]
        if any(k is None for k in known) or any(line[:1] in ("#", "") for line in lines[1:]):
            return None
        names = [k[0] for k in known]  # type: ignore[index]
        starts = [i for i in range(len(names)) if i == 0 or names[i] is not names[i - 1]]  # a sample name's run begins
        segments = [(names[low], low, high, [k[1] for k in known[low:high]])  # type: ignore[index]
                    for low, high in zip(starts, starts[1:] + [len(names)])]  # fmt: skip
        return cls(lines[0], keys, segments)


def parse(text: str) -> Page:
    """Parse one page with no memory of earlier pages."""
    return Parser().parse(text)


def _series_key(key: str) -> tuple[str, Labels]:
    brace = key.find("{")
    if brace < 0:
        name, labels = key, {}
    elif not key.endswith("}"):
        raise ParseError(f"unterminated label set in {key[:80]!r}")
    else:
        name = key[:brace]
        labels = _labels(key[brace + 1 : -1], key)
    if not _NAME_RE.match(name):
        raise ParseError(f"invalid metric name {name[:80]!r}")
    return sys.intern(name), labels  # interned: lines compare names by identity


def _value_with_timestamp(rest: str, line: str) -> float:
    fields = rest.split()
    if len(fields) == 2:
        try:
            float(fields[1])
            return float(fields[0])
        except ValueError:
            pass
    raise ParseError(f"expected a number (and optional timestamp) after the series in {line[:80]!r}")


def _type_line(line: str, page: Page) -> None:
    parts = line.split()
    if len(parts) != 4:
        raise ParseError(f"malformed TYPE line {line[:80]!r}")
    page.types[parts[2]] = parts[3]


def _labels(text: str, line: str) -> Labels:
    if not text:
        return {}
    if _LABELS_STRICT_RE.match(text):
        pairs = _LABEL_RE.findall(text)
    elif _LABELS_LOOSE_RE.match(text):
        pairs = _LABEL_LOOSE_RE.findall(text)
    else:
        raise ParseError(f"malformed labels in {line[:80]!r}")
    if "\\" not in text:
        return dict(pairs)
    return {k: _ESCAPE_RE.sub(_unescape, v) for k, v in pairs}


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPES[match.group(0)]


def parse_le(text: str) -> float:
    """A histogram bucket bound: ``+Inf`` and plain floats."""
    value = float(text)
    if math.isnan(value):
        raise ValueError("le is NaN")
    return value
