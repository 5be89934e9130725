"""Context-length buckets: which upstream pool a request goes to, from its estimated prompt length. Pure.

The estimate has to be cheap (it runs on every request, before the request
is admitted): token ids count one each, text is its characters divided by a characters-per-token ratio,
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


class BadRequest(ValueError):
    """A body that is not an OpenAI completions or chat request: the client hears why (400), nothing is logged as a crash."""


def prompt_tokens(body: Any, chars_per_token: float, chat: bool) -> int:
    """The estimated prompt length of an OpenAI completions (``prompt``) or chat (``messages``) body.

    Every shape vLLM takes is counted: a string, a batch of strings, token
    ids (each exactly one token), a batch of token-id lists; a batch counts
    its total. Chat content is a string or a list of parts whose ``text``
    counts. Anything else raises ``BadRequest`` saying what is wrong.
    """
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if chat:
        return _chars_tokens(_message_chars(body.get("messages")), chars_per_token)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _chars_tokens(len(prompt), chars_per_token)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return _chars_tokens(sum(len(p) for p in prompt), chars_per_token)
        if _token_ids(prompt):
            return len(prompt)
        if all(isinstance(p, list) and p and _token_ids(p) for p in prompt):
            return sum(len(p) for p in prompt)
    raise BadRequest("'prompt' must be a non-empty string, a list of strings, a list of token ids (integers) "
                     "or a list of lists of token ids")  # fmt: skip


def _token_ids(values: list[Any]) -> bool:
    """Non-negative integers only (``type is int``: true and false are not ids); a 128k list takes a few ms."""
    return all(type(v) is int for v in values) and min(values) >= 0


def _message_chars(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages")
    total = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object with a 'role' and a 'content'")
        content = message.get("content")
        if content is None or isinstance(content, str):
            total += len(content or "")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    raise BadRequest(f"messages[{i}].content[{j}] must be an object such as {{\"type\": \"text\", \"text\": \"…\"}}")
                text = part.get("text", "")
                if not isinstance(text, str):
                    raise BadRequest(f"messages[{i}].content[{j}].text must be a string")
                total += len(text)
        else:
            raise BadRequest(f"messages[{i}].content must be a string or a list of content parts")
    return total


def _chars_tokens(chars: int, chars_per_token: float) -> int:
    return int(chars / chars_per_token) + 1


def choose(buckets: Sequence[Bucket], tokens: int) -> Choice:
    """``buckets`` sorted by ``max_tokens``."""
    for bucket in buckets:
        if tokens <= bucket.max_tokens:
            return Choice(bucket, tokens)
    return Choice(None, tokens)
