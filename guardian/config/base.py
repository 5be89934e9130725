"""What every section shares: the strict model, refusals with their fix, listen addresses and GPU ids."""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Annotated, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, ConfigDict

EXIT_CONFIG = 2

Attention = Literal["flash_attn", "triton", "flashinfer"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Problem(ValueError):
    """A validator's refusal with the fix attached (pydantic keeps the message)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(f"{message}\x00{fix}")


class Problems(ValueError):
    """Every problem one validator found, so ``check-config`` lists them all in one pass, not the first."""

    def __init__(self, found: list[tuple[str, str]]) -> None:
        super().__init__("\x01".join(f"{message}\x00{fix}" for message, fix in found))


def refuse(found: list[tuple[str, str]]) -> None:
    if found:
        raise Problems(found)


def _time_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise Problem(f"unknown time zone {value!r}", 'use an IANA name, e.g. "Europe/Berlin" or "UTC"') from None
    return value


TimeZone = Annotated[str, AfterValidator(_time_zone)]


def all_positive(section: str, params: object) -> None:
    for f in dataclasses.fields(params):  # type: ignore[arg-type]
        value = getattr(params, f.name)
        if value <= 0:
            raise Problem(f"{section}.{f.name} = {value} must be above 0", f"use the default, {f.default}")


def check_gpu_id(item: int | str) -> None:
    if isinstance(item, int):
        if item < 0:
            raise Problem(f"GPU index {item} is negative", "use indices as nvidia-smi shows them: 0, 1, …")
    elif item.startswith("MIG-"):
        raise Problem(f"{item!r} is a MIG slice", "select its parent GPU; its MIG slices are reported under it")
    elif not item.startswith("GPU-"):
        raise Problem(f"{item!r} is neither a GPU index nor a UUID", 'use 0 or "GPU-8f6c…" (nvidia-smi -L)')


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise Problem(f"{value!r} is not HOST:PORT", 'use e.g. "127.0.0.1:9400"')
    return host, int(port)


def loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def masked_url(url: str) -> str:
    """scheme://host:port/… with no credentials, path or query: tokens often live in all three (webhook URLs)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unparsable URL, not shown)"
    rest = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{'***@' if parts.username or parts.password else ''}{host}{port}{rest}"
