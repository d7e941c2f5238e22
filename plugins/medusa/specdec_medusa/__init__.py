"""specdec-plugin-medusa: Medusa heads (method ``medusa``).

Head ``i`` reads the target's last hidden state (after the final norm) at a position and guesses the token
``i + 2`` positions ahead, so all k drafts come from one batched pass (:mod:`specdec_medusa.heads`). Loading a
head happens when the proposer is built, not at import.
"""

from __future__ import annotations

from typing import Any

import specdec
from specdec_medusa.training_hook import specdec_register_trainers  # noqa: F401 (the trainer for specdec train)


@specdec.hookimpl
def specdec_register_proposers(register: Any) -> None:
    from specdec_medusa.proposer import MedusaProposer

    register(MedusaProposer)


__all__ = ["specdec_register_proposers", "specdec_register_trainers"]
