"""specdec-plugin-extract_hs: method ``extract_hidden_states`` and the ``specdec extract`` command.

The method drafts nothing: it records the target's hidden states (the layers asked for) of every
position the target processes into hidden-state shards (:mod:`specdec_tools.shards`), the training
data of EAGLE, EAGLE-3, Medusa and DFlash heads. ``specdec extract`` runs a target over a data set
(text, JSONL prompts or conversations, token ids) and writes the same shards, optionally letting the
target write the responses (:mod:`specdec_extract_hs.command`).

Importing this package stays light: the proposer and the command load when used.
"""

from __future__ import annotations

from typing import Any

import specdec

__version__ = "0.1.0"

__all__ = ["specdec_register_proposers"]


@specdec.hookimpl
def specdec_register_proposers(register: Any) -> None:
    """Register ``extract_hidden_states``."""
    from specdec_extract_hs.proposer import ExtractHiddenStatesProposer

    register(ExtractHiddenStatesProposer)
