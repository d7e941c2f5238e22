"""Rejection sampling in torch: the reference implementation, and the inputs every implementation shares.

The public entry points are in :mod:`specdec.rejection_sampler`, which re-exports these names; the
Triton kernels (``specdec.kernels.rejection_triton``) import this module, not that one, so the
sampler can pick the kernels without the two importing each other.

For each request the sampler walks its drafts in order. A greedy request (temperature 0) accepts a
draft while it equals the argmax of the target logits. A random request accepts draft ``x`` with
probability ``min(1, p(x) / q(x))``, where ``p`` is the target distribution after temperature,
top-k and top-p, and ``q`` the draft distribution (one-hot when the drafter gives none). At the
first rejection it emits a token drawn from ``norm(max(p - q, 0))``; when every draft is accepted
it emits a bonus token drawn from ``p`` at the bonus row. The emitted tokens then follow exactly
the distribution of sampling from the target alone.

Randomness, per call, is drawn in one place (:func:`prepare_sampler_inputs`), which the torch
reference and the Triton kernels (``specdec.kernels.rejection_triton``) both start from, so given the
same RNG state and generators they emit the same tokens:

* unseeded requests draw from the global RNG in two vectorised calls;
* a seeded request (``sampling_metadata.generators[i]``) draws, from its own generator and in this
  order, ``num_draft_tokens[i]`` float64 uniforms and then ``V`` float32 exponentials, whatever its
  temperature and whatever the rest of the batch holds, so its output depends only on its own
  inputs and seed.

Each request emits exactly one sampled (recovered or bonus) token, so one row of exponentials per
request is enough: the position that uses it is chosen by the uniforms, which are independent of it.
Categorical sampling uses the exponential race ``argmax(w / E)``, ``E ~ Exp(1)``, which samples
index ``j`` with probability ``w_j / sum(w)`` for any non-negative ``w``: no normalisation, no
host sync, and the same noise can be replayed by a fused kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.metadata import SpecDecodeMetadata
from specdec.sampling import SamplingMetadata

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "SamplerInputs",
    "compute_target_probs",
    "parse_output",
    "prepare_sampler_inputs",
    "rejection_sample",
    "sample_prepared",
]

PLACEHOLDER_TOKEN_ID = -1
"""Pads each output row after the last emitted token."""


def parse_output(output: torch.Tensor) -> list[list[int]]:
    """Turn the sampler's ``[B, max_spec_len + 1]`` output into per-request token lists (no -1)."""
    return [[t for t in row if t != PLACEHOLDER_TOKEN_ID] for row in output.tolist()]


def compute_target_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Target distribution per row: ``softmax(filter(logits / temperature))`` in float32.

    Args:
        logits: ``[R, V]``.
        temperature: ``[R]``; rows with temperature <= 0 (greedy) are scaled by 1 instead, so the
            result stays finite; greedy callers ignore those rows.
        top_k: ``[R]`` int, keep the ``top_k`` most likely tokens (ties broken by lower index);
            0 or >= V keeps all. ``None`` skips top-k.
        top_p: ``[R]`` float in (0, 1], then keep the smallest set of most likely tokens whose mass
            (after top-k) is >= ``top_p``; always at least the top token; 1 keeps all. ``None``
            skips top-p.

    Returns:
        ``[R, V]`` float32 probabilities; filtered tokens have probability exactly 0.
    """
    temperature = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    scaled = logits.float() / temperature.float().unsqueeze(1)  # [R, V]
    if top_k is None and top_p is None:
        return torch.softmax(scaled, dim=-1)
    # Filter in sorted order: a stable descending sort makes top-k exact under ties.
    sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True, stable=True)  # [R, V]
    rank = torch.arange(scaled.shape[1], device=scaled.device)  # [V]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, scaled.shape[1]).unsqueeze(1)  # [R, 1]
        sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)  # [R, V]
    if top_p is not None:
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [R, V]
        top_p = top_p.float().unsqueeze(1)  # [R, 1]
        # top_p == 1 must keep the whole tail even where the rounded cumsum reaches 1 early.
        keep = (mass_before < top_p) | (top_p >= 1.0)
        sorted_probs = sorted_probs.masked_fill(~keep, 0.0)
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.empty_like(sorted_probs).scatter_(1, sorted_idx, sorted_probs)


@dataclass(slots=True)
class SamplerInputs:
    """What an implementation reads besides the metadata and the draft probs.

    Built once by :func:`prepare_sampler_inputs`, so the torch reference (:func:`sample_prepared`)
    and the Triton kernels consume the same target probabilities and the same random numbers and
    therefore emit the same tokens.

    Attributes:
        logits: ``[N + B, V]`` target logits as given; greedy requests take their argmax here.
        is_greedy: ``[B]`` bool, temperature == 0.
        any_greedy / any_random: whether the batch holds greedy / random requests (host bools).
        p: ``[N + B, V]`` float32 target probabilities, one row per draft (flat draft order) then one
            bonus row per request; ``None`` when every request is greedy.
        u: ``[N]`` float64 acceptance uniforms.
        noise: ``[B, V]`` float32 race weights ``1 / E`` with ``E ~ Exp(1)`` clamped to >= tiny, so the
            exponential race is one multiply per token (``argmax(w * noise)``), not a division.
    """

    logits: torch.Tensor
    is_greedy: torch.Tensor
    any_greedy: bool
    any_random: bool
    p: torch.Tensor | None
    u: torch.Tensor
    noise: torch.Tensor


def rejection_sample(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling_metadata: SamplingMetadata,
) -> torch.Tensor:
    """Verify every request's drafts and emit its accepted prefix plus one sampled token.

    This is the torch reference; :class:`specdec.RejectionSampler` switches to the Triton kernels on CUDA.

    Args:
        metadata: draft layout; request ``i`` owns ``num_draft_tokens[i] + 1`` logits rows.
        draft_probs: ``[N, V]`` draft distribution for each draft (flat, same order as
            ``metadata.draft_token_ids``), or ``None`` when the draft is one-hot (n-gram, suffix).
        logits: ``[N + B, V]`` target logits.
        sampling_metadata: per-request temperature / top-k / top-p and seeded generators.

    Returns:
        ``[B, max_spec_len + 1]`` int64 on ``logits.device``: accepted drafts, then the recovered
        (after a rejection) or bonus (all accepted) token, then ``PLACEHOLDER_TOKEN_ID``.
    """
    inputs = prepare_sampler_inputs(metadata, draft_probs, logits, sampling_metadata)
    return sample_prepared(metadata, draft_probs, inputs)


def prepare_sampler_inputs(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling_metadata: SamplingMetadata,
) -> SamplerInputs:
    """Validate the inputs, draw this call's random numbers and compute the target probabilities.

    Every implementation starts here, which is what keeps their random streams identical.
    """
    _check_inputs(metadata, draft_probs, logits, sampling_metadata)
    device = logits.device
    batch, vocab, n = metadata.batch_size, logits.shape[1], metadata.draft_token_ids.numel()
    is_greedy = sampling_metadata.temperature.to(device) == 0  # [B]
    any_greedy, any_random, need_top_k, need_top_p = _batch_flags(sampling_metadata, is_greedy)
    u, noise = _draw_randomness(metadata, sampling_metadata, vocab, device, any_random)
    p = None
    if any_random:
        req_of_draft, _ = _draft_positions(metadata, n, device)  # [N]
        row_req = torch.cat([req_of_draft, torch.arange(batch, device=device)])  # [N + B]
        p = compute_target_probs(
            logits[_sampler_rows(metadata, device)],
            sampling_metadata.temperature.to(device)[row_req],
            sampling_metadata.top_k.to(device)[row_req] if need_top_k else None,
            sampling_metadata.top_p.to(device)[row_req] if need_top_p else None,
        )  # [N + B, V]
    return SamplerInputs(logits, is_greedy, any_greedy, any_random, p, u, noise)


def sample_prepared(
    metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, inputs: SamplerInputs
) -> torch.Tensor:
    """Torch reference for the verification proper: :func:`rejection_sample` after
    :func:`prepare_sampler_inputs`. Same result layout as :func:`rejection_sample`."""
    if metadata.draft_token_ids.numel() == 0:  # nothing to verify (a plain decode step): [B, 1]
        return _bonus_only(metadata, inputs).unsqueeze(1)
    return _verify(metadata, draft_probs, inputs)


def _verify(metadata: SpecDecodeMetadata, draft_probs: torch.Tensor | None, inputs: SamplerInputs) -> torch.Tensor:
    """The acceptance pass of :func:`sample_prepared`, valid for any number of drafts (N = 0 too)."""
    device = inputs.logits.device
    batch, vocab, n = metadata.batch_size, inputs.logits.shape[1], metadata.draft_token_ids.numel()
    is_greedy = inputs.is_greedy  # [B]
    req_of_draft, pos_of_draft = _draft_positions(metadata, n, device)  # [N], [N]
    draft = metadata.draft_token_ids.to(device=device, dtype=torch.int64)  # [N]
    in_range = (draft >= 0) & (draft < vocab)  # [N]
    safe_draft = draft.clamp(0, vocab - 1)  # [N], for gathers only; in_range masks the result

    accept = torch.zeros(n, dtype=torch.bool, device=device)  # [N]
    greedy_token = torch.zeros(batch, dtype=torch.int64, device=device)  # [B]
    random_token = torch.zeros(batch, dtype=torch.int64, device=device)  # [B]
    if inputs.any_greedy:
        argmax = inputs.logits.argmax(dim=-1)[_sampler_rows(metadata, device)]  # [N + B]
        accept_greedy = in_range & (draft == argmax[:n])
        accept = torch.where(is_greedy[req_of_draft], accept_greedy, accept)
    if inputs.any_random:
        p = inputs.p  # [N + B, V]
        accept_random = _accept_random(p[:n], draft_probs, safe_draft, in_range, inputs.u)
        accept = torch.where(is_greedy[req_of_draft], accept, accept_random)

    accept_len, rejected, rej_idx = _accept_lengths(accept, req_of_draft, pos_of_draft, metadata, batch)
    if inputs.any_greedy:
        recovered = argmax[:n][rej_idx] if n else greedy_token
        greedy_token = torch.where(rejected, recovered, argmax[n:])
    if inputs.any_random:
        dist = p[n:]  # [B, V] bonus distribution
        if n:
            residual = _residual(p[:n], draft_probs, safe_draft, in_range, rej_idx)  # [B, V]
            dist = torch.where(rejected.unsqueeze(1), residual, dist)
        random_token = _sample(dist, inputs.noise)
    token = torch.where(is_greedy, greedy_token, random_token)  # [B]
    return _assemble(draft, req_of_draft, pos_of_draft, accept_len, token, metadata, batch)


def _bonus_only(metadata: SpecDecodeMetadata, inputs: SamplerInputs) -> torch.Tensor:
    """Each request's one token when no request has drafts, ``[B]``: what the general path of
    :func:`sample_prepared` yields with N = 0 (the argmax of its bonus row, or the exponential race
    over the target distribution with the same noise), without its acceptance bookkeeping."""
    bonus_rows = metadata.bonus_logits_indices.to(inputs.logits.device)
    if not inputs.any_random:  # every request greedy (or none at all)
        return inputs.logits.argmax(dim=-1)[bonus_rows]
    random_token = _sample(inputs.p, inputs.noise)  # p rows: the bonus rows, in request order
    if not inputs.any_greedy:
        return random_token
    return torch.where(inputs.is_greedy, inputs.logits.argmax(dim=-1)[bonus_rows], random_token)


def _sampler_rows(metadata: SpecDecodeMetadata, device: torch.device) -> torch.Tensor:
    """Logits row of each draft (flat order) then of each request's bonus token, ``[N + B]``."""
    return torch.cat([metadata.target_logits_indices, metadata.bonus_logits_indices]).to(device)


def _check_inputs(
    metadata: SpecDecodeMetadata,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling_metadata: SamplingMetadata,
) -> None:
    batch, n = metadata.batch_size, metadata.draft_token_ids.numel()
    if sum(metadata.num_draft_tokens) != n:
        raise ValueError(
            f"metadata.draft_token_ids has {n} tokens but sum(metadata.num_draft_tokens) = "
            f"{sum(metadata.num_draft_tokens)}; they must match."
        )
    if logits.dim() != 2 or logits.shape[0] != n + batch:
        raise ValueError(
            f"logits must have shape [N + B, V] = [{n + batch}, V] (N={n} drafts, B={batch} requests), "
            f"got {tuple(logits.shape)}."
        )
    if logits.shape[1] == 0:
        raise ValueError("logits must have shape [N + B, V] with V >= 1, got V = 0.")
    if draft_probs is not None and tuple(draft_probs.shape) != (n, logits.shape[1]):
        raise ValueError(
            f"draft_probs must have shape [N, V] = [{n}, {logits.shape[1]}] or be None, "
            f"got {tuple(draft_probs.shape)}."
        )
    for name in ("temperature", "top_k", "top_p"):
        got = tuple(getattr(sampling_metadata, name).shape)
        if got != (batch,):
            raise ValueError(
                f"sampling_metadata.{name} must have shape [B] = [{batch}] (one entry per request), "
                f"got {got}."
            )
    bad = sorted(i for i in sampling_metadata.generators if not 0 <= i < batch)
    if bad:
        raise ValueError(
            f"sampling_metadata.generators has request indices {bad} outside [0, {batch}) (B={batch})."
        )


def _batch_flags(sampling_metadata: SamplingMetadata, is_greedy: torch.Tensor) -> list[bool]:
    """(any greedy, any random, any random top-k, any random top-p), read in one host transfer.

    It lets a greedy or unfiltered batch skip the softmax or the vocabulary sort, which costs far
    more on a large vocabulary than one small transfer. Metadata built by
    ``SamplingMetadata.from_params`` carries them from the host, and then nothing is read.
    """
    if sampling_metadata.host_flags is not None:
        return list(sampling_metadata.host_flags)
    random = ~is_greedy
    flags = torch.stack([
        is_greedy.any(),
        random.any(),
        (random & (sampling_metadata.top_k.to(is_greedy.device) > 0)).any(),
        (random & (sampling_metadata.top_p.to(is_greedy.device) < 1.0)).any(),
    ])
    return [bool(f) for f in flags.tolist()]


def _draft_positions(
    metadata: SpecDecodeMetadata, n: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Request index and position within the request of each flat draft, ``[N]`` each."""
    cu = metadata.cu_num_draft_tokens.to(device=device, dtype=torch.int64)  # [B]
    num = torch.diff(cu, prepend=cu.new_zeros(1))  # [B]
    req = torch.repeat_interleave(torch.arange(metadata.batch_size, device=device), num, output_size=n)
    pos = torch.arange(n, device=device) - (cu - num)[req]
    return req, pos


def _draw_randomness(
    metadata: SpecDecodeMetadata,
    sampling_metadata: SamplingMetadata,
    vocab: int,
    device: torch.device,
    any_random: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniforms ``[N]`` (float64) for acceptance and inverse exponentials ``[B, V]`` for sampling.

    Unseeded rows come from the global RNG (skipped when the batch is all greedy or every request is
    seeded); each seeded request overwrites its own slices from its generator: uniforms first, then
    exponentials.
    """
    n, batch = metadata.draft_token_ids.numel(), metadata.batch_size
    u = torch.zeros(n, dtype=torch.float64, device=device)
    noise = torch.ones(batch, vocab, dtype=torch.float32, device=device)
    if any_random and len(sampling_metadata.generators) < batch:
        # float64 so that u * q(x) < p(x) rounds in the right direction even for tiny p(x).
        u.uniform_()
        noise.exponential_()
    if sampling_metadata.generators:
        starts = [0]
        for count in metadata.num_draft_tokens:
            starts.append(starts[-1] + count)
        for i, gen in sampling_metadata.generators.items():
            u[starts[i] : starts[i + 1]].uniform_(generator=gen)
            noise[i].exponential_(generator=gen)
    # Exp(1) may round to 0: clamped, 1 / E stays finite (<= 2**126), so w * (1 / E) is never inf or NaN
    # and a zero-probability token never wins. Both implementations multiply by the same float32 1 / E.
    return u, noise.clamp_min_(torch.finfo(torch.float32).tiny).reciprocal_()


def _accept_random(
    p: torch.Tensor,
    draft_probs: torch.Tensor | None,
    safe_draft: torch.Tensor,
    in_range: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """Accept each draft with probability ``min(1, p(x) / q(x))``; ``p`` is ``[N, V]``."""
    p_x = p.gather(1, safe_draft.unsqueeze(1)).squeeze(1).double()  # [N]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        q_x = draft_probs.gather(1, safe_draft.unsqueeze(1)).squeeze(1).double()  # [N]
    # u < p/q written as u * q < p: no division, and p(x) == 0 is never accepted (strict <).
    return in_range & (u * q_x < p_x)


def _accept_lengths(
    accept: torch.Tensor,
    req_of_draft: torch.Tensor,
    pos_of_draft: torch.Tensor,
    metadata: SpecDecodeMetadata,
    batch: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accepted prefix length ``[B]``, whether a draft was rejected ``[B]``, and the flat index of
    the first rejected draft ``[B]`` (clamped into range where nothing was rejected)."""
    device = accept.device
    width = max(metadata.max_spec_len, 1)
    padded = torch.zeros(batch, width, dtype=torch.bool, device=device)  # [B, k]
    padded[req_of_draft, pos_of_draft] = accept
    accept_len = padded.long().cumprod(dim=1).sum(dim=1)  # [B]
    cu = metadata.cu_num_draft_tokens.to(device=device, dtype=torch.int64)  # [B]
    num = torch.diff(cu, prepend=cu.new_zeros(1))  # [B]
    rejected = accept_len < num  # [B]
    rej_idx = (cu - num + accept_len).clamp(max=max(accept.numel() - 1, 0))  # [B]
    return accept_len, rejected, rej_idx


def _residual(
    p: torch.Tensor,
    draft_probs: torch.Tensor | None,
    safe_draft: torch.Tensor,
    in_range: torch.Tensor,
    rej_idx: torch.Tensor,
) -> torch.Tensor:
    """Unnormalised ``max(p - q, 0)`` at each request's first rejected draft, ``[B, V]``.

    Falls back to ``p`` where the draft id is out of range or the residual is all zeros.
    """
    p_rej = p[rej_idx]  # [B, V]
    x = safe_draft[rej_idx].unsqueeze(1)  # [B, 1]
    if draft_probs is None:
        residual = p_rej.scatter(1, x, 0.0)  # one-hot q: p with p(x) zeroed
    else:
        residual = (p_rej - draft_probs[rej_idx].float()).clamp_min(0.0)
    usable = in_range[rej_idx].unsqueeze(1) & (residual.sum(dim=1, keepdim=True) > 0)  # [B, 1]
    return torch.where(usable, residual, p_rej)


def _sample(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Exponential race: ``argmax(w / E) = argmax(w * noise)`` picks ``j`` with probability ``w_j / sum(w)``."""
    return (weights * noise).argmax(dim=-1)


def _assemble(
    draft: torch.Tensor,
    req_of_draft: torch.Tensor,
    pos_of_draft: torch.Tensor,
    accept_len: torch.Tensor,
    token: torch.Tensor,
    metadata: SpecDecodeMetadata,
    batch: int,
) -> torch.Tensor:
    """``[B, k + 1]``: drafts before ``accept_len``, ``token`` at it, placeholders after."""
    width = metadata.max_spec_len + 1
    out = torch.full((batch, width), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=draft.device)
    out[req_of_draft, pos_of_draft] = draft
    keep = torch.arange(width, device=draft.device) < accept_len.unsqueeze(1)  # [B, k + 1]
    out = torch.where(keep, out, PLACEHOLDER_TOKEN_ID)
    return out.scatter_(1, accept_len.unsqueeze(1), token.unsqueeze(1))
