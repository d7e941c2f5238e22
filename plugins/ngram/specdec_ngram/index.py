"""Incremental n-gram index: per request, hash tables of the n-grams seen so far.

The scan (:mod:`specdec_ngram.scan`) rereads every request's whole history each step. The index
keeps, per request and per n in [min_n, max_n], a hash table mapping each n-gram to one position
where it ends: its first occurrence (``match="leftmost"``) or its latest (``match="recent"``).
The tables hold every n-gram that ends before the last token, so looking up the sequence's own
suffix, from max_n down, finds exactly the occurrence the scan would find. A step inserts the
n-grams ending at the newly appended positions and looks the suffix up: O(new tokens x
(max_n - min_n + 1)) whatever the context length, for the whole batch in one jitted call
(:func:`specdec_ngram.index_kernels.step`).

The index keeps its own copy of each request's history. Each step it compares the batch row
with it: a row that is shorter, or whose last max_n known tokens differ (the history was
rewritten), rebuilds that request's index from the row; otherwise only the new tokens are read.

Memory: one pool, anonymous ``mmap`` memory advised for transparent huge pages (random probes
into gigabytes of 4 KiB pages spend most of their time in page walks: ~10x slower here). A
request's region holds ``(nn + 1) * cap`` int64 words (``nn = max_n - min_n + 1``), ``cap``
between 2 and 3.75 times its length: 16-30 bytes per token per table plus its token copy. A
request that outgrows its region moves to a bigger one (rehash, O(its length), amortised O(1)
per token but a spike in that step). Regions are recycled per size class; the pool only grows,
and is released when the last request is removed.
"""

from __future__ import annotations

import mmap

import numpy as np

from specdec_ngram import index_kernels as _k

__all__ = ["NgramIndex", "warmup"]

_MIN_CAP = 64
_MIN_POOL_WORDS = 1 << 18


def _capacity(length: int) -> int:
    """Smallest size class (64 * 2^i or 96 * 2^i) >= 2 * length: tables stay at most half full."""
    need = max(2 * int(length), _MIN_CAP)
    pow2 = 1 << (need - 1).bit_length()
    three_quarters = pow2 // 4 * 3
    return three_quarters if three_quarters >= need and three_quarters >= _MIN_CAP else pow2


def _room_for(length: int) -> int:
    """Capacity for a request now ``length`` long, with headroom so it does not move again soon."""
    return _capacity(int(length) + int(length) // 4 + 32)


def _hugepage_array(words: int) -> np.ndarray:
    """An int64 array in anonymous memory advised for huge pages (plain numpy where unsupported)."""
    try:
        mm = mmap.mmap(-1, words * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            mm.madvise(mmap.MADV_HUGEPAGE)
        return np.frombuffer(mm, dtype=np.int64)
    except (AttributeError, OSError, ValueError):
        return np.empty(words, dtype=np.int64)


class NgramIndex:
    """Per-request n-gram indexes for a batch; :meth:`step` proposes exactly what the scan would.

    ``add(req_id, prompt)`` indexes a prompt (optional: a request first seen in :meth:`step` is
    indexed from its row), ``remove(req_id)`` frees it, ``step(...)`` syncs every row with the
    batch and drafts for the active rows.
    """

    def __init__(self, min_n: int, max_n: int, match: str = "leftmost") -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"min_n={min_n}, max_n={max_n} are invalid: the rule is 1 <= min_n <= max_n.")
        if match not in ("leftmost", "recent"):
            raise ValueError(f"match={match!r} is invalid: it must be 'leftmost' or 'recent'.")
        self.min_n, self.max_n, self.recent = min_n, max_n, match == "recent"
        self._nn = max_n - min_n + 1
        self._slots: dict[str, int] = {}
        self._free_slots: list[int] = []
        self._meta = np.zeros((0, 3), np.int64)  # per slot: OFF, CAP, LEN
        self._reset_pool()

    def _reset_pool(self) -> None:
        self._pool = np.empty(0, np.int64)
        self._top = 0  # bump pointer into the pool
        self._free_regions: dict[int, list[int]] = {}  # cap -> offsets of free regions of that size

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._slots

    def nbytes(self) -> int:
        """Bytes of pool memory in use by live requests."""
        caps = self._meta[list(self._slots.values()), _k.CAP]
        return int(caps.sum()) * (self._nn + 1) * 8

    # -- regions --------------------------------------------------------------------------------
    def _alloc(self, cap: int) -> int:
        free = self._free_regions.get(cap)
        if free:
            return free.pop()
        words = (self._nn + 1) * cap
        if self._top + words > self._pool.shape[0]:
            grown = _hugepage_array(max(2 * self._pool.shape[0], self._top + words, _MIN_POOL_WORDS))
            grown[: self._top] = self._pool[: self._top]
            self._pool = grown
        off = self._top
        self._top += words
        return off

    def _release(self, off: int, cap: int) -> None:
        self._free_regions.setdefault(cap, []).append(off)

    def _new_slot(self, req_id: str, length: int) -> int:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = len(self._slots) + len(self._free_slots)
            if slot >= self._meta.shape[0]:
                grow = max(16, self._meta.shape[0])
                self._meta = np.concatenate([self._meta, np.zeros((grow, 3), np.int64)])
        cap = _room_for(length)
        self._meta[slot] = (self._alloc(cap), cap, 0)
        self._pool[self._meta[slot, 0] + cap: self._meta[slot, 0] + (self._nn + 1) * cap] = -1
        self._slots[req_id] = slot
        return slot

    def _grow(self, slots: np.ndarray, lengths: np.ndarray) -> None:
        """Give every slot a region with room for its new length (rehashing in one jitted call)."""
        new_cap = np.array([_room_for(n) for n in lengths], np.int64)
        old = [(int(self._meta[s, _k.OFF]), int(self._meta[s, _k.CAP])) for s in slots]
        new_off = np.array([self._alloc(int(c)) for c in new_cap], np.int64)
        _k.relocate(self._pool, self._meta, slots, new_off, new_cap, self._nn)
        for off, cap in old:
            self._release(off, cap)

    # -- requests -------------------------------------------------------------------------------
    def add(self, req_id: str, prompt_token_ids: np.ndarray) -> None:
        """Index a new request's prompt (replacing anything kept under the same id)."""
        tokens = np.ascontiguousarray(prompt_token_ids)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"prompt_token_ids must be a 1-D integer array; got {tokens.dtype} "
                             f"with shape {tokens.shape}.")
        self.remove(req_id)
        slot = self._new_slot(req_id, tokens.shape[0])
        _k.index_sequence(self._pool, self._meta, slot, tokens.astype(np.int32, copy=False),
                          self.min_n, self.max_n, self.recent)

    def remove(self, req_id: str) -> None:
        """Free a request's index; unknown ids are ignored."""
        slot = self._slots.pop(req_id, None)
        if slot is None:
            return
        self._release(int(self._meta[slot, _k.OFF]), int(self._meta[slot, _k.CAP]))
        self._free_slots.append(slot)
        if not self._slots:  # give the memory back once idle
            self._free_slots.clear()
            self._reset_pool()

    def step(self, req_ids, token_ids, num_tokens, active, k, max_model_len):
        """Sync every row, then draft for active rows: (``[B, k]`` int64 padded -1, ``[B]`` counts).

        ``token_ids`` (``[B, L]`` int32/int64, C-contiguous), ``num_tokens`` (int64) and ``active``
        (bool) must be checked already (``scan.check_batch``); ``req_ids`` must be distinct.
        """
        slots_of = self._slots
        try:
            slots = np.fromiter(map(slots_of.__getitem__, req_ids), np.int64, len(req_ids))
        except KeyError:
            slots = np.array([slots_of[r] if r in slots_of else self._new_slot(r, int(n))
                              for r, n in zip(req_ids, num_tokens)], np.int64)
        short = np.flatnonzero(2 * num_tokens > self._meta[slots, _k.CAP])
        if short.size:
            self._grow(slots[short], num_tokens[short])
        out = np.full((len(req_ids), k), -1, dtype=np.int64)
        num_out = np.zeros(len(req_ids), dtype=np.int64)
        _k.step(self._pool, self._meta, slots, token_ids, num_tokens, active, self.min_n, self.max_n, k,
                max_model_len, self.recent, out, num_out)
        return out, num_out


def warmup(min_n: int, max_n: int, match: str) -> None:
    """Compile (or load from Numba's cache) the index kernels for int32 batches."""
    idx = NgramIndex(min_n, max_n, match)
    idx.add("warmup", np.arange(12, dtype=np.int32) % 3)
    ids = (np.arange(400, dtype=np.int32) % 3).reshape(2, 200)
    for n in (12, 40, 200):  # the last length forces a relocation
        idx.step(["warmup", "warmup-2"], ids, np.array([n, 9], np.int64), np.ones(2, np.bool_), 2, 512)
