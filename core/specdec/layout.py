"""Where a batch's requests sit in the padded ``[rows, width]`` inputs of a target forward.

Both the eager forward (:mod:`specdec.target`) and the CUDA-graph replays (:mod:`specdec.cuda_graphs`)
pack token ids and find the logits rows with these two functions; they live apart from both so that
the target can import the graph runner without the runner importing the target back.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["logit_rows", "pack_tokens"]


def pack_tokens(rows: list[int], tokens: list[list[int]], lens: list[int], num_rows: int, width: int,
                out: np.ndarray | None = None) -> np.ndarray:
    """``[num_rows, width]`` int64 ids with ``tokens[i]`` left-aligned in row ``rows[i]``, zeros
    elsewhere, written with one vectorised scatter (into ``out`` when given)."""
    if out is None:
        out = np.zeros((num_rows, width), dtype=np.int64)
    else:
        out[:] = 0
    flat = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int64, count=sum(lens))
    n = np.asarray(lens, dtype=np.int64)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(n) - n, n)
    out[np.repeat(np.asarray(rows, dtype=np.int64), n), cols] = flat
    return out


def logit_rows(rows: list[int], q: int, lens: list[int], num_logits: list[int]) -> np.ndarray:
    """Flat rows (``rows[i] * q + j``) of the last ``num_logits[i]`` of request i's ``lens[i]`` tokens,
    request by request: where its logits sit in ``[len(rows) * q, ...]`` padded states."""
    want = np.asarray(num_logits, dtype=np.int64)
    ends = np.asarray(rows, dtype=np.int64) * q + np.asarray(lens, dtype=np.int64)
    within = np.arange(int(want.sum())) - np.repeat(np.cumsum(want) - want, want)  # 0..want[i]-1
    return np.repeat(ends - want, want) + within
