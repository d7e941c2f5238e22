"""Triton kernels of :class:`specdec.fused.FusedLlama` (imported only when it runs them,
so importing the plugin never imports triton: its interpreter must be set up before triton's first import)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["add_rmsnorm", "rope_store", "silu_mul"]


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
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
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
def _silu_mul_kernel(gu_ptr, out_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    g = tl.load(gu_ptr + row * 2 * N + offs, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * N + N + offs, mask=m, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty)  # rounded as F.silu's output is
    tl.store(out_ptr + row * N + offs, (act.to(tl.float32) * u).to(out_ptr.dtype.element_ty),
             mask=m)


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
