"""Slow reference for ``rejection_triton``: one request, one draft at a time, in plain Python.

It reads the same :class:`~specdec.rejection_torch.SamplerInputs` as the kernels and the
vectorised torch reference, so all three must give identical tokens; the parity tests compare them.
"""

from __future__ import annotations

import torch

from specdec.metadata import SpecDecodeMetadata
from specdec.rejection_torch import PLACEHOLDER_TOKEN_ID, SamplerInputs

__all__ = ["sample_prepared_naive"]


def sample_prepared_naive(
    metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, inputs: SamplerInputs
) -> torch.Tensor:
    """Same contract as :func:`specdec.rejection_torch.sample_prepared`, written as loops."""
    vocab, n = inputs.logits.shape[1], metadata.draft_token_ids.numel()
    drafts = metadata.draft_token_ids.tolist()
    target_rows = metadata.target_logits_indices.tolist()
    bonus_rows = metadata.bonus_logits_indices.tolist()
    out = torch.full((metadata.batch_size, metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64)
    start = 0
    for i, num in enumerate(metadata.num_draft_tokens):
        greedy = bool(inputs.is_greedy[i])
        accepted = 0
        for j in range(num):
            x = drafts[start + j]
            if not 0 <= x < vocab:
                break
            if greedy:
                ok = x == int(inputs.logits[target_rows[start + j]].argmax())
            else:
                p_x = float(inputs.p[start + j, x])  # Python floats are float64, like the kernels' test
                q_x = 1.0 if draft_probs is None else float(draft_probs[start + j, x].float())
                ok = float(inputs.u[start + j]) * q_x < p_x
            if not ok:
                break
            out[i, j] = x
            accepted += 1
        rejected = accepted < num
        if greedy:
            row = target_rows[start + accepted] if rejected else bonus_rows[i]
            token = int(inputs.logits[row].argmax())
        else:
            token = _race(_weights(inputs, draft_probs, start + accepted, n + i, rejected, drafts, vocab),
                          inputs.noise[i])
        out[i, accepted] = token
        start += num
    return out.to(inputs.logits.device)


def _weights(
    inputs: SamplerInputs,
    draft_probs: torch.Tensor | None,
    draft_row: int,
    bonus_row: int,
    rejected: bool,
    drafts: list[int],
    vocab: int,
) -> torch.Tensor:
    """The unnormalised distribution the emitted token is drawn from, ``[V]`` float32."""
    if not rejected:
        return inputs.p[bonus_row]
    p = inputs.p[draft_row]
    x = drafts[draft_row]
    if not 0 <= x < vocab:
        return p
    if draft_probs is None:
        residual = p.clone()
        residual[x] = 0.0
    else:
        residual = torch.clamp_min(p - draft_probs[draft_row].float(), 0.0)
    return residual if bool((residual > 0).any()) else p


def _race(weights: torch.Tensor, noise: torch.Tensor) -> int:
    """First index of the largest ``w_j / E_j = w_j * noise_j`` (the exponential race), element by element."""
    ratios = (weights * noise).tolist()
    best = 0
    for j, r in enumerate(ratios):
        if r > ratios[best]:
            best = j
    return best
