"""Exceptions raised by specdec. Each message names the value, the rule and the fix."""

from __future__ import annotations

__all__ = ["UnknownMethodError", "PluginValidationError", "DraftValidationError", "SpecDecError", "check_int"]


class SpecDecError(Exception):
    """Base class of specdec's own errors."""


class UnknownMethodError(SpecDecError, ValueError):
    """No installed plugin provides the requested ``method``."""


class PluginValidationError(SpecDecError, TypeError):
    """A plugin registered a proposer class that breaks the contract (docs/design.md section 2)."""

    def __init__(self, plugin: str, message: str) -> None:
        self.plugin = plugin
        super().__init__(f"Plugin {plugin!r}: {message}")


class DraftValidationError(SpecDecError, ValueError):
    """A proposer returned drafts that the engine cannot verify (wrong shape, dtype or ids)."""


def check_int(name: str, value: object, minimum: int, hint: str = "") -> int:
    """``value`` when it is an int (a bool is not) of at least ``minimum``; else a ValueError naming the
    value and the rule, then ``hint`` (what the value means, or the fix)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: it must be an int >= {minimum}{' ' + hint if hint else ''}.")
    return value
