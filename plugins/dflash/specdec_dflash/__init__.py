"""specdec-plugin-dflash: DFlash block-diffusion drafts (method ``dflash``).

The draft (:mod:`specdec_dflash.heads`) is a plain PyTorch module; loading a draft happens when the proposer is
built, not at import.
"""

from __future__ import annotations

from typing import Any

import specdec


@specdec.hookimpl
def specdec_register_proposers(register: Any) -> None:
    """Register :class:`specdec_dflash.proposer.DFlashProposer` (method ``dflash``)."""
    from specdec_dflash.proposer import DFlashProposer

    register(DFlashProposer)


__all__ = ["specdec_register_proposers"]
