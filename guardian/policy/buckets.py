"""Context-length buckets: which upstream pool a request goes to, from its estimated prompt length. Pure.

The estimate has to be cheap (it runs on every request, before the request
is admitted): prompt characters divided by a characters-per-token ratio,
calibrated per model (English text with Llama-3's tokenizer runs at about 4;
code and non-Latin scripts lower, so calibrate: ``guardian`` exposes the
estimate beside vLLM's own prompt-token counts). The estimate only picks a
bucket; vLLM still counts exactly and refuses what exceeds its limit.

Default buckets (DESIGN): 0–4096 tokens → the block-16 pool, 4097–32768 →
the block-32 pool, 32769–128000 → the block-32 pool as *preemptible* work;
over the largest bucket the request is refused with a 400 that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Bucket:
    name: str
    max_tokens: int  # inclusive upper bound of the estimated prompt length
    engines: tuple[str, ...]  # the upstream pool
    preemptible: bool = False  # low priority by nature: the first to wait when the breaker pauses low-priority work


@dataclass(frozen=True)
class Choice:
    bucket: Bucket | None  # None: longer than the largest bucket
    tokens: int  # the estimate


def prompt_chars(body: Any) -> int:
    """Characters of prompt in an OpenAI completions or chat body (token-id prompts count 4 per id)."""
    if not isinstance(body, dict):
        return 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, str) else 4 for p in prompt)
    total = 0
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):  # multi-part content: count the text parts
            total += sum(len(part.get("text", "")) for part in content if isinstance(part, dict))
    return total


def choose(buckets: Sequence[Bucket], chars: int, chars_per_token: float) -> Choice:
    """``buckets`` sorted by ``max_tokens``."""
    tokens = int(chars / chars_per_token) + 1
    for bucket in buckets:
        if tokens <= bucket.max_tokens:
            return Choice(bucket, tokens)
    return Choice(None, tokens)
