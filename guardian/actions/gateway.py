"""The breaker's gates in the request path, as an interface; the admission gateway implements it.

vLLM has no endpoint to refuse long prompts or to pause one priority class,
so these gates live in guardian's own gateway in front of vLLM
(``gateway/proxy.py``, with ``[gateway]`` in the config). Until one is configured, ``NoGateway`` answers every call with
``not_configured`` and says so in the log: the breaker still acts through
vLLM's own endpoints and restarts, and nobody believes a gate is shut that
is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from guardian.actions.outcome import Outcome


@dataclass(frozen=True)
class Gates:
    refuse_long_context: bool = False  # L1 and above
    pause_low_priority: bool = False  # L2 and above
    high_priority_only: bool = False  # L3
    level: int = 0  # the breaker level and rule that shut them: what a refused client is told
    rule: str = ""

    @classmethod
    def for_level(cls, level: int, rule: str = "", shut: int | None = None) -> Gates:
        """The gates of ``shut`` (default: the level itself) shut, told as the level and rule (see ``policy/breaker.py``)."""
        g = level if shut is None else shut
        return cls(refuse_long_context=g >= 1, pause_low_priority=g >= 2, high_priority_only=g >= 3, level=level, rule=rule)

    def why(self) -> str:
        """"breaker L3 (engine_dead)": the words a refused request carries."""
        return f"breaker L{self.level}" + (f" ({self.rule})" if self.rule else "")


class Gateway(Protocol):
    async def set_gates(self, engine: str, gates: Gates) -> Outcome: ...

    async def set_cap(self, engine: str, cap: int) -> Outcome:
        """The engine's concurrency cap: the tuner's effective batch."""
        ...

    async def drain(self, engine: str, timeout: float) -> Outcome:
        """Stop admitting new requests to the engine (they wait in the gateway); return once none is in flight."""
        ...

    async def admit(self, engine: str) -> Outcome:
        """Admit to the engine again after a drain."""
        ...


NO_GATEWAY = "no admission gateway is configured: clients reach vLLM directly, so this gate cannot be applied"


class NoGateway:
    async def set_gates(self, engine: str, gates: Gates) -> Outcome:
        return Outcome("gates", "not_configured", NO_GATEWAY)

    async def set_cap(self, engine: str, cap: int) -> Outcome:
        return Outcome("cap", "not_configured", NO_GATEWAY)

    async def drain(self, engine: str, timeout: float) -> Outcome:
        return Outcome("drain", "not_configured", NO_GATEWAY)

    async def admit(self, engine: str) -> Outcome:
        return Outcome("admit", "not_configured", NO_GATEWAY)
