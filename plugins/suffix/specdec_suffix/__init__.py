"""specdec-plugin-suffix: SuffixDecoding (method ``suffix``), model-free drafting from suffix trees.

Each request's prompt and output, plus a global tree over earlier responses, are matched against
the sequence's last tokens; the most likely continuation is drafted, with a length that varies per
request and per step. The backend, Snowflake's ``arctic-inference``, is imported only when the
proposer is built, so a missing backend never affects the other methods.
"""

from __future__ import annotations

from typing import Any

import specdec


@specdec.hookimpl
def specdec_register_proposers(register: Any) -> None:
    from specdec_suffix.proposer import SuffixProposer

    register(SuffixProposer)


__all__ = ["specdec_register_proposers"]
