"""Triton kernel for keyed sampling (:mod:`specdec.keyed`): the keyed sample of unfiltered rows in one launch.

The torch form hashes a whole ``[R, V]`` block with elementwise int64 tensor operations (about 150 a step with the
probabilities and the argmax), each a kernel launch on a GPU: on the H200 seeded T = 0.8 decoding of the bench model
ran at 19-23% of greedy's tokens per second at batch 8; this kernel made it 1.7-2.0x faster at batch 1-32 on a model
of the bench model's layers with a 128k vocabulary (``benchmarks/keyed_speed.py``). ``_keyed_argmax_kernel``, grid
``[R]``, does it in one pass over each row: it hashes (seed, position, token id) in uint32 lanes (the same 32-bit
mixer, so the same 23-bit uniforms ``u``, exactly), scores ``logit * (1 / T) - log(-log u)`` in float32 and keeps each
lane's best score (the lowest token id among equals), then the row's best, lowest id first (as ``torch.argmax``).
The row keys (two 32-bit words per row, :func:`specdec.keyed.row_keys`) come from the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK_V", "keyed_argmax"]

BLOCK_V = 2048  # vocabulary entries per inner step of a row


@triton.jit
def _hash32(x, c1, c2):
    """The 32-bit mixer of :func:`specdec.keyed._hash32` on uint32 lanes (``c1``, ``c2``: its multipliers as uint32
    tiles, so the products wrap modulo 2**32)."""
    x = x ^ (x >> 16)
    x = x * c1
    x = x ^ (x >> 15)
    x = x * c2
    return x ^ (x >> 16)


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _smaller(a, b):
    return tl.minimum(a, b)


@triton.jit
def _keyed_argmax_kernel(logits_ptr, stride, meta_ptr, inv_ptr, out_ptr, R, V, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row = tl.load(meta_ptr + r)  # meta: [3, R] int64, the logits row, key 1, key 2 of each sampled row
    k1 = tl.load(meta_ptr + R + r).to(tl.uint32)
    k2 = tl.load(meta_ptr + 2 * R + r).to(tl.uint32)
    inv_t = tl.load(inv_ptr + r)  # 1 / T: a multiply, bit-identical to torch's (Triton's float32 '/' is not)
    lanes = tl.arange(0, BLOCK)
    c1 = tl.full([BLOCK], 0x7FEB352D, tl.uint32)  # the mixer's multipliers; uint32 products wrap modulo 2**32
    c2 = tl.full([BLOCK], 0x846CA68B, tl.uint32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    arg = tl.full([BLOCK], 0, tl.int32)
    base = logits_ptr + row * stride
    for start in range(0, V, BLOCK):
        v = start + lanes
        ok = v < V
        x = tl.load(base + v, mask=ok, other=float("-inf")).to(tl.float32)
        h = _hash32(k1 ^ _hash32(v.to(tl.uint32), c1, c2), c1, c2)
        h = _hash32(h ^ k2, c1, c2)
        u = ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23: (0, 1), 23 bits, exact
        score = x * inv_t - tl.log(-tl.log(u))
        score = tl.where(ok, score, float("-inf"))
        better = score > best  # a later tile holds larger ids: ties keep the earlier one
        best = tl.where(better, score, best)
        arg = tl.where(better, v, arg)
    # tl.reduce with our own combiners, not tl.max / tl.min: the interpreter runs only builtins and this module's
    # jit functions when triton was imported without it (as in a test session that ran models before)
    top = tl.reduce(best, 0, _larger)
    tl.store(out_ptr + r, tl.reduce(tl.where(best == top, arg, V), 0, _smaller).to(tl.int64))


def keyed_argmax(logits: torch.Tensor, meta: torch.Tensor, inv_temperature: torch.Tensor) -> torch.Tensor:
    """``[R]`` int64: for each sampled row ``r``, ``argmax_v logits[meta[0, r], v] * inv_temperature[r] - log(-log u)``
    with ``u`` the keyed uniform of (``meta[1, r]``, ``meta[2, r]``, v) (:func:`specdec.keyed.row_keys`).

    Args:
        logits: ``[N, V]`` (rows contiguous), any float dtype (read as float32).
        meta: ``[3, R]`` int64 on the logits' device: logits row, key 1, key 2 of each sampled row.
        inv_temperature: ``[R]`` float32 on that device: 1 / T of each row (float32 division, as
            :func:`specdec.keyed.gumbel_row_samples` computes it).
    """
    n_rows, vocab = logits.shape
    r = meta.shape[1]
    out = torch.empty(r, dtype=torch.long, device=logits.device)
    if r:
        _keyed_argmax_kernel[(r,)](logits, logits.stride(0), meta, inv_temperature, out, r, vocab, BLOCK=BLOCK_V,
                                   num_warps=4)
    return out
