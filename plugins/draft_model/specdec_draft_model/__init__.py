"""specdec-plugin-draft_model: an independent small causal LM drafts k tokens per step.

The heavy work (loading the draft model) happens when the proposer is built, not at import.
"""

from __future__ import annotations

from typing import Any

import specdec


@specdec.hookimpl
def specdec_register_proposers(register: Any) -> None:
    from specdec_draft_model.proposer import DraftModelProposer

    register(DraftModelProposer)


__all__ = ["specdec_register_proposers"]
