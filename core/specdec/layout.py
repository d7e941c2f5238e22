"""Where a batch's requests sit in the padded ``[rows, width]`` inputs of a target forward.

Both the eager forward (:mod:`specdec.target`) and the CUDA-graph replays (:mod:`specdec.cuda_graphs`)
pack token ids and find the logits rows with these functions (and find side-by-side hidden states with
:func:`adjacent_columns`); they live apart from both so that the target can import the graph runner without the
runner importing the target back.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

__all__ = ["adjacent_columns", "logit_rows", "pack_tokens", "tree_layout"]

SMALL_BATCH = 4  # up to this many requests the packing loops in Python: cheaper than the vectorised path's calls


def pack_tokens(rows: list[int], tokens: list[list[int]], lens: list[int], num_rows: int, width: int,
                out: np.ndarray | None = None) -> np.ndarray:
    """``[num_rows, width]`` int64 ids with ``tokens[i]`` left-aligned in row ``rows[i]``, zeros
    elsewhere, written with one vectorised scatter (into ``out`` when given)."""
    if out is None:
        out = np.zeros((num_rows, width), dtype=np.int64)
    else:
        out[:] = 0
    if len(rows) <= SMALL_BATCH:  # a row at a time: fewer numpy calls than the scatter's five
        for r, t, n in zip(rows, tokens, lens):
            out[r, :n] = t[:n] if len(t) != n else t
        return out
    flat = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int64, count=sum(lens))
    n = np.asarray(lens, dtype=np.int64)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(n) - n, n)
    out[np.repeat(np.asarray(rows, dtype=np.int64), n), cols] = flat
    return out


def logit_rows(rows: list[int], q: int, lens: list[int], num_logits: list[int]) -> np.ndarray:
    """Flat rows (``rows[i] * q + j``) of the last ``num_logits[i]`` of request i's ``lens[i]`` tokens,
    request by request: where its logits sit in ``[len(rows) * q, ...]`` padded states."""
    if len(rows) <= SMALL_BATCH:
        return np.array([r * q + n - w + j for r, n, w in zip(rows, lens, num_logits) for j in range(w)],
                        dtype=np.int64)
    want = np.asarray(num_logits, dtype=np.int64)
    ends = np.asarray(rows, dtype=np.int64) * q + np.asarray(lens, dtype=np.int64)
    within = np.arange(int(want.sum())) - np.repeat(np.cumsum(want) - want, want)  # 0..want[i]-1
    return np.repeat(ends - want, want) + within


def tree_layout(rows: list[int], parents: list[list[int]], lens: list[int], num_rows: int, width: int,
                depth: np.ndarray | None = None, sees: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Depths ``[num_rows, width]`` and ancestor sets ``sees [num_rows, width, width]`` (bool: node j of a row
    attends node a, itself included) of token trees: request i's ``lens[i]`` nodes in row ``rows[i]``, node 0 its
    root, ``parents[i][j]`` the parent of node ``j + 1`` (an earlier node). Padding nodes and idle rows see nothing
    (their attention is the row's prefix alone). Written into ``depth`` / ``sees`` when given. Raises ValueError
    for a parent count or a parent index that does not fit."""
    if depth is None:
        depth = np.zeros((num_rows, width), dtype=np.int64)
    else:
        depth[:] = 0
    if sees is None:
        sees = np.zeros((num_rows, width, width), dtype=bool)
    else:
        sees[:] = False
    for i, (row, par, n) in enumerate(zip(rows, parents, lens)):
        if len(par) != n - 1:
            raise ValueError(f"request {i}: {len(par)} parents for {n - 1} tree nodes.")
        d, s = depth[row], sees[row]
        s[0, 0] = True
        for j, p in enumerate(par, start=1):
            if not 0 <= p < j:
                raise ValueError(f"request {i}: node {j} has parent {p}; a parent must be an earlier node "
                                 f"(0 .. {j - 1}).")
            d[j] = d[p] + 1
            s[j] = s[p]
            s[j, j] = True
    return depth, sees


def adjacent_columns(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The 2-D tensor whose consecutive column ranges ``parts`` are (as :meth:`ModelRunner.collect` hands the aux
    hidden states over: views of one ``[T, n * H]`` tensor), or None when they are not: what a consumer can copy
    or index once instead of once per part."""
    if len(parts) < 2 or any(p.dim() != 2 for p in parts):
        return None
    p0 = parts[0]
    rows, stride, offset = p0.shape[0], p0.stride(), p0.storage_offset()
    width = sum(p.shape[1] for p in parts)
    if stride[1] != 1 or stride[0] < width:
        return None
    at = offset
    for p in parts:
        if (p.shape[0] != rows or p.stride() != stride or p.storage_offset() != at or p.dtype != p0.dtype
                or p.untyped_storage().data_ptr() != p0.untyped_storage().data_ptr()):
            return None
        at += p.shape[1]
    return p0.as_strided((rows, width), stride, offset)
