"""``[[engines]]`` and ``[gpus]``: what guardian watches, how it finds the processes and how it restarts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from guardian.actions.engine_args import Value, validate
from guardian.config.base import Attention, Problem, loopback_host, Section, check_gpu_id, masked_url


class ProcessSection(Section):
    """How to find an engine's processes; exactly one way."""

    systemd_unit: str | None = None
    pid_file: Path | None = None
    match: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ProcessSection:
        given = [k for k in ("systemd_unit", "pid_file", "match") if getattr(self, k) is not None]
        if len(given) != 1:
            raise Problem(
                f"give exactly one of systemd_unit, pid_file, match (got {', '.join(given) or 'none'})",
                'e.g. systemd_unit = "vllm.service" or match = "vllm serve"',
            )
        if self.pid_file is not None and not self.pid_file.is_absolute():
            raise Problem(f"pid_file {str(self.pid_file)!r} is not an absolute path", 'use e.g. "/run/vllm/vllm.pid"')
        if self.match is not None and not self.match.strip():
            raise Problem("match is empty and would match every process", 'use e.g. match = "vllm serve"')
        return self


class RestartSection(Section):
    """How guardian restarts an engine with new arguments (actions/launcher.py)."""

    launcher: Literal["systemd", "child"]
    unit: str | None = None  # systemd: the vLLM unit
    env_file: Path | None = None  # systemd: the EnvironmentFile its ExecStart reads $VLLM_ARGS from
    command: list[str] | None = None  # child: the program and its fixed arguments, e.g. ["vllm", "serve", "MODEL"]
    args: dict[str, Value] = {}  # the base engine arguments, flag names without dashes
    attention_backend: Attention = "flash_attn"

    @model_validator(mode="after")
    def _complete(self) -> RestartSection:
        if self.launcher == "systemd":
            if not self.unit or self.env_file is None:
                raise Problem("the systemd launcher needs unit and env_file",
                              'e.g. unit = "vllm.service", env_file = "/etc/vllm/args.env" (its ExecStart uses $VLLM_ARGS)')  # fmt: skip
            if not self.env_file.is_absolute():
                raise Problem(f"env_file {str(self.env_file)!r} is not an absolute path", 'use e.g. "/etc/vllm/args.env"')
        if self.launcher == "child" and not self.command:
            raise Problem("the child launcher needs command", 'e.g. command = ["/opt/vllm/bin/vllm", "serve", "MODEL"]')
        problems = validate(self.args, self.attention_backend)
        if problems:
            raise Problem("args: " + "; ".join(problems), "use arguments vLLM accepts (see vllm serve --help)")
        return self


class EngineSection(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    url: str
    api_key: SecretStr | None = None
    api_key_file: Path | None = None
    dev_mode: bool = False  # the server runs with VLLM_SERVER_DEV_MODE=1 (admin endpoints)
    process: ProcessSection | None = None
    restart: RestartSection | None = None
    preset: str | None = None  # an engine profile under its arguments: high_throughput, low_latency, mixed or [presets.NAME]

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        shown = repr(masked_url(value))
        if parts.username is not None or parts.password is not None:  # it would show in /status and every log line
            raise Problem(f"{shown} carries credentials (user:password@)",
                          "remove them; put vLLM's API key in api_key_file, which guardian sends as a bearer token")  # fmt: skip
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Problem(f"{shown} is not an http(s) URL", 'use the server\'s base URL, e.g. "http://127.0.0.1:8000"')
        try:
            _ = parts.port  # urlsplit checks the port only when asked for it
        except ValueError:
            raise Problem(f"{shown} has an invalid port", 'use e.g. "http://127.0.0.1:8000"') from None
        if parts.query or parts.fragment:
            raise Problem(f"{shown} has a query or fragment", "give the base URL only; guardian adds /metrics and /health")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _key(self) -> EngineSection:
        if self.api_key is not None and self.api_key_file is not None:
            raise Problem("both api_key and api_key_file are set", "keep one (api_key_file keeps the key out of this file)")
        return self

    def read_api_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_file is not None:
            return self.api_key_file.read_text().strip()
        return None

    @property
    def is_loopback(self) -> bool:
        return loopback_host(urlsplit(self.url).hostname or "")


class GpuSection(Section):
    select: Literal["all"] | list[int | str] = "all"

    @field_validator("select")
    @classmethod
    def _select(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise Problem("select is an empty list: no GPU would be watched", 'use "all" or list indices/UUIDs')
            for item in value:
                check_gpu_id(item)
        return value
