"""``[gateway]``: the admission gateway's listener, buckets, queue and lanes."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from guardian.config.base import Problem, Section, parse_listen
from guardian.gateway import routes
from guardian.listener import ListenerLimits


class BucketSection(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    max_tokens: int = Field(ge=1, le=10_000_000)  # estimated prompt tokens, inclusive
    engines: list[str] = []  # the upstream pool; empty: every engine
    preemptible: bool = False  # low priority by nature


DEFAULT_BUCKETS = [
    BucketSection(name="short", max_tokens=4096),
    BucketSection(name="long", max_tokens=32768),
    BucketSection(name="very-long", max_tokens=128000, preemptible=True),
]


class GatewaySection(Section):
    """The admission gateway: clients send their OpenAI requests here instead of to vLLM."""

    listen: str = "127.0.0.1:9401"
    buckets: list[BucketSection] = DEFAULT_BUCKETS
    chars_per_token: float = Field(4.0, gt=0, le=64)  # calibrate per model: prompt characters per token
    long_context_tokens: int = Field(32768, ge=1)  # at breaker L1, prompts estimated above this get 503
    concurrency: int = Field(64, ge=1, le=100_000)  # requests in flight per engine (the effective batch)
    queue_size: int = Field(256, ge=0, le=1_000_000)  # waiting per engine; past it 429
    queue_deadline_seconds: float = Field(30.0, gt=0, le=3600)  # waiting longer: 429 with Retry-After
    restart_hold_seconds: float = Field(300.0, ge=0, le=3600)  # requests wait out a restart expected to end within this; else 503
    long_prefill_share: float = Field(0.005, gt=0, le=1)  # of an engine's time, a flood of long prompts' while short ones flow (1: no limit)
    long_flood_share: float = Field(0.1, ge=0, le=1)  # long prompts asking for more of an engine's time (last minute) are a flood
    priority_header: str = "x-guardian-priority"  # high or low
    high_priority_keys_file: Path | None = None  # API keys (one a line) whose requests are high priority
    inject_priority: bool = False  # set vLLM's "priority" field (needs --scheduling-policy priority)
    high_priority_engines: list[str] = []  # a dedicated pool for the high lane (its own GPU or MIG slice)
    extra_paths: list[str] = []  # proxied too (any method), beyond the OpenAI inference paths; never vLLM's admin paths
    max_body_bytes: int | None = Field(None, ge=1024, le=1024**3)  # unset: 16 bytes per token of the largest bucket, 2 MiB at least
    max_connections: int = Field(4096, ge=1, le=1_000_000)  # clients' connections; one more is answered 503
    header_timeout_seconds: float = Field(10.0, gt=0, le=600)
    idle_timeout_seconds: float = Field(75.0, gt=0, le=3600)

    @property
    def listener_limits(self) -> ListenerLimits:
        return ListenerLimits(self.max_connections, self.header_timeout_seconds, self.idle_timeout_seconds)

    @field_validator("extra_paths")
    @classmethod
    def _paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or "{" in path or "*" in path:
                raise Problem(f"{path!r} is not a literal path", 'name each path whole, e.g. "/v1/embeddings"')
            if routes.admin(path):
                raise Problem(f"{path!r} is one of vLLM's admin endpoints: the gateway never proxies those (they are "
                              "unauthenticated: pause, sleep, reset …)", "remove it; guardian calls them itself on loopback")  # fmt: skip
        return paths

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("buckets")
    @classmethod
    def _ordered(cls, buckets: list[BucketSection]) -> list[BucketSection]:
        if not buckets:
            raise Problem("no buckets: every request would be refused", "remove the key to get the three default buckets")
        for a, b in zip(buckets, buckets[1:]):
            if b.max_tokens <= a.max_tokens:
                raise Problem(f"bucket {b.name!r} (max_tokens {b.max_tokens}) does not come after {a.name!r} "
                              f"({a.max_tokens})", "list buckets from the shortest to the longest")  # fmt: skip
        return buckets
