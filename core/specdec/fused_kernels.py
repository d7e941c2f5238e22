"""Triton kernels of :class:`specdec.fused.FusedLlama` (imported only when it runs them,
so importing the plugin never imports triton: its interpreter must be set up before triton's first import)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

__all__ = ["ATTEND_BLOCK_N", "ATTEND_PROGRAMS", "LINEAR_CONFIGS", "LINEAR_MAX_ROWS", "add_rmsnorm", "attend",
           "linear", "linear_config", "norm_linear", "rope_store", "silu_linear", "silu_mul"]

ATTEND_BLOCK_N = 64  # keys per inner step of attend
ATTEND_PROGRAMS = 256  # attend splits the keys until about this many programs run (an H200 has 132 SMs)
# The small-row projections (linear, norm_linear, silu_linear): at most this many rows run the Triton kernel, more
# go to cuBLAS (a decode step of batch b has b rows, a verify step b * (k + 1)).
LINEAR_MAX_ROWS = 16
# (rows rounded up to a power of two, n, k) -> (block_n, block_k, num_warps, num_stages, use_dot): tuned entries
# that override linear_config's rule for that shape (benchmarks/target_linear.py measures them).
LINEAR_CONFIGS: dict[tuple[int, int, int], tuple[int, int, int, int, bool]] = {}


@triton.jit
def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, N, eps,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
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
                       D: tl.constexpr, HALF: tl.constexpr):
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
                   PARTIAL: tl.constexpr):
    # One program: batch row ``row``, KV head ``g``, a tile of (query token, query head of g's group) pairs and one
    # split of the keys: every query head that shares g's keys reads them once, from the row's own cache slot (no
    # gather, no GQA copy), and only up to the row's last visible key (``end_ptr``). With PARTIAL, the split's
    # unnormalised output, running max and sum go to ``out_ptr``/``m_ptr``/``l_ptr`` for _attend_combine_kernel.
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
                           D: tl.constexpr, BLOCK_S: tl.constexpr):
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
def _silu_mul_kernel(gu_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    g = tl.load(gu_ptr + row * 2 * N + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * N + N + offs, mask=m, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty)  # rounded as F.silu's output is
    tl.store(out_ptr + row * N + offs, (act.to(tl.float32) * u).to(out_ptr.dtype.element_ty),
             mask=m)


@triton.jit
def _small_linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, res_ptr, ln_ptr, sum_ptr, M, N, K, sxm, eps,
                         PRO: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, DOT: tl.constexpr,
                         IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # out[:M, n-tile] = f(x) @ w[n-tile].T (+ bias) for a few rows (a decode or verify step): a program per tile of
    # BLOCK_N output columns walks all of K, so the weight, the only large operand, is read once in long runs and no
    # split-K reduction follows. f, the prologue: PRO 0 nothing; 1 RMSNorm(x [+ res]) * ln, recomputed by every
    # program from the rows (a few KB; program 0 also stores the sum x + res); 2 SiLU(x[:, :K]) * x[:, K:]. Each
    # rounds to the model dtype where specdec.fused's torch steps do, so the matmul's inputs are theirs.
    dt = out_ptr.dtype.element_ty
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    xrow = x_ptr + rm[:, None].to(tl.int64) * sxm
    if PRO == 1:
        ss = tl.zeros([BLOCK_M], tl.float32)
        store_m = tl.where(tl.program_id(0) == 0, M, 0)  # rows program 0 writes the sum of (no other program)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            ok = m_ok[:, None] & (rk < K)[None, :]
            s = tl.load(xrow + rk[None, :], mask=ok, other=0.0).to(tl.float32)
            if HAS_RES:  # the sum rounded to the model dtype, as Hugging Face's add in that dtype
                s = (s + tl.load(res_ptr + rm[:, None] * K + rk[None, :], mask=ok, other=0.0).to(tl.float32))
                s = s.to(dt)
                tl.store(sum_ptr + rm[:, None] * K + rk[None, :], s, mask=(rm < store_m)[:, None] & (rk < K)[None, :])
                s = s.to(tl.float32)
            ss += tl.sum(s * s, 1)
        inv = 1.0 / tl.sqrt(ss / K + tl.cast(eps, tl.float32))
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        ok = m_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0)
        if PRO == 0:
            xv = tl.load(xrow + rk[None, :], mask=ok, other=0.0)
        elif PRO == 1:
            s = tl.load(xrow + rk[None, :], mask=ok, other=0.0).to(tl.float32)
            if HAS_RES:
                s = (s + tl.load(res_ptr + rm[:, None] * K + rk[None, :], mask=ok, other=0.0).to(tl.float32))
                s = s.to(dt).to(tl.float32)
            ln = tl.load(ln_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
            xv = ((s * inv[:, None]).to(dt).to(tl.float32) * ln[None, :]).to(dt)
        else:
            g = tl.load(xrow + rk[None, :], mask=ok, other=0.0).to(tl.float32)
            u = tl.load(xrow + K + rk[None, :], mask=ok, other=0.0).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dt)  # rounded as F.silu's output is
            xv = (act.to(tl.float32) * u).to(dt)
        if DOT:
            if IEEE:
                acc += tl.dot(xv, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(xv, tl.trans(w))
        else:
            acc += tl.sum(xv.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], 2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(dt), mask=m_ok[:, None] & n_ok[None, :])


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specdec.fused.add_rmsnorm` in one kernel (a program per row)."""
    x = x.contiguous()
    rows, n = x.shape
    out = torch.empty_like(x)
    s = torch.empty_like(x) if residual is not None else x
    _add_rmsnorm_kernel[(rows,)](x, residual if residual is not None else x, weight, out, s, n, eps,
                                 HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n))
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
    _rope_store_kernel[(b * q, nh + nk)](qkv, cos, sin, pos, wpos, slot, q_out, k_buf, v_buf, q, nh, nk, cos.shape[0],
                                        k_buf.stride(0), k_buf.stride(1), k_buf.stride(2), D=d, HALF=d // 2)
    return q_out.transpose(1, 2)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """:func:`specdec.fused.silu_mul` in one kernel."""
    gu = gu.contiguous()
    rows, n = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(rows, n, dtype=gu.dtype, device=gu.device)
    block = min(1024, triton.next_power_of_2(n))
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gu, out, n, BLOCK=block)
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
        D=d, BLOCK_M=block_m, BLOCK_N=ATTEND_BLOCK_N, IEEE=q.dtype == torch.float32, PARTIAL=partial)
    if partial:
        _attend_combine_kernel[(b * q_len * nh,)](part, m_part, l_part, out, q_len, nh, splits, out.stride(0),
                                                   out.stride(1), out.stride(2), D=d,
                                                   BLOCK_S=triton.next_power_of_2(splits))
    return out


def linear_config(m: int, n: int, k: int) -> tuple[int, tuple[int, int, int, int, bool]]:
    """``(block_m, (block_n, block_k, num_warps, num_stages, use_dot))`` of the small-row kernel for ``m`` rows of
    an ``[n, k]`` weight: a :data:`LINEAR_CONFIGS` entry when there is one, else the rule measured on an H200
    (``benchmarks/target_linear.py``)."""
    block_m = triton.next_power_of_2(max(m, 1))
    cfg = LINEAR_CONFIGS.get((block_m, n, k))
    if cfg is None:
        if block_m == 1:  # a plain dot per column tile, enough tiles for about two programs an SM
            block_n = 4
            while block_n < 32 and triton.cdiv(n, block_n * 2) >= 256:
                block_n *= 2
            cfg = (block_n, 512, 4, 2, False)
        else:  # tensor-core tiles, the rows padded to 16
            cfg = (32, 128, 4, 3, True)
    if cfg[4]:
        block_m = max(block_m, 16)  # tl.dot's smallest operand
    return block_m, cfg


def _small_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, pro: int, k: int,
                  residual: torch.Tensor | None = None, ln: torch.Tensor | None = None, eps: float = 0.0
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    m, n = x.shape[0], w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    s = torch.empty(m, k, dtype=x.dtype, device=x.device) if residual is not None else None
    block_m, (block_n, block_k, warps, stages, dot) = linear_config(m, n, k)
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    _small_linear_kernel[(triton.cdiv(n, block_n),)](
        x, w, bias if bias is not None else w, out, residual if residual is not None else x,
        ln if ln is not None else w, s if s is not None else out, m, n, k, x.stride(0), eps,
        PRO=pro, HAS_RES=residual is not None, HAS_BIAS=bias is not None, DOT=dot, IEEE=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out, s


def _small(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the small-row kernel takes ``x @ w.T``: few rows, both operands row-major."""
    return x.shape[0] <= LINEAR_MAX_ROWS and w.is_contiguous() and x.stride(-1) == 1


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w)``: one small-row kernel for at most :data:`LINEAR_MAX_ROWS` rows, cuBLAS above."""
    if not _small(x, w):
        return F.linear(x, w)
    return _small_linear(x, w, None, 0, x.shape[1])[0]


def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, w: torch.Tensor,
                bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specdec.fused.norm_linear` (residual add, RMSNorm and the projection) in one kernel for at most
    :data:`LINEAR_MAX_ROWS` rows; above, :func:`add_rmsnorm` then cuBLAS."""
    x = x.contiguous()
    if residual is not None:
        residual = residual.contiguous()
    if not _small(x, w):
        h, s = add_rmsnorm(x, residual, weight, eps)
        return F.linear(h, w, bias), s
    out, s = _small_linear(x, w, bias, 1, x.shape[1], residual, weight, eps)
    return out, (x if s is None else s)


def silu_linear(gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """:func:`specdec.fused.silu_linear` (``SiLU(gate) * up`` then the projection) in one kernel for at most
    :data:`LINEAR_MAX_ROWS` rows; above, :func:`silu_mul` then cuBLAS."""
    gu = gu.contiguous()
    if not _small(gu, w):
        return F.linear(silu_mul(gu), w)
    return _small_linear(gu, w, None, 2, gu.shape[1] // 2)[0]
