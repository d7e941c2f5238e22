"""EAGLE-1 and EAGLE-3 draft heads as plain PyTorch modules (no transformers classes).

Both heads share one interface, so the trainer and the proposer use them the same way:

- :meth:`EagleHead.forward` -- a full-sequence causal forward for training (or any caller that holds
  whole sequences): ``input_ids [B, T]`` (or ``inputs_embeds [B, T, E]``) and ``features [B, T, F]``
  -> ``hidden [B, T, H]``, the head's pre-norm output at every position. Position ``t`` reads the token
  at ``t + 1`` and the feature at ``t`` (the target's hidden state after reading token ``t``) and
  predicts token ``t + 2``: the caller shifts, the head does not.
- :meth:`EagleHead.logits` -- ``hidden [..., H]`` -> float logits ``[..., V]`` in the TARGET vocabulary
  order (EAGLE-3: ``d2t`` applied, ``-inf`` on target tokens outside the draft vocabulary);
  :meth:`EagleHead.draft_logits` -- ``[..., Vd]`` over the draft vocabulary (what EAGLE-3 trains on).
- :meth:`EagleHead.decode` -- the per-step forward for drafting, over a :class:`HeadKVCache` of slots.

Features: EAGLE-1 takes the target's last hidden state (after its final norm, width ``Ht`` = H).
EAGLE-3 takes the concatenation of ``num_aux_layers`` target layers (width ``n * Ht``), projected by
``fc`` to H; as in the reference, ``fc`` is applied only when the feature width is not H, so the head's
own output (width H) can be fed back as the feature of the next step (the chain, training-time test).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdec.head_layers import RMSNorm, attention, rope_inv_freq

__all__ = ["HeadConfig", "EagleHead", "Eagle1Head", "Eagle3Head", "HeadKVCache", "build_head", "rope_inv_freq"]

KINDS = ("eagle", "eagle3")


@dataclass(frozen=True, slots=True)
class HeadConfig:
    """Architecture of one head. Sizes: H = ``hidden_size``, Ht = ``target_hidden_size``, V =
    ``vocab_size`` (the target's), Vd = ``draft_vocab_size`` (EAGLE-3; equals V for EAGLE-1).

    Attributes:
        kind: ``"eagle"`` (EAGLE-1) or ``"eagle3"``.
        bias: EAGLE-1's ``fc`` has a bias (SafeAILab's default; Llama-3 heads set false).
        num_aux_layers: EAGLE-3's fc input is ``num_aux_layers * Ht`` wide.
        norm_before_residual: EAGLE-3 (speculators/vLLM): the residual is ``hidden_norm(fc_out)``
            instead of ``fc_out``.
        rope_scaling: None, or a dict with ``rope_type`` (``"linear"`` or ``"llama3"``) and its keys.
    """

    kind: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    target_hidden_size: int = 0  # 0: hidden_size
    draft_vocab_size: int = 0  # 0: vocab_size
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    bias: bool = True
    num_aux_layers: int = 3
    norm_before_residual: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is invalid: it must be one of {KINDS}.")
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: it must be an int >= 1.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}.")
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if not self.target_hidden_size:
            object.__setattr__(self, "target_hidden_size", self.hidden_size)
        if not self.draft_vocab_size or self.kind == "eagle":
            object.__setattr__(self, "draft_vocab_size", self.vocab_size)
        if self.kind == "eagle" and self.target_hidden_size != self.hidden_size:
            raise ValueError(f"EAGLE-1 heads read the target's hidden state as is: target_hidden_size="
                             f"{self.target_hidden_size} must equal hidden_size={self.hidden_size}.")

    @property
    def feature_size(self) -> int:
        """Width of the target features :meth:`EagleHead.forward` takes (Ht, or n * Ht for EAGLE-3)."""
        return self.target_hidden_size * (self.num_aux_layers if self.kind == "eagle3" else 1)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Attention(nn.Module):
    """Llama attention whose q/k/v projections read ``in_size`` features (2H in EAGLE-3)."""

    def __init__(self, cfg: HeadConfig, in_size: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(in_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(in_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, "EAGLE heads"),
                             persistent=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Roped ``q [B, heads, T, d]``, ``k``/``v [B, kv_heads, T, d]`` of ``x [B, T, in]`` at ``positions [B, T]``."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        angles = positions.float()[:, None, :, None] * self.inv_freq  # [B, 1, T, d/2]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``q [B, heads, T, d]`` over ``k``/``v [B, kv_heads, S, d]`` where ``mask [B or 1, T, S]`` (bool,
        True = visible) -> ``[B, T, H]`` after ``o_proj``."""
        out = attention(q, k, v, mask[:, None])  # grouped-query heads: see head_layers.attention
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class HeadKVCache:
    """The head's KV cache for drafting: one slot per request, ``capacity`` positions each plus a scratch
    position that padding writes to. ``keys``/``values``: ``[slots, kv_heads, capacity + 1, head_dim]``.
    Positions a slot has not committed are masked by position, so rolling drafts back is only a matter
    of the caller's committed length: later writes overwrite them (no copies)."""

    def __init__(self, cfg: HeadConfig, num_slots: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        shape = (num_slots, cfg.num_key_value_heads, capacity + 1, cfg.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity

    @property
    def num_slots(self) -> int:
        return self.keys.shape[0]


class EagleHead(nn.Module):
    """Common parts of both heads: embeddings ``embed_tokens [V, H]`` (usually the target's, frozen) and
    the attention/MLP block; subclasses define :meth:`layer` (one decoder step over prepared inputs)."""

    cfg: HeadConfig

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)

    # -- subclass parts ----------------------------------------------------------------------
    def attn_input(self, embeds: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention input ``[B, T, in]``, residual ``[B, T, H]``) from embeddings and features."""
        raise NotImplementedError

    def finish(self, residual: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual add, post-attention norm, MLP, residual add -> hidden ``[B, T, H]``."""
        h = residual + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> float32 logits over the draft vocabulary ``[..., Vd]``."""
        raise NotImplementedError

    # -- public entry points -----------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None = None, features: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
                past_kv: tuple[torch.Tensor, torch.Tensor] | None = None, attn_mask: torch.Tensor | None = None,
                return_kv: bool = False) -> Any:
        """Full-sequence causal forward (training, tests).

        Args:
            input_ids: ``[B, T]`` tokens (the token at ``t + 1`` for position ``t``), or ``inputs_embeds``
                ``[B, T, H]``.
            features: ``[B, T, F]``: target features (``cfg.feature_size`` wide) or the head's own hidden
                ``[B, T, H]`` (EAGLE-3's fc is skipped when the width is H).
            positions: ``[B, T]`` or ``[T]`` rotary positions; default ``0..T-1``.
            past_kv: optional ``(k, v)``, each ``[B, kv_heads, S, d]`` (already roped), visible before this
                call's own keys: lets a trainer unroll steps against earlier steps' keys (EAGLE-3's
                training-time test).
            attn_mask: optional bool ``[B or 1, T, S + T]`` (True = visible); default: every past key,
                causal over this call's keys.
            return_kv: also return this call's ``(k, v)`` ``[B, kv_heads, T, d]``.

        Returns:
            ``hidden [B, T, H]`` (pre-norm), or ``(hidden, (k, v))`` with ``return_kv``.
        """
        embeds = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        b, t = embeds.shape[:2]
        if positions is None:
            positions = torch.arange(t, device=embeds.device)
        positions = positions.expand(b, t)
        x, residual = self.attn_input(embeds, features)
        q, k, v = self.self_attn.qkv(x, positions)
        keys, values = (k, v) if past_kv is None else (torch.cat((past_kv[0], k), 2), torch.cat((past_kv[1], v), 2))
        if attn_mask is None:
            s = keys.shape[2] - t
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            attn_mask = torch.cat((torch.ones(t, s, dtype=torch.bool, device=x.device), causal), 1)[None]
        hidden = self.finish(residual, self.self_attn.attend(q, keys, values, attn_mask))
        return (hidden, (k, v)) if return_kv else hidden

    def decode(self, cache: HeadKVCache, slots: torch.Tensor, input_ids: torch.Tensor, features: torch.Tensor,
               positions: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """One drafting forward over slot KV cache ``cache``.

        Args:
            slots: ``[b]`` long, the cache slot of each row.
            input_ids: ``[b, q]`` tokens; features: ``[b, q, F]`` (target features or own hidden, as in
                :meth:`forward`); positions: ``[b, q]`` long, the head position of each token.
            valid: optional ``[b, q]`` bool; False marks padding, whose keys go to the scratch position.

        Writes each valid token's K/V at its position in its slot, then attends to every position of the
        slot up to its own (positions below are the slot's committed or earlier-written entries).
        Returns ``hidden [b, q, H]`` (rows of padding tokens are garbage).
        """
        x, residual = self.attn_input(self.embed(input_ids), features)
        q, k, v = self.self_attn.qkv(x, positions)
        write = positions if valid is None else torch.where(valid, positions, cache.capacity)
        rows = slots[:, None].expand_as(write)
        cache.keys[rows, :, write] = k.transpose(1, 2).to(cache.keys.dtype)  # [b, q, kv_heads, d]
        cache.values[rows, :, write] = v.transpose(1, 2).to(cache.values.dtype)
        kv_len = int(positions.max()) + 1
        keys, values = cache.keys[slots, :, :kv_len], cache.values[slots, :, :kv_len]
        mask = torch.arange(kv_len, device=x.device)[None, None, :] <= positions[:, :, None]  # [b, q, S]
        return self.finish(residual, self.self_attn.attend(q, keys.to(q.dtype), values.to(q.dtype), mask))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> float32 logits ``[..., V]`` in the target's vocabulary order."""
        return self.draft_logits(hidden)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (identity unless EAGLE-3 with a smaller vocabulary)."""
        return draft_ids


class Eagle1Head(EagleHead):
    """EAGLE-1: ``h = layer(fc(cat(embed(token), feature)))`` with a Llama decoder layer that has no
    ``input_layernorm``; no final norm; logits through the target's ``lm_head`` (``[V, H]``, set by the
    loader or the trainer, frozen)."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__(cfg)
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=cfg.bias)
        self.self_attn = Attention(cfg, h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size)
        self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)

    def attn_input(self, embeds: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.fc(torch.cat((embeds, features.to(embeds.dtype)), dim=-1))
        return x, x

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


class Eagle3Head(EagleHead):
    """EAGLE-3: ``f = fc(features)`` (when not H wide); attention over ``cat(input_layernorm(embed),
    hidden_norm(f))`` (2H wide) with residual ``f`` (``hidden_norm(f)`` when ``norm_before_residual``),
    post-attention norm, MLP; logits ``lm_head(norm(h))`` over the draft vocabulary, mapped to target
    ids by ``d2t`` (``target = draft + d2t[draft]``); ``t2d [V]`` bool marks target ids in the draft
    vocabulary. Without a draft vocabulary (Vd = V) ``d2t`` is zeros and ``t2d`` all true."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__(cfg)
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.feature_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, 2 * h)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))

    def set_vocab_map(self, d2t: torch.Tensor) -> None:
        """Set ``d2t`` (offsets ``[Vd]``) and derive ``t2d``."""
        self.d2t.copy_(d2t)
        self.t2d.zero_()
        self.t2d[torch.arange(self.cfg.draft_vocab_size, device=d2t.device) + d2t] = True

    def attn_input(self, embeds: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = features.to(embeds.dtype)
        if f.shape[-1] != self.cfg.hidden_size:
            f = self.fc(f)
        normed = self.hidden_norm(f)
        residual = normed if self.cfg.norm_before_residual else f
        return torch.cat((self.input_layernorm(embeds), normed), dim=-1), residual

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        d = self.draft_logits(hidden)
        if self.cfg.draft_vocab_size == self.cfg.vocab_size and not self.d2t.any():
            return d
        out = d.new_full((*d.shape[:-1], self.cfg.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.draft_to_target(torch.arange(d.shape[-1], device=d.device)), d)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def build_head(cfg: HeadConfig) -> EagleHead:
    """A randomly initialised head of ``cfg.kind`` (float32, on the CPU)."""
    return Eagle1Head(cfg) if cfg.kind == "eagle" else Eagle3Head(cfg)
