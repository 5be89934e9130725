"""``guardian breaker`` and ``guardian ack``: an operator's word to the running guardian, through its API."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from guardian.commands.common import base_url, load_or_exit


def breaker(args: argparse.Namespace) -> int:
    if args.action == "force" and args.level is None:
        print("guardian breaker: force needs a level (0-3), e.g. guardian breaker force llama-8b 2", file=sys.stderr)
        return 2
    body = {"action": args.action, "who": args.who} | ({"level": args.level} if args.action == "force" else {})
    answer = _call_api("breaker", args.config, f"breaker/{args.engine}", body)
    if isinstance(answer, int):
        return answer
    pinned = f" (pinned by {answer['forced_by']})" if answer.get("forced") else " (the rules decide again)"
    print(f"{answer['engine']}: L{answer['level']}{pinned}" + (" [dry run]" if answer.get("dry_run") else ""))
    return 0


def ack(args: argparse.Namespace) -> int:
    answer = _call_api("ack", args.config, "alerts/ack", {"key": args.key, "who": args.who})
    if isinstance(answer, int):
        return answer
    print(f"{answer['key']}: acknowledged by {answer['acknowledged_by']}; no more repeats or escalation")
    return 0


def _call_api(command: str, config_path: Path, path: str, body: dict[str, object]) -> dict[str, Any] | int:
    """POST to the running guardian's API with the token from its config; an exit code when that fails."""

    config = load_or_exit(config_path)
    try:
        token = config.guardian.read_api_token()
    except OSError as exc:
        print(f"guardian {command}: cannot read the API token: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if token is None:
        print(f"guardian {command}: {config_path} sets no guardian.api_token_file: the API is off", file=sys.stderr)
        return 2
    url = f"{base_url(config)}/api/v1/{path}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        doc = json.loads(exc.read() or b"{}")
        extra = f" (firing: {', '.join(doc['firing']) or 'none'})" if "firing" in doc else ""
        print(f"guardian {command}: {url} answered {exc.code}: {doc.get('error', exc.reason)}{extra}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"guardian {command}: cannot reach guardian at {url}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1
