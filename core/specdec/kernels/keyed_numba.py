"""Numba kernel for keyed sampling on the CPU (:mod:`specdec.keyed`): the keyed sample of unfiltered rows in one
pass over each row, when numba is installed (the ngram plugin needs it; the torch reference runs otherwise).

The torch reference (:func:`specdec.keyed.gumbel_row_samples`) hashes every (row, token) pair with dozens of
whole-tensor int64 operations, then scores and reduces: about 1 ms a row at a 16k vocabulary on a 2-core machine,
and a verify step samples k + 1 rows a request. :func:`keyed_argmax_rows` walks each row once: the same 32-bit mixer
(in uint64 lanes masked to 32 bits), the same 23-bit uniform ``u``, the score ``logit * (1 / T) - log(-log u)`` in
float32, the lowest token id among equal scores. A token whose scaled logit is more than :data:`NOISE_BOUND` below
the best score so far, or below the row's largest scaled logit less :data:`NOISE_FLOOR` (the score that token gets at
least), cannot win (``-log(-log u)`` lies within -2.82 .. 16.64 for ``u`` in ``2**-24 .. 1 - 2**-24``), so its hash and
logarithms are skipped: the result is the same.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["NOISE_BOUND", "NOISE_FLOOR", "keyed_argmax_rows", "keyed_row_keys"]

NOISE_BOUND = np.float32(16.75)  # > -log(-log(1 - 2**-24)) = 16.6355, the largest Gumbel noise a uniform gives
NOISE_FLOOR = np.float32(2.85)  # > log(-log(2**-24)) = 2.8115, minus the smallest
_M32 = np.uint64(0xFFFFFFFF)
_C1 = np.uint64(0x7FEB352D)
_C2 = np.uint64(0x846CA68B)
_S9, _S15, _S16 = np.uint64(9), np.uint64(15), np.uint64(16)
_SEED_MIX, _KEY2_MIX, _S32 = np.uint64(0x9E3779B9), np.uint64(0x85EBCA6B), np.uint64(32)


@njit(cache=True, nogil=True, inline="always")
def _hash32(x):  # the mixer of specdec.keyed._hash32 on a value in [0, 2**32)
    x ^= x >> _S16
    x = (x * _C1) & _M32
    x ^= x >> _S15
    x = (x * _C2) & _M32
    return x ^ (x >> _S16)


@njit(cache=True, nogil=True)
def keyed_row_keys(seeds: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
    """``out[r] = specdec.keyed.row_keys(seeds[r], positions[r])`` for every row (``seeds``: uint64, two's
    complement; ``positions``: uint64; ``out``: int64 ``[R, 2]``), in one call: the numpy form costs a few
    microseconds per array operation (~35 of them), whatever the row count, on the host path of every keyed step."""
    for r in range(seeds.shape[0]):
        s = seeds[r]
        k = _hash32((s & _M32) ^ _SEED_MIX)
        k = _hash32(k ^ (s >> _S32))
        k = _hash32(k ^ (positions[r] & _M32))
        out[r, 0] = k
        out[r, 1] = _hash32(k ^ _KEY2_MIX)


@njit(cache=True, nogil=True)
def keyed_argmax_rows(logits: np.ndarray, rows: np.ndarray, k1: np.ndarray, k2: np.ndarray, inv: np.ndarray,
                      out: np.ndarray) -> None:
    """``out[r] = argmax_v logits[rows[r], v] * inv[r] - log(-log u(k1[r], k2[r], v))`` for each sampled row ``r``
    (``logits`` float32 ``[N, V]``; ``rows``, ``k1``, ``k2``, ``out`` int64; ``inv`` float32, 1 / T)."""
    vocab = logits.shape[1]
    half, scale = np.float32(0.5), np.float32(2.0 ** -23)
    for r in range(rows.shape[0]):
        row, a, b, s = rows[r], np.uint64(k1[r]), np.uint64(k2[r]), inv[r]
        top = np.float32(-np.inf)
        for v in range(vocab):
            top = max(top, np.float32(logits[row, v] * s))
        # the winner scores at least top - NOISE_FLOOR (the top token's own score): below that, nobody can win
        best, arg, floor = np.float32(-np.inf), 0, np.float32(top - NOISE_FLOOR)
        for v in range(vocab):
            x = np.float32(logits[row, v] * s)
            if x + NOISE_BOUND < max(best, floor):
                continue
            h = _hash32(_hash32(a ^ _hash32(np.uint64(v))) ^ b)
            u = np.float32((np.float32(h >> _S9) + half) * scale)
            score = np.float32(x - np.float32(np.log(np.float32(-np.log(u)))))
            if score > best:
                best, arg = score, v
        out[r] = arg
