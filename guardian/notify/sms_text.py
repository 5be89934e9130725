"""SMS bodies that fit a segment budget, most important facts first.

An SMS is GSM-7 (160 characters, 153 per part when split) unless one
character falls outside that alphabet, and then the whole message is UCS-2
(70, 67 per part): one "→" or "…" more than halves what fits, and carriers
bill per part. So text is first folded to GSM-7 where a plain equivalent
exists, then the facts are added in order of importance until the budget is
spent; what does not fit is cut, never the start. Twilio refuses bodies over
1600 characters (error 21617).
"""

from __future__ import annotations

from dataclasses import dataclass

TWILIO_MAX_CHARS = 1600

_GSM_BASIC = set(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
_GSM_EXTENDED = set("^{}\\[~]|€\f")  # two septets each (escape + character)
_FOLD = {
    "…": "...", "→": "->", "←": "<-", "—": "-", "–": "-", "‘": "'", "’": "'", "“": '"', "”": '"',
    "≥": ">=", "≤": "<=", "×": "x", "·": ".", "\t": " ", "°": "deg", "µ": "u", "•": "*",
}  # fmt: skip


@dataclass(frozen=True)
class Encoded:
    text: str
    encoding: str  # "GSM-7" or "UCS-2"
    units: int  # septets (GSM-7) or UTF-16 code units (UCS-2)
    segments: int


def fold(text: str) -> str:
    """Replace characters that would force UCS-2 with plain GSM-7 equivalents where one exists."""
    return "".join(_FOLD.get(ch, ch) for ch in text)


def encode(text: str) -> Encoded:
    if all(ch in _GSM_BASIC or ch in _GSM_EXTENDED for ch in text):
        units = sum(2 if ch in _GSM_EXTENDED else 1 for ch in text)
        single, part = 160, 153
        encoding = "GSM-7"
    else:
        units = sum(2 if ord(ch) > 0xFFFF else 1 for ch in text)
        single, part = 70, 67
        encoding = "UCS-2"
    segments = 1 if units <= single else -(-units // part)
    return Encoded(text, encoding, units, segments)


def fit(facts: list[str], max_segments: int, separator: str = " | ") -> str:
    """Join ``facts`` (most important first) into a body of at most ``max_segments`` parts and 1600 characters."""
    body = ""
    for fact in (fold(f).strip() for f in facts):
        if not fact:
            continue
        candidate = f"{body}{separator}{fact}" if body else fact
        if _fits(candidate, max_segments):
            body = candidate
            continue
        if not body:  # even the first fact is too long: cut it
            body = _cut(fact, max_segments)
        break
    return body


def _fits(text: str, max_segments: int) -> bool:
    return len(text) <= TWILIO_MAX_CHARS and encode(text).segments <= max_segments


def _cut(text: str, max_segments: int) -> str:
    low, high = 0, len(text)
    while low < high:  # the longest prefix that fits with the "..." mark
        mid = (low + high + 1) // 2
        if _fits(text[:mid] + "...", max_segments):
            low = mid
        else:
            high = mid - 1
    return text[:low].rstrip() + "..."
