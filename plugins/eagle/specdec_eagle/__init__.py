"""specdec-plugin-eagle: EAGLE-1 and EAGLE-3 draft heads (methods ``eagle`` and ``eagle3``).

The heads (:mod:`specdec_eagle.heads`) are plain PyTorch modules; loading a head happens when the proposer
is built, not at import.
"""

from __future__ import annotations

from typing import Any

import specdec
from specdec_eagle.training_hook import specdec_register_trainers  # noqa: F401 (trainers for specdec train)


@specdec.hookimpl
def specdec_register_proposers(register: Any) -> None:
    from specdec_eagle.proposer import Eagle3Proposer, EagleProposer

    register(EagleProposer)
    register(Eagle3Proposer)


__all__ = ["specdec_register_proposers", "specdec_register_trainers"]
