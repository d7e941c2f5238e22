"""Plugin discovery and the method registry (pluggy + ``importlib.metadata`` entry points).

Plugins are found through entry points of group ``specdec``. They are imported lazily: asking
for one method loads the plugin most likely to provide it (the entry point whose name is the
method or a prefix of it) and only falls back to loading every plugin when that one does not
register it. A plugin that fails to import or register is recorded and reported, never fatal.

``SPECDEC_PLUGINS=a,b`` loads only the plugins (entry point names, not method names) listed; a name
that matches no installed plugin is warned about. ``SPECDEC_DISABLE_PLUGIN_AUTOLOAD`` is a boolean
(1/true/yes/on load no entry point; unset, empty, 0/false/no/off load them; anything else is an error).

The trainer registry (``TrainerInfo``, the hook ``specdec_register_trainers``, the checks) is
:mod:`specdec.trainers`; ``available_trainers`` and ``get_trainer_class`` here run it on this registry.
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import os
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from specdec import hookspecs, trainers
from specdec.errors import PluginValidationError, UnknownMethodError
from specdec.options import build_options
from specdec.plugin_checks import checked_method_name, validate_options_class
from specdec.proposer import Proposer
from specdec.trainers import TrainerInfo

if TYPE_CHECKING:
    from specdec.config import SpeculativeConfig  # annotations only: the config imports this module

__all__ = [
    "ENTRY_POINT_GROUP",
    "MethodInfo",
    "available_methods",
    "get_proposer_class",
    "resolve_options",
    "create_proposer",
    "register_plugin",
    "unregister_plugin",
    "plugin_errors",
    "TrainerInfo",
    "available_trainers",
    "get_trainer_class",
]

ENTRY_POINT_GROUP = "specdec"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _env_flag(name: str) -> bool:
    """Environment variable ``name`` as a boolean: 1/true/yes/on are True; unset, empty and
    0/false/no/off are False (any case); anything else raises a ValueError naming both."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is invalid: it is a boolean; set it to 1, true, yes or on (on), or to 0, "
                     "false, no or off, or leave it empty or unset (off).")


def _allowlist() -> list[str]:
    """The plugin names SPECDEC_PLUGINS lists, in order (empty: no allowlist)."""
    return [name.strip() for name in os.environ.get("SPECDEC_PLUGINS", "").split(",") if name.strip()]


@dataclass(frozen=True, slots=True)
class MethodInfo:
    """What ``available_methods()`` reports for one method (or for a plugin that failed to load).

    status is ``"ok"`` or ``"error"``; ``error`` then holds the exception text.
    """

    method: str
    plugin: str
    distribution: str | None
    version: str | None
    status: str
    error: str | None = None
    proposer_class: type | None = None


@dataclass(frozen=True, slots=True)
class _PluginFailure:
    plugin: str
    distribution: str | None
    version: str | None
    error: str


class _Registry:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("specdec")
        self.pm.add_hookspecs(hookspecs)
        self.methods: dict[str, MethodInfo] = {}
        self.failures: dict[str, _PluginFailure] = {}
        self.entry_points: dict[str, importlib_metadata.EntryPoint] | None = None
        # Installed entry points that SPECDEC_PLUGINS left out (for the unknown-method error).
        self.left_out: dict[str, importlib_metadata.EntryPoint] = {}
        self.autoload_disabled = False
        self.tried: set[str] = set()
        # Trainers are collected on demand (specdec_register_trainers), never when a plugin loads: specdec.trainers.
        self.trainers = trainers.TrainerTable()
        self.dists: dict[str, tuple[str | None, str | None]] = {}

    # -- discovery ---------------------------------------------------------------------------
    def _discover(self) -> dict[str, importlib_metadata.EntryPoint]:
        if self.entry_points is None:
            if _env_flag("SPECDEC_DISABLE_PLUGIN_AUTOLOAD"):
                self.autoload_disabled = True
                self.entry_points = {}
            else:
                eps = {ep.name: ep for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP)}
                allow = _allowlist()
                if allow:
                    _warn_unmatched(allow, eps)
                    self.left_out = {name: ep for name, ep in eps.items() if name not in allow}
                    eps = {name: ep for name, ep in eps.items() if name in allow}
                self.entry_points = eps
        return self.entry_points

    def _load_entry_point(self, name: str) -> None:
        if name in self.tried:
            return
        self.tried.add(name)
        ep = self._discover()[name]
        dist = ep.dist.name if ep.dist is not None else None
        version = ep.dist.version if ep.dist is not None else None
        try:
            module = ep.load()
            self._register(module, name, dist, version)
        except Exception as exc:  # a broken plugin must not break the others
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.failures[name] = _PluginFailure(name, dist, version, detail)

    def load_for(self, method: str) -> None:
        eps = self._discover()
        likely = sorted((n for n in eps if method == n or method.startswith(n)), key=len, reverse=True)
        for name in likely:
            self._load_entry_point(name)
            if method in self.methods:
                return
        self.load_all()

    def load_all(self) -> None:
        for name in list(self._discover()):
            self._load_entry_point(name)

    # -- registration --------------------------------------------------------------------------
    def _register(
        self, plugin: Any, name: str, distribution: str | None = None, version: str | None = None
    ) -> None:
        try:
            self.pm.register(plugin, name=name)
        except ValueError as exc:
            raise PluginValidationError(name, str(exc)) from exc
        except pluggy.PluginValidationError as exc:  # a hookimpl whose arguments are not in the spec
            if self.pm.get_plugin(name) is plugin:  # older pluggy releases keep the name on failure
                self.pm.unregister(name=name)
            raise PluginValidationError(name, f"{exc}; the hooks are listed in specdec.hookspecs") from exc
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(name=name)
            raise PluginValidationError(name, f"{exc}; the hooks are listed in specdec.hookspecs") from exc
        added: list[str] = []

        def register(cls: type) -> None:
            _validate_proposer_class(name, cls, self.methods)
            self.methods[cls.method] = MethodInfo(
                method=cls.method, plugin=name, distribution=distribution, version=version,
                status="ok", proposer_class=cls,
            )
            added.append(cls.method)

        try:
            for impl in self.pm.hook.specdec_register_proposers.get_hookimpls():
                if impl.plugin_name == name:
                    impl.function(register=register)
        except Exception:
            for method in added:
                del self.methods[method]
            self.pm.unregister(name=name)
            raise
        self.dists[name] = (distribution, version)

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        for method in [m for m, info in self.methods.items() if info.plugin == name]:
            del self.methods[method]
        self.tried.discard(name)
        self.failures.pop(name, None)
        self.trainers.forget(name)
        self.dists.pop(name, None)


def _warn_unmatched(allow: list[str], installed: dict[str, importlib_metadata.EntryPoint]) -> None:
    unmatched = [name for name in allow if name not in installed]
    if unmatched:
        warnings.warn(
            f"SPECDEC_PLUGINS={os.environ.get('SPECDEC_PLUGINS', '')!r} names {unmatched}, which match no "
            f"installed plugin. Installed plugins (entry point names): {', '.join(sorted(installed)) or 'none'}. "
            "SPECDEC_PLUGINS lists plugin names, not method names (`specdec methods` shows which plugin "
            "provides each method).",
            UserWarning,
            stacklevel=4,
        )


def _provider_left_out(method: str, left_out: dict[str, importlib_metadata.EntryPoint]) -> str | None:
    """The entry point among those SPECDEC_PLUGINS left out whose plugin registers ``method``, found by
    loading them in a throwaway registry (most likely first: a name that is the method or its prefix)."""
    scratch = _Registry()
    scratch.entry_points = dict(left_out)
    order = sorted(left_out, key=lambda n: (not method.startswith(n), -len(n), n))
    for name in order:
        scratch._load_entry_point(name)
        if method in scratch.methods:
            return name
    return None


def _filtered_out_message(method: str, provider: str) -> str:
    allow = _allowlist()
    kept = [n for n in allow if n in (_REGISTRY.entry_points or {})]
    fix = ",".join([*kept, provider])
    installed = ", ".join(sorted(_REGISTRY.methods)) or "none"
    return (
        f"Unknown method {method!r}: it is provided by the installed plugin {provider!r}, which "
        f"SPECDEC_PLUGINS={os.environ.get('SPECDEC_PLUGINS', '')!r} leaves out (SPECDEC_PLUGINS lists plugin "
        f"entry point names, not methods). Add the plugin: SPECDEC_PLUGINS={fix}, or unset SPECDEC_PLUGINS. "
        f"Installed: {installed}"
    )


def _validate_proposer_class(plugin: str, cls: Any, taken: dict[str, MethodInfo]) -> None:
    if not isinstance(cls, type) or not issubclass(cls, Proposer):
        raise PluginValidationError(
            plugin, f"register() got {cls!r}; expected a subclass of specdec.Proposer."
        )
    method = checked_method_name(plugin, cls, "'ngram' (the name users pass as method=)")
    if method in taken:
        raise PluginValidationError(
            plugin,
            f"method {method!r} of {cls.__name__} is already registered by plugin "
            f"{taken[method].plugin!r}; pick another name or uninstall one of the two plugins.",
        )
    if getattr(cls.propose, "__isabstractmethod__", False):
        raise PluginValidationError(plugin, f"{cls.__name__} must implement propose(batch) -> Drafts.")
    validate_options_class(plugin, cls)


_REGISTRY = _Registry()


def _reset() -> None:
    """Forget everything loaded (tests use it after changing SPECDEC_* variables)."""
    global _REGISTRY
    _REGISTRY = _Registry()


def register_plugin(plugin: ModuleType | object, name: str | None = None) -> str:
    """Register a plugin object by hand (embedders and tests). Returns the name it got.

    Raises :class:`PluginValidationError` if it or a proposer class it registers is invalid.
    """
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    _REGISTRY._register(plugin, name)
    _REGISTRY.tried.add(name)
    return name


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered by hand (or loaded) and the methods it provided."""
    _REGISTRY.unregister(name)


def available_methods() -> dict[str, MethodInfo]:
    """Every installed method (loads all plugins), plus one ``status="error"`` entry per plugin
    that failed to load, keyed by its entry-point name."""
    _REGISTRY.load_all()
    out = dict(sorted(_REGISTRY.methods.items()))
    for name, fail in sorted(_REGISTRY.failures.items()):
        out.setdefault(
            name,
            MethodInfo(method=name, plugin=name, distribution=fail.distribution, version=fail.version,
                       status="error", error=fail.error),
        )
    return out


def plugin_errors() -> dict[str, str]:
    """Plugin name -> error text, for plugins that failed to import or register."""
    _REGISTRY.load_all()
    return {name: f.error for name, f in _REGISTRY.failures.items()}


def get_proposer_class(method: str) -> type[Proposer]:
    """The proposer class registered for ``method``; raises :class:`UnknownMethodError`."""
    if not isinstance(method, str) or not method:
        raise UnknownMethodError(f"method={method!r} is invalid: it must be a method name such as 'ngram'.")
    if method not in _REGISTRY.methods:
        _REGISTRY.load_for(method)
    info = _REGISTRY.methods.get(method)
    if info is not None:
        return info.proposer_class  # type: ignore[return-value]
    raise UnknownMethodError(_unknown_method_message(method))


def _unknown_method_message(method: str) -> str:
    provider = _provider_left_out(method, _REGISTRY.left_out) if _REGISTRY.left_out else None
    if provider is not None:
        msg = _filtered_out_message(method, provider)
    else:
        installed = ", ".join(sorted(_REGISTRY.methods)) or "none"
        msg = (
            f"Unknown method {method!r}. Installed: {installed}. "
            f"Install a plugin with: pip install specdec-plugin-<name> (e.g. pip install specdec-plugin-{method})"
        )
        if _REGISTRY.autoload_disabled:
            value = os.environ.get("SPECDEC_DISABLE_PLUGIN_AUTOLOAD", "")
            msg += (f". SPECDEC_DISABLE_PLUGIN_AUTOLOAD={value!r} stops installed plugins from loading: unset it "
                    "(or set it to 0) to load them")
    if _REGISTRY.failures:
        broken = "; ".join(
            f"{f.plugin} ({f.distribution or 'unknown distribution'} {f.version or ''}".rstrip() + f"): {f.error}"
            for f in _REGISTRY.failures.values()
        )
        msg += f". Plugins that failed to load: {broken}"
    return msg


def resolve_options(method: str, options: dict[str, Any]) -> tuple[type[Proposer], Any]:
    """The proposer class of ``method`` and its ``Options`` built from ``options`` (the config's
    non-core keys), with one lookup. Raises :class:`UnknownMethodError`, a ValueError for an unknown
    key and a TypeError for a value of the wrong type (see :func:`specdec.options.build_options`)."""
    cls = get_proposer_class(method)
    return cls, build_options(cls.Options, method, options)


def create_proposer(config: SpeculativeConfig, target: Any = None) -> Proposer:
    """Instantiate the proposer for ``config.method``, a built :class:`specdec.SpeculativeConfig`.

    ``specdec.create_proposer`` (:func:`specdec.config.create_proposer`) also takes a flat dict: reading
    one needs the config class, which imports this module, so that conversion lives there.
    """
    if isinstance(config, Mapping):
        raise TypeError(
            f"specdec.registry.create_proposer takes a SpeculativeConfig, got a {type(config).__name__}: pass "
            "the dict to specdec.create_proposer, which builds the config first."
        )
    return get_proposer_class(config.method)(config, target)


def available_trainers() -> dict[str, TrainerInfo]:
    """Every method some installed plugin can train (loads all plugins and asks each for its trainers
    once), plus one ``status="error"`` entry per plugin whose trainer hook failed, keyed by its name.
    The trainer registry is :mod:`specdec.trainers`; its table lives on this module's registry."""
    return trainers.available(_REGISTRY)


def get_trainer_class(method: str) -> type:
    """The trainer class (a ``specdec_tools.train.Trainer`` subclass) registered for ``method``; raises
    :class:`UnknownMethodError` naming the methods that have trainers and how to get one."""
    return trainers.trainer_class(_REGISTRY, method)
