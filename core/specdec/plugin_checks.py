"""Checks that both registries (proposers in :mod:`specdec.registry`, trainers in :mod:`specdec.trainers`)
make of a class a plugin registers. Kept apart from both so that each imports it without importing the other."""

from __future__ import annotations

from dataclasses import MISSING, fields, is_dataclass

from specdec.errors import PluginValidationError

__all__ = ["checked_method_name", "validate_options_class"]


def checked_method_name(plugin: str, cls: type, example: str) -> str:
    """``cls.method``, a non-empty identifier; else a PluginValidationError naming ``plugin``, ending with
    ``example`` (how the method name is used, for the registry at hand)."""
    method = getattr(cls, "method", None)
    if not isinstance(method, str) or not method.isidentifier():
        raise PluginValidationError(
            plugin,
            f"{cls.__name__}.method = {method!r} is invalid: it must be a non-empty identifier such as {example}.",
        )
    return method


def validate_options_class(plugin: str, cls: type) -> None:
    """``cls.Options`` is a dataclass whose fields all have defaults; else a PluginValidationError naming ``plugin``."""
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and is_dataclass(options)):
        raise PluginValidationError(
            plugin, f"{cls.__name__}.Options = {options!r} must be a dataclass of the method's options."
        )
    missing = [
        f.name for f in fields(options) if f.init and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise PluginValidationError(
            plugin, f"{cls.__name__}.Options fields {missing} need defaults so configs can omit them."
        )
