"""The DFlash draft model as plain PyTorch modules (no transformers classes, no code from the checkpoint).

A DFlash draft is ``n`` Qwen3-style decoder layers of width H with no embedding and no lm_head of its own
(both are the target's; a speculators checkpoint may carry a smaller draft vocabulary's ``lm_head``).

- **Context**: the target's decoder-layer outputs at ``target_layer_ids``, concatenated (``[.., n_ids * Ht]``),
  projected by ``fc`` and normed by ``hidden_norm`` (:meth:`DFlashDraft.context`). Every layer projects these
  same context features with its own ``k_proj``/``v_proj`` (+ ``k_norm``, + rotary at their positions): the
  context is keys and values only, never queries. :class:`ContextKVCache` keeps those per slot.
- **Block**: ``[bonus, mask x (block_size - 1)]`` at positions ``p .. p + block_size - 1`` (``p``: the
  bonus token's position), embedded with the target's embeddings, runs through the layers NON-causally: each
  block query sees every context key of its row (positions ``0 .. p - 1``) and every block key. After the
  last layer, ``norm``; the logits at block index ``i`` (1..) draft the token at ``p + i``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdec.head_layers import RMSNorm, attention, rope_inv_freq

__all__ = ["DFlashConfig", "DFlashDraft", "DFlashLayer", "ContextKVCache", "rope_inv_freq"]


@dataclass(frozen=True, slots=True)
class DFlashConfig:
    """Architecture of one DFlash draft. H = ``hidden_size``, Ht = ``target_hidden_size``, V = ``vocab_size``
    (the target's), Vd = ``draft_vocab_size`` (V unless a speculators checkpoint brings its own ``lm_head``).

    Attributes:
        target_layer_ids: target decoder layers whose OUTPUTS are the context features, in concatenation
            order (z-lab convention: layer ``i`` is Hugging Face ``hidden_states[i + 1]``).
        mask_token_id: the id filling the block after the bonus token.
        block_size: tokens per drafting block (bonus + block_size - 1 masks): at most block_size - 1 drafts.
        attention_bias: q/k/v/o projections have biases (Qwen3's ``attention_bias``; false in published heads).
        rope_scaling: None, or a dict with ``rope_type`` ``"linear"`` or ``"llama3"`` and its keys.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_layers: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int = 16
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    target_hidden_size: int = 0  # 0: hidden_size
    draft_vocab_size: int = 0  # 0: vocab_size (the target's lm_head)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    attention_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_layers",
                     "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: it must be an int >= 1.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}.")
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ValueError(f"block_size={self.block_size!r} is invalid: a block holds the bonus token and at "
                             "least one mask, so it must be an int >= 2.")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty: DFlash reads at least one target layer.")
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if not self.target_hidden_size:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)
        if not self.draft_vocab_size:
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features ``fc`` reads (``len(target_layer_ids) * Ht``)."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The target layers to ask for in Hugging Face ``output_hidden_states`` indexing (ids + 1)."""
        return tuple(i + 1 for i in self.target_layer_ids)


def _rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary (halves layout) on ``x [b, heads, T, d]`` at ``positions [b, T]``."""
    angles = positions.float()[:, None, :, None] * inv_freq  # [b, 1, T, d/2]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class DFlashLayer(nn.Module):
    """One draft decoder layer: Qwen3 attention (per-head ``q_norm``/``k_norm`` before rotary) whose keys and
    values are the context's then the block's, and a SiLU-gated MLP."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, self.heads * d, bias=bias)
        self.self_attn.k_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.self_attn.v_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.self_attn.o_proj = nn.Linear(self.heads * d, h, bias=bias)
        self.self_attn.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def kv(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Roped keys and values ``[b, kv_heads, T, d]`` of ``x [b, T, H]`` at ``positions [b, T]``."""
        a = self.self_attn
        b, t, _ = x.shape
        k = a.k_norm(a.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = a.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rope(k, positions, inv_freq), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, ctx_visible: torch.Tensor, block_visible: torch.Tensor | None = None
                ) -> torch.Tensor:
        """The block ``x [b, B, H]`` at ``positions [b, B]`` over context keys/values ``[b, kv_heads, S, d]``
        (already roped), of which ``ctx_visible [b, S]`` (bool) are real; non-causal inside the block.

        Training packs many blocks into one row: ``ctx_visible [b, B, S]`` then says per query which context
        positions it sees, and ``block_visible [b or 1, B, B]`` which of the row's block tokens (its own block's);
        without ``block_visible`` every query sees every block token."""
        a = self.self_attn
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = _rope(a.q_norm(a.q_proj(h).view(b, t, self.heads, self.head_dim)).transpose(1, 2), positions, inv_freq)
        k, v = self.kv(h, positions, inv_freq)
        keys, values = torch.cat((ctx_k, k), 2), torch.cat((ctx_v, v), 2)
        if ctx_visible.dim() == 2:
            visible = torch.cat((ctx_visible, ctx_visible.new_ones(b, t)), 1)[:, None, None, :]  # [b, 1, 1, S + B]
        else:
            own = ctx_visible.new_ones(b, t, t) if block_visible is None else block_visible.expand(b, t, t)
            visible = torch.cat((ctx_visible, own), 2)[:, None]  # [b, 1, B, S + B]
        out = attention(q, keys, values, visible)  # grouped-query heads: see head_layers.attention
        x = x + a.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        m = self.mlp
        h = self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class ContextKVCache:
    """Each layer's context keys/values for drafting: one slot per request, ``capacity`` positions each plus a
    scratch position that padding writes to. ``keys[l]``/``values[l]``: ``[slots, kv_heads, capacity + 1, d]``.
    Only verified positions are ever written (the block's own K/V is never cached), so a slot's valid prefix is
    its caller's committed length; entries past it are masked and later overwritten (no copies)."""

    def __init__(self, cfg: DFlashConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        shape = (num_slots, cfg.num_key_value_heads, capacity + 1, cfg.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.capacity = capacity

    @property
    def num_slots(self) -> int:
        """Slots the cache holds."""
        return self.keys[0].shape[0]

    def grow(self, num_slots: int) -> None:
        """Hold ``num_slots`` slots, keeping every entry."""
        extra = num_slots - self.num_slots
        if extra > 0:
            self.keys = [torch.cat((k, k.new_zeros(extra, *k.shape[1:]))) for k in self.keys]
            self.values = [torch.cat((v, v.new_zeros(extra, *v.shape[1:]))) for v in self.values]


class DFlashDraft(nn.Module):
    """A DFlash draft: ``fc [H, n_ids * Ht]``, ``hidden_norm``, ``layers``, ``norm``; ``embed_tokens`` and
    ``lm_head`` are the target's (set by the loader). With a draft vocabulary (Vd < V), ``draft_lm_head
    [Vd, H]`` and ``d2t [Vd]`` (target id = draft id + ``d2t[draft id]``) replace the target's ``lm_head``."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.feature_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.embed_tokens: nn.Module | None = None
        self.lm_head: nn.Module | None = None
        if cfg.draft_vocab_size != cfg.vocab_size:
            self.draft_lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        # A plain attribute, not a buffer: module.to(dtype=bfloat16) would round the frequencies.
        self._inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, "DFlash drafts")

    @property
    def inv_freq(self) -> torch.Tensor:
        """Rotary inverse frequencies (float32) on the draft's device."""
        device = self.fc.weight.device
        if self._inv_freq.device != device:
            self._inv_freq = self._inv_freq.to(device)
        return self._inv_freq

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[..., n_ids * Ht]`` -> context ``hidden_norm(fc(features))`` ``[..., H]``."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def append_context(self, cache: ContextKVCache, slots: torch.Tensor, features: torch.Tensor,
                       positions: torch.Tensor, valid: torch.Tensor) -> None:
        """Write the context K/V of every layer for ``features [b, T, n_ids * Ht]`` at ``positions [b, T]`` into
        ``slots [b]``; ``valid [b, T]`` False marks padding, written to the scratch position."""
        ctx = self.context(features)
        write = torch.where(valid, positions, cache.capacity)
        rows = slots[:, None].expand_as(write)
        for layer, keys, values in zip(self.layers, cache.keys, cache.values):
            k, v = layer.kv(ctx, positions, self.inv_freq)
            keys[rows, :, write] = k.transpose(1, 2).to(keys.dtype)  # [b, T, kv_heads, d]
            values[rows, :, write] = v.transpose(1, 2).to(values.dtype)

    def block_hidden(self, embeds: torch.Tensor, start: torch.Tensor, ctx_len: torch.Tensor,
                     ctx_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The block forward: ``embeds [b, B, H]`` at positions ``start[b] + 0..B-1`` over each layer's context
        ``(k, v)`` ``[b, kv_heads, S, d]`` of which the first ``ctx_len[b]`` positions are real. Returns the
        normed output ``[b, B, H]``."""
        b, t, _ = embeds.shape
        positions = start[:, None] + torch.arange(t, device=embeds.device)[None, :]
        s = ctx_kv[0][0].shape[2]
        visible = torch.arange(s, device=embeds.device)[None, :] < ctx_len[:, None]  # [b, S]
        x = embeds
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, positions, self.inv_freq, k.to(x.dtype), v.to(x.dtype), visible)
        return self.norm(x)

    def cached_block_hidden(self, cache: ContextKVCache, slots: torch.Tensor, embeds: torch.Tensor,
                            ctx_len: torch.Tensor, max_ctx: int) -> torch.Tensor:
        """:meth:`block_hidden` over the cached context of ``slots [b]``: the block of each row starts at its
        context length ``ctx_len[b]`` (the bonus token's position); ``max_ctx`` = ``max(ctx_len)``."""
        ctx_kv = [(k[slots, :, :max_ctx], v[slots, :, :max_ctx]) for k, v in zip(cache.keys, cache.values)]
        return self.block_hidden(embeds, ctx_len, ctx_len, ctx_kv)

    def forward(self, features: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
        """Cache-free block logits for one batch of equal-length contexts (tests, training): target
        ``features [b, C, n_ids * Ht]`` at positions ``0..C-1`` and ``block_ids [b, B]`` at ``C..C+B-1``
        -> float32 logits ``[b, B, V]`` over the target vocabulary."""
        b, c, _ = features.shape
        dev = features.device
        ctx = self.context(features)
        positions = torch.arange(c, device=dev)[None, :].expand(b, c)
        ctx_kv = [layer.kv(ctx, positions, self.inv_freq) for layer in self.layers]
        start = torch.full((b,), c, dtype=torch.long, device=dev)
        return self.logits(self.block_hidden(self.embed_tokens(block_ids), start, start, ctx_kv))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normed block output ``[..., H]`` -> float32 logits ``[..., V]`` over the target vocabulary (with a
        draft vocabulary: ``-inf`` on target ids outside it)."""
        if self.cfg.draft_vocab_size == self.cfg.vocab_size:
            return self.lm_head(hidden).float()
        d = self.draft_lm_head(hidden).float()
        out = d.new_full((*d.shape[:-1], self.cfg.vocab_size), float("-inf"))
        return out.index_copy_(-1, torch.arange(d.shape[-1], device=d.device) + self.d2t, d)
