"""Frozen state, changed only where a poll changes it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

T = TypeVar("T")


def updated(state: T, **changes: Any) -> T:
    """``state`` with ``changes``; the very same object when they change nothing.

    Most polls change nothing, and ``dataclasses.replace`` of a frozen
    dataclass (its fields listed, a new object set field by field through
    ``object.__setattr__``) was several calls per engine per poll; the same
    object also lets a caller see by identity that nothing changed.
    """
    for key, value in changes.items():
        if getattr(state, key) != value:
            return replace(state, **changes)  # type: ignore[type-var]
    return state
