"""Index metadata that tells the rejection sampler where each draft's logits live.

Layout used throughout specdec: request ``i`` owns ``num_draft_tokens[i] + 1`` consecutive rows of
the target logits, one per draft position (the row that predicts draft ``j``) and then its bonus row
(the row after the last draft). ``logits_indices`` lists, in that order, every row the sampler reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["SpecDecodeMetadata"]


@dataclass
class SpecDecodeMetadata:
    """Flattened per-batch draft layout.

    Attributes:
        draft_token_ids: ``[N]`` int64, every request's drafts concatenated (N = total drafts).
        num_draft_tokens: drafts per request, length B (0 allowed).
        cu_num_draft_tokens: ``[B]`` int32 inclusive prefix sum of ``num_draft_tokens``.
        cu_num_sampled_tokens: ``[B]`` int32 inclusive prefix sum of ``num_draft_tokens + 1``.
        target_logits_indices: ``[N]`` row of the logits that verifies each draft.
        bonus_logits_indices: ``[B]`` row of each request's bonus token.
        logits_indices: ``[N + B]`` rows the sampler needs, request by request.
        max_spec_len: ``max(num_draft_tokens)`` (0 for an empty batch).
    """

    draft_token_ids: torch.Tensor
    num_draft_tokens: list[int]
    cu_num_draft_tokens: torch.Tensor
    cu_num_sampled_tokens: torch.Tensor
    target_logits_indices: torch.Tensor
    bonus_logits_indices: torch.Tensor
    logits_indices: torch.Tensor
    max_spec_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.max_spec_len = max(self.num_draft_tokens, default=0)

    @property
    def batch_size(self) -> int:
        """Number of requests (B)."""
        return len(self.num_draft_tokens)

    @classmethod
    def from_draft_token_ids(
        cls, draft_token_ids: list[list[int]], device: torch.device | str = "cpu"
    ) -> SpecDecodeMetadata:
        """Build metadata for the layout where request i owns ``len(drafts[i]) + 1`` logits rows.

        Everything is computed on the host and moved in one copy (one transfer per step on a GPU)."""
        num_draft = np.array([len(ids) for ids in draft_token_ids], dtype=np.int64)
        b, n = len(num_draft), int(num_draft.sum())
        cu_draft = np.cumsum(num_draft)
        cu_sampled = np.cumsum(num_draft + 1)
        starts = cu_sampled - (num_draft + 1)  # first logits row of each request
        target = np.repeat(starts - (cu_draft - num_draft), num_draft) + np.arange(n)
        flat = np.fromiter((t for ids in draft_token_ids for t in ids), dtype=np.int64, count=n)
        packed = np.concatenate([flat, cu_draft, cu_sampled, target, cu_sampled - 1, np.arange(n + b)])
        dev = torch.from_numpy(packed).to(device, non_blocking=True)
        parts = torch.split(dev, [n, b, b, n, b, n + b])
        return cls(
            draft_token_ids=parts[0],
            num_draft_tokens=num_draft.tolist(),
            cu_num_draft_tokens=parts[1].to(torch.int32),
            cu_num_sampled_tokens=parts[2].to(torch.int32),
            target_logits_indices=parts[3],
            bonus_logits_indices=parts[4],
            logits_indices=parts[5],
        )

    @classmethod
    def make_dummy(
        cls, draft_token_ids: list[list[int]], device: torch.device | str = "cpu"
    ) -> SpecDecodeMetadata:
        """Fixed-shape placeholder metadata (all indices zero) for graph capture and warm-up.

        The shapes equal those :meth:`from_draft_token_ids` would build for the same draft counts,
        so a graph captured with it can be replayed with real metadata copied into the same buffers.
        """
        num_draft = [len(ids) for ids in draft_token_ids]
        num_sampled = [n + 1 for n in num_draft]
        n, b = sum(num_draft), len(num_draft)
        return cls(
            draft_token_ids=torch.tensor(
                [t for ids in draft_token_ids for t in ids], dtype=torch.int64, device=device
            ),
            num_draft_tokens=num_draft,
            cu_num_draft_tokens=torch.tensor(num_draft, dtype=torch.int32).cumsum(0).to(device, torch.int32),
            cu_num_sampled_tokens=torch.tensor(num_sampled, dtype=torch.int32).cumsum(0).to(device, torch.int32),
            target_logits_indices=torch.zeros(n, dtype=torch.int64, device=device),
            bonus_logits_indices=torch.zeros(b, dtype=torch.int64, device=device),
            logits_indices=torch.zeros(n + b, dtype=torch.int64, device=device),
        )
