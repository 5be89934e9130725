"""What the commands share: where the config is by default, and loading it or exiting with its problems."""

from __future__ import annotations

import sys
from pathlib import Path

from guardian import config as cfg

DEFAULT_CONFIG = Path("/etc/vllm-guardian/guardian.toml")


def load_or_exit(path: Path) -> cfg.Config:
    try:
        return cfg.load(path)
    except cfg.ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(cfg.EXIT_CONFIG) from None


def base_url(config: cfg.Config) -> str:
    """Where the running guardian of this config answers (a wildcard listen is reached on loopback)."""
    host, port = cfg.parse_listen(config.guardian.listen)
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"
