"""Slow, obviously-correct references for the n-gram kernels (parity tests only).

The rule, for one sequence ``t`` of length ``T``: let ``k' = min(k, max_model_len - T)``; nothing
if ``T < min_n`` or ``k' <= 0``. Otherwise take the largest ``n`` in ``[min_n, max_n]`` whose
suffix ``t[T-n:]`` also starts at some earlier ``s < T - n``; among those starts take the smallest
(``leftmost``) or the largest (``recent``); draft ``t[s+n : s+n+k']`` (so cut at ``T``).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["find_longest_ngram_ref", "ngram_propose_ref"]


def find_longest_ngram_ref(
    tokens: np.ndarray, min_n: int, max_n: int, k: int, max_model_len: int, match: str = "leftmost"
) -> np.ndarray:
    """Draft for one sequence by trying every n-gram length and every start position."""
    tokens = np.asarray(tokens)
    total = tokens.shape[0]
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return tokens[:0]
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        # Windows of tokens[:T-1] start at s <= T-1-n, i.e. strictly before the suffix itself.
        windows = sliding_window_view(tokens[: total - 1], n)  # [T-n, n]
        starts = np.flatnonzero((windows == tokens[total - n :]).all(axis=1))
        if starts.size:
            s = int(starts[0] if match == "leftmost" else starts[-1])
            return tokens[s + n : s + n + k]
    return tokens[:0]


def ngram_propose_ref(
    token_ids: np.ndarray,
    num_tokens: np.ndarray,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int,
    match: str = "leftmost",
) -> list[list[int]]:
    """Row-by-row :func:`find_longest_ngram_ref` over a padded ``[B, L]`` batch."""
    return [
        find_longest_ngram_ref(token_ids[i, : int(n)], min_n, max_n, k, max_model_len, match).tolist()
        for i, n in enumerate(num_tokens)
    ]
