"""Numba kernels of the incremental n-gram index (the Python side is :mod:`specdec_ngram.index`).

Memory layout. All requests live in one ``int64`` pool. Request slot ``s`` owns the region
``pool[off : off + (nn + 1) * cap]`` (``off, cap, len = meta[s]``, ``nn = max_n - min_n + 1``):
first ``cap`` words holding its token history, then one open-addressing hash table of ``cap``
buckets per n-gram length. A bucket holds ``fingerprint << 32 | end`` (-1 = empty): the n-gram
ending at position ``end`` whose 64-bit hash has these top 31 bits. The bucket index comes from
the fingerprint alone (``fp * cap >> 31``), so relocating to a bigger region rehashes without
reading tokens; a fingerprint hit is confirmed by comparing tokens, so collisions never change
a proposal. Each table keeps the first (``recent=False``) or the latest (``recent=True``) end of
every n-gram that ends before the last token.

Why passes over the batch: at long context the tables are far out of cache and every insert or
lookup is a random access. One after another they cost a DRAM round trip each (~100 ns here);
hashing everything first and prefetching every bucket lets the memory system serve the misses
in parallel, which is what brings a step for 256 requests to tens of microseconds.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

OFF, CAP, LEN = 0, 1, 2  # meta columns
_MASK32 = np.int64(0xFFFFFFFF)
_SEED = np.uint64(0x243F6A8885A308D3)
_MUL1 = np.uint64(0x9E3779B97F4A7C15)
_MUL2 = np.uint64(0xBF58476D1CE4E5B9)


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Ask the CPU to start loading ``arr[idx]`` (LLVM's prefetch: never faults, changes nothing)."""

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], fnty)
        # rw=1 (buckets get written), locality=3 (keep in every cache level), data cache.
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, types.intp), codegen


@njit(cache=True, nogil=True)
def _ngram_fps(pool, tok0, end, count, fps, f0):
    """fps[f0 + j] = fingerprint (31 bits, >= 0) of the (j+1)-gram ending at ``end``, j < count.

    Everything below indexes the pool with plain offsets (``tok0``: where a slot's tokens start,
    ``tab0``: where one of its tables starts) rather than slicing it: each slice is a new array
    view whose reference count Numba bumps atomically, which cost more than the probing itself.
    """
    h = _SEED
    for j in range(count):
        h = (h ^ np.uint64(pool[tok0 + end - j])) * _MUL1
        x = h ^ (h >> np.uint64(31))
        x = x * _MUL2
        x = x ^ (x >> np.uint64(29))
        fps[f0 + j] = np.int64(x >> np.uint64(33))


@njit(cache=True, nogil=True)
def _same(pool, tok0, p, q, n):
    for j in range(n):
        if pool[tok0 + p - j] != pool[tok0 + q - j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _insert(pool, tab0, cap, fp, end, n, tok0, recent):
    """Record that the n-gram with fingerprint fp ends at ``end`` (first or latest end kept).
    Returns whether it had been seen before."""
    b = (fp * cap) >> 31
    while True:
        ent = pool[tab0 + b]
        if ent < 0:
            pool[tab0 + b] = (fp << 32) | end
            return False
        if (ent >> 32) == fp and _same(pool, tok0, ent & _MASK32, end, n):
            if recent:
                pool[tab0 + b] = (fp << 32) | end
            return True
        b += 1
        if b == cap:
            b = 0


@njit(cache=True, nogil=True)
def _find(pool, tab0, cap, fp, end, n, tok0):
    """Stored end of the n-gram that ends at ``end`` (an earlier occurrence), or -1."""
    b = (fp * cap) >> 31
    while True:
        ent = pool[tab0 + b]
        if ent < 0:
            return -1
        if (ent >> 32) == fp and _same(pool, tok0, ent & _MASK32, end, n):
            return ent & _MASK32
        b += 1
        if b == cap:
            b = 0


@njit(cache=True, nogil=True)
def relocate(pool, meta, slots, new_off, new_cap, nn):
    """Move each slot to its new (bigger) region, rehashing its tables by fingerprint."""
    for i in range(slots.shape[0]):
        s = slots[i]
        off, cap, seen = meta[s, OFF], meta[s, CAP], meta[s, LEN]
        dst_off, dst_cap = new_off[i], new_cap[i]
        pool[dst_off: dst_off + seen] = pool[off: off + seen]
        pool[dst_off + dst_cap: dst_off + (nn + 1) * dst_cap] = -1
        for r in range(nn):
            src0 = off + (r + 1) * cap
            dst0 = dst_off + (r + 1) * dst_cap
            for b0 in range(cap):
                ent = pool[src0 + b0]
                if ent >= 0:
                    b = ((ent >> 32) * dst_cap) >> 31
                    while pool[dst0 + b] >= 0:
                        b += 1
                        if b == dst_cap:
                            b = 0
                    pool[dst0 + b] = ent
        meta[s, OFF] = dst_off
        meta[s, CAP] = dst_cap


@njit(cache=True, nogil=True)
def _sync_tokens(pool, meta, s, token_ids, i, total, max_n, nn):
    """Append ``token_ids[i, len:total]`` to slot s's history, first resetting the slot if the row
    no longer extends what it saw (shorter, or its last max_n seen tokens differ). Returns the
    first position whose n-grams need inserting (all that end before the new last token)."""
    seen = meta[s, LEN]
    off, cap = meta[s, OFF], meta[s, CAP]
    fresh = seen > total
    if not fresh:
        for j in range(seen - min(max_n, seen), seen):
            if pool[off + j] != token_ids[i, j]:
                fresh = True
                break
    if fresh:
        pool[off + cap: off + (nn + 1) * cap] = -1
        seen = 0
    for j in range(seen, total):
        pool[off + j] = token_ids[i, j]
    meta[s, LEN] = total
    return max(seen - 1, 0)


@njit(cache=True, nogil=True)
def _prefetch_buckets(pool, meta, s, fps, f0, e, min_n, max_n):
    off, cap = meta[s, OFF], meta[s, CAP]
    for n in range(min_n, min(max_n, e + 1) + 1):
        _prefetch(pool, off + (n - min_n + 1) * cap + ((fps[f0 + n - 1] * cap) >> 31))


@njit(cache=True, nogil=True)
def _insert_all(pool, meta, s, fps, f0, e, min_n, max_n, recent):
    off, cap = meta[s, OFF], meta[s, CAP]
    for n in range(min(max_n, e + 1), min_n - 1, -1):
        seen = _insert(pool, off + (n - min_n + 1) * cap, cap, fps[f0 + n - 1], e, n, off, recent)
        if seen and not recent:
            # An earlier n-gram equal to this one has its shorter suffixes indexed at its end
            # already, and "leftmost" keeps first ends: nothing shorter would change.
            return


@njit(cache=True, nogil=True)
def _draft(pool, meta, s, fps, f0, min_n, max_n, k, max_model_len, out, i):
    """Drafts for one synced slot (fps: its suffix n-grams'); the scan's rule. Returns the count."""
    off, cap, total = meta[s, OFF], meta[s, CAP], meta[s, LEN]
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return 0
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        p = _find(pool, off + (n - min_n + 1) * cap, cap, fps[f0 + n - 1], total - 1, n, off)
        if p >= 0:
            count = min(k, total - 1 - p)
            for j in range(count):
                out[i, j] = pool[off + p + 1 + j]
            return count
    return 0


@njit(cache=True, nogil=True)
def step(pool, meta, slots, token_ids, num_tokens, active, min_n, max_n, k, max_model_len, recent,
         out, num_out):
    """Sync every row's slot with the batch, then draft for the active rows (one call per step)."""
    batch = token_ids.shape[0]
    nn = max_n - min_n + 1
    for i in range(batch):
        if num_tokens[i] > 0:
            _prefetch(token_ids[i], num_tokens[i] - 1)
            _prefetch(pool, meta[slots[i], OFF] + max(meta[slots[i], LEN] - 1, 0))
    first = np.empty(batch, np.int64)
    jobs = 0  # one per position e in [first, total): inserts for e < total - 1, the lookup at total - 1
    for i in range(batch):
        first[i] = _sync_tokens(pool, meta, slots[i], token_ids, i, num_tokens[i], max_n, nn)
        jobs += max(num_tokens[i] - first[i], 0)
    fps = np.empty(jobs * max_n, np.int64)
    j = 0
    for i in range(batch):
        s = slots[i]
        for e in range(first[i], num_tokens[i]):
            _ngram_fps(pool, meta[s, OFF], e, min(max_n, e + 1), fps, j * max_n)
            _prefetch_buckets(pool, meta, s, fps, j * max_n, e, min_n, max_n)
            j += 1
    j = 0
    for i in range(batch):
        s = slots[i]
        total = num_tokens[i]
        for e in range(first[i], total - 1):
            _insert_all(pool, meta, s, fps, j * max_n, e, min_n, max_n, recent)
            j += 1
        if total > 0:
            if active[i]:
                num_out[i] = _draft(pool, meta, s, fps, j * max_n, min_n, max_n, k, max_model_len, out, i)
            j += 1


@njit(cache=True, nogil=True)
def index_sequence(pool, meta, s, tokens, min_n, max_n, recent):
    """Make slot s hold exactly ``tokens`` (reset, copy, insert every n-gram), prefetching ahead."""
    nn = max_n - min_n + 1
    total = tokens.shape[0]
    off, cap = meta[s, OFF], meta[s, CAP]
    pool[off + cap: off + (nn + 1) * cap] = -1
    pool[off: off + total] = tokens
    meta[s, LEN] = total
    chunk = 32
    fps = np.empty(chunk * max_n, np.int64)
    for e0 in range(0, total - 1, chunk):
        e1 = min(e0 + chunk, total - 1)
        for e in range(e0, e1):
            _ngram_fps(pool, off, e, min(max_n, e + 1), fps, (e - e0) * max_n)
            _prefetch_buckets(pool, meta, s, fps, (e - e0) * max_n, e, min_n, max_n)
        for e in range(e0, e1):
            _insert_all(pool, meta, s, fps, (e - e0) * max_n, e, min_n, max_n, recent)
