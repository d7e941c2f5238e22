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

__all__ = ["adjacent_columns", "check_tree_parents", "logit_rows", "pack_tokens", "tree_layout", "tree_layout_device",
           "tree_node_inputs"]

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


def check_tree_parents(parents: list[list[int]], lens: list[int]) -> None:
    """Raise ValueError unless request i's ``parents[i]`` holds one parent per node after the root (``lens[i] - 1``)
    and each is an earlier node (node ``j``'s in ``0 .. j - 1``)."""
    for i, (par, n) in enumerate(zip(parents, lens)):
        if len(par) != n - 1:
            raise ValueError(f"request {i}: {len(par)} parents for {n - 1} tree nodes.")
        for j, p in enumerate(par, start=1):
            if not 0 <= p < j:
                raise ValueError(f"request {i}: node {j} has parent {p}; a parent must be an earlier node "
                                 f"(0 .. {j - 1}).")


def tree_layout(rows: list[int], parents: list[list[int]], lens: list[int], num_rows: int, width: int,
                depth: np.ndarray | None = None, sees: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Depths ``[num_rows, width]`` and ancestor sets ``sees [num_rows, width, width]`` (bool: node j of a row
    attends node a, itself included) of token trees: request i's ``lens[i]`` nodes in row ``rows[i]``, node 0 its
    root, ``parents[i][j]`` the parent of node ``j + 1`` (an earlier node). Padding nodes and idle rows see nothing
    (their attention is the row's prefix alone). Written into ``depth`` / ``sees`` when given. Raises ValueError
    for a parent count or a parent index that does not fit (:func:`check_tree_parents`). The host reference of
    :func:`tree_layout_device`, which the tree forwards use."""
    check_tree_parents(parents, lens)
    if depth is None:
        depth = np.zeros((num_rows, width), dtype=np.int64)
    else:
        depth[:] = 0
    if sees is None:
        sees = np.zeros((num_rows, width, width), dtype=bool)
    else:
        sees[:] = False
    for row, par in zip(rows, parents):
        d, s = depth[row], sees[row]
        s[0, 0] = True
        for j, p in enumerate(par, start=1):
            d[j] = d[p] + 1
            s[j] = s[p]
            s[j, j] = True
    return depth, sees


def tree_layout_device(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tree_layout` on the device, capturable (no host reads): ``parents [rows, width]`` (int64) holds each
    node's parent as an index into its row, node 0 the root (its entry is ignored). A parent that is not an earlier
    node is clamped into ``0 .. j - 1`` first (so any input makes a tree: a bad tree is caught on the host, after the
    forward, and its nodes dropped). Returns depths ``[rows, width]`` and ancestor sets ``sees [rows, width, width]``
    (each node sees itself); a padding node is a node like any other (parent 0: the root), the caller masks it.
    Pointer doubling: after round t every node's set holds its ancestors up to 2^t levels up, so ``ceil(log2(width))``
    rounds of two gathers each cover any depth."""
    rows, width = parents.shape
    j = torch.arange(width, device=parents.device)
    up = torch.minimum(parents.clamp(min=0), (j - 1).clamp(min=0))  # [rows, width] an earlier node (root: itself)
    sees = (up[:, :, None] == j) | torch.eye(width, dtype=torch.bool, device=parents.device)
    for _ in range(max(0, (width - 1).bit_length())):
        sees |= sees.gather(1, up[:, :, None].expand(rows, width, width))
        up = up.gather(1, up)
    return sees.sum(-1) - 1, sees


def tree_node_inputs(ids: torch.Tensor, parents: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A tree forward's inputs for the nodes after each root, from trees as a proposer drafts them (``ids``,
    ``parents`` ``[B, N]``: :attr:`specdec.Drafts.parents`' convention, -1 the root): ``[2, B, N]``, the ids clamped
    into ``0 .. vocab_size - 1`` and the parents as indices of the forward's nodes (the root is node 0, draft j
    node j + 1) clamped into ``0 .. j``, so that any values index in range (device ops, no host read)."""
    n = ids.shape[1]
    j = torch.arange(n, device=ids.device)
    return torch.stack((ids.clamp(0, vocab_size - 1), torch.minimum((parents + 1).clamp(min=0), j)))


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
