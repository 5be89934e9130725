"""SMS through Twilio's real client (``twilio.rest.Client(...).messages.create``), every call with a timeout.

The twilio library waits forever by default; here each call has
``timeout_seconds``. What Twilio answers decides what happens next, so
``send`` never raises; it says which of these it was:

| result | when | what the outbox does |
| --- | --- | --- |
| ``sent`` | 201 with a message SID | done |
| ``retry`` | 429 / 20429, 5xx, the connection refused or failed before the request went out | try again with backoff |
| ``auth`` | 401 / 20003 | its own alert (log, metric); keep the message and try again slowly |
| ``too_long`` | 21617 | send again, shortened to one segment |
| ``permanent`` | 21211 invalid number, 21610 unsubscribed, 21614 not a mobile, any other 4xx | drop it, with the reason |
| ``uncertain`` | a timeout or a reset after the request went out: Twilio may have sent it | send again, marked possibly duplicate |

The auth token comes from ``$TWILIO_AUTH_TOKEN`` or the systemd credential
``twilio-auth-token`` (``$CREDENTIALS_DIRECTORY``), never from the TOML; it
and the numbers stay out of logs (numbers are masked).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import requests
from twilio.base.exceptions import TwilioRestException
from twilio.http.http_client import TwilioHttpClient
from twilio.rest import Client
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

Result = Literal["sent", "retry", "auth", "too_long", "permanent", "uncertain"]

PERMANENT_CODES = {
    21211: "invalid 'To' number",
    21610: "the recipient unsubscribed (replied STOP)",
    21614: "'To' is not a mobile number",
    21612: "Twilio cannot route to this number",
    21408: "the account may not send to this region",
}
AUTH_CODE = 20003
TOO_MANY_CODE = 20429
TOO_LONG_CODE = 21617
TOKEN_ENV = "TWILIO_AUTH_TOKEN"
TOKEN_CREDENTIAL = "twilio-auth-token"

# twilio's own logger prints request bodies (numbers, text) at INFO: keep it to warnings
logging.getLogger("twilio.http_client").setLevel(logging.WARNING)


@dataclass(frozen=True)
class Sent:
    result: Result
    detail: str
    sid: str | None = None
    code: int | None = None


def mask(number: str) -> str:
    """+4915112345678 -> +49*********78: enough to tell two contacts apart in a log, not to call them."""
    if len(number) <= 5:
        return "*" * len(number)
    return number[:3] + "*" * (len(number) - 5) + number[-2:]


def read_token() -> str | None:
    """The auth token from the environment or systemd's credential directory; None when neither has one."""
    token = os.environ.get(TOKEN_ENV)
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if not token and creds and (Path(creds) / TOKEN_CREDENTIAL).exists():
        token = (Path(creds) / TOKEN_CREDENTIAL).read_text().strip()
    return token or None


class TwilioSender:
    def __init__(
        self,
        account_sid: str,
        auth_token: str,
        from_number: str | None = None,
        messaging_service_sid: str | None = None,
        status_callback: str | None = None,
        timeout: float = 10.0,
        api_url: str = "https://api.twilio.com",
    ) -> None:
        self.from_number = from_number
        self.messaging_service_sid = messaging_service_sid
        self.status_callback = status_callback
        self.timeout = timeout
        self._client = Client(account_sid, auth_token, http_client=TwilioHttpClient(timeout=timeout))
        self._client.api.base_url = api_url.rstrip("/")

    def send(self, to: str, body: str) -> Sent:
        """One message; blocking (run it in a thread). Never raises."""
        kwargs: dict[str, str] = {"to": to, "body": body}
        if self.messaging_service_sid:
            kwargs["messaging_service_sid"] = self.messaging_service_sid
        if self.from_number:
            kwargs["from_"] = self.from_number
        if self.status_callback:
            kwargs["status_callback"] = self.status_callback
        try:
            message = self._client.messages.create(**kwargs)
        except TwilioRestException as exc:
            return classify(exc.status, exc.code, exc.msg)
        except requests.exceptions.ConnectTimeout:
            return Sent("retry", f"no connection to Twilio within {self.timeout:g}s")
        except requests.exceptions.Timeout:
            return Sent("uncertain", f"Twilio did not answer within {self.timeout:g}s; it may have sent the message")
        except requests.exceptions.ConnectionError as exc:
            if _never_sent(exc):
                return Sent("retry", f"cannot connect to Twilio: {_reason(exc)}")
            return Sent("uncertain", f"the connection broke after the request went out: {_reason(exc)}")
        except requests.exceptions.RequestException as exc:
            return Sent("retry", f"{type(exc).__name__}: {_reason(exc)}")
        if not message.sid:
            return Sent("uncertain", "Twilio answered without a message SID")
        return Sent("sent", f"accepted as {message.sid} ({message.status})", sid=message.sid)


def classify(status: int, code: int | None, msg: str = "") -> Sent:
    text = f"HTTP {status}" + (f", Twilio error {code}" if code else "") + (f": {msg[:160]}" if msg else "")
    if status == 429 or code == TOO_MANY_CODE or status >= 500:
        return Sent("retry", text, code=code)
    if status == 401 or code == AUTH_CODE:
        return Sent("auth", text + " (check the account SID and the auth token)", code=code)
    if code == TOO_LONG_CODE:
        return Sent("too_long", text, code=code)
    reason = PERMANENT_CODES.get(code or 0)
    return Sent("permanent", f"{text}" + (f" ({reason})" if reason else ""), code=code)


def _never_sent(exc: requests.exceptions.ConnectionError) -> bool:
    """Refused or unreachable: the request cannot have reached Twilio, so a retry is no duplicate."""
    cause = exc.args[0] if exc.args else None
    reason = getattr(cause, "reason", cause)
    return isinstance(reason, (NewConnectionError, ConnectTimeoutError))


def _reason(exc: BaseException) -> str:
    return str(exc)[:200]
