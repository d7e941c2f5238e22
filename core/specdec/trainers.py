"""The trainer registry: which plugin trains which method's head (hook ``specdec_register_trainers``).

Trainers are collected on demand, never when a plugin loads: the first lookup asks each registered plugin once.
Their table lives on the plugin registry (:class:`specdec.registry._Registry`), so unregistering a plugin forgets
its trainers and a fresh registry starts with none. :mod:`specdec.registry` imports this module and its
``available_trainers()`` and ``get_trainer_class()`` call :func:`available` and :func:`trainer_class` with its
registry; this module never imports the registry back (the import graph stays acyclic).
"""

from __future__ import annotations

import inspect
import os
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec.errors import PluginValidationError, UnknownMethodError
from specdec.plugin_checks import checked_method_name, validate_options_class

if TYPE_CHECKING:
    from specdec.registry import _Registry  # annotations only: the registry imports this module

__all__ = ["TrainerInfo", "TrainerTable", "available", "collect", "trainer_class"]


@dataclass(frozen=True, slots=True)
class TrainerInfo:
    """What ``available_trainers()`` reports for one trainable method (or for a plugin whose trainer hook
    failed: then ``method`` is the plugin's name, status is ``"error"`` and ``error`` holds the text)."""

    method: str
    plugin: str
    distribution: str | None
    version: str | None
    status: str
    error: str | None = None
    trainer_class: type | None = None


@dataclass(slots=True)
class TrainerTable:
    """A registry's trainers: method -> info, the plugins whose hook failed, and the plugins already asked."""

    by_method: dict[str, TrainerInfo] = field(default_factory=dict)
    failures: dict[str, TrainerInfo] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)

    def forget(self, plugin: str) -> None:
        """Drop what plugin ``plugin`` registered (it is being unregistered)."""
        for method in [m for m, info in self.by_method.items() if info.plugin == plugin]:
            del self.by_method[method]
        self.asked.discard(plugin)
        self.failures.pop(plugin, None)


def collect(registry: _Registry, only: str | None = None) -> None:
    """Call ``specdec_register_trainers`` of every registered plugin (or of plugin ``only``) not asked yet. A
    plugin whose hook raises (or registers an invalid class) keeps none of its trainers and is recorded."""
    table = registry.trainers
    for name, plugin in registry.pm.list_name_plugin():
        if name in table.asked or plugin is None or only not in (None, name):
            continue
        table.asked.add(name)
        dist, version = registry.dists.get(name, (None, None))
        added: dict[str, TrainerInfo] = {}

        def register(cls: type, name: str = name, dist: str | None = dist, version: str | None = version,
                     added: dict[str, TrainerInfo] = added) -> None:
            _validate_trainer_class(name, cls, {**table.by_method, **added})
            added[cls.method] = TrainerInfo(method=cls.method, plugin=name, distribution=dist, version=version,
                                            status="ok", trainer_class=cls)

        try:
            for impl in registry.pm.hook.specdec_register_trainers.get_hookimpls():
                if impl.plugin_name == name:
                    impl.function(register=register)
        except Exception as exc:  # a broken trainer must not hide the others
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            table.failures[name] = TrainerInfo(method=name, plugin=name, distribution=dist, version=version,
                                               status="error", error=detail)
            continue
        table.by_method.update(added)


def _validate_trainer_class(plugin: str, cls: Any, taken: dict[str, TrainerInfo]) -> None:
    from specdec_tools.train import Trainer  # reached only by training, never by `import specdec`

    if not isinstance(cls, type) or not issubclass(cls, Trainer):
        raise PluginValidationError(
            plugin, f"register() got {cls!r}; expected a subclass of specdec_tools.train.Trainer."
        )
    method = checked_method_name(plugin, cls, "'medusa' (the method whose head it trains, the name users pass as "
                                              "--method)")
    if method in taken:
        raise PluginValidationError(
            plugin,
            f"a trainer for method {method!r} ({cls.__name__}) is already registered by plugin "
            f"{taken[method].plugin!r}; pick another method name or uninstall one of the two plugins.",
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise PluginValidationError(plugin, f"{cls.__name__} must implement {missing} (see specdec_tools.train."
                                    "Trainer and docs/training.md).")
    validate_options_class(plugin, cls)


def available(registry: _Registry) -> dict[str, TrainerInfo]:
    """``specdec.registry.available_trainers()`` for ``registry``: loads every plugin, asks each for its trainers
    once; one ``status="error"`` entry per plugin whose trainer hook failed, keyed by its name."""
    registry.load_all()
    collect(registry)
    table = registry.trainers
    out = dict(sorted(table.by_method.items()))
    for name, fail in sorted(table.failures.items()):
        out.setdefault(name, fail)
    return out


def trainer_class(registry: _Registry, method: str) -> type:
    """``specdec.registry.get_trainer_class(method)`` for ``registry``: the class, or UnknownMethodError."""
    if not isinstance(method, str) or not method:
        raise UnknownMethodError(f"method={method!r} is invalid: it must be a method name such as 'medusa'.")
    table = registry.trainers
    if method not in table.by_method:
        # The likely plugin first (the entry point named like the method, or its prefix), as for proposers;
        # every plugin's training code only when that one does not train the method.
        eps = registry._discover()
        for name in sorted((n for n in eps if method == n or method.startswith(n)), key=len, reverse=True):
            registry._load_entry_point(name)
            collect(registry, only=name)
            if method in table.by_method:
                break
        else:
            registry.load_all()
            collect(registry)
    info = table.by_method.get(method)
    if info is not None:
        return info.trainer_class  # type: ignore[return-value]
    raise UnknownMethodError(_no_trainer_message(registry, method))


def _no_trainer_message(registry: _Registry, method: str) -> str:
    table = registry.trainers
    trainable = ", ".join(sorted(table.by_method)) or "none"
    msg = f"No trainer for method {method!r}. Methods with trainers: {trainable}."
    info = registry.methods.get(method)
    if info is not None:
        msg += (f" Method {method!r} is installed (plugin {info.plugin!r}) but no plugin registers a trainer for "
                "it: install one that does (pip install specdec-plugin-<name>), or train its head elsewhere.")
    else:
        msg += (" Install a plugin that trains it with: pip install specdec-plugin-<name> "
                f"(e.g. pip install specdec-plugin-{method})")
        if registry.autoload_disabled:
            value = os.environ.get("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", "")
            msg += (f". SPECDEC_DISABLE_PLUGIN_AUTOLOAD={value!r} stops installed plugins from loading: unset it "
                    "(or set it to 0) to load them")
    broken = [*(f"{f.plugin}: {f.error}" for f in registry.failures.values()),
              *(f"{f.plugin} (trainers): {f.error}" for f in table.failures.values())]
    if broken:
        msg = msg.rstrip(".") + ". Plugins that failed to load: " + "; ".join(broken)
    return msg
