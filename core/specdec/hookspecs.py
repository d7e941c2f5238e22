"""Hook specifications: the functions a specdec plugin may implement.

A plugin is a module (usually the package named by an entry point in group ``specdec``) that
defines functions decorated with :data:`specdec.hookimpl` and named like the specs below.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

hookspec = pluggy.HookspecMarker("specdec")
hookimpl = pluggy.HookimplMarker("specdec")


@hookspec
def specdec_register_proposers(register: Callable[[type], None]) -> None:
    """Register the proposer classes this plugin provides.

    Called once, when the plugin is loaded. Call ``register(ProposerClass)`` once per method; the
    class attribute ``method`` is the name users pass as ``method=``. ``register`` validates the
    class and raises :class:`specdec.PluginValidationError` if it breaks the contract.
    Returns nothing.
    """
