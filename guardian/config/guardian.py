"""``[guardian]``: the daemon's own poll, listener, logging, state and API token."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from guardian.config.base import Problem, Section, parse_listen
from guardian.listener import ListenerLimits


class GuardianSection(Section):
    poll_interval_seconds: float = Field(1.0, gt=0, le=3600)
    listen: str = "127.0.0.1:9400"
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    telemetry_lost_after_polls: int = Field(3, ge=1, le=1000)
    nvml_timeout_seconds: float = Field(2.0, gt=0, le=60)
    scrape_timeout_seconds: float | None = Field(None, gt=0, le=60)
    latency_window_seconds: float = Field(60.0, gt=0, le=86400)
    # the breaker's level, restart history and engine-argument overlay; systemd's StateDirectory= sets $STATE_DIRECTORY
    state_dir: Path = Field(default_factory=lambda: Path(os.environ.get("STATE_DIRECTORY", "/var/lib/vllm-guardian")))
    # bearer token for guardian's HTTP API (breaker force/clear); without one the API is off.
    # Under systemd, LoadCredential=api-token:PATH is read from $CREDENTIALS_DIRECTORY instead.
    api_token_file: Path | None = None
    max_connections: int = Field(256, ge=1, le=100_000)  # on guardian.listen; one more is answered 503
    header_timeout_seconds: float = Field(10.0, gt=0, le=600)  # a new connection's request headers, complete by then
    idle_timeout_seconds: float = Field(30.0, gt=0, le=3600)  # a kept-alive connection with no request

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @model_validator(mode="after")
    def _timings(self) -> GuardianSection:
        if self.scrape_timeout_seconds is not None and self.scrape_timeout_seconds >= self.poll_interval_seconds:
            raise Problem(
                f"scrape_timeout_seconds ({self.scrape_timeout_seconds}) is not below "
                f"poll_interval_seconds ({self.poll_interval_seconds}): a slow engine would make every poll overrun",
                "lower scrape_timeout_seconds or raise poll_interval_seconds",
            )
        if self.latency_window_seconds < 2 * self.poll_interval_seconds:
            raise Problem(
                f"latency_window_seconds ({self.latency_window_seconds}) holds fewer than two polls",
                f"set latency_window_seconds to at least {2 * self.poll_interval_seconds:g}",
            )
        return self

    @property
    def listener_limits(self) -> ListenerLimits:
        return ListenerLimits(self.max_connections, self.header_timeout_seconds, self.idle_timeout_seconds)

    @property
    def scrape_timeout(self) -> float:
        return self.scrape_timeout_seconds or 0.8 * self.poll_interval_seconds

    def read_api_token(self) -> str | None:
        """The API token: systemd's credential first, then ``api_token_file``; None: the API is off."""
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        candidates = [Path(creds) / "api-token"] if creds else []
        candidates += [self.api_token_file] if self.api_token_file else []
        for path in candidates:
            if path.exists() or path == self.api_token_file:
                token = path.read_text().strip()
                if token:
                    return token  # an empty credential is the unit's fallback for a missing file: try the next
        return None
