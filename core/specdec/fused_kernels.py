"""Triton kernels of :class:`specdec.fused.FusedLlama` (imported only when it runs them,
so importing the plugin never imports triton: its interpreter must be set up before triton's first import)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import specdec.fused as _reference

__all__ = ["ATTEND_BLOCK_N", "ATTEND_PROGRAMS", "PDL", "ROW_BLOCK_K", "ROW_WIDE_N", "ROWS_TILE", "TOPK_CHUNK",
           "add_rmsnorm", "attend", "linear", "rope_store", "row_linear", "silu_mul", "topk", "uses_pdl"]

ATTEND_BLOCK_N = 64  # keys per inner step of attend
ATTEND_PROGRAMS = 256  # attend splits the keys until about this many programs run (an H200 has 132 SMs)
ROW_BLOCK_K = 1024  # weight columns per step of the one-row projection kernel (linear)
ROW_WIDE_N = 16384  # weights of at least this many rows take 8 a program in that kernel, others 4
ROWS_TILE = 4096  # products a step of the few-row kernel (rows x weight rows x columns), ~32 registers a thread
TOPK_CHUNK = 8192  # entries of a row one program of topk holds (a draft vocabulary of up to this many: one launch)
# Programmatic dependent launch (Hopper and later): each kernel lets the next one start while it drains, and the
# next one waits (griddepcontrol.wait) before it touches anything an earlier kernel wrote; the one-row projection
# loads its first weight tile before that wait. Off by default: on an H200 it shortened a 1B target's batch-1 step
# by 5% and lengthened a 3B target's by 5% (benchmarks/target_linear.py); batch 8 unchanged.
PDL = False


@functools.cache
def _capability(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def uses_pdl(t: torch.Tensor) -> bool:
    """Whether the kernels launch with programmatic dependent launch for tensors like ``t`` (:data:`PDL`, on a CUDA
    device of compute capability 9 or more)."""
    return PDL and t.is_cuda and _capability(t.device.index if t.device.index is not None else 0) >= 9


@triton.jit
def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, N, eps,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # see PDL: the next kernel may start now; this one waits for the one before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < N
    xf = tl.load(x_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:  # the sum rounded to the model dtype, as Hugging Face's add in that dtype
        s = (xf + tl.load(res_ptr + row * N + offs, mask=m, other=0.0).to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * N + offs, s, mask=m)
        xf = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + tl.cast(eps, tl.float32))  # float64 under torch.compile
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    y = (xf * inv).to(out_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * N + offs, y.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, wpos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr,
                       Q, NH, NK, MAX_POS, cs0, cs1, cs2,
                       D: tl.constexpr, HALF: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # see PDL: the next kernel may start now; this one waits for the one before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, HALF)
    p = tl.minimum(tl.load(pos_ptr + t), MAX_POS - 1)  # an idle row's position may run past the table
    c1 = tl.load(cos_ptr + p * D + offs).to(tl.float32)
    c2 = tl.load(cos_ptr + p * D + HALF + offs).to(tl.float32)
    s1 = tl.load(sin_ptr + p * D + offs).to(tl.float32)
    s2 = tl.load(sin_ptr + p * D + HALF + offs).to(tl.float32)
    row = qkv_ptr + t * (NH + 2 * NK) * D
    if head < NH:
        src = row + head * D
        x1 = tl.load(src + offs).to(tl.float32)
        x2 = tl.load(src + HALF + offs).to(tl.float32)
        dst = q_ptr + (t * NH + head) * D  # [b, q, heads, d], Hugging Face's layout before its transpose
        tl.store(dst + offs, (x1 * c1 - x2 * s1).to(q_ptr.dtype.element_ty))
        tl.store(dst + HALF + offs, (x2 * c2 + x1 * s2).to(q_ptr.dtype.element_ty))
    else:
        kh = head - NH
        src = row + (NH + kh) * D
        x1 = tl.load(src + offs).to(tl.float32)
        x2 = tl.load(src + HALF + offs).to(tl.float32)
        at = tl.load(slot_ptr + t) * cs0 + kh * cs1 + tl.load(wpos_ptr + t) * cs2
        tl.store(k_ptr + at + offs, (x1 * c1 - x2 * s1).to(k_ptr.dtype.element_ty))
        tl.store(k_ptr + at + HALF + offs, (x2 * c2 + x1 * s2).to(k_ptr.dtype.element_ty))
        vsrc = row + (NH + NK + kh) * D
        v = tl.load(vsrc + tl.arange(0, D)).to(tl.float32)
        tl.store(v_ptr + at + tl.arange(0, D), v.to(v_ptr.dtype.element_ty))


@triton.jit
def _attend_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, slot_ptr, end_ptr, out_ptr, m_ptr, l_ptr, Q, NH, REP, SPLIT_KEYS,
                   scale, masked, qs0, qs1, qs2, ks0, ks1, ks2, ms0, ms1, ms2, os0, os1, os2, rs0,
                   D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
                   PARTIAL: tl.constexpr, GDC: tl.constexpr):
    # One program: batch row ``row``, KV head ``g``, a tile of (query token, query head of g's group) pairs and one
    # split of the keys: every query head that shares g's keys reads them once, from the row's own cache slot (no
    # gather, no GQA copy), and only up to the row's last visible key (``end_ptr``). With PARTIAL, the split's
    # unnormalised output, running max and sum go to ``out_ptr``/``m_ptr``/``l_ptr`` for _attend_combine_kernel.
    if GDC:  # see PDL: the next kernel may start now; this one waits for the one before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as float64: keep the loop state float32
    masked = tl.cast(masked, tl.float32)
    row = tl.program_id(0).to(tl.int64)
    tiles = tl.cdiv(Q * REP, BLOCK_M)
    g = tl.program_id(1) // tiles
    m = (tl.program_id(1) % tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(2)
    m_ok = m < Q * REP
    j = m // REP  # query token
    h = g * REP + m % REP  # query head
    d = tl.arange(0, D)
    qv = tl.load(q_ptr + row * qs0 + j[:, None] * qs1 + h[:, None] * qs2 + d[None, :], mask=m_ok[:, None], other=0.0)
    slot = tl.load(slot_ptr + row * rs0).to(tl.int64)
    k_base = k_ptr + slot * ks0 + g * ks1
    v_base = v_ptr + slot * ks0 + g * ks1
    lo = split * SPLIT_KEYS
    hi = tl.minimum(lo + SPLIT_KEYS, tl.load(end_ptr + row))
    m_i = tl.full([BLOCK_M], -3.0e38, tl.float32)  # finite: a split with no visible key merges without a NaN
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        bias = tl.load(mask_ptr + row * ms0 + j[:, None] * ms1 + n[None, :] * ms2,
                       mask=m_ok[:, None] & n_ok[None, :], other=masked).to(tl.float32)
        bias = tl.maximum(bias, masked)  # -inf entries as the dtype's minimum: a hidden row never makes a NaN
        k = tl.load(k_base + n[:, None] * ks2 + d[None, :], mask=n_ok[:, None], other=0.0)
        if IEEE:
            s = tl.dot(qv, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(qv, tl.trans(k))
        s = s * scale + bias
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(bias > masked, tl.exp(s - m_new[:, None]), 0.0)  # hidden keys weigh exactly nothing
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + n[:, None] * ks2 + d[None, :], mask=n_ok[:, None], other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    if PARTIAL:
        at = ((row * tl.num_programs(2) + split) * Q + j) * NH + h  # [b, splits, q, nh]
        tl.store(m_ptr + at, m_i, mask=m_ok)
        tl.store(l_ptr + at, l_i, mask=m_ok)
        tl.store(out_ptr + at[:, None] * D + d[None, :], acc, mask=m_ok[:, None])
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a query that sees nothing (an idle row) gets zeros
        tl.store(out_ptr + row * os0 + j[:, None] * os1 + h[:, None] * os2 + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _attend_combine_kernel(part_ptr, m_ptr, l_ptr, out_ptr, Q, NH, SPLITS, os0, os1, os2,
                           D: tl.constexpr, BLOCK_S: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # see PDL: the next kernel may start now; this one waits for the one before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    # One program per (row, query token, query head): the splits' partial softmaxes merged (flash-decoding).
    pid = tl.program_id(0).to(tl.int64)
    row = pid // (Q * NH)
    jh = pid % (Q * NH)
    sp = tl.arange(0, BLOCK_S)
    s_ok = sp < SPLITS
    at = (row * SPLITS + sp) * Q * NH + jh  # [BLOCK_S]
    m_s = tl.load(m_ptr + at, mask=s_ok, other=float("-inf"))
    l_s = tl.load(l_ptr + at, mask=s_ok, other=0.0)
    top = tl.max(m_s, 0)
    w = tl.where(s_ok & (l_s > 0), tl.exp(m_s - top), 0.0)  # a split past the row's keys has l = 0
    d = tl.arange(0, D)
    acc = tl.sum(tl.load(part_ptr + at[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0) * w[:, None], 0)
    total = tl.sum(l_s * w, 0)
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + row * os0 + (jh // NH) * os1 + (jh % NH) * os2 + d, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, N, BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # see PDL: the next kernel may start now; this one waits for the one before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    g = tl.load(gu_ptr + row * 2 * N + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * N + N + offs, mask=m, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty)  # rounded as F.silu's output is
    tl.store(out_ptr + row * N + offs, (act.to(tl.float32) * u).to(out_ptr.dtype.element_ty),
             mask=m)


@triton.jit
def _row_input(x_ptr, nw_ptr, rk, k_ok, K, NORM: tl.constexpr, GLU: tl.constexpr):
    # One K-tile of the one-row kernel's input, float32, and its squares (for NORM's mean): x itself; with GLU
    # SiLU(gate) * up of x = [gate | up] (rounded as silu_mul's output is); with NORM times the norm's weight (the
    # 1 / RMS factor, known only after the last tile, scales the sums at the end).
    x = tl.load(x_ptr + rk, mask=k_ok, other=0.0)
    if GLU:
        g = x.to(tl.float32)
        u = tl.load(x_ptr + K + rk, mask=k_ok, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(x_ptr.dtype.element_ty).to(tl.float32)
        x = (act * u).to(x_ptr.dtype.element_ty)
    xf = x.to(tl.float32)
    sq = xf * xf
    if NORM:
        xf = xf * tl.load(nw_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
    return xf, sq


@triton.jit
def _row_linear_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, out_ptr, N, K, eps, HAS_BIAS: tl.constexpr,
                       NORM: tl.constexpr, GLU: tl.constexpr, RES: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GDC: tl.constexpr):
    # out[n-tile] = x @ w[n-tile].T (+ bias) for one row (a decode step at batch 1): a program per BLOCK_N weight rows
    # walks all of K, so the weight, the only large operand, is read once in long runs and no split-K reduction
    # follows. Under PDL the first weight tile is loaded before waiting for the kernel that wrote x. The layer's
    # neighbouring steps ride along (see row_linear): NORM, GLU on the input (_row_input), RES on the output.
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn[:, None] < N
    w_row = w_ptr + rn[:, None].to(tl.int64) * K
    rk = tl.arange(0, BLOCK_K)
    w = tl.load(w_row + rk[None, :], mask=n_ok & (rk < K)[None, :], other=0.0)
    if GDC:
        tl.extra.cuda.gdc_wait()
    # Products and squares summed elementwise over the K tiles, reduced across the threads once at the end.
    x, sq = _row_input(x_ptr, nw_ptr, rk, rk < K, K, NORM, GLU)
    acc = x[None, :] * w.to(tl.float32)
    ss = sq
    for k0 in range(BLOCK_K, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        w = tl.load(w_row + rk[None, :], mask=n_ok & k_ok[None, :], other=0.0)
        x, sq = _row_input(x_ptr, nw_ptr, rk, k_ok, K, NORM, GLU)
        acc += x[None, :] * w.to(tl.float32)
        if NORM:
            ss += sq
    acc = tl.sum(acc, 1)
    if NORM:  # as add_rmsnorm's 1 / RMS (float64 under torch.compile without the cast)
        acc = acc * (1.0 / tl.sqrt(tl.sum(ss, 0) / K + tl.cast(eps, tl.float32)))
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    out = acc.to(x_ptr.dtype.element_ty)  # rounded to the model dtype, whatever out's (float32 logits)
    if RES:  # the residual add in the model dtype, as Hugging Face's
        out = (out.to(tl.float32) + tl.load(r_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)).to(
            x_ptr.dtype.element_ty)
    tl.store(out_ptr + rn, out.to(out_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _rows_linear_kernel(x_ptr, w_ptr, b_ptr, nw_ptr, r_ptr, out_ptr, M, N, K, eps, HAS_BIAS: tl.constexpr,
                        NORM: tl.constexpr, GLU: tl.constexpr, RES: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # The row kernel for a few rows (M <= BLOCK_M, a draft head's tree frontier or small batch): a program per BLOCK_N
    # weight rows reads each weight tile once and takes every row's products with it together ([BLOCK_M, BLOCK_N,
    # BLOCK_K] at a time, reduced over K per tile), so its latency is about the one-row kernel's and the weight is read
    # once. The same neighbours ride along (NORM, GLU, RES); each row sums in a different order from the one-row case.
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_ok = rn < N
    m_ok = rm < M
    if GLU:  # an input row's width
        XW = 2 * K
    else:
        XW = K
    w_row = w_ptr + rn[:, None].to(tl.int64) * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        w = tl.load(w_row + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        xo = x_ptr + rm[:, None] * XW + rk[None, :]
        xm = m_ok[:, None] & k_ok[None, :]
        x = tl.load(xo, mask=xm, other=0.0)
        if GLU:  # SiLU(gate) * up, rounded as silu_mul's output is
            g = x.to(tl.float32)
            u = tl.load(xo + K, mask=xm, other=0.0).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(x_ptr.dtype.element_ty).to(tl.float32)
            x = (act * u).to(x_ptr.dtype.element_ty)
        xf = x.to(tl.float32)
        if NORM:
            ss += tl.sum(xf * xf, 1)
            xf = xf * tl.load(nw_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        acc += tl.sum(xf[:, None, :] * w[None, :, :], 2)
    if NORM:
        acc = acc * (1.0 / tl.sqrt(ss / K + tl.cast(eps, tl.float32)))[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = acc.to(x_ptr.dtype.element_ty)
    om = m_ok[:, None] & n_ok[None, :]
    if RES:
        out = (out.to(tl.float32) + tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=om, other=0.0).to(
            tl.float32)).to(x_ptr.dtype.element_ty)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], out.to(out_ptr.dtype.element_ty), mask=om)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specdec.fused.add_rmsnorm` in one kernel (a program per row)."""
    x = x.contiguous()
    rows, n = x.shape
    out = torch.empty_like(x)
    s = torch.empty_like(x) if residual is not None else x
    gdc = uses_pdl(x)
    _add_rmsnorm_kernel[(rows,)](x, residual if residual is not None else x, weight, out, s, n, eps,
                                 HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n), GDC=gdc,
                                 launch_pdl=gdc)
    return out, s


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
               wpos: torch.Tensor, slot: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
               b: int, q: int, nh: int, nk: int, d: int) -> torch.Tensor:
    """:func:`specdec.fused.rope_store` in one kernel (a program per token and head)."""
    if k_buf.stride() != v_buf.stride() or k_buf.stride(3) != 1:
        raise ValueError("the key and value caches must share one layout with a contiguous head_dim")
    if not pos.numel() == wpos.numel() == slot.numel() == b * q:
        raise ValueError(f"pos, wpos and slot must hold b * q = {b * q} entries each, got "
                         f"{pos.numel()}, {wpos.numel()}, {slot.numel()}")
    # The kernel reads entry t of each index at ptr + t. FusedLlama's slot index is row_index.expand(b, q)
    # flattened, which for b == 1 is a stride-0 view of ONE element: read that way, entries 1..q-1 came from
    # whatever memory followed it, and the KV writes went to garbage addresses (the H200's illegal memory
    # access in draft chains, 2026-12-02: it faulted eagerly too, so not a capture problem).
    pos, wpos, slot = pos.contiguous(), wpos.contiguous(), slot.contiguous()
    qkv = qkv.contiguous()
    q_out = torch.empty(b, q, nh, d, dtype=qkv.dtype, device=qkv.device)
    gdc = uses_pdl(qkv)
    _rope_store_kernel[(b * q, nh + nk)](qkv, cos, sin, pos, wpos, slot, q_out, k_buf, v_buf, q, nh, nk, cos.shape[0],
                                        k_buf.stride(0), k_buf.stride(1), k_buf.stride(2), D=d, HALF=d // 2,
                                        GDC=gdc, launch_pdl=gdc)
    return q_out.transpose(1, 2)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """:func:`specdec.fused.silu_mul` in one kernel."""
    gu = gu.contiguous()
    rows, n = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(rows, n, dtype=gu.dtype, device=gu.device)
    block = min(1024, triton.next_power_of_2(n))
    gdc = uses_pdl(gu)
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gu, out, n, BLOCK=block, GDC=gdc, launch_pdl=gdc)
    return out


def attend(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, mask: torch.Tensor, rows: slice | torch.Tensor,
           row_index: torch.Tensor, kv_len: int, scale: float, ends: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`specdec.fused.attend` as a split-key (flash-decoding) Triton kernel: a program per (row, KV head, tile
    of the queries sharing that head, split of the keys), reading keys and values from the row's cache slot up to
    ``ends[row]`` (its last visible key + 1, from :func:`specdec.fused.visible_ends`; ``kv_len`` when None), so the
    read stops at each row's length, not its bucket's; the splits (enough of them that a small batch still fills the
    GPU) are merged by a second kernel. One kernel when a single split suffices."""
    b, q_len, nh, d = q.shape
    nk = k_buf.shape[1]
    if q.stride(3) != 1 or k_buf.stride() != v_buf.stride() or k_buf.stride(3) != 1:
        raise ValueError("attend needs a contiguous head_dim in the queries and one layout for both caches")
    if mask.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"attend needs an additive float mask, got {mask.dtype}")
    if d < 16:
        raise ValueError(f"attend needs a head_dim >= 16 (tl.dot's smallest operand), got {d}")
    rep = nh // nk
    block_m = max(16, min(64, triton.next_power_of_2(q_len * rep)))
    tiles = triton.cdiv(q_len * rep, block_m)
    blocks = triton.cdiv(kv_len, ATTEND_BLOCK_N)
    splits = max(1, min(blocks, ATTEND_PROGRAMS // (b * nk * tiles)))
    split_keys = triton.cdiv(blocks, splits) * ATTEND_BLOCK_N
    splits = triton.cdiv(kv_len, split_keys)
    if ends is None:
        ends = torch.full((b,), kv_len, dtype=torch.int32, device=q.device)
    out = torch.empty(b, q_len, nh, d, dtype=q.dtype, device=q.device)
    m3 = mask[:, 0] if mask.dim() == 4 else mask  # [b, q, kv_len]
    partial = splits > 1
    gdc = uses_pdl(q)
    if partial:
        part = torch.empty(b, splits, q_len, nh, d, dtype=torch.float32, device=q.device)
        m_part, l_part = (torch.empty(b, splits, q_len, nh, dtype=torch.float32, device=q.device) for _ in range(2))
    else:
        part, m_part, l_part = out, out, out
    _attend_kernel[(b, nk * tiles, splits)](
        q, k_buf, v_buf, m3, row_index, ends, part, m_part, l_part, q_len, nh, rep, split_keys, scale,
        float(torch.finfo(mask.dtype).min), q.stride(0), q.stride(1), q.stride(2),
        k_buf.stride(0), k_buf.stride(1), k_buf.stride(2), m3.stride(0), m3.stride(1), m3.stride(2),
        out.stride(0), out.stride(1), out.stride(2), row_index.stride(0),
        D=d, BLOCK_M=block_m, BLOCK_N=ATTEND_BLOCK_N, IEEE=q.dtype == torch.float32, PARTIAL=partial, GDC=gdc,
        launch_pdl=gdc)
    if partial:
        _attend_combine_kernel[(b * q_len * nh,)](part, m_part, l_part, out, q_len, nh, splits, out.stride(0),
                                                   out.stride(1), out.stride(2), D=d,
                                                   BLOCK_S=triton.next_power_of_2(splits), GDC=gdc, launch_pdl=gdc)
    return out


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, max_rows: int = 1) -> torch.Tensor:
    """``F.linear(x, w, bias)``: up to ``max_rows`` rows (``x`` ``[m, k]``, contiguous) by the row kernel, which reads
    the row-major weight ``[n, k]`` once (4 of its rows a program, 8 from :data:`ROW_WIDE_N` rows; several rows take
    their products with each weight tile together); more rows, other layouts: cuBLAS. Callers raise ``max_rows``
    where a few rows are the rule and the weights are small (a draft head's steps); a wide weight at many rows is
    cuBLAS's ground."""
    if (not 1 <= x.shape[0] <= max_rows or not w.is_contiguous() or not x.is_contiguous()
            or x.shape[1] != w.shape[1]):
        return F.linear(x, w, bias)
    return _row(x, w, bias, None, 0.0, False, None)


def row_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
               eps: float = 1e-6, glu: bool = False, residual: torch.Tensor | None = None,
               out: torch.Tensor | None = None, max_rows: int = 1) -> torch.Tensor:
    """:func:`specdec.fused.row_linear` (a projection with its RMSNorm, SiLU * up or residual add) as one launch of the
    row kernel for up to ``max_rows`` contiguous rows (one row: the one-row kernel; several: their few-row form, which
    sums in another order); otherwise its torch steps."""
    n, k = w.shape
    m = x.shape[0]
    one = (1 <= m <= max_rows and x.is_contiguous() and w.is_contiguous() and x.shape[1] == (2 * k if glu else k)
           and (norm is None or (not glu and norm.is_contiguous()))
           and (residual is None or (residual.is_contiguous() and residual.shape == (m, n)))
           and (out is None or (out.is_contiguous() and out.shape == (m, n) and out.device == x.device)))
    if not one:
        return _reference.row_linear(x, w, bias, norm=norm, eps=eps, glu=glu, residual=residual, out=out)
    return _row(x, w, bias, norm, eps, glu, residual, out)


def _row(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, norm: torch.Tensor | None, eps: float,
         glu: bool, residual: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    n, k = w.shape
    m = x.shape[0]
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_n = 8 if n >= ROW_WIDE_N else 4
    args = (x, w, bias if bias is not None else w, norm if norm is not None else w,
            residual if residual is not None else w, out)
    flags = dict(HAS_BIAS=bias is not None, NORM=norm is not None, GLU=glu, RES=residual is not None)
    if m > 1:  # every row against each weight tile at once: [block_m, block_n, block_k] products a step
        block_m = triton.next_power_of_2(m)
        block_k = min(triton.next_power_of_2(k), max(32, ROWS_TILE // (block_m * block_n)))
        _rows_linear_kernel[(triton.cdiv(n, block_n),)](*args, m, n, k, eps, **flags, BLOCK_M=block_m,
                                                        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=3)
        return out
    gdc = uses_pdl(x)
    _row_linear_kernel[(triton.cdiv(n, block_n),)](
        *args, n, k, eps, **flags, BLOCK_N=block_n, BLOCK_K=min(ROW_BLOCK_K, triton.next_power_of_2(k)),
        GDC=gdc, num_warps=4, num_stages=3, launch_pdl=gdc)
    return out


@triton.jit
def _topk_kernel(x_ptr, val_ptr, idx_ptr, m_ptr, s_ptr, V, CHUNKS, K: tl.constexpr, LOGSM: tl.constexpr,
                 FINAL: tl.constexpr, BLOCK: tl.constexpr):
    # One program per (row, chunk of BLOCK entries): the chunk's K largest entries, largest first (ties: the lower
    # index first), by K rounds of a maximum and the lowest index holding it, each taken out before the next. With
    # FINAL (one chunk a row) they are the row's, written as its log-probabilities under LOGSM; otherwise written
    # with the chunk's maximum and sum of exp(x - maximum) for _topk_merge_kernel.
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    x = tl.load(x_ptr + row * V + offs, mask=ok, other=float("-inf")).to(tl.float32)
    if LOGSM:
        m = tl.max(x, 0)
        s = tl.sum(tl.where(ok, tl.exp(x - m), 0.0), 0)
    free = ok
    out = (row * CHUNKS + chunk) * K
    for i in tl.static_range(K):
        best = tl.max(tl.where(free, x, float("-inf")), 0)
        at = tl.min(tl.where(free & (x == best), offs, 2147483647), 0)
        free = free & (offs != at)
        if FINAL and LOGSM:
            best = best - (m + tl.log(s))
        tl.store(val_ptr + out + i, best)
        tl.store(idx_ptr + out + i, at.to(tl.int64))
    if LOGSM and not FINAL:
        tl.store(m_ptr + row * CHUNKS + chunk, m)
        tl.store(s_ptr + row * CHUNKS + chunk, s)


@triton.jit
def _topk_merge_kernel(cv_ptr, ci_ptr, m_ptr, s_ptr, val_ptr, idx_ptr, CHUNKS, K: tl.constexpr, LOGSM: tl.constexpr,
                       BLOCK: tl.constexpr, BLOCK_C: tl.constexpr):
    # One program per row: the K largest of its chunks' candidates (CHUNKS * K of them, each with its index in the
    # row), as _topk_kernel chooses; under LOGSM less the row's log-sum-exp, merged from the chunks' (max, sum).
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < CHUNKS * K
    x = tl.load(cv_ptr + row * CHUNKS * K + offs, mask=ok, other=float("-inf"))
    at_row = tl.load(ci_ptr + row * CHUNKS * K + offs, mask=ok, other=2147483647)
    if LOGSM:
        c = tl.arange(0, BLOCK_C)
        c_ok = c < CHUNKS
        m = tl.load(m_ptr + row * CHUNKS + c, mask=c_ok, other=float("-inf"))
        s = tl.load(s_ptr + row * CHUNKS + c, mask=c_ok, other=0.0)
        top = tl.max(m, 0)
        lse = top + tl.log(tl.sum(tl.where(c_ok, s * tl.exp(m - top), 0.0), 0))
    free = ok
    for i in tl.static_range(K):
        best = tl.max(tl.where(free, x, float("-inf")), 0)
        at = tl.min(tl.where(free & (x == best), at_row, 2147483647), 0)
        free = free & (at_row != at)
        if LOGSM:
            best = best - lse
        tl.store(val_ptr + row * K + i, best)
        tl.store(idx_ptr + row * K + i, at)


def topk(x: torch.Tensor, k: int, log_softmax: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of each row of ``x [..., V]`` and their indices, largest first (ties: the lower
    index first), as float32 values ``[..., k]`` and int64 indices; with ``log_softmax`` the values are the entries'
    float32 log-probabilities over the row (``torch.log_softmax(x.float(), -1).topk(k)``). One launch where a row
    fits one program (:data:`TOPK_CHUNK` entries), else one per chunk and a merge: a token tree's top-k over the
    draft vocabulary, where ``log_softmax`` then ``topk`` took a kernel for the softmax and four or more for the
    selection (a radix select, then a sort of the k). ``k`` at most 64 and at most ``V``."""
    *lead, v = x.shape
    if not 1 <= k <= min(64, v):
        raise ValueError(f"topk needs 1 <= k <= min(64, {v}), got k={k}")
    rows = x.reshape(-1, v)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    r = rows.shape[0]
    block = min(TOPK_CHUNK, triton.next_power_of_2(v))
    chunks = triton.cdiv(v, block)
    dev = x.device
    vals = torch.empty(r, k, dtype=torch.float32, device=dev)
    idx = torch.empty(r, k, dtype=torch.int64, device=dev)
    warps = 8 if block >= 4096 else 4
    if chunks == 1:
        _topk_kernel[(r, 1)](rows, vals, idx, vals, vals, v, 1, K=k, LOGSM=log_softmax, FINAL=True, BLOCK=block,
                             num_warps=warps)
    else:
        cv = torch.empty(r, chunks, k, dtype=torch.float32, device=dev)
        ci = torch.empty(r, chunks, k, dtype=torch.int64, device=dev)
        m, s = (torch.empty(r, chunks, dtype=torch.float32, device=dev) for _ in range(2))
        _topk_kernel[(r, chunks)](rows, cv, ci, m, s, v, chunks, K=k, LOGSM=log_softmax, FINAL=False, BLOCK=block,
                                  num_warps=warps)
        _topk_merge_kernel[(r,)](cv, ci, m, s, vals, idx, chunks, K=k, LOGSM=log_softmax,
                                 BLOCK=triton.next_power_of_2(chunks * k), BLOCK_C=triton.next_power_of_2(chunks))
    return vals.view(*lead, k), idx.view(*lead, k)
