"""The OpenAI API's bodies as vLLM writes them: errors, usage, a finished completion or chat answer."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


async def read_json(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return error(400, "The request body is not valid JSON.", "BadRequestError")
    if not isinstance(body, dict):
        return error(400, "The request body must be a JSON object.", "BadRequestError")
    return body


def error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status)


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def final(rid: str, created: int, model: str, chat: bool, tokens: int, reason: str, prompt: int) -> dict[str, Any]:
    text = " tok" * tokens
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                  "finish_reason": reason}  # fmt: skip
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], "usage": usage(prompt, tokens)}
