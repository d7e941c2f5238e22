"""specdec-plugin-dflash: DFlash block-diffusion drafts (method ``dflash``).

The draft (:mod:`specdec_dflash.heads`) is a plain PyTorch module; loading a draft happens when the proposer is
built, not at import; the trainer (:mod:`specdec_dflash.train`, ``specdec train --method dflash``) is imported
only when trainers are asked for.
"""

from __future__ import annotations

from typing import Any

import specdec
from specdec_dflash.training_hook import specdec_register_trainers  # noqa: F401 (the trainer for specdec train)


@specdec.hookimpl
def specdec_register_proposers(register: Any) -> None:
    """Register :class:`specdec_dflash.proposer.DFlashProposer` (method ``dflash``)."""
    from specdec_dflash.proposer import DFlashProposer

    register(DFlashProposer)


__all__ = ["specdec_register_proposers", "specdec_register_trainers"]
