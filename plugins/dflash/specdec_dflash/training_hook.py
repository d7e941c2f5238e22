"""The dflash plugin's trainer hook: method ``dflash`` for ``specdec train``.

Kept apart from the package's ``__init__`` so that loading the plugin imports no training code: the trainer is
imported only when the hook is called (the first time trainers are asked for).
"""

from __future__ import annotations

from typing import Any

import specdec


@specdec.hookimpl
def specdec_register_trainers(register: Any) -> None:
    """Register :class:`specdec_dflash.train.DFlashTrainer` (method ``dflash``)."""
    from specdec_dflash.train import DFlashTrainer

    register(DFlashTrainer)
