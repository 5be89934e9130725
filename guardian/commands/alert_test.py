"""``guardian test-alert``: one SMS through the configured Twilio account, to prove the path before a night needs it."""

from __future__ import annotations

import argparse
import socket
import sys
from datetime import datetime, timezone

from guardian import config as cfg
from guardian.commands.common import load_or_exit
from guardian.notify.sms import TwilioSender, mask, read_token
from guardian.notify.sms_text import encode, fit


def main(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    sms = config.notify.sms
    if sms is None:
        print(f"guardian test-alert: {args.config} has no [notify.sms]", file=sys.stderr)
        return 2
    try:
        cfg.ContactSection(name="test", number=args.to)
    except Exception:
        print(f"guardian test-alert: {args.to!r} is not an E.164 number like +4915112345678", file=sys.stderr)
        return 2
    at = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    body = fit([f"TEST from vllm-guardian on {socket.gethostname()}", f"at {at}", "no action needed"], sms.max_segments)
    encoded = encode(body)
    print(f"to {mask(args.to)}: {body!r} ({encoded.encoding}, {encoded.segments} segment{'s' if encoded.segments > 1 else ''})")
    if args.dry_run:
        return 0
    token = read_token()
    if token is None:
        print("guardian test-alert: no auth token: set $TWILIO_AUTH_TOKEN (or the twilio-auth-token credential)", file=sys.stderr)
        return 2
    sender = TwilioSender(sms.account_sid, token, sms.from_number, sms.messaging_service_sid, sms.status_callback,
                          sms.timeout_seconds, sms.api_url)  # fmt: skip
    sent = sender.send(args.to, body)
    print(f"{sent.result}: {sent.detail}")
    return 0 if sent.result == "sent" else 1
