"""Medusa heads as one batched module: every head's residual blocks and vocabulary projection in stacked tensors,
so the k heads a step needs run as a few batched matmuls over the requests' last hidden states.

Head ``i`` (0-based): ``x -> ResBlock^L(x) -> W_i x``, ``ResBlock(x) = x + SiLU(W x + b)``, read from the target's
last hidden state (after the final norm) at position ``t``; its argmax is the guess for the token at ``t + 2 + i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MedusaConfig", "MedusaHeads"]


@dataclass(frozen=True, slots=True)
class MedusaConfig:
    """Sizes of a set of Medusa heads.

    Attributes:
        num_heads: heads (the most drafts a step can take).
        num_layers: residual blocks per head (0: the vocabulary projection alone).
        hidden_size: the target's hidden size H.
        vocab_size: the target's vocabulary V.
        head_vocab_size: rows of each vocabulary projection, Vd (0: V). Less than V only with a ``token_map``
            (vLLM's truncated vocabulary: draft id -> target id).
        bias: the blocks' linears have a bias.
        shared_block: one residual block applied ``num_layers`` times per head (the FasterDecoding reference
            builds ``[ResBlock] * layers``: one module); else ``num_layers`` blocks of their own (vLLM).
        shared_lm_head: one vocabulary projection for every head (vLLM's ``original_lm_head``).
    """

    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    head_vocab_size: int = 0
    bias: bool = True
    shared_block: bool = False
    shared_lm_head: bool = False

    def __post_init__(self) -> None:
        for name, low in (("num_heads", 1), ("num_layers", 0), ("hidden_size", 1), ("vocab_size", 1),
                          ("head_vocab_size", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"MedusaConfig.{name}={v!r} is invalid: it must be an int >= {low}.")
        if self.head_vocab_size > self.vocab_size:
            raise ValueError(f"MedusaConfig.head_vocab_size={self.head_vocab_size} is more than vocab_size="
                             f"{self.vocab_size}: a truncated vocabulary is a subset of the target's.")

    @property
    def draft_vocab_size(self) -> int:
        """Vd: the rows of each head's vocabulary projection."""
        return self.head_vocab_size or self.vocab_size


class MedusaHeads(nn.Module):
    """All heads of one checkpoint. Parameters: ``weight [N, Lb, H, H]`` and ``bias [N, Lb, H]`` (Lb = 1 with a
    shared block, else L), ``lm_head [N or 1, Vd, H]``; buffer ``token_map [Vd]`` (draft id -> target id) when the
    vocabulary is truncated. Blocks start at zero (the identity), as Medusa trains them."""

    def __init__(self, cfg: MedusaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n, h = cfg.num_heads, cfg.hidden_size
        blocks = min(cfg.num_layers, 1) if cfg.shared_block else cfg.num_layers
        self.weight = nn.Parameter(torch.zeros(n, blocks, h, h))
        self.bias = nn.Parameter(torch.zeros(n, blocks, h)) if cfg.bias else None
        self.lm_head = nn.Parameter(torch.zeros(1 if cfg.shared_lm_head else n, cfg.draft_vocab_size, h))
        token_map = torch.arange(cfg.draft_vocab_size) if cfg.head_vocab_size else None
        self.register_buffer("token_map", token_map)

    def hidden(self, x: torch.Tensor, num: int | None = None) -> torch.Tensor:
        """``x [M, H]`` -> the first ``num`` heads' block outputs ``[num, M, H]``."""
        num = self.cfg.num_heads if num is None else num
        h = x.expand(num, *x.shape)  # [num, M, H]
        for j in range(self.cfg.num_layers):
            b = 0 if self.cfg.shared_block else j
            w = self.weight[:num, b].transpose(1, 2)  # [num, H, H]: x @ W^T
            z = torch.bmm(h, w) if self.bias is None else torch.baddbmm(self.bias[:num, b, None], h, w)
            h = h + F.silu(z)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Block outputs ``[num, M, H]`` -> logits ``[num, M, Vd]`` over the head vocabulary."""
        lm = self.lm_head if not self.cfg.shared_lm_head else self.lm_head.expand(h.shape[0], -1, -1)
        return torch.bmm(h, lm[: h.shape[0]].transpose(1, 2))

    def head_logits(self, h: torch.Tensor, i: int) -> torch.Tensor:
        """Head ``i``'s block outputs ``[..., H]`` -> its logits ``[..., Vd]``."""
        return h @ self.lm_head[0 if self.cfg.shared_lm_head else i].T

    def forward(self, x: torch.Tensor, num: int | None = None) -> torch.Tensor:
        """``x [M, H]`` (the target's last hidden states) -> the first ``num`` heads' logits ``[num, M, Vd]``."""
        return self.logits(self.hidden(x, num))

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Head-vocabulary ids -> target ids (the identity without a truncated vocabulary)."""
        return ids if self.token_map is None else self.token_map[ids]
