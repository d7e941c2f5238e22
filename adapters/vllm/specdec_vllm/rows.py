"""Which request each of vLLM's batch rows holds, although vLLM's custom-class hook passes no request ids.

vLLM hands ``propose`` its persistent batch: row ``i`` of ``token_ids_cpu`` is one running request, valid up to
``num_tokens_no_spec[i]``, which already counts the ``sampled_token_ids[i]`` appended this step. Rows are reused
as requests finish (a new request lands in a free row), moved down when vLLM condenses the batch, and reordered
(decodes before prefills). :class:`RowTracker` keeps per row a short fingerprint of the request it held at the
last step (its length, its first ``head`` tokens and the ``tail`` tokens before its end) and, each step, takes
row ``i`` to hold the same request when its length before this step's tokens and both fingerprints match; else
it looks for the request among the other rows' (moved), else the row holds a new request. Requests seen last
step and found in no row have left. All of it is O(B x (head + tail)) numpy per step, O(B x R) only for rows
whose request changed.

A new request whose length, first ``head`` and last ``tail`` tokens all equal those of the request the row held
is taken for it. For token-only methods this can change drafts only, never output: vLLM verifies every draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import numpy as np

__all__ = ["RowTracker", "RowChanges"]


@dataclass(slots=True)
class RowChanges:
    """What changed in one step.

    Attributes:
        req_ids: the request id of every row ``0..B-1`` this step (ids the tracker made up).
        joined: ``(row, req_id)`` of requests first seen this step; the proposer should add each with its
            tokens before this step (``token_ids[row, :num_tokens[row] - len(sampled_token_ids[row])]``).
        left: ids of requests seen at the last step and in no row now; the proposer should remove them.
    """

    req_ids: list[str]
    joined: list[tuple[int, str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


class RowTracker:
    """Request identity per vLLM batch row, from lengths and token fingerprints (see the module docstring).

    Args:
        head: how many leading tokens of a request fingerprint it (its prompt's start).
        tail: how many tokens before the end of the last step's history fingerprint it.
    """

    def __init__(self, head: int = 8, tail: int = 8) -> None:
        if head < 1 or tail < 1:
            raise ValueError(f"head={head}, tail={tail} are invalid: both must be >= 1.")
        self.head, self.tail = head, tail
        self._ids: list[str | None] = []
        self._len = np.zeros(0, np.int64)  # [R] each row's length at the last step
        self._head = np.zeros((0, head), np.int64)  # [R, head] its first tokens, -1 past its length
        self._tail = np.zeros((0, tail), np.int64)  # [R, tail] the tokens before its end, -1 before position 0
        self._count = count()

    def __len__(self) -> int:
        """Requests tracked (rows that held one at the last step)."""
        return sum(r is not None for r in self._ids)

    def reset(self) -> list[str]:
        """Forget every row; returns the ids that were tracked (the proposer should remove them)."""
        left = [r for r in self._ids if r is not None]
        self._ids = []
        self._len = np.zeros(0, np.int64)
        self._head = np.zeros((0, self.head), np.int64)
        self._tail = np.zeros((0, self.tail), np.int64)
        return left

    def _fingerprints(self, token_ids: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[B, head]`` first tokens and ``[B, tail]`` tokens before ``ends`` of rows ``0..B-1`` (-1 where a row
        is shorter)."""
        b = ends.shape[0]
        rows = np.arange(b)[:, None]
        cols = np.arange(self.head)[None, :]
        head = np.where(cols < ends[:, None], token_ids[rows, np.minimum(cols, token_ids.shape[1] - 1)], -1)
        pos = ends[:, None] - self.tail + np.arange(self.tail)[None, :]  # [B, tail]
        tail = np.where(pos >= 0, token_ids[rows, np.maximum(pos, 0)], -1)
        return head.astype(np.int64, copy=False), tail.astype(np.int64, copy=False)

    def update(self, sampled_token_ids: list[list[int]], num_tokens: np.ndarray, token_ids: np.ndarray
               ) -> RowChanges:
        """Match this step's rows ``0..B-1`` (``B = len(sampled_token_ids)``) with the requests of the last step.

        ``num_tokens`` (``[>= B]``) counts each row's tokens including this step's sampled ones; ``token_ids``
        (``[>= B, L]``) holds them. Neither is copied or written.
        """
        b = len(sampled_token_ids)
        n = np.asarray(num_tokens[:b], dtype=np.int64)
        grew = np.fromiter(map(len, sampled_token_ids), np.int64, b)
        before = n - grew  # [B] each row's length before this step's tokens
        head_now, tail_before = self._fingerprints(token_ids, np.maximum(before, 0))
        r = len(self._ids)
        m = min(b, r)
        kept = np.zeros(b, np.bool_)
        if m:
            kept[:m] = ((self._len[:m] == before[:m]) & (self._head[:m] == head_now[:m]).all(1)
                        & (self._tail[:m] == tail_before[:m]).all(1)
                        & np.fromiter((x is not None for x in self._ids[:m]), np.bool_, m))
        kept &= before >= 0
        ids: list[str | None] = list(self._ids[:b]) + [None] * max(0, b - r)
        claimed = set(np.flatnonzero(kept[:m]).tolist())
        changes = RowChanges(req_ids=[])
        for i in np.flatnonzero(~kept).tolist():
            src = self._find_moved(i, before[i], head_now[i], tail_before[i], claimed)
            if src is None:
                ids[i] = f"vllm-row{i}-{next(self._count)}"
                changes.joined.append((i, ids[i]))
            else:
                claimed.add(src)
                ids[i] = self._ids[src]
        changes.left = [x for j, x in enumerate(self._ids) if x is not None and j not in claimed]
        changes.req_ids = ids  # type: ignore[assignment]  # every row 0..B-1 has an id now
        self._ids = ids
        self._len = n.copy()
        self._head, self._tail = self._fingerprints(token_ids, n)
        return changes

    def _find_moved(self, row: int, before: int, head: np.ndarray, tail: np.ndarray, claimed: set[int]
                    ) -> int | None:
        """The last step's row whose request row ``row`` holds now (vLLM moved it), or None."""
        if before < 0:
            return None
        hits = np.flatnonzero((self._len == before) & (self._head == head).all(1) & (self._tail == tail).all(1))
        for j in hits.tolist():
            if j != row and j not in claimed and self._ids[j] is not None:
                return j
        return None
