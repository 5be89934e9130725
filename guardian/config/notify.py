"""``[notify]``: who is told, by which channel, how often, and when not at night."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from guardian.config.base import Problem, TimeZone, loopback_host, Section, refuse, masked_url


class ContactSection(Section):
    name: str = Field(min_length=1, max_length=64)
    number: str = Field(pattern=r"^\+[1-9][0-9]{6,14}$")  # E.164


class SmsSection(Section):
    """Twilio. The auth token is never written here: $TWILIO_AUTH_TOKEN or LoadCredential=twilio-auth-token."""

    account_sid: str = Field(pattern=r"^AC[0-9a-fA-F]{32}$")
    from_number: str | None = Field(None, pattern=r"^\+[1-9][0-9]{6,14}$")
    messaging_service_sid: str | None = Field(None, pattern=r"^MG[0-9a-fA-F]{32}$")
    status_callback: str | None = None
    timeout_seconds: float = Field(10.0, gt=0, le=120)
    max_segments: int = Field(3, ge=1, le=10)
    api_url: str = "https://api.twilio.com"  # tests and egress proxies; plain http only to loopback

    @model_validator(mode="after")
    def _sender(self) -> SmsSection:
        if (self.from_number is None) == (self.messaging_service_sid is None):
            raise Problem("give exactly one of from_number and messaging_service_sid",
                          'e.g. from_number = "+15017122661" (a Twilio number of yours)')  # fmt: skip
        parts = urlsplit(self.api_url)
        if parts.scheme != "https" and not (parts.scheme == "http" and loopback_host(parts.hostname or "")):
            raise Problem(f"api_url {self.api_url!r} would send the auth token unencrypted", "use https://")
        return self


class WebhookSection(Section):
    url: str
    token_file: Path | None = None  # sent as a bearer token
    timeout_seconds: float = Field(10.0, gt=0, le=120)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https"):
            raise Problem(f"{masked_url(value)!r} is not an http(s) URL", 'e.g. "https://chat.example.com/hooks/oncall"')
        return value


class NotifySection(Section):
    channels: list[Literal["sms", "webhook"]] = []  # every message is also logged; these deliver it
    oncall: list[ContactSection] = []  # in escalation order: the first is told first
    group_wait_seconds: float = Field(10.0, ge=0, le=3600)
    repeat_warning_seconds: float = Field(4 * 3600.0, gt=0)
    repeat_page_seconds: float = Field(1800.0, gt=0)
    escalate_after_seconds: float = Field(900.0, gt=0)
    storm_limit_per_hour: int = Field(10, ge=1, le=1000)
    timezone: TimeZone = "UTC"  # of the quiet hours
    quiet_hours: dict[Literal["info", "warning"], tuple[int, int]] = {}  # severity -> [from hour, to hour]; pages never
    page_valid_seconds: float = Field(3600.0, gt=0)
    warning_valid_seconds: float = Field(4 * 3600.0, gt=0)
    sms: SmsSection | None = None
    webhook: WebhookSection | None = None

    @field_validator("quiet_hours")
    @classmethod
    def _hours(cls, value: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        for severity, (start, end) in value.items():
            if not (0 <= start <= 23 and 0 <= end <= 23) or start == end:
                raise Problem(f"quiet_hours.{severity} = [{start}, {end}] is not two different hours 0-23",
                              "e.g. warning = [22, 7] (from 22:00 to 07:00)")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _channels(self) -> NotifySection:
        found = []
        if "sms" in self.channels and self.sms is None:
            found.append(('channels has "sms" but there is no [notify.sms]', "add [notify.sms] with account_sid and from_number"))
        if "webhook" in self.channels and self.webhook is None:
            found.append(('channels has "webhook" but there is no [notify.webhook]', "add [notify.webhook] with url"))
        if self.channels and not self.oncall:
            found.append(("channels are set but [[notify.oncall]] names nobody", 'add [[notify.oncall]] name = "…" number = "+…"'))
        refuse(found)
        return self

    @property
    def alert_params(self) -> Any:
        from zoneinfo import ZoneInfo

        from guardian.notify.alerts import AlertParams

        return AlertParams(
            group_wait_seconds=self.group_wait_seconds, repeat_warning_seconds=self.repeat_warning_seconds,
            repeat_page_seconds=self.repeat_page_seconds, escalate_after_seconds=self.escalate_after_seconds,
            storm_limit_per_hour=self.storm_limit_per_hour, quiet_hours={str(k): v for k, v in self.quiet_hours.items()}, zone=ZoneInfo(self.timezone),
        )  # fmt: skip
