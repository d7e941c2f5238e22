"""Which request each of vLLM's batch rows holds, although vLLM's custom-class hook passes no request ids.

vLLM hands ``propose`` its persistent batch: row ``i`` of ``token_ids_cpu`` is one running request, valid up to
``num_tokens_no_spec[i]``, which already counts the ``sampled_token_ids[i]`` appended this step. Rows are reused
as requests finish (a new request lands in a free row), moved down when vLLM condenses the batch, and reordered
(decodes before prefills). :class:`RowTracker` keeps per row a short fingerprint of the request it held at the
last step (its length, its first ``head`` tokens and the ``tail`` tokens before its end) and, each step, takes
row ``i`` to hold the same request when its length before this step's tokens and both fingerprints match; else
it looks the request up among the other rows' (moved), else the row holds a new request. Requests seen last
step and found in no row have left. Cost: O(head + tail + new tokens) per row and step. A plain loop over rows
with byte-string fingerprints: at vLLM's CPU batch sizes it costs a few microseconds a row, where a vectorised
numpy version spent ~70 us a step on its dozen small-array calls whatever the batch size.

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
        self._ids: list[str] = []  # row i's request at the last step
        self._len: list[int] = []  # its length then
        self._head: list[bytes] = []  # its first min(head, length) tokens
        self._tail: list[bytes] = []  # its last min(tail, length) tokens
        return left

    def update(self, sampled_token_ids: list[list[int]], num_tokens: np.ndarray, token_ids: np.ndarray
               ) -> RowChanges:
        """Match this step's rows ``0..B-1`` (``B = len(sampled_token_ids)``) with the requests of the last step.

        ``num_tokens`` (``[>= B]``) counts each row's tokens including this step's sampled ones; ``token_ids``
        (``[>= B, L]``) holds them. Neither is copied or written.
        """
        b = len(sampled_token_ids)
        nums = num_tokens[:b].tolist()
        size, h, t = token_ids.itemsize, self.head, self.tail
        old = len(self._ids)
        changed: list[int] = []
        keys: dict[int, tuple[int, bytes, bytes]] = {}  # changed row -> (length before, head, tail) now
        heads, tails = self._head[:b] + [b""] * (b - old), [b""] * b
        for i in range(b):
            n = nums[i]
            before = n - len(sampled_token_ids[i])
            start = max(0, before - t)
            seg = token_ids[i, start:n].tobytes()  # the old tail and this step's tokens, one read
            tail = seg[: (before - start) * size]
            tails[i] = seg[(max(0, n - t) - start) * size:]
            if (i < old and self._len[i] == before and self._tail[i] == tail
                    and self._head[i] == token_ids[i, : min(h, before)].tobytes()):
                if before < h:  # the head still grows with the request
                    heads[i] = token_ids[i, : min(h, n)].tobytes()
                continue
            if before < 0:
                before, tail = -1, b""
            head = token_ids[i, : max(0, min(h, before))].tobytes()
            changed.append(i)
            keys[i] = (before, head, tail)
            heads[i] = token_ids[i, : min(h, n)].tobytes()
        changes = RowChanges(req_ids=self._ids[:b] + [""] * (b - old), num_tokens=nums)
        if changed or old != b:
            self._rematch(changes, changed, keys)
        self._ids = list(changes.req_ids)
        self._len, self._head, self._tail = nums, heads, tails
        return changes

    def _rematch(self, changes: RowChanges, changed: list[int], keys: dict[int, tuple[int, bytes, bytes]]) -> None:
        """Rows whose request changed: found among the last step's rows no row kept (vLLM moved it), or new.
        Requests of the last step found in no row have left."""
        changed_set = set(changed)
        kept = {i for i in range(min(len(changes.req_ids), len(self._ids))) if i not in changed_set}
        free = {(self._len[j], self._head[j], self._tail[j]): j for j in reversed(range(len(self._ids)))
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
