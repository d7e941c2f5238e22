"""torch n-gram kernel for ``ngram_gpu``: the whole batch at once, no host sync, compilable.

Same rule as the Numba scan (:mod:`specdec_ngram.naive` states it). Sliding windows of the last
``max_n`` tokens at every position come from ``unfold`` (a view); comparing them with the
sequence's own suffix, one offset at a time, gives after ``n`` offsets the mask of positions
where an n-gram equal to the suffix ends. For each n in [min_n, max_n] the earliest (or latest)
such end is kept when it exists, larger n winning, and the k tokens after it are gathered.
Work is O(B x L x max_n); memory O(B x L). Launcher: :func:`ngram_match_torch` (checks);
the traced body is :func:`_ngram_kernel`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["ngram_match_torch", "compiled_kernel"]


def _ngram_kernel(
    token_ids: torch.Tensor,  # [B, L] integer
    num_tokens: torch.Tensor,  # [B] int64
    active: torch.Tensor,  # [B] bool
    max_model_len: int,
    min_n: int,
    max_n: int,
    k: int,
    recent: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, width = token_ids.shape
    tokens = token_ids.long()
    total = num_tokens.long()
    # Left padding with -1 (never a token id) makes windows that start before 0 never match.
    windows = F.pad(tokens, (max_n - 1, 0), value=-1).unfold(1, max_n, 1)  # [B, L, max_n]
    last = (total - 1).clamp(min=0)
    suffix = windows.gather(1, last.view(batch, 1, 1).expand(batch, 1, max_n)).squeeze(1)  # [B, max_n]
    pos = torch.arange(width, device=tokens.device)
    matched = pos.unsqueeze(0) < (total - 1).unsqueeze(1)  # [B, L]: an occurrence ends before the last token
    none = width if not recent else -1
    best_end = torch.full((batch,), -1, dtype=torch.long, device=tokens.device)
    best_n = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    for n in range(1, max_n + 1):
        col = max_n - n  # windows[b, e, col] = tokens[b, e - (n - 1)]
        matched = matched & (windows[:, :, col] == suffix[:, col].unsqueeze(1))
        if n < min_n:
            continue
        ends = torch.where(matched, pos.unsqueeze(0), none)
        end = ends.max(dim=1).values if recent else ends.min(dim=1).values  # [B]
        found = (end != none) & (total > n)  # the suffix itself needs n real tokens, plus one before
        best_end = torch.where(found, end, best_end)
        best_n = torch.where(found, torch.full_like(best_n, n), best_n)
    ok_row = active & (best_n >= min_n)  # [B]
    limit = torch.clamp(max_model_len - total, min=0, max=k)  # [B]
    offs = torch.arange(k, device=tokens.device)
    idx = best_end.unsqueeze(1) + 1 + offs.unsqueeze(0)  # [B, k]
    ok = ok_row.unsqueeze(1) & (offs.unsqueeze(0) < limit.unsqueeze(1)) & (idx < total.unsqueeze(1))
    drafts = torch.where(ok, tokens.gather(1, idx.clamp(0, width - 1)), -1)
    return drafts, ok.sum(dim=1)


_COMPILED: dict[tuple, object] = {}


def compiled_kernel(max_model_len: int, min_n: int, max_n: int, k: int, recent: bool):
    """``torch.compile`` of the kernel with its scalars baked in and dynamic shapes (B and L change
    every step), built once per setting."""
    key = (max_model_len, min_n, max_n, k, recent)
    fn = _COMPILED.get(key)
    if fn is None:

        def kernel(token_ids, num_tokens, active):
            return _ngram_kernel(token_ids, num_tokens, active, max_model_len, min_n, max_n, k, recent)

        fn = _COMPILED[key] = torch.compile(kernel, dynamic=True, fullgraph=True)
    return fn


def ngram_match_torch(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int,
    *,
    active: torch.Tensor | None = None,
    match: str = "leftmost",
    compile: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts for a padded batch on the tensors' device: (``[B, k]`` int64 padded -1, ``[B]`` counts).

    ``num_tokens`` and ``active`` are moved to ``token_ids``'s device if needed; nothing is read
    back to the host.
    """
    if token_ids.dim() != 2:
        raise ValueError(f"token_ids must be 2-D [B, L]; got shape {tuple(token_ids.shape)}.")
    if token_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"token_ids must be int32 or int64; got {token_ids.dtype}.")
    if not 1 <= min_n <= max_n or k < 0:
        raise ValueError(
            f"min_n={min_n}, max_n={max_n}, k={k} are invalid: the rule is 1 <= min_n <= max_n, k >= 0."
        )
    if match not in ("leftmost", "recent"):
        raise ValueError(f"match={match!r} is invalid: it must be 'leftmost' or 'recent'.")
    batch = token_ids.shape[0]
    device = token_ids.device
    num_tokens = torch.as_tensor(num_tokens).to(device=device, dtype=torch.int64, non_blocking=True)
    if num_tokens.shape != (batch,):
        raise ValueError(f"num_tokens must have shape ({batch},); got {tuple(num_tokens.shape)}.")
    if active is None:
        active = torch.ones(batch, dtype=torch.bool, device=device)
    else:
        active = torch.as_tensor(active).to(device=device, dtype=torch.bool, non_blocking=True)
        if active.shape != (batch,):
            raise ValueError(f"active must have shape ({batch},); got {tuple(active.shape)}.")
    if batch == 0 or token_ids.shape[1] == 0 or k == 0:
        return torch.full((batch, k), -1, dtype=torch.int64, device=device), torch.zeros(
            batch, dtype=torch.int64, device=device)
    recent = match == "recent"
    if compile:
        return compiled_kernel(max_model_len, min_n, max_n, k, recent)(token_ids, num_tokens, active)
    return _ngram_kernel(token_ids, num_tokens, active, max_model_len, min_n, max_n, k, recent)
