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
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, TypeVar

Labels = dict[str, str]
HELP_SLACK_BYTES = 4096  # a HELP line is looked for this far around its last place (values change length)
ABSENT_RECHECK_PARSES = 60  # a family missing from a target's page is looked for again every this many parses
RUN_GAP_BYTES = 1024  # wanted families closer than this are read as one run (with what lies between)
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
    """Parses pages from one target, remembering the series it has seen and where its families sit.

    A vLLM page carries the same few hundred series every poll, so the
    series key (name and label set, the text before the value) is looked up
    in a dict and only new keys pay for validation and label splitting. The
    returned label dicts are shared between pages: treat them as read-only.

    With a filter (``parse(text, families)``), the wanted families are read
    by a plan made from the page the first time: runs of wanted families
    that sit close together (with the small blocks between them, vLLM's
    ``_created`` families), each with the layout of its lines. A later page
    whose run has the same lines but for the values is read by one split and
    one comparison per run, where a block per family cost as much again in
    overhead as in reading; anything else (a new series, a timestamp, a
    family moved) is read family by family, and the plan made again.
    """

    def __init__(self, max_series: int = 20_000) -> None:
        self._series: dict[str, tuple[str, Labels]] = {}
        self._max_series = max_series
        self._plans: dict[frozenset[str], _Plan] = {}
        self._offsets: dict[str, int | None] = {}  # per family: where its HELP line was last time (None: missing)
        self._absent_checks: dict[str, int] = {}  # per family missing from the page: parses since it went missing

    def parse(self, text: str, families: frozenset[str] | None = None) -> Page:
        """Parse a page; with ``families``, only those families' samples are read.

        Filtering works on the ``# HELP`` blocks prometheus_client writes (one
        per family, the family named as in its samples: ``x_total``, ``x``
        for histograms, ``x_created``): blocks of other families are skipped
        whole, unread and unchecked. A page without HELP lines is read whole.
        """
        if not text or text.isspace():  # not strip(): a copy of the page
            raise ParseError("empty page")
        if not text.endswith("\n"):
            raise ParseError("page is truncated: the last line has no newline", truncated=True)
        if len(self._series) > self._max_series:
            self._series.clear()  # a target with churning labels: start over rather than grow
            self._plans.clear()
            self._offsets.clear()
        page = Page()
        if families is None or not text.startswith("# HELP "):
            self._lines(text, 0, len(text), page)
            return page
        plan = self._plans.get(families)
        if plan is not None:
            plan.parses += 1
            due = plan.absent and plan.parses % ABSENT_RECHECK_PARSES == 0
            appeared = due and any(self._help_line(text, family, recheck=True) >= 0 for family in plan.absent)
            if not appeared and self._by_plan(plan, text, page):
                return page
            page = Page()  # a run changed, or a missing family appeared: family by family, and a new plan
        return self._by_family(text, families, page)

    def forget(self) -> None:
        """The target went away (a restart may bring another version's page): look for every family afresh."""
        self._offsets.clear()
        self._absent_checks.clear()
        self._plans.clear()

    def _by_plan(self, plan: _Plan, text: str, page: Page) -> bool:
        """The page read run by run; False when a run is not where, or not what, it was."""
        for run in plan.runs:
            start = self._help_line(text, run.first)
            last = start if run.last == run.first else self._help_line(text, run.last)
            if start < 0 or last < start:
                return False
            stop = _block_end(text, last)
            if run.layout is None:
                if self._lines(text, start, stop, page):
                    return True  # # EOF
            elif not run.layout.read(text[start:stop], page):
                return False
        return True

    def _by_family(self, text: str, families: frozenset[str], page: Page) -> Page:
        """Each wanted family found by its HELP line and read line by line; the plan for the next pages made from them."""
        found = []
        for family in families:
            start = self._help_line(text, family)
            if start >= 0:
                found.append((start, family))
        found.sort()
        blocks = []
        for start, family in found:
            stop = _block_end(text, start)
            blocks.append((start, stop, family))
            if self._lines(text, start, stop, page):
                return page  # # EOF: no plan for a page that ends inside its families
        self._plans[families] = _Plan(self._runs(text, blocks, families), families - {f for _, f in found})
        return page

    def _runs(self, text: str, blocks: list[tuple[int, int, str]], families: frozenset[str]) -> list[_Run]:
        """Blocks closer than ``RUN_GAP_BYTES`` grouped into runs, each with its layout; a run that has none is split into its families."""
        groups: list[list[tuple[int, int, str]]] = []
        for block in blocks:
            if groups and block[0] - groups[-1][-1][1] <= RUN_GAP_BYTES:
                groups[-1].append(block)
            else:
                groups.append([block])
        runs = []
        for group in groups:
            layout = _Layout.of(text[group[0][0] : group[-1][1]], self._series, families)
            if layout is None and len(group) > 1:
                runs += [_Run(f, f, _Layout.of(text[a:b], self._series, families)) for a, b, f in group]
            else:
                runs.append(_Run(group[0][2], group[-1][2], layout))
        return runs

    def _help_line(self, text: str, family: str, recheck: bool = False) -> int:
        """Where ``family``'s HELP line starts, or -1; looked for near its last place, a missing one now and then (or on ``recheck``)."""
        header = f"# HELP {family} "
        last = self._offsets.get(family)
        if last is None and family in self._offsets and not recheck:  # missing last time: look again only now and then
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
    """A run's lines as they were: the text before each line's last space, the comment lines' ends, the samples to keep."""

    heads: tuple[str, ...]  # per line: the series key of a sample, the start of a comment
    comment_tails: tuple[str, ...]  # how the HELP and TYPE lines end ...
    comments: Callable[[tuple[str, ...]], tuple[str, ...]]  # ... picked from all lines' ends
    samples: Callable[[tuple[str, ...]], tuple[str, ...]]  # the sample lines' ends (their values)
    types: dict[str, str]  # the wanted families' TYPE lines
    segments: list[tuple[str, int, int, list[Labels]]]  # wanted samples: (sample name, first value, past the last, labels)

    def read(self, region: str, page: Page) -> bool:
        """``region``'s samples into ``page`` when its lines are the layout's but for the values; else False."""
        lines = region.split("\n")
        if lines[-1] == "":
            lines.pop()
        # split, transposed and picked in C: no Python loop over the lines
        heads, _, tails = zip(*map(str.rpartition, lines, repeat(" ", len(lines))))
        if heads != self.heads or self.comments(tails) != self.comment_tails:
            return False
        try:
            values = list(map(float, self.samples(tails)))
        except ValueError:
            return False
        page.types.update(self.types)
        samples = page.samples
        for name, low, high, labels in self.segments:
            found = samples.get(name)
            if found is None:
                samples[name] = list(zip(labels, values[low:high]))
            else:
                found.extend(zip(labels, values[low:high]))
        return True

    @classmethod
    def of(cls, region: str, series: dict[str, tuple[str, Labels]], families: frozenset[str]) -> _Layout | None:
        """None when the region is not HELP and TYPE lines and plain samples (other comments, timestamps, odd spacing)."""
        lines = region.split("\n")
        if lines[-1] == "":
            lines.pop()
        heads, comment_at, comment_tails, sample_at = [], [], [], []
        types: dict[str, str] = {}
        names: list[tuple[str, Labels] | None] = []  # per sample: its series, None in a family not wanted
        wanted = False
        for i, line in enumerate(lines):
            head, _, tail = line.rpartition(" ")
            heads.append(head)
            if line.startswith("# HELP "):
                wanted = line.split(" ", 3)[2] in families
            elif line.startswith("# TYPE "):
                parts = line.split()
                if len(parts) != 4:
                    return None
                if wanted:
                    types[parts[2]] = parts[3]
            elif not line or line[0] == "#":
                return None
            else:
                try:
                    float(tail)
                    known = series.get(head) or series.setdefault(head, _series_key(head))
                except (ValueError, ParseError):
                    return None
                sample_at.append(i)
                names.append(known if wanted else None)
                continue
            comment_at.append(i)
            comment_tails.append(tail)
        segments: list[tuple[str, int, int, list[Labels]]] = []
        for i, entry in enumerate(names):
            if entry is None:
                continue
            if segments and segments[-1][0] is entry[0] and segments[-1][2] == i:
                name, low, _, labels = segments[-1]
                segments[-1] = (name, low, i + 1, labels + [entry[1]])
            else:
                segments.append((entry[0], i, i + 1, [entry[1]]))
        return cls(tuple(heads), tuple(comment_tails), _picker(comment_at), _picker(sample_at), types, segments)


def _block_end(text: str, help_at: int) -> int:
    """Past the last line of the family block whose HELP line starts at ``help_at``: the next HELP line, or the page's end."""
    following = text.find("\n# HELP ", text.find("\n", help_at))
    return len(text) if following < 0 else following + 1


def _picker(indexes: list[int]) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    """A tuple of the items at ``indexes``, always a tuple (``itemgetter`` of one index gives the item itself)."""
    if len(indexes) == 1:
        only = indexes[0]
        return lambda items: (items[only],)
    return itemgetter(*indexes) if indexes else lambda items: ()


@dataclass(slots=True)
class _Run:
    """Wanted families next to each other on the page: from ``first``'s HELP line to the end of ``last``'s block."""

    first: str
    last: str
    layout: _Layout | None  # None: read line by line every time


@dataclass(slots=True)
class _Plan:
    """How one set of families is read from a target's pages."""

    runs: list[_Run]
    absent: frozenset[str]  # wanted families the page did not have: looked for every ABSENT_RECHECK_PARSES parses
    parses: int = 0


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
