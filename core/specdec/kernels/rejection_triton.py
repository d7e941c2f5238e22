"""Triton kernels for the rejection sampler: the same tokens as the torch reference
(:func:`specdec.rejection_torch.sample_prepared`) given the same :class:`SamplerInputs`.

Both implementations start from :func:`specdec.rejection_torch.prepare_sampler_inputs`, which
validates the call, computes the target probabilities ``p`` in torch and draws every random number
(float64 uniforms ``u``, inverse ``Exp(1)`` noise ``1 / E``); the kernels only replace the verification proper:

1. ``_greedy_argmax_kernel``, grid ``[B, k + 1, S]`` (only when the batch holds greedy requests):
   for each greedy request, position and vocabulary split, the max and first argmax of its target
   logits row, read through the metadata's row indices (no gathered copy of the logits).
2. ``_accept_kernel``, grid ``[B]``: every draft of a request at once. Greedy: ``x == argmax``;
   random: ``u * q(x) < p(x)`` in float64. The accepted length is the first failure; writes the
   accepted drafts, the greedy token and the -1 padding.
3. ``_race_kernel``, grid ``[B, S]`` (random requests): the exponential race ``argmax(w * (1 / E))``,
   both with ``w = max(p - q, 0)`` (one-hot drafts: ``p`` with ``p(x)`` zeroed) at the first rejected
   draft and with ``w = p`` at that row (the fallback) or at the bonus row, in one read of the row.
4. ``_finalize_kernel``, grid ``[B]``: combines the splits and writes the random token.

The vocabulary is read in ``BLOCK_V`` tiles and may be split over ``S`` programs per row, so a
single request still spreads over the GPU at V = 152k. Draft ids outside ``[0, V)`` are never used
as addresses: every load they index is masked by ``0 <= x < V``.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from specdec.metadata import SpecDecodeMetadata
from specdec.rejection_torch import (
    PLACEHOLDER_TOKEN_ID,
    SamplerInputs,
    prepare_sampler_inputs,
    sample_prepared,
)
from specdec.sampling import SamplingMetadata

__all__ = ["launch_rejection_kernels", "rejection_sample_triton", "sample_prepared_triton"]

# Globals read inside @triton.jit functions must be constexpr.
_INT32_MAX = tl.constexpr(2**31 - 1)
_PAD = tl.constexpr(PLACEHOLDER_TOKEN_ID)
_MAX_GRID_YZ = 65535  # CUDA limit on grid dimensions 1 and 2
_LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------------------ kernels


@triton.jit
def _greedy_argmax_kernel(
    logits_ptr, logits_row_stride,  # [R, V] target logits, any float dtype
    target_rows_ptr, bonus_rows_ptr,  # [N], [B] int64 rows of logits_ptr
    cu_ptr, greedy_ptr,  # [B] inclusive prefix sum of draft counts, [B] int8
    part_val_ptr, part_idx_ptr,  # [B, K1, S] float32 / int32 per-split max and argmax
    V, K1, S, chunk,
    BLOCK_V: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    s = tl.program_id(2)
    start = tl.load(cu_ptr + i - 1, mask=i > 0, other=0).to(tl.int64)
    num = tl.load(cu_ptr + i).to(tl.int64) - start
    greedy = tl.load(greedy_ptr + i) != 0
    if greedy & (j <= num):
        row = tl.load(target_rows_ptr + start + j, mask=j < num, other=0)
        row = tl.where(j < num, row, tl.load(bonus_rows_ptr + i)).to(tl.int64)
        base = logits_ptr + row * logits_row_stride
        lo = s * chunk
        hi = tl.minimum(lo + chunk, V)
        lanes = tl.arange(0, BLOCK_V)
        # Per-lane running max with a strict '>' keeps each lane's first maximum; the final min over
        # tied lanes then gives the first index overall, as torch.argmax does.
        best_val = tl.full([BLOCK_V], float("-inf"), tl.float32)
        best_idx = lo + lanes
        for v0 in range(lo, hi, BLOCK_V):
            cols = v0 + lanes
            x = tl.load(base + cols, mask=cols < hi, other=float("-inf")).to(tl.float32)
            better = x > best_val
            best_idx = tl.where(better, cols, best_idx)
            best_val = tl.where(better, x, best_val)
        top = tl.max(best_val, axis=0)
        out = (i * K1 + j) * S + s
        tl.store(part_val_ptr + out, top)
        tl.store(part_idx_ptr + out, tl.min(tl.where(best_val == top, best_idx, _INT32_MAX), axis=0))


@triton.jit
def _splat(flag, lanes):
    """Scalar bool ``flag`` as a bool vector shaped like ``lanes``: masks are combined from vectors only,
    because the Triton interpreter mistypes ``scalar & vector`` on booleans."""
    return (lanes * 0 + flag.to(tl.int32)) != 0


@triton.jit
def _argmax_of_splits(val_ptr, idx_ptr, base, S, mask, BLOCK_S: tl.constexpr):
    """``[R]`` first argmax over the ``S`` per-split results starting at each ``base`` offset."""
    s = tl.arange(0, BLOCK_S)
    offs = base[:, None] + s[None, :]
    m = mask[:, None] & (s[None, :] < S)
    vals = tl.load(val_ptr + offs, mask=m, other=float("-inf"))
    idxs = tl.load(idx_ptr + offs, mask=m, other=_INT32_MAX)
    top = tl.max(vals, axis=1)
    return tl.min(tl.where(vals == top[:, None], idxs, _INT32_MAX), axis=1)


@triton.jit
def _accept_kernel(
    out_ptr, accept_len_ptr,  # [B, K1] int64 result, [B] int32
    draft_ptr, cu_ptr, greedy_ptr,  # [N] int64, [B], [B] int8
    part_val_ptr, part_idx_ptr,  # greedy per-split results [B, K1, S]
    p_ptr, q_ptr, u_ptr,  # [N + B, V] float32, [N, V] draft probs, [N] float64
    V, K1, S,
    HAS_GREEDY: tl.constexpr, HAS_RANDOM: tl.constexpr, HAS_Q: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    start = tl.load(cu_ptr + i - 1, mask=i > 0, other=0).to(tl.int64)
    num = tl.load(cu_ptr + i).to(tl.int64) - start
    greedy = tl.load(greedy_ptr + i) != 0
    pos = tl.arange(0, BLOCK_K)  # draft positions, then the bonus position num
    active = pos < num
    x = tl.load(draft_ptr + start + pos, mask=active, other=_PAD)  # [BLOCK_K] int64
    in_range = (x >= 0) & (x < V)
    if HAS_GREEDY:
        argmax = _argmax_of_splits(part_val_ptr, part_idx_ptr, (i * K1 + pos) * S, S,
                                   _splat(greedy, pos) & (pos <= num), BLOCK_S)
        ok_greedy = x == argmax
    if HAS_RANDOM:
        safe = tl.where(in_range, x, 0)
        m = active & in_range & ~_splat(greedy, pos)
        p_x = tl.load(p_ptr + (start + pos) * V + safe, mask=m, other=0.0).to(tl.float64)
        if HAS_Q:
            q_x = tl.load(q_ptr + (start + pos) * V + safe, mask=m, other=0.0).to(tl.float32).to(tl.float64)
        else:
            q_x = tl.full([BLOCK_K], 1.0, tl.float64)
        u = tl.load(u_ptr + start + pos, mask=m, other=1.0)
        # float64 and u * q < p (no division): the comparison is exact for tiny p(x), and
        # p(x) == 0 is never accepted.
        ok_random = in_range & (u * q_x < p_x)
    if HAS_GREEDY and HAS_RANDOM:
        ok = tl.where(greedy, ok_greedy, ok_random)
    elif HAS_GREEDY:
        ok = ok_greedy
    else:
        ok = ok_random
    fail = active & ~ok
    accept_len = tl.minimum(tl.min(tl.where(fail, pos, BLOCK_K), axis=0).to(tl.int64), num)
    token = tl.full([BLOCK_K], _PAD, tl.int64)  # random tokens come from the race
    if HAS_GREEDY:
        token = tl.where(greedy, argmax.to(tl.int64), token)
    row = tl.where(pos < accept_len, x, _PAD)
    row = tl.where(pos == accept_len, token, row)
    tl.store(out_ptr + i * K1 + pos, row, mask=pos < K1)
    tl.store(accept_len_ptr + i, accept_len.to(tl.int32))


@triton.jit
def _race_kernel(
    p_ptr, q_ptr, noise_ptr,  # [N + B, V] float32, [N, V] draft probs, [B, V] float32
    draft_ptr, cu_ptr, greedy_ptr, accept_len_ptr,  # [N] int64, [B], [B] int8, [B] int32
    part_val_ptr, part_idx_ptr,  # [B, 3, S] float32 (residual race, p race, max w) / int32 (argmaxes)
    N, V, S, chunk,
    HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    if tl.load(greedy_ptr + i) == 0:
        start = tl.load(cu_ptr + i - 1, mask=i > 0, other=0).to(tl.int64)
        num = tl.load(cu_ptr + i).to(tl.int64) - start
        al = tl.load(accept_len_ptr + i).to(tl.int64)
        rejected = al < num
        x = tl.load(draft_ptr + start + al, mask=rejected, other=_PAD)
        use_residual = rejected & (x >= 0) & (x < V)
        p_base = p_ptr + tl.where(rejected, start + al, N + i) * V  # rejected draft's row or bonus row
        q_base = q_ptr + (start + al) * V  # read only where use_residual
        e_base = noise_ptr + i * V
        lo = s * chunk
        hi = tl.minimum(lo + chunk, V)
        lanes = tl.arange(0, BLOCK_V)
        read_q = _splat(use_residual, lanes)
        res_val = tl.full([BLOCK_V], -1.0, tl.float32)  # ratios are >= 0, so lane 0 of the tile wins
        res_idx = lo + lanes
        p_val = tl.full([BLOCK_V], -1.0, tl.float32)
        p_idx = lo + lanes
        w_max = tl.zeros([BLOCK_V], tl.float32)
        for v0 in range(lo, hi, BLOCK_V):
            cols = v0 + lanes
            m = cols < hi
            p = tl.load(p_base + cols, mask=m, other=0.0)
            e = tl.load(e_base + cols, mask=m, other=0.0)
            if HAS_Q:
                q = tl.load(q_base + cols, mask=m & read_q, other=0.0).to(tl.float32)
                w = tl.maximum(p - q, 0.0)
            else:
                w = tl.where(cols == x, 0.0, p)
            # e holds 1 / E: one IEEE multiply, bit-identical to torch's, where a division would need
            # div_rn (Triton's float32 '/' is approximate) at several times the instructions.
            r_res = tl.where(m, w * e, -1.0)
            r_p = tl.where(m, p * e, -1.0)
            better = r_res > res_val
            res_idx = tl.where(better, cols, res_idx)
            res_val = tl.where(better, r_res, res_val)
            better = r_p > p_val
            p_idx = tl.where(better, cols, p_idx)
            p_val = tl.where(better, r_p, p_val)
            w_max = tl.maximum(w_max, w)
        top_res = tl.max(res_val, axis=0)
        top_p = tl.max(p_val, axis=0)
        val_out = part_val_ptr + i * 3 * S + s
        idx_out = part_idx_ptr + i * 3 * S + s
        tl.store(val_out, top_res)
        tl.store(val_out + S, top_p)
        tl.store(val_out + 2 * S, tl.max(w_max, axis=0))
        tl.store(idx_out, tl.min(tl.where(res_val == top_res, res_idx, _INT32_MAX), axis=0))
        tl.store(idx_out + S, tl.min(tl.where(p_val == top_p, p_idx, _INT32_MAX), axis=0))


@triton.jit
def _finalize_kernel(
    out_ptr, draft_ptr, cu_ptr, greedy_ptr, accept_len_ptr,  # as in _accept_kernel / _race_kernel
    part_val_ptr, part_idx_ptr,  # [B, 3, S] race results of _race_kernel
    V, K1, S,
    BLOCK_S: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    if tl.load(greedy_ptr + i) == 0:
        start = tl.load(cu_ptr + i - 1, mask=i > 0, other=0).to(tl.int64)
        num = tl.load(cu_ptr + i).to(tl.int64) - start
        al = tl.load(accept_len_ptr + i).to(tl.int64)
        rejected = al < num
        x = tl.load(draft_ptr + start + al, mask=rejected, other=_PAD)
        s = tl.arange(0, BLOCK_S)
        m = s < S
        w_max = tl.max(tl.load(part_val_ptr + (i * 3 + 2) * S + s, mask=m, other=0.0), axis=0)
        # The residual max(p - q, 0) is sampled only where it has mass; otherwise p at the same row.
        usable = rejected & (x >= 0) & (x < V) & (w_max > 0)
        base = (i * 3 + tl.where(usable, 0, 1)) * S
        vals = tl.load(part_val_ptr + base + s, mask=m, other=float("-inf"))
        idxs = tl.load(part_idx_ptr + base + s, mask=m, other=_INT32_MAX)
        token = tl.min(tl.where(vals == tl.max(vals, axis=0), idxs, _INT32_MAX), axis=0)
        tl.store(out_ptr + i * K1 + al, token.to(tl.int64))


# ------------------------------------------------------------------------------------------ host side


def rejection_sample_triton(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling_metadata: SamplingMetadata,
) -> torch.Tensor:
    """:func:`specdec.rejection_sample` with the verification done by the Triton kernels.

    Same arguments, result and random stream as the torch reference (both draw through
    :func:`prepare_sampler_inputs`), so for the same RNG state the tokens are identical.
    """
    inputs = prepare_sampler_inputs(metadata, draft_probs, logits, sampling_metadata)
    return sample_prepared_triton(metadata, draft_probs, inputs)


def sample_prepared_triton(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,
    inputs: SamplerInputs,
    *,
    block_v: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Kernel counterpart of :func:`specdec.rejection_torch.sample_prepared`.

    Moves the metadata to the logits' device and launches :func:`launch_rejection_kernels`.
    Dtypes the kernels cannot match bit for bit (float64 logits or draft probs) go to the torch
    reference instead, so the result never depends on which implementation ran.

    Args:
        block_v: vocabulary tile (power of 2); default by vocabulary size.
        num_splits: programs per vocabulary row; default fills the GPU (1 off the GPU).
    """
    logits = inputs.logits
    if logits.dtype not in _LOGITS_DTYPES or (draft_probs is not None and draft_probs.dtype not in _LOGITS_DTYPES):
        return sample_prepared(metadata, draft_probs, inputs)
    device = logits.device
    if logits.dim() == 2 and logits.shape[1] > 0 and logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty((metadata.batch_size, metadata.max_spec_len + 1), dtype=torch.int64, device=device)
    launch_rejection_kernels(
        out,
        draft_token_ids=metadata.draft_token_ids.to(device=device, dtype=torch.int64),
        cu_num_draft_tokens=metadata.cu_num_draft_tokens.to(device),
        is_greedy=inputs.is_greedy.to(device),
        logits=logits if inputs.any_greedy else None,
        target_rows=metadata.target_logits_indices.to(device=device, dtype=torch.int64),
        bonus_rows=metadata.bonus_logits_indices.to(device=device, dtype=torch.int64),
        p=inputs.p if inputs.any_random else None,
        draft_probs=draft_probs,
        u=inputs.u,
        noise=inputs.noise,
        block_v=block_v,
        num_splits=num_splits,
    )
    return out


def launch_rejection_kernels(
    out: torch.Tensor,
    *,
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    is_greedy: torch.Tensor,
    logits: torch.Tensor | None,
    target_rows: torch.Tensor,
    bonus_rows: torch.Tensor,
    p: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    u: torch.Tensor,
    noise: torch.Tensor,
    block_v: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Check every tensor the kernels read or write, then launch them; fills and returns ``out``.

    Args:
        out: ``[B, K + 1]`` int64, written in full (K = longest draft).
        draft_token_ids: ``[N]`` int64, flat drafts; any value (ids outside ``[0, V)`` are rejected).
        cu_num_draft_tokens: ``[B]`` int32/int64 inclusive prefix sum of the draft counts.
        is_greedy: ``[B]`` bool.
        logits: ``[R, V]`` float32/float16/bfloat16 with unit column stride, rows addressed by
            ``target_rows`` ``[N]`` and ``bonus_rows`` ``[B]`` (int64); ``None`` if no request is greedy.
        p: ``[N + B, V]`` float32 target probabilities (draft rows, then bonus rows); ``None`` if no
            request is random.
        draft_probs: ``[N, V]`` float32/float16/bfloat16, or ``None`` for one-hot drafts.
        u: ``[N]`` float64; noise: ``[B, V]`` float32, > 0.
    """
    batch, width = _check_2d("out", out, (torch.int64,), out.device)
    device = out.device
    _check_device(device)
    n = _check_1d("draft_token_ids", draft_token_ids, (torch.int64,), device, None)
    _check_1d("cu_num_draft_tokens", cu_num_draft_tokens, (torch.int32, torch.int64), device, batch)
    _check_1d("is_greedy", is_greedy, (torch.bool,), device, batch)
    _check_1d("u", u, (torch.float64,), device, n)
    noise_shape = _check_2d("noise", noise, (torch.float32,), device)
    vocab = noise_shape[1]
    if noise_shape[0] != batch or vocab == 0:
        raise ValueError(f"noise must have shape [B, V] = [{batch}, V >= 1] (B from out), got {noise_shape}.")
    if logits is not None:
        rows, v = logits.shape if logits.dim() == 2 else (None, None)
        if logits.dim() != 2 or v != vocab or logits.dtype not in _LOGITS_DTYPES or logits.device != device \
                or (vocab > 1 and logits.stride(1) != 1):
            raise ValueError(
                f"logits must be a [R, V={vocab}] float32/float16/bfloat16 tensor on {device} with unit column "
                f"stride, got {_describe(logits)} with strides {tuple(logits.stride())}."
            )
        _check_1d("target_rows", target_rows, (torch.int64,), device, n)
        _check_1d("bonus_rows", bonus_rows, (torch.int64,), device, batch)
    if p is not None and _check_2d("p", p, (torch.float32,), device) != (n + batch, vocab):
        raise ValueError(f"p must have shape [N + B, V] = [{n + batch}, {vocab}], got {tuple(p.shape)}.")
    if draft_probs is not None and _check_2d("draft_probs", draft_probs, _LOGITS_DTYPES, device) != (n, vocab):
        raise ValueError(f"draft_probs must have shape [N, V] = [{n}, {vocab}], got {tuple(draft_probs.shape)}.")
    if batch == 0:
        return out
    if logits is None and p is None:
        raise ValueError("logits (greedy requests) and p (random requests) are both None: pass at least one.")
    if width > _MAX_GRID_YZ or vocab > _INT32_MAX.value // 2:
        raise ValueError(
            f"out has {width} columns and V = {vocab}; the kernels support at most {_MAX_GRID_YZ} columns "
            f"(longest draft + 1) and V < 2**30."
        )
    block_v = _block_v(vocab) if block_v is None else block_v
    if block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of 2, got {block_v}.")

    greedy_i8 = is_greedy.view(torch.int8)  # same bytes; an int8 pointer is the portable way to pass bools
    accept_len = torch.empty(batch, dtype=torch.int32, device=device)
    draft_arg = _nonempty(draft_token_ids)
    has_q = draft_probs is not None and n > 0
    part_val = part_idx = accept_len  # placeholders where a kernel is skipped (never dereferenced)
    splits = 1
    if logits is not None:
        splits, chunk = _splits(vocab, block_v, batch * width, num_splits, device)
        part_val = torch.empty((batch, width, splits), dtype=torch.float32, device=device)
        part_idx = torch.empty((batch, width, splits), dtype=torch.int32, device=device)
        _greedy_argmax_kernel[(batch, width, splits)](
            logits, logits.stride(0), _nonempty(target_rows), bonus_rows, cu_num_draft_tokens, greedy_i8,
            part_val, part_idx, vocab, width, splits, chunk,
            BLOCK_V=block_v, num_warps=_warps(block_v),
        )
    _accept_kernel[(batch,)](
        out, accept_len, draft_arg, cu_num_draft_tokens, greedy_i8, part_val, part_idx,
        p if p is not None else accept_len, draft_probs if has_q else accept_len, _nonempty(u),
        vocab, width, splits,
        HAS_GREEDY=logits is not None, HAS_RANDOM=p is not None, HAS_Q=has_q,
        BLOCK_K=triton.next_power_of_2(width), BLOCK_S=triton.next_power_of_2(splits), num_warps=1,
    )
    if p is None:
        return out
    splits, chunk = _splits(vocab, block_v, batch, num_splits, device)
    race_val = torch.empty((batch, 3, splits), dtype=torch.float32, device=device)
    race_idx = torch.empty((batch, 3, splits), dtype=torch.int32, device=device)
    _race_kernel[(batch, splits)](
        p, draft_probs if has_q else p, noise, draft_arg, cu_num_draft_tokens, greedy_i8, accept_len,
        race_val, race_idx, n, vocab, splits, chunk,
        HAS_Q=has_q, BLOCK_V=block_v, num_warps=_warps(block_v),
    )
    _finalize_kernel[(batch,)](
        out, draft_arg, cu_num_draft_tokens, greedy_i8, accept_len, race_val, race_idx, vocab, width, splits,
        BLOCK_S=triton.next_power_of_2(splits), num_warps=1,
    )
    return out


# --------------------------------------------------------------------------------- launch parameters


def _block_v(vocab: int) -> int:
    return min(2048, triton.next_power_of_2(vocab))


def _warps(block_v: int) -> int:
    """About 8 elements per thread: 16-byte loads of float32 without spilling the running argmaxes."""
    return max(1, min(8, block_v // 256))


def _splits(vocab: int, block_v: int, rows: int, num_splits: int | None, device: torch.device) -> tuple[int, int]:
    """(programs per row, columns per program): enough programs to fill the GPU when rows are few,
    each covering a whole number of tiles."""
    tiles = triton.cdiv(vocab, block_v)
    if num_splits is None:
        num_splits = triton.cdiv(4 * _num_sms(device), max(rows, 1)) if device.type == "cuda" else 1
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}.")
    splits = min(num_splits, tiles, _MAX_GRID_YZ)
    chunk = triton.cdiv(tiles, splits) * block_v
    return triton.cdiv(vocab, chunk), chunk


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# ------------------------------------------------------------------------------------------- checks


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_device(device: torch.device) -> None:
    if device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"the Triton rejection kernels run on CUDA tensors (or on CPU under TRITON_INTERPRET=1), got {device}; "
            "use specdec.rejection_sample for the torch implementation."
        )


def _describe(t: torch.Tensor) -> str:
    layout = "contiguous" if t.is_contiguous() else "non-contiguous"
    return f"{t.dtype} {tuple(t.shape)} {layout} on {t.device}"


def _check(name: str, t: torch.Tensor, dim: int, dtypes: tuple, device: torch.device) -> None:
    if t.dim() != dim or t.dtype not in dtypes or t.device != device or not t.is_contiguous():
        wanted = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must be a contiguous {dim}-d {wanted} tensor on {device}, got {_describe(t)}.")


def _check_1d(name: str, t: torch.Tensor, dtypes: tuple, device: torch.device, size: int | None) -> int:
    _check(name, t, 1, dtypes, device)
    if size is not None and t.shape[0] != size:
        raise ValueError(f"{name} must have {size} entries, got {t.shape[0]}.")
    return t.shape[0]


def _check_2d(name: str, t: torch.Tensor, dtypes: tuple, device: torch.device) -> tuple[int, int]:
    _check(name, t, 2, dtypes, device)
    return tuple(t.shape)


def _nonempty(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor may have a null data pointer; the kernels never read it, but need an address."""
    return t if t.numel() else torch.zeros(1, dtype=t.dtype, device=t.device)
