"""A local stand-in for Twilio's Messages API that checks what Twilio checks, and can be scripted to fail.

POST /2010-04-01/Accounts/{AccountSid}/Messages.json with HTTP basic auth
(the account SID and the auth token) and form fields To, Body and From or
MessagingServiceSid. Each request takes the next scripted answer: ``201``,
an HTTP status with a Twilio error code (``(429, 20429)``), ``"hang"`` (no
answer for a while), or ``"reset"`` (the connection is dropped after the
request was read). When the script is empty every request gets 201.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

SID = "AC" + "0123456789abcdef" * 2
TOKEN = "twilio-secret-token-123"
FROM = "+15017122661"

Answer = int | tuple[int, int] | str


@dataclass
class FakeTwilio:
    url: str = ""
    script: list[Answer] = field(default_factory=list)
    received: list[dict[str, str]] = field(default_factory=list)  # form fields of every authorised request
    delivered: list[dict[str, str]] = field(default_factory=list)  # those answered 201
    hang_seconds: float = 3.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_answer(self) -> Answer:
        with self.lock:
            return self.script.pop(0) if self.script else 201


def _handler(fake: FakeTwilio) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            if self.path != f"/2010-04-01/Accounts/{SID}/Messages.json":
                return self._error(404, 20404, "The requested resource was not found")
            expected = "Basic " + base64.b64encode(f"{SID}:{TOKEN}".encode()).decode()
            if self.headers.get("Authorization") != expected:
                return self._error(401, 20003, "Authenticate")
            if "To" not in form or "Body" not in form or ("From" not in form and "MessagingServiceSid" not in form):
                return self._error(400, 21604, "A 'To', 'Body' and 'From' or 'MessagingServiceSid' are required")
            with fake.lock:
                fake.received.append(form)
            answer = fake.next_answer()
            if answer == "hang":
                time.sleep(fake.hang_seconds)
                answer = 201
            if answer == "reset":
                self.close_connection = True
                self.connection.close()
                return None
            if answer != 201:
                status, code = answer if isinstance(answer, tuple) else (answer, None)
                return self._error(status, code, "scripted failure")
            with fake.lock:
                fake.delivered.append(form)
            sid = "SM" + uuid.uuid4().hex
            body = {"sid": sid, "status": "queued", "to": form["To"], "from": form.get("From"), "body": form["Body"],
                    "account_sid": SID, "num_segments": "1", "error_code": None}  # fmt: skip
            self._send(201, body)
            return None

        def _error(self, status: int, code: int | None, message: str) -> None:
            self._send(status, {"code": code, "message": message, "more_info": f"https://www.twilio.com/docs/errors/{code}",
                                "status": status})  # fmt: skip

        def _send(self, status: int, doc: dict[str, object]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def fake_twilio(port: int = 0) -> Iterator[FakeTwilio]:
    fake = FakeTwilio()
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
