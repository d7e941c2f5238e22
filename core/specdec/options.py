"""A method's options: the core keys every config has, and building a method's ``Options`` dataclass.

This module is plain data and checks. It imports no other specdec module, so the registry (which
resolves a method name to its proposer class) and the config (which calls the registry) both use it.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["CORE_KEYS", "NoOptions", "build_options", "init_option_names"]

# Keys every config understands; every other key belongs to the method's Options dataclass.
CORE_KEYS = ("method", "num_speculative_tokens", "model", "on_bad_drafts", "speculation_policy")


@dataclass(frozen=True, slots=True)
class NoOptions:
    """Options of a method that has none."""


def init_option_names(options: Any) -> list[str]:
    """The fields of Options class (or instance) ``options`` that a config may set (``init=False``
    fields are derived in ``__post_init__``, not keys)."""
    return [f.name for f in fields(options) if f.init]


def build_options(options_cls: type, method: str, given: dict[str, Any]) -> Any:
    """``options_cls(**given)``, after checking that every key is a field of it and every value fits
    the field's annotation: a ValueError lists the valid keys, a TypeError names the value and the type."""
    valid = init_option_names(options_cls)
    unknown = sorted(set(given) - set(valid))
    if unknown:
        listed = ", ".join(valid) if valid else "none"
        raise ValueError(
            f"Unknown option(s) {unknown} for method {method!r}. Valid options: {listed} "
            f"(core keys: {', '.join(CORE_KEYS)})."
        )
    try:
        built = options_cls(**given)
    except ValueError:
        raise  # the Options' own validation: its message knows the option best
    except Exception as exc:  # e.g. a comparison with a value of the wrong type, deep in __post_init__
        mismatch = _type_mismatch(options_cls, method, given)
        if mismatch is not None:
            raise mismatch from exc
        raise
    mismatch = _type_mismatch(options_cls, method, given)
    if mismatch is not None:
        raise mismatch
    return built


_TypeRule = tuple[Callable[[Any], bool], str, str]  # check, what it must be, an example value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


_SIMPLE_TYPES: dict[Any, _TypeRule] = {
    bool: (lambda v: isinstance(v, bool), "a bool (true or false, unquoted)", "true"),
    int: (_is_int, "an int (not a bool)", "4"),
    float: (_is_number, "a finite number (an int or a float)", "0.5"),
    str: (lambda v: isinstance(v, str), "a string", '"text"'),
}


def _type_rule(hint: Any) -> _TypeRule | None:
    """How to check a value against annotation ``hint``; None for annotations left to the Options."""
    allow_none = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            return None
        hint, allow_none = rest[0], len(rest) < len(args)
    rule = _SIMPLE_TYPES.get(hint)
    if rule is None or not allow_none:
        return rule
    check, text, example = rule
    return (lambda v: v is None or check(v)), f"{text} or None", example


def _type_mismatch(options_cls: type, method: str, given: dict[str, Any]) -> TypeError | None:
    """A TypeError for the first given option whose value does not fit its field's annotation."""
    try:
        hints = typing.get_type_hints(options_cls)
    except Exception:  # an annotation that does not resolve: leave the checks to the Options
        return None
    for name, value in given.items():
        rule = _type_rule(hints.get(name))
        if rule is not None and not rule[0](value):
            return TypeError(f"option {name}={value!r} of method {method!r} is invalid: it must be {rule[1]}, "
                             f"got {type(value).__name__}; e.g. {name}={rule[2]}.")
    return None
