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


@hookspec
def specdec_register_trainers(register: Callable[[type], None]) -> None:
    """Register the trainer classes this plugin provides (``specdec train``, docs/training.md).

    Called once per plugin, the first time trainers are asked for (``specdec train``,
    :func:`specdec.registry.available_trainers`, :func:`specdec.registry.get_trainer_class`), not when the
    plugin loads: import the training code inside this function, so loading the plugin to decode never
    imports it. Call ``register(TrainerClass)`` once per method it trains: a subclass of
    ``specdec_tools.train.Trainer`` whose class attribute ``method`` is the method the head is for.
    ``register`` validates the class and raises :class:`specdec.PluginValidationError` if it breaks the
    contract; the error is recorded for the plugin and reported, and other plugins' trainers still load.
    Returns nothing.
    """
