"""Numba scan kernel: each step, search every request's whole history for its suffix (vLLM's way).

Per sequence of length T, one left-to-right pass (right-to-left for ``match="recent"``) over the
history. Most positions are rejected by one compare with the last token, done 64 at a time as a
branch-free count the compiler vectorises; only blocks holding that token are walked, and only
candidates extend backwards (at most ``max_n`` compares each). The pass stops early once an
occurrence of full length ``max_n`` is found, since nothing can beat it. So the cost is O(T) with a
small constant and no allocation, against vLLM's KMP failure-function pass (kept here as
:func:`lps_propose`, the baseline the benchmark compares with).

Launchers: :func:`scan_propose` checks shapes and dtypes and picks the thread count; :func:`scan_sampled` is the
one-call, one-thread path the proposer takes when the arrays already fit (lengths checked inside the kernel).
Reference: :mod:`specdec_ngram.naive`.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

__all__ = ["scan_propose", "scan_sampled", "lps_propose", "find_longest_ngram", "ngram_propose", "warmup"]

_BLOCK = 64
_INT_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


@njit(cache=True, nogil=True)
def _extend(tokens, e, total, lim):
    """Length (<= lim) of the common suffix of tokens[:e+1] and tokens[:total], given tokens[e] matches."""
    m = 1
    while m < lim and tokens[e - m] == tokens[total - 1 - m]:
        m += 1
    return m


@njit(cache=True, nogil=True)
def _count_eq(block, value):
    """How many of the _BLOCK entries of ``block`` equal value.

    Branch-free over a slice so that LLVM vectorises it: indexing ``tokens[begin + j]`` directly
    keeps Numba's negative-index wraparound check in the loop, which blocks vectorisation and made
    the backward scan 10-80x slower.
    """
    hits = 0
    for j in range(_BLOCK):
        hits += block[j] == value
    return hits


@njit(cache=True, nogil=True)
def _match_leftmost(tokens, total, cap):
    """(length, end) of the longest earlier match of the suffix, capped at ``cap``; earliest end wins."""
    last = tokens[total - 1]
    best = 0
    best_e = -1
    stop = total - 1  # an occurrence ends at e <= total - 2
    e = 0
    while e < stop:
        end = min(e + _BLOCK, stop)
        if end - e == _BLOCK and _count_eq(tokens[e:end], last) == 0:
            e = end
            continue
        for j in range(e, end):
            if tokens[j] == last:
                m = _extend(tokens, j, total, min(cap, j + 1))
                if m > best:
                    best = m
                    best_e = j
                    if best == cap:
                        return best, best_e
        e = end
    return best, best_e


@njit(cache=True, nogil=True)
def _match_recent(tokens, total, cap):
    """As :func:`_match_leftmost`, scanning from the end: the latest end wins."""
    last = tokens[total - 1]
    best = 0
    best_e = -1
    e = total - 1  # exclusive upper end of the block being scanned
    while e > 0:
        begin = max(e - _BLOCK, 0)
        if e - begin == _BLOCK and _count_eq(tokens[begin:e], last) == 0:
            e = begin
            continue
        for j in range(e - 1, begin - 1, -1):
            if tokens[j] == last:
                m = _extend(tokens, j, total, min(cap, j + 1))
                if m > best:
                    best = m
                    best_e = j
                    if best == cap:
                        return best, best_e
        e = begin
    return best, best_e


@njit(cache=True, nogil=True)
def _propose_row(tokens, total, min_n, max_n, k, max_model_len, recent, out_row):
    """Write one row's drafts into ``out_row``; returns how many."""
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0 or total < 2:
        return 0
    cap = min(max_n, total - 1)
    if recent:
        n, e = _match_recent(tokens, total, cap)
    else:
        n, e = _match_leftmost(tokens, total, cap)
    if n < min_n:
        return 0
    count = min(k, total - 1 - e)
    for j in range(count):
        out_row[j] = tokens[e + 1 + j]
    return count


@njit(cache=True, nogil=True)
def _scan_serial(token_ids, num_tokens, active, min_n, max_n, k, max_model_len, recent, out, num_out):
    for i in range(token_ids.shape[0]):
        if active[i]:
            num_out[i] = _propose_row(token_ids[i], num_tokens[i], min_n, max_n, k, max_model_len,
                                      recent, out[i])


@njit(cache=True, nogil=True)
def _scan_sampled(token_ids, num_tokens, new, min_n, max_n, k, max_model_len, recent, out, num_out):
    """:func:`_scan_serial` for the rows that sampled this step (``new[i] > 0``), every length checked against
    the width first (the kernels do not bounds-check): returns ``-1 - i`` for the first row whose length lies
    outside ``[0, width]``, reading nothing, else 0. One call does what check_batch + scan_propose do in six
    numpy calls (the vLLM adapter's per-step host time)."""
    width = token_ids.shape[1]
    for i in range(token_ids.shape[0]):
        if num_tokens[i] < 0 or num_tokens[i] > width:
            return -1 - i
    _scan_serial(token_ids, num_tokens, new > 0, min_n, max_n, k, max_model_len, recent, out, num_out)
    return 0


@njit(cache=True, nogil=True, parallel=True)
def _scan_parallel(token_ids, num_tokens, active, min_n, max_n, k, max_model_len, recent, out, num_out):
    for i in prange(token_ids.shape[0]):
        if active[i]:
            num_out[i] = _propose_row(token_ids[i], num_tokens[i], min_n, max_n, k, max_model_len,
                                      recent, out[i])


@njit(cache=True, nogil=True)
def _lps_row(tokens, total, min_n, max_n, k, max_model_len, out_row):
    """vLLM's algorithm: KMP failure function of the reversed sequence, capped at max_n (leftmost)."""
    k = min(k, max_model_len - total)
    if total < min_n or k <= 0:
        return 0
    # fail[j]: longest proper border of rev[:j+1], kept for j < max_n only; rev[i] = tokens[T-1-i].
    fail = np.zeros(max_n, np.int64)
    cur = 0
    best = 0
    best_i = 0
    for i in range(1, total):
        c = tokens[total - 1 - i]
        while cur > 0 and tokens[total - 1 - cur] != c:
            cur = fail[cur - 1]
        if tokens[total - 1 - cur] == c:
            cur += 1
            if cur >= best:  # ">=": the largest i, i.e. the earliest occurrence, wins ties
                best = cur
                best_i = i
        if i < max_n:
            fail[i] = cur
        if cur == max_n:
            cur = fail[max_n - 1]
    if best < min_n:
        return 0
    start = total - 1 - best_i + best
    count = min(k, total - start)
    for j in range(count):
        out_row[j] = tokens[start + j]
    return count


@njit(cache=True, nogil=True)
def _lps_serial(token_ids, num_tokens, active, min_n, max_n, k, max_model_len, out, num_out):
    for i in range(token_ids.shape[0]):
        if active[i]:
            num_out[i] = _lps_row(token_ids[i], num_tokens[i], min_n, max_n, k, max_model_len, out[i])


def check_batch(token_ids: np.ndarray, num_tokens: np.ndarray, active: np.ndarray | None):
    """Validate and normalise a batch: (token_ids [B, L] int32/int64 C-contiguous, num_tokens [B]
    int64, active [B] bool). Raises ValueError/TypeError naming the offending array."""
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2:
        raise ValueError(f"token_ids must be 2-D [B, L]; got shape {token_ids.shape}.")
    if token_ids.dtype not in (np.int32, np.int64):
        raise TypeError(f"token_ids must be int32 or int64; got {token_ids.dtype}.")
    token_ids = np.ascontiguousarray(token_ids)
    num_tokens = np.ascontiguousarray(num_tokens, dtype=np.int64)
    batch, width = token_ids.shape
    if num_tokens.shape != (batch,):
        raise ValueError(f"num_tokens must have shape ({batch},) to match token_ids; got {num_tokens.shape}.")
    if batch and (num_tokens.min() < 0 or num_tokens.max() > width):
        raise ValueError(f"num_tokens must lie in [0, {width}] (the width of token_ids); got "
                         f"min {num_tokens.min()}, max {num_tokens.max()}.")
    if active is None:
        active = np.ones(batch, dtype=np.bool_)
    else:
        active = np.ascontiguousarray(active, dtype=np.bool_)
        if active.shape != (batch,):
            raise ValueError(f"active must have shape ({batch},); got {active.shape}.")
    return token_ids, num_tokens, active


def _check_params(min_n: int, max_n: int, k: int) -> None:
    if not 1 <= min_n <= max_n:
        raise ValueError(f"min_n={min_n}, max_n={max_n} are invalid: the rule is 1 <= min_n <= max_n.")
    if k < 0:
        raise ValueError(f"k={k} is invalid: it must be >= 0.")


def pick_threads(num_tokens: np.ndarray, active: np.ndarray, num_threads: int | None, threshold: int) -> int:
    """One thread for small batches (fewer than ``threshold`` tokens), else up to num_threads."""
    limit = numba.config.NUMBA_NUM_THREADS if num_threads is None else min(num_threads,
                                                                           numba.config.NUMBA_NUM_THREADS)
    rows = int(np.count_nonzero(active))
    if rows <= 1 or limit <= 1 or int(num_tokens[active].sum()) < threshold:
        return 1
    return max(1, min(limit, rows))


def scan_propose(
    token_ids: np.ndarray,
    num_tokens: np.ndarray,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int,
    *,
    active: np.ndarray | None = None,
    match: str = "leftmost",
    num_threads: int | None = 1,
    parallel_threshold: int = 1 << 20,
    checked: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Drafts for a padded batch: (``[B, k]`` int64 padded with -1, ``[B]`` int64 counts).

    Rows with ``active[i] == False`` get no draft. ``num_threads=None`` uses every Numba thread
    once the batch holds ``parallel_threshold`` tokens; the result never depends on it.
    ``checked=True``: the arrays already come from :func:`check_batch` (skips a second check).
    """
    if not checked:
        token_ids, num_tokens, active = check_batch(token_ids, num_tokens, active)
    _check_params(min_n, max_n, k)
    if match not in ("leftmost", "recent"):
        raise ValueError(f"match={match!r} is invalid: it must be 'leftmost' or 'recent'.")
    out = np.full((token_ids.shape[0], k), -1, dtype=np.int64)
    num_out = np.zeros(token_ids.shape[0], dtype=np.int64)
    threads = pick_threads(num_tokens, active, num_threads, parallel_threshold)
    args = (token_ids, num_tokens, active, min_n, max_n, k, max_model_len, match == "recent", out, num_out)
    if threads == 1:
        _scan_serial(*args)
    else:
        before = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            _scan_parallel(*args)
        finally:
            numba.set_num_threads(before)
    return out, num_out


def scan_sampled(token_ids: np.ndarray, num_tokens: np.ndarray, sampled_token_ids: list, min_n: int, max_n: int,
                 k: int, max_model_len: int, recent: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """One-thread drafts for the rows that sampled this step, in one kernel call, or None when the arrays are not
    already what the kernel takes (``token_ids`` a C-contiguous 2-D int32/int64 array, ``num_tokens`` a 1-D
    int32/int64 array of the same rows): the caller then goes through :func:`check_batch` and
    :func:`scan_propose`. Lengths outside ``[0, width]`` raise check_batch's ValueError."""
    if not (type(token_ids) is np.ndarray and type(num_tokens) is np.ndarray and token_ids.ndim == 2
            and num_tokens.ndim == 1 and token_ids.dtype in _INT_DTYPES and num_tokens.dtype in _INT_DTYPES
            and token_ids.flags.c_contiguous and num_tokens.shape[0] == token_ids.shape[0]):
        return None
    b = token_ids.shape[0]
    new = np.fromiter(map(len, sampled_token_ids), np.int64, b)
    out = np.full((b, k), -1, dtype=np.int64)
    num_out = np.zeros(b, dtype=np.int64)
    if _scan_sampled(token_ids, num_tokens, new, min_n, max_n, k, max_model_len, recent, out, num_out) < 0:
        check_batch(token_ids, num_tokens, None)  # raises, naming the lengths
    return out, num_out


def lps_propose(token_ids, num_tokens, min_n, max_n, k, max_model_len, *, active=None):
    """The same batch API with vLLM's KMP algorithm (leftmost only, one thread): the baseline."""
    token_ids, num_tokens, active = check_batch(token_ids, num_tokens, active)
    _check_params(min_n, max_n, k)
    out = np.full((token_ids.shape[0], k), -1, dtype=np.int64)
    num_out = np.zeros(token_ids.shape[0], dtype=np.int64)
    _lps_serial(token_ids, num_tokens, active, min_n, max_n, k, max_model_len, out, num_out)
    return out, num_out


def find_longest_ngram(
    tokens: np.ndarray, min_n: int, max_n: int, k: int, max_model_len: int, match: str = "leftmost"
) -> np.ndarray:
    """Draft for one sequence: what followed the earliest (or latest, ``match="recent"``) earlier
    occurrence of its longest suffix n-gram, n in [min_n, max_n]; empty if none. Same dtype as tokens."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D; got shape {tokens.shape}.")
    src = tokens if tokens.dtype in (np.int32, np.int64) else tokens.astype(np.int64)
    out, num = scan_propose(src[None, :], np.array([tokens.shape[0]]), min_n, max_n, k, max_model_len,
                            match=match)
    return out[0, : num[0]].astype(tokens.dtype)


def ngram_propose(
    token_ids: np.ndarray,
    num_tokens: np.ndarray,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int,
    match: str = "leftmost",
    num_threads: int | None = None,
) -> list[list[int]]:
    """Batch version of :func:`find_longest_ngram` over a padded ``[B, L]`` array, as lists."""
    out, num = scan_propose(token_ids, num_tokens, min_n, max_n, k, max_model_len, match=match,
                            num_threads=num_threads)
    return [row[:n] for row, n in zip(out.tolist(), num.tolist())]


def warmup(num_threads: int | None = None) -> None:
    """Compile (or load from Numba's cache) the one-thread kernels for int32 and int64 ids.

    The parallel kernel is deliberately not run here: starting Numba's thread pool leaves worker
    threads that (with the OpenMP layer) spin on small machines and slowed whole processes ~10x on
    a 2-core box. It is compiled on first use instead, which only happens for batches holding at
    least ``parallel_threshold`` tokens. ``num_threads`` is accepted for API stability."""
    del num_threads
    for dtype in (np.int32, np.int64):
        ids = np.arange(24, dtype=dtype).reshape(2, 12) % 3
        scan_propose(ids, np.array([12, 7]), 1, 3, 2, 64)
        scan_propose(ids, np.array([12, 7]), 1, 3, 2, 64, match="recent")
        for num_dtype in (np.int32, np.int64):  # vLLM's lengths are int32, the engine's int64
            scan_sampled(ids, np.array([12, 7], num_dtype), [[1], []], 1, 3, 2, 64, False)
