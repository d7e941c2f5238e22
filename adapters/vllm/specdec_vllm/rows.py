"""Which request each of vLLM's batch rows holds, although vLLM's custom-class hook passes no request ids.

vLLM hands ``propose`` its persistent batch: row ``i`` of ``token_ids_cpu`` is one running request, valid up to
``num_tokens_no_spec[i]``, which already counts the ``sampled_token_ids[i]`` appended this step. Rows are reused
as requests finish (a new request lands in a free row), moved down when vLLM condenses the batch, and reordered
(decodes before prefills). :class:`RowTracker` keeps per row a short fingerprint of the request it held at the
last step (its length, its first ``head`` tokens and the ``tail`` tokens before its end) and, each step, takes
row ``i`` to hold the same request when its length before this step's tokens and both fingerprints match; else
it looks the request up among the other rows' (moved), else the row holds a new request. Requests seen last
step and found in no row have left. Cost: O(head + tail + new tokens) per row and step, in one Numba call for the
whole batch (the fingerprints live in two ``[rows, 1 + head + tail]`` arrays, swapped each step); only rows
that changed go through Python. At vLLM's CPU batch sizes the per-row Python loop it replaced cost ~2 us a row, and
a vectorised numpy version ~70 us a step on its dozen small-array calls whatever the batch size.

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
        num_tokens: each row's length this step (``num_tokens[:B]`` as ints).
    """

    req_ids: list[str]
    num_tokens: list[int] = field(default_factory=list)
    joined: list[tuple[int, str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def _fingerprint_rows(token_ids, nums, new, old_rows, old, now, same, h):
    """Row ``i < old_rows`` holds the same request as at the last step when its length before this step's
    ``new[i]`` tokens is ``old[i, 0]`` and its first ``min(h, that)`` and last ``min(tail, that)`` tokens before
    them are the stored ones (``same[i]``). Every row's fingerprint of now goes to ``now``. A fingerprint row:
    the length, then ``h`` slots for the first tokens, then ``tail`` slots for the last ones (left-aligned).
    Returns how many rows are not the same, or ``-1 - i`` for the first row whose length lies outside
    ``[0, width]`` (nothing read then: the loops below do not bounds-check)."""
    b, width = nums.shape[0], token_ids.shape[1]
    t = now.shape[1] - 1 - h
    for i in range(b):
        if nums[i] < 0 or nums[i] > width:
            return -1 - i
    changed = 0
    for i in range(b):
        n = nums[i]
        before = n - new[i]
        ok = i < old_rows and before >= 0 and old[i, 0] == before
        if ok:
            for j in range(min(h, before)):
                if token_ids[i, j] != old[i, 1 + j]:
                    ok = False
                    break
        if ok:
            tn = min(t, before)
            for j in range(tn):
                if token_ids[i, before - tn + j] != old[i, 1 + h + j]:
                    ok = False
                    break
        same[i] = ok
        changed += not ok
        now[i, 0] = n
        for j in range(min(h, n)):
            now[i, 1 + j] = token_ids[i, j]
        tn = min(t, n)
        for j in range(tn):
            now[i, 1 + h + j] = token_ids[i, n - tn + j]
    return changed


_compiled = None


def _kernel():
    """:func:`_fingerprint_rows` compiled by Numba (cached on disk), imported on first use, not with this module:
    vLLM's CPU worker, while it starts, walks every loaded module for Triton kernels and fails on llvmlite's
    objects (``'_lib_fn_wrapper' object has no attribute 'get'``), so numba must not be loaded before vLLM builds
    the drafter."""
    global _compiled
    if _compiled is None:
        from numba import njit

        _compiled = njit(cache=True, nogil=True)(_fingerprint_rows)
    return _compiled


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
        self._count = count()
        self._grow(8)
        self.reset()

    def __len__(self) -> int:
        """Requests tracked (the rows of the last step)."""
        return len(self._ids)

    @property
    def req_ids(self) -> list[str]:
        """The request id of each row at the last step."""
        return list(self._ids)

    def reset(self) -> list[str]:
        """Forget every row; returns the ids that were tracked (the proposer should remove them)."""
        left = list(getattr(self, "_ids", []))
        self._ids: list[str] = []  # row i's request at the last step; its fingerprint: self._fp[0][i]
        return left

    def _grow(self, rows: int) -> None:
        """Room for ``rows`` rows in both fingerprint buffers (lengths, first ``head`` and last ``tail`` tokens),
        the last step's kept."""
        old = getattr(self, "_fp", None)
        self._fp = [np.zeros((rows, 1 + self.head + self.tail), np.int64) for _ in range(2)]
        self._same = np.zeros(rows, np.bool_)
        if old is not None:
            self._fp[0][: len(old[0])] = old[0]

    def _key(self, length: int, head: np.ndarray, tail: np.ndarray) -> tuple[int, bytes, bytes]:
        """A fingerprint as a hashable key (the rows that changed are matched through a dict)."""
        hn, tn = max(0, min(self.head, length)), max(0, min(self.tail, length))  # stored tails are left-aligned
        return length, head[:hn].astype(np.int64).tobytes(), tail[:tn].astype(np.int64).tobytes()

    def update(self, sampled_token_ids: list[list[int]], num_tokens: np.ndarray, token_ids: np.ndarray
               ) -> RowChanges:
        """Match this step's rows ``0..B-1`` (``B = len(sampled_token_ids)``) with the requests of the last step.

        ``num_tokens`` (``[>= B]``) counts each row's tokens including this step's sampled ones; ``token_ids``
        (``[>= B, L]``) holds them. Neither is copied or written.
        """
        b = len(sampled_token_ids)
        if b > len(self._same):
            self._grow(max(b, 2 * len(self._same)))
        nums = num_tokens[:b]
        new = np.fromiter(map(len, sampled_token_ids), np.int64, b)
        old = len(self._ids)
        changed_count = _kernel()(token_ids, nums, new, old, self._fp[0], self._fp[1], self._same, self.head)
        if changed_count < 0:
            i = -1 - changed_count
            raise ValueError(f"num_tokens[{i}]={int(nums[i])} is outside [0, {token_ids.shape[1]}] (the width of "
                             "token_ids): vLLM's arrays do not match each other.")
        changes = RowChanges(req_ids=self._ids[:b] + [""] * (b - old), num_tokens=nums.tolist())
        if changed_count or old != b:
            changed = np.flatnonzero(~self._same[:b]).tolist()
            keys = {}
            for i in changed:
                before = changes.num_tokens[i] - int(new[i])
                keys[i] = ((-1, b"", b"") if before < 0 else
                           self._key(before, token_ids[i, : min(self.head, before)],
                                     token_ids[i, max(0, before - self.tail): before]))
            self._rematch(changes, changed, keys)
        self._ids = list(changes.req_ids)
        self._fp.reverse()
        return changes

    def _rematch(self, changes: RowChanges, changed: list[int], keys: dict[int, tuple[int, bytes, bytes]]) -> None:
        """Rows whose request changed: found among the last step's rows no row kept (vLLM moved it), or new.
        Requests of the last step found in no row have left."""
        fp, h = self._fp[0], self.head
        changed_set = set(changed)
        kept = {i for i in range(min(len(changes.req_ids), len(self._ids))) if i not in changed_set}
        free = {self._key(int(fp[j, 0]), fp[j, 1: 1 + h], fp[j, 1 + h:]): j for j in reversed(range(len(self._ids)))
                if j not in kept}
        claimed = set(kept)
        for i in changed:
            j = free.pop(keys[i], None) if keys[i][0] >= 0 else None
            if j is None or j == i:
                changes.req_ids[i] = f"vllm-row{i}-{next(self._count)}"
                changes.joined.append((i, changes.req_ids[i]))
            else:
                claimed.add(j)
                changes.req_ids[i] = self._ids[j]
        changes.left = [x for j, x in enumerate(self._ids) if j not in claimed]
