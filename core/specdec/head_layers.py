"""Small building blocks of the draft heads that plugins define themselves (EAGLE, DFlash): rotary inverse
frequencies as Llama-family configs give them, the RMSNorm of Llama and Qwen3 (normalised in float32,
scaled in the input's dtype), and masked attention without cuDNN's SDPA kernel. Public so that plugins share one
copy; heads of other shapes need not use them."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["rope_inv_freq", "rope_from_config", "RMSNorm", "rms_norm", "attention", "SDPA_BACKENDS"]

# The SDPA kernels draft heads may use. cuDNN's is left out: on the H200 (torch 2.11) it builds a plan for every
# new (query length, key length, mask) shape, 50 ms each, and eager drafting sees a new shape nearly every call
# (an EAGLE catch-up after skipped steps, a growing KV); it also failed inside CUDA graph capture with a mask.
# The memory-efficient kernel serves these small masked shapes. A module attribute so that a check can put it back.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
              scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, ...)`` restricted to :data:`SDPA_BACKENDS` on
    CUDA (the CPU's kernels are used as they are): ``q [b, heads, t, d]``, ``k``/``v [b, kv_heads, s, d]``, ``mask``
    (bool, True = visible, or additive) broadcastable to ``[b, heads, t, s]``; returns ``[b, heads, t, d]``.

    Grouped-query attention (``kv_heads`` dividing ``heads``) needs no ``enable_gqa``. On the CPU the ``t`` queries
    of the ``heads / kv_heads`` query heads sharing a KV head attend as that head's query rows, so no key or value is
    copied per query head (repeating them cost 4-13x the attention itself at batch 8-32; SDPA's ``enable_gqa`` took
    1.1-1.7x the packed form's time there); only a mask with rows per query token repeats, ``heads / kv_heads``
    times (a mask per head, or of fewer than four dimensions, falls back to repeating the keys and values). On CUDA
    the keys and values are repeated per query head (the packed form is measured and tested on the CPU only so
    far)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads and not enable_gqa:
        if heads % kv_heads:
            raise ValueError(f"attention: {heads} query heads do not share {kv_heads} KV heads evenly")
        rep = heads // kv_heads
        if q.device.type != "cuda" and (mask is None or (mask.dim() == 4 and mask.shape[1] == 1)):
            b, _, t, d = q.shape
            if mask is not None and mask.shape[2] > 1:  # rows per query token: one per head
                mb, _, _, s = mask.shape
                mask = mask[:, :, None].expand(mb, 1, rep, t, s).reshape(mb, 1, rep * t, s)
            # head g * rep + r, token j -> row r * t + j of KV head g (the output's view undoes it)
            out = _sdpa(q.reshape(b, kv_heads, rep * t, d), k, v, mask, scale, False)
            return out.reshape(b, heads, t, out.shape[-1])
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return _sdpa(q, k, v, mask, scale, enable_gqa)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float | None,
          enable_gqa: bool) -> torch.Tensor:
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    with sdpa_kernel(SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None, what: str = "draft heads"
                  ) -> torch.Tensor:
    """Rotary inverse frequencies ``[head_dim // 2]`` (float32) for ``scaling`` None (default), ``linear`` or
    ``llama3``; another ``rope_type`` raises a ValueError naming ``what`` reads the config."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        inv = torch.where((wavelen >= old / hi) & (wavelen <= old / lo), smoothed, scaled)
    elif kind != "default":
        raise ValueError(f"rope_scaling type {kind!r} is not supported by {what}: use none, 'linear' or 'llama3'.")
    return inv.float()


def rope_from_config(config: Any) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling or None) of a transformers config (``rope_parameters`` in transformers 5, else
    ``rope_theta`` / ``rope_scaling``): what a head trained for that target copies."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(params.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0))
    scaling = getattr(config, "rope_scaling", None) or params
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    return theta, (None if kind == "default" else {k: v for k, v in scaling.items() if k != "rope_theta"})


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension: normalised in float32, scaled by ``weight`` in the input's dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x))`` over the last dimension, normalised in float32. On the CPU (and wherever the
    dtypes differ) the seven-op formula that the heads' bitwise CPU tests pin; on CUDA with one dtype, aten's
    fused ``rms_norm`` (one kernel: the captured draft chains are launch-bound, about 3.5 us a kernel on the
    H200), equal up to rounding."""
    if x.is_cuda and x.dtype == weight.dtype:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
