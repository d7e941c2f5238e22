"""Keyed sampling: a seeded request's tokens as a function of (prompt, sampling params, seed) only.

A seeded request with temperature > 0 samples the token at sequence position ``t`` (its index in prompt +
output) by the exponential race over the target distribution ``p_t`` (after temperature, top-k, top-p):
``x_t = argmax_v p_t(v) / E(seed, t, v)``, with ``E`` an Exp(1) variate drawn from a counter-based hash of
``(seed, t, v)`` (:func:`keyed_noise`), not from a generator whose state depends on how many numbers earlier
steps consumed. ``x_t`` follows ``p_t`` exactly (the race picks ``v`` with probability ``p_t(v)``), and it is
the same number whatever was drafted, whatever the batch holds, on every call.

Verification of such a request (:func:`keyed_accept`) accepts draft ``d_j`` (proposing position ``t + j``)
iff it equals ``x_{t + j}``, and emits ``x`` at the first mismatch (or at the bonus row): the output is
``x_t, x_{t+1}, ...``, the baseline's own keyed samples, for any drafts. A one-hot draft is accepted with
probability ``p(d)``, as under the ``min(1, p/q)`` rule. A probabilistic drafter that draws its drafts with the
same keyed noise (:func:`keyed_draft_noise`, coupled drafting: ``d = argmax q(v) / E(seed, t, v)``) gets
``d = x`` whenever the races of ``q`` and ``p`` pick the same token, which is likely when ``q`` is close to
``p`` (``benchmarks/bench_keyed.py`` measures it against ``1 - TV(p, q)``, the ``min(1, p/q)`` rule's rate).

The hash works on 32-bit lanes held in int64 tensors (multiplications split into 16-bit halves, so nothing
overflows) and gives 24-bit uniforms; one set of tensor ops covers every keyed row of a step (no generator call
per request). Unseeded requests keep the rejection sampler and its global random stream.
"""

from __future__ import annotations

import torch

from specdec.metadata import SpecDecodeMetadata
from specdec.rejection_torch import compute_target_probs

__all__ = ["keyed_noise", "keyed_sample", "keyed_row_samples", "keyed_accept", "keyed_draft_noise", "seed_halves"]

_M32 = 0xFFFFFFFF
_TWO_M24 = 2.0 ** -24


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for ``x`` in ``[0, 2**32)`` (int64) and a constant ``c < 2**32``, without overflow."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (xorshift-multiply, two rounds) on values in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seed_halves(seed: int) -> tuple[int, int]:
    """The low and high 32 bits of a seed (any int :class:`specdec.SamplingParams` accepts, negative ones in
    two's complement)."""
    return seed & _M32, (seed >> 32) & _M32


def _row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit keys per row from ``seeds [R, 2]`` (low, high halves) and ``positions [R]``."""
    k = _hash32(seeds[:, 0] ^ 0x9E3779B9)
    k = _hash32(k ^ seeds[:, 1])
    k = _hash32(k ^ (positions & _M32))
    return k, _hash32(k ^ 0x85EBCA6B)


def keyed_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int | torch.Tensor) -> torch.Tensor:
    """Race weights ``1 / E`` ``[R, V]`` (float32; ``E ~ Exp(1)``, a pure function of (seed, position, token id)).

    Args:
        seeds: ``[R, 2]`` int64, each row's seed as (low, high) 32-bit halves (:func:`seed_halves`).
        positions: ``[R]`` int64, the sequence position each row samples.
        vocab: V, for token ids ``0 .. V - 1``; or a ``[V']`` tensor of the target ids the columns stand for (a
            drafter over a smaller vocabulary passes its draft->target map, so its noise is the target's).
    """
    device = seeds.device
    ids = torch.arange(vocab, device=device) if isinstance(vocab, int) else vocab.to(device=device, dtype=torch.long)
    k1, k2 = _row_keys(seeds.long(), positions.long())
    h = _hash32(k1[:, None] ^ _hash32(ids & _M32)[None, :])
    h = _hash32(h ^ k2[:, None])
    u = ((h >> 8).float() + 0.5) * _TWO_M24  # (0, 1), 24 bits
    return torch.reciprocal(-torch.log(u))


def keyed_sample(p: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``argmax_v p[r, v] / E(seed_r, position_r, v)`` ``[R]``: a draw from each row of ``p [R, V]`` (any
    non-negative weights) keyed by its seed and position."""
    return (p.float() * keyed_noise(seeds, positions, p.shape[-1])).argmax(-1)


def keyed_row_samples(logits: torch.Tensor, rows: list[int], owner: list[int], positions: list[int],
                      temperature: list[float], top_k: list[int], top_p: list[float], seeds: list[int]) -> list[int]:
    """The keyed sample of each listed row of ``logits [R, V]``: row ``rows[m]`` belongs to request ``owner[m]``
    (an index into the per-request ``temperature``, ``top_k``, ``top_p`` and ``seeds``) and samples sequence
    position ``positions[m]``. One probability pass and one host read for all of them."""
    device = logits.device
    own = torch.tensor(owner, device=device)
    temp = torch.tensor(temperature, dtype=torch.float32, device=device)[own]
    k = torch.tensor(top_k, dtype=torch.long, device=device)[own] if any(top_k) else None
    p_ = torch.tensor(top_p, dtype=torch.float32, device=device)[own] if any(x < 1.0 for x in top_p) else None
    p = compute_target_probs(logits[torch.tensor(rows, device=device)], temp, k, p_)
    halves = torch.tensor([seed_halves(s) for s in seeds], dtype=torch.long, device=device)[own]
    return keyed_sample(p, halves, torch.tensor(positions, dtype=torch.long, device=device)).tolist()


def keyed_accept(drafts: list[list[int]], logits: torch.Tensor, metadata: SpecDecodeMetadata,
                 requests: list[int], temperature: list[float], top_k: list[int], top_p: list[float],
                 seeds: list[int], starts: list[int]) -> list[list[int]]:
    """Verify keyed requests: for each request index ``i`` in ``requests`` (with its ``temperature`` > 0,
    ``top_k``, ``top_p``, ``seeds`` and ``starts``, the sequence position of its first verify row), the keyed
    samples ``x`` of its rows (its drafts' rows in ``metadata``, then its bonus row) over ``logits [N + B, V]``;
    returns, per listed request, its drafts up to the first that differs from ``x`` there, plus ``x`` at that
    row. One gather, one probability pass and one host read for all of them."""
    if not requests:
        return []
    cu = [0]
    for n in metadata.num_draft_tokens:
        cu.append(cu[-1] + n)
    target_rows, bonus_rows = metadata.target_logits_indices.tolist(), metadata.bonus_logits_indices.tolist()
    rows, positions, owner = [], [], []
    for j, i in enumerate(requests):
        mine = target_rows[cu[i]: cu[i + 1]] + [bonus_rows[i]]
        rows += mine
        positions += [starts[j] + m for m in range(len(mine))]
        owner += [j] * len(mine)
    x = keyed_row_samples(logits, rows, owner, positions, temperature, top_k, top_p, seeds)
    out, at = [], 0
    for i in requests:
        d = drafts[i]
        a = 0
        while a < len(d) and d[a] == x[at + a]:
            a += 1
        out.append(d[:a] + [x[at + a]])
        at += len(d) + 1
    return out


def keyed_draft_noise(sampling_params: list, num_tokens, steps: int, vocab: int | torch.Tensor,
                      device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Coupled drafting: the keyed race weights ``[B, steps, V]`` of each request's next ``steps`` positions
    (request ``b`` holds ``num_tokens[b]`` tokens, so draft ``s`` proposes position ``num_tokens[b] + s``) and
    which requests are keyed ``[B]`` (seeded, temperature > 0; other rows hold ones); None when none is. A
    drafter samples draft ``s`` of a keyed request as ``argmax q(v) * noise[b, s, v]``. ``vocab`` as in
    :func:`keyed_noise`."""
    keyed = [p is not None and p.seed is not None and p.temperature > 0 for p in sampling_params]
    if not any(keyed):
        return None
    b = len(keyed)
    rows = [i for i in range(b) if keyed[i]]
    seeds = torch.tensor([seed_halves(sampling_params[i].seed) for i in rows for _ in range(steps)],
                         dtype=torch.long, device=device)
    pos = torch.tensor([int(num_tokens[i]) + s for i in rows for s in range(steps)], dtype=torch.long, device=device)
    width = vocab if isinstance(vocab, int) else vocab.numel()
    noise = torch.ones(b, steps, width, device=device)
    noise[torch.tensor(rows, device=device)] = keyed_noise(seeds, pos, vocab).view(len(rows), steps, width)
    return noise, torch.tensor(keyed, device=device)
