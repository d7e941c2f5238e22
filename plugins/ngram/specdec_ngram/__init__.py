"""specdec-plugin-ngram: model-free drafting by n-gram prompt lookup.

Methods:
    ``ngram``: CPU, Numba. ``index="scan"`` (default) searches each request's history every step
        like vLLM; ``index="incremental"`` keeps a per-request hash index updated with the new
        tokens only, O(new tokens) per step, with identical proposals.
    ``ngram_gpu``: the same rule in torch for the whole batch at once (``torch.compile`` on CUDA).

Both draft what followed the earlier occurrence (left-most, or ``match="recent"``: latest) of the
longest suffix n-gram with n in [prompt_lookup_min, prompt_lookup_max].

Plain functions (the ``ngram`` rule without a proposer): :func:`find_longest_ngram` for one
sequence, :func:`ngram_propose` for a padded batch. Importing this package stays light: Numba is
imported, and kernels compiled, when a proposer is built or one of these functions is first used.
"""

from __future__ import annotations

from typing import Any

import specdec
from specdec_ngram.options import NgramGPUOptions, NgramOptions
from specdec_ngram.proposer import NgramGPUProposer, NgramProposer, branches, merge_branches

__version__ = "0.1.0"

__all__ = [
    "NgramGPUOptions",
    "NgramGPUProposer",
    "NgramOptions",
    "NgramProposer",
    "branches",
    "find_longest_ngram",
    "merge_branches",
    "ngram_propose",
    "specdec_register_proposers",
]

_LAZY = {"find_longest_ngram": "specdec_ngram.scan", "ngram_propose": "specdec_ngram.scan"}


@specdec.hookimpl
def specdec_register_proposers(register) -> None:
    """Register ``ngram`` and ``ngram_gpu``."""
    register(NgramProposer)
    register(NgramGPUProposer)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec_ngram' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
