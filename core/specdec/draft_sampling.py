"""Draft-side sampling that proposers share: the ``draft_sample_method`` option's values, each request's
temperature when a batch samples, and drafts sampled from logits at those temperatures together with the
distributions the rejection sampler needs (``Drafts.probs``)."""

from __future__ import annotations

from typing import Any

import torch

from specdec.keyed import DraftKeys

__all__ = ["DRAFT_SAMPLE_METHODS", "check_draft_sample_method", "draft_probs_needed", "draft_temperatures",
           "sample_at_temperatures"]

DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


def check_draft_sample_method(value: Any, extra: tuple[str, ...] = ()) -> None:
    """Raise a ValueError unless ``value`` is one of :data:`DRAFT_SAMPLE_METHODS` (or of ``extra``: values a
    plugin accepts besides them, named in the message)."""
    allowed = DRAFT_SAMPLE_METHODS + tuple(extra)
    if value not in allowed:
        raise ValueError(f"draft_sample_method={value!r} is invalid: it must be one of {allowed}.")


def draft_temperatures(batch: Any, device: torch.device, probabilistic: bool) -> torch.Tensor | None:
    """Each request's temperature ``[B]`` on ``device`` when drafts are ``probabilistic`` and any request of
    ``batch`` (a :class:`specdec.DraftBatch`) samples; else None (every draft is an argmax)."""
    if not probabilistic or batch.sampling_params is None:
        return None
    temps = [float(p.temperature) for p in batch.sampling_params]
    return torch.tensor(temps, device=device) if any(temps) else None


def draft_probs_needed(batch: Any) -> bool:
    """Whether the verifier reads draft distributions for ``batch`` (a :class:`specdec.DraftBatch`): only when a
    request samples without a seed (the ``min(1, p/q)`` rule). Greedy requests are checked against the argmax and
    seeded ones by the keyed rule (:mod:`specdec.keyed`), neither reading ``q``; without it a proposer can send
    one-hot drafts (``probs=None``), which on a GPU also stay on the device until the verify forward has read them
    (:class:`specdec.validation.DeferredDrafts`)."""
    params = batch.sampling_params
    return params is not None and any(p is not None and p.free for p in params)


def sample_at_temperatures(logits: torch.Tensor, temps: torch.Tensor,
                           keyed: tuple[torch.Tensor, torch.Tensor] | DraftKeys | None = None, probs: bool = True
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Drafts ``[B, s]`` and their distributions ``softmax(logits / T)`` ``[B, s, V]`` from logits ``[B, s, V]``:
    row b sampled at ``temps[b]``, or its argmax where that is 0 (its distribution then taken at T = 1; the
    sampler compares greedy requests with the target's argmax). ``keyed``: keyed (seeded) rows draw by the
    target's own keyed race (coupled drafting) instead of a free sample: given as a
    :class:`specdec.keyed.DraftKeys` (:func:`specdec.keyed.keyed_draft_keys`; one kernel launch for every keyed
    row, and no free sample drawn when no other row samples), or as :func:`specdec.keyed.keyed_draft_noise`'s
    ``(noise [B, s, V], keyed [B])``, keyed rows then drawing ``argmax q * noise``. ``probs=False``: the
    distributions are not returned (None; :func:`draft_probs_needed` says when the verifier reads none), nor
    computed where no row draws from them (every sampled row keyed by a :class:`~specdec.keyed.DraftKeys`)."""
    b, s, v = logits.shape
    greedy = temps == 0
    if isinstance(keyed, DraftKeys) and not probs and not keyed.unkeyed_sampled:
        q = None  # the keyed rows race on the logits, greedy ones take the argmax: no softmax
    else:
        q = torch.softmax(logits / torch.where(greedy, 1.0, temps)[:, None, None], -1)
    if isinstance(keyed, DraftKeys):
        if len(keyed.rows) == b:
            return keyed.samples(logits), q if probs else None
        rows = keyed.index(logits.device)  # (one upload for the gather and the scatter)
        out = logits.argmax(-1)
        if keyed.unkeyed_sampled:
            sampled = torch.multinomial(q.reshape(b * s, v), 1).view(b, s)
            out = torch.where(greedy[:, None], out, sampled)
        return out.index_copy(0, rows, keyed.samples(logits[rows])), q if probs else None
    sampled = torch.multinomial(q.reshape(b * s, v), 1).view(b, s)
    if keyed is not None:
        noise, mask = keyed
        sampled = torch.where(mask[:, None], (q * noise).argmax(-1), sampled)
    return torch.where(greedy[:, None], logits.argmax(-1), sampled), q if probs else None
