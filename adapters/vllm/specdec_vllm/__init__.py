"""specdec-vllm: specdec's token-only drafting methods inside vLLM, through vLLM's custom-class speculative hook.

    LLM(model=..., speculative_config={"model": "specdec_vllm.methods.ngram", "num_speculative_tokens": 4})

vLLM (>= 0.32) imports the class path, builds ``Class(vllm_config)`` and calls its ``propose`` each step. Class
paths: ``specdec_vllm.methods.<method>`` for any installed method, :class:`Ngram` / :class:`Suffix`, or
:class:`SpecdecProposer` with the method in ``SPECDEC_VLLM_METHOD``. Options: ``SPECDEC_VLLM_OPTIONS`` (JSON) or
``SPECDEC_VLLM_CONFIG`` (a JSON/YAML file); see docs/vllm.md. This package never imports vLLM.
"""

from __future__ import annotations

from specdec_vllm import methods
from specdec_vllm.proposer import Ngram, SpecdecProposer, Suffix
from specdec_vllm.rows import RowChanges, RowTracker
from specdec_vllm.settings import ENV_CONFIG, ENV_METHOD, ENV_OPTIONS, TokenOnlyError, build_proposer, read_settings

__version__ = "0.1.0"

__all__ = [
    "ENV_CONFIG",
    "ENV_METHOD",
    "ENV_OPTIONS",
    "Ngram",
    "RowChanges",
    "RowTracker",
    "SpecdecProposer",
    "Suffix",
    "TokenOnlyError",
    "build_proposer",
    "methods",
    "read_settings",
]
