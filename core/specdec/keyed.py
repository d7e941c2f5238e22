"""Keyed sampling: a seeded request's tokens as a function of (prompt, sampling params, seed) only.

A seeded request with temperature > 0 samples the token at sequence position ``t`` (its index in prompt +
output) by the exponential race over the target distribution ``p_t`` (after temperature, top-k, top-p):
``x_t = argmax_v p_t(v) / E(seed, t, v)``, with ``E`` an Exp(1) variate drawn from a counter-based hash of
``(seed, t, v)`` (:func:`keyed_noise`), not from a generator whose state depends on how many numbers earlier
steps consumed. ``x_t`` follows ``p_t`` exactly (the race picks ``v`` with probability ``p_t(v)``), and it is
the same number whatever was drafted, whatever the batch holds, on every call. A request without top-k or top-p
runs the same race in its Gumbel-max form, ``x_t = argmax_v l_t(v) / T - log E(seed, t, v)`` on its logits
``l_t`` (the log of ``p_t(v) / E`` up to the row's constant log-normaliser: the same draw, without a softmax),
which one Triton launch computes on a GPU for every such row of a step (:mod:`specdec.kernels.keyed_triton`,
the hash included) and one numba pass a row on the CPU (:mod:`specdec.kernels.keyed_numba`, where numba is
installed); :func:`gumbel_row_samples` is their torch reference, used otherwise (:data:`KEYED_KERNEL`). The form
depends only on the request's sampling params, so a request always takes the same one.

Verification of such a request (:func:`keyed_accept`) accepts draft ``d_j`` (proposing position ``t + j``)
iff it equals ``x_{t + j}``, and emits ``x`` at the first mismatch (or at the bonus row): the output is
``x_t, x_{t+1}, ...``, the baseline's own keyed samples, for any drafts. A one-hot draft is accepted with
probability ``p(d)``, as under the ``min(1, p/q)`` rule. A probabilistic drafter that draws its drafts with the
same keyed noise (:func:`keyed_draft_noise`, coupled drafting: ``d = argmax q(v) / E(seed, t, v)``) gets
``d = x`` whenever the races of ``q`` and ``p`` pick the same token, which is likely when ``q`` is close to
``p`` (``benchmarks/bench_keyed.py`` measures it against ``1 - TV(p, q)``, the ``min(1, p/q)`` rule's rate).

The hash works on 32-bit lanes held in int64 tensors (multiplications split into 16-bit halves, so nothing
overflows) and gives 23-bit uniforms ``(k + 0.5) / 2**23``, exact in float32, so never 0 or 1 (24 bits rounded the
largest to 1.0: ``E = 0``, an infinite race weight, so a token whose hash came out largest, one in 2**24, was
drawn whatever its probability: 0.8% of draws at a 128k vocabulary). One set of tensor ops covers every keyed row of
a step (no generator call per request). Unseeded requests keep the rejection sampler and its global random stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from specdec.kernels import numba_available, triton_available
from specdec.metadata import SpecDecodeMetadata
from specdec.rejection_torch import compute_target_probs

__all__ = ["KEYED_KERNEL", "DraftKeys", "gumbel_row_samples", "inverse_temperatures", "keyed_accept",
           "keyed_draft_keys", "keyed_draft_noise", "keyed_noise", "keyed_plain_samples", "keyed_row_samples",
           "keyed_row_tensor", "keyed_sample", "row_keys", "rows_keys", "seed_halves", "verify_rows"]

_M32 = 0xFFFFFFFF
_TWO_M23 = 2.0 ** -23
KEYED_KERNEL = True  # unfiltered keyed rows: the Triton kernel on a CUDA device, numba's on the CPU when installed
# (specdec.kernels.keyed_numba); else, and with this False, the torch reference gumbel_row_samples


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


def _hash32_int(x: int) -> int:
    """:func:`_hash32` of one Python int in ``[0, 2**32)``."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def row_keys(seed: int, position: int) -> tuple[int, int]:
    """The two 32-bit keys of one sampled row (:func:`_row_keys` on the host): ``seed`` as
    :class:`specdec.SamplingParams` takes it, ``position`` its sequence position."""
    lo, hi = seed_halves(seed)
    k = _hash32_int(lo ^ 0x9E3779B9)
    k = _hash32_int(k ^ hi)
    k = _hash32_int(k ^ (position & _M32))
    return k, _hash32_int(k ^ 0x85EBCA6B)


def _hash32_np(x: np.ndarray) -> np.ndarray:
    """:func:`_hash32` of uint64 lanes holding 32-bit values (a uint64 product wraps modulo 2**64, a multiple of
    2**32, so its low 32 bits are exact)."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(_M32)
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) & np.uint64(_M32)
    return x ^ (x >> np.uint64(16))


_ROWS_LOOP = 24  # without numba, at most this many rows are keyed row by row in Python (no array set-up)


def rows_keys(seeds: list[int], positions: list[int]) -> np.ndarray:
    """``[R, 2]`` int64: :func:`row_keys` of every ``(seeds[r], positions[r])``: one numba call where numba is
    installed (:func:`specdec.kernels.keyed_numba.keyed_row_keys`); else row by row up to :data:`_ROWS_LOOP` rows,
    a few array operations past that. A step's keyed rows are dozens at batch 8 with drafts; the array form's ~35
    operations cost 46 us at batch 8 on the H100 machine's host (s35, ``keyed_launch.py``), ~120 us on a 2-core CPU,
    whatever the row count, against ~4 us a row in Python and ~10 us for 8 to 40 rows in numba there."""
    s = np.array([x & 0xFFFFFFFFFFFFFFFF for x in seeds], dtype=np.uint64)  # two's complement, as seed_halves
    if numba_available():
        from specdec.kernels.keyed_numba import keyed_row_keys

        out = np.empty((len(s), 2), dtype=np.int64)
        keyed_row_keys(s, np.array([p & 0xFFFFFFFFFFFFFFFF for p in positions], dtype=np.uint64), out)
        return out
    if len(seeds) <= _ROWS_LOOP:
        return np.array([row_keys(x, p) for x, p in zip(seeds, positions)], dtype=np.int64).reshape(-1, 2)
    m = np.uint64(_M32)
    k = _hash32_np((s & m) ^ np.uint64(0x9E3779B9))
    k = _hash32_np(k ^ (s >> np.uint64(32)))
    k = _hash32_np(k ^ (np.asarray(positions, dtype=np.uint64) & m))
    return np.stack([k, _hash32_np(k ^ np.uint64(0x85EBCA6B))], 1).astype(np.int64)


def _uniforms(k1: torch.Tensor, k2: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The keyed uniforms ``[R, V']`` in (0, 1) (float32, 23 bits: ``(k + 0.5) / 2**23`` is exact, from 2**-24 to
    1 - 2**-24) of rows with keys ``k1, k2 [R]`` at token ``ids``."""
    h = _hash32(k1[:, None] ^ _hash32(ids & _M32)[None, :])
    h = _hash32(h ^ k2[:, None])
    return ((h >> 9).float() + 0.5) * _TWO_M23


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
    return torch.reciprocal(-torch.log(_uniforms(k1, k2, ids)))


def gumbel_row_samples(logits: torch.Tensor, rows: list[int], temperature: list[float],
                       keys: list[tuple[int, int]] | np.ndarray) -> torch.Tensor:
    """``[R]`` int64: the keyed sample of each listed row of ``logits [N, V]`` without top-k / top-p, in the
    Gumbel-max form ``argmax_v logits[row, v] / T - log(-log u)`` (float32; ``u`` the keyed uniforms of the row's
    ``keys``, :func:`row_keys`; ``logit / T`` as ``logit * (1 / T)``): the torch reference of
    :func:`specdec.kernels.keyed_triton.keyed_argmax`."""
    device = logits.device
    k = torch.tensor(keys, dtype=torch.long, device=device).view(-1, 2)
    u = _uniforms(k[:, 0], k[:, 1], torch.arange(logits.shape[-1], device=device))
    inv = torch.from_numpy(inverse_temperatures(temperature)).to(device)[:, None]
    scores = logits[torch.tensor(rows, dtype=torch.long, device=device)].float() * inv - torch.log(-torch.log(u))
    return scores.argmax(-1)


def inverse_temperatures(temperature: list[float]) -> np.ndarray:
    """``1 / T`` in float32 (float32 division), the factor both forms of :func:`gumbel_row_samples` scale by."""
    return np.float32(1.0) / np.asarray(temperature, dtype=np.float32)


def keyed_sample(p: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``argmax_v p[r, v] / E(seed_r, position_r, v)`` ``[R]``: a draw from each row of ``p [R, V]`` (any
    non-negative weights) keyed by its seed and position."""
    return (p.float() * keyed_noise(seeds, positions, p.shape[-1])).argmax(-1)


def keyed_row_samples(logits: torch.Tensor, rows: list[int], owner: list[int], positions: list[int],
                      temperature: list[float], top_k: list[int], top_p: list[float], seeds: list[int]) -> list[int]:
    """The keyed sample of each listed row of ``logits [R, V]``: row ``rows[m]`` belongs to request ``owner[m]``
    (an index into the per-request ``temperature``, ``top_k``, ``top_p`` and ``seeds``) and samples sequence
    position ``positions[m]``. Rows of requests without top-k / top-p take the Gumbel-max form (one Triton launch on
    a CUDA device, one numba pass on the CPU: :data:`KEYED_KERNEL`); the others the race over their filtered
    probabilities. One host read (:func:`keyed_row_tensor` reads none)."""
    if not rows:
        return []
    return keyed_row_tensor(logits, rows, owner, positions, temperature, top_k, top_p, seeds).tolist()


def keyed_row_tensor(logits: torch.Tensor, rows: list[int], owner: list[int], positions: list[int],
                     temperature: list[float], top_k: list[int], top_p: list[float], seeds: list[int]
                     ) -> torch.Tensor:
    """:func:`keyed_row_samples` as ``[len(rows)]`` int64 on ``logits``' device, unread (a step verifying drafts that
    stayed on the device reads them with its argmax: :func:`specdec.verify.accept_deferred`)."""
    if not rows:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    plain = [m for m, j in enumerate(owner) if not top_k[j] and top_p[j] >= 1.0]
    filtered = [m for m, j in enumerate(owner) if top_k[j] or top_p[j] < 1.0]
    parts: list[tuple[list[int], torch.Tensor]] = []
    if plain:
        keys = rows_keys([seeds[owner[m]] for m in plain], [positions[m] for m in plain])
        temps = [float(temperature[owner[m]]) for m in plain]
        parts.append((plain, _gumbel_samples(logits, [rows[m] for m in plain], temps, keys).to(logits.device)))
    if filtered:
        device = logits.device
        own = torch.tensor([owner[m] for m in filtered], device=device)
        temp = torch.tensor(temperature, dtype=torch.float32, device=device)[own]
        k = torch.tensor(top_k, dtype=torch.long, device=device)[own] if any(top_k) else None
        p_ = torch.tensor(top_p, dtype=torch.float32, device=device)[own] if any(x < 1.0 for x in top_p) else None
        p = compute_target_probs(logits[torch.tensor([rows[m] for m in filtered], device=device)], temp, k, p_)
        halves = torch.tensor([seed_halves(s) for s in seeds], dtype=torch.long, device=device)[own]
        pos = torch.tensor([positions[m] for m in filtered], dtype=torch.long, device=device)
        parts.append((filtered, keyed_sample(p, halves, pos)))
    if len(parts) == 1:
        return parts[0][1]
    order = torch.tensor(plain + filtered, device=logits.device)
    return torch.empty(len(rows), dtype=torch.long, device=logits.device).index_copy_(
        0, order, torch.cat([x for _, x in parts]))


def _gumbel_samples(logits: torch.Tensor, rows: list[int], temperature: list[float], keys: np.ndarray
                    ) -> torch.Tensor:
    """:func:`gumbel_row_samples` (``[R]`` int64) by the fastest path here: one Triton launch on a CUDA device
    (:func:`_on_kernel`; on the device, unread), one numba pass on the CPU where numba is installed, else the torch
    reference."""
    if _on_kernel(logits):
        return _kernel_samples(logits, rows, temperature, keys)
    if KEYED_KERNEL and logits.device.type == "cpu" and numba_available():
        from specdec.kernels.keyed_numba import keyed_argmax_rows

        found = np.empty(len(rows), dtype=np.int64)
        keyed_argmax_rows(logits.detach().float().contiguous().numpy(), np.array(rows, dtype=np.int64),
                          np.ascontiguousarray(keys[:, 0]), np.ascontiguousarray(keys[:, 1]),
                          inverse_temperatures(temperature), found)
        return torch.from_numpy(found)
    return gumbel_row_samples(logits, rows, temperature, keys)


def _on_kernel(logits: torch.Tensor) -> bool:
    """Unfiltered keyed rows of ``logits`` go to the Triton kernel (a CUDA device, Triton, :data:`KEYED_KERNEL`)."""
    return KEYED_KERNEL and logits.is_cuda and logits.stride(-1) == 1 and triton_available()


def _kernel_samples(logits: torch.Tensor, rows: list[int], temperature: list[float], keys: np.ndarray
                    ) -> torch.Tensor:
    """:func:`gumbel_row_samples` by one launch of :func:`specdec.kernels.keyed_triton.keyed_argmax` (its inputs in
    one host-to-device copy), on the device, unread."""
    from specdec.kernels.keyed_triton import keyed_argmax

    meta = torch.empty((4, len(rows)), dtype=torch.long, pin_memory=True)  # pinned: the copy does not wait for
    m = meta.numpy()  # the device (the engine queues the next step behind these samples, overlap_steps)
    m[0], m[1:3] = rows, keys.T
    m[3] = inverse_temperatures(temperature).view(np.int32)  # one copy: 1 / T as its float32 bits
    meta_dev = meta.to(logits.device, non_blocking=True)
    return keyed_argmax(logits, meta_dev[:3], meta_dev[3].to(torch.int32).view(torch.float32))


def keyed_plain_samples(logits: torch.Tensor, rows: list[int], positions: list[int], temperature: list[float],
                        seeds: list[int]) -> torch.Tensor:
    """``[R]`` int64 on ``logits``' device, unread: the keyed samples of rows ``rows`` of ``logits`` for requests
    without top-k / top-p, row ``rows[m]`` at sequence position ``positions[m]`` with ``temperature[m]`` and
    ``seeds[m]``; what :func:`keyed_row_samples` returns for them (the Triton kernel where it would take it, else
    the torch reference, which the CPU's numba pass equals). The engine queues the next decode step of a sampled
    batch on these ids before reading them (``overlap_steps``)."""
    keys = rows_keys(seeds, positions)
    temps = [float(t) for t in temperature]
    if _on_kernel(logits):
        return _kernel_samples(logits, rows, temps, keys)
    return gumbel_row_samples(logits, rows, temps, keys)


def verify_rows(widths: list[int], requests: list[int], starts: list[int]) -> tuple[list[int], list[int], list[int]]:
    """The verify rows of the requests ``requests`` (indices into ``widths``; request i owns ``widths[i] + 1``
    consecutive rows, its drafts' then its bonus row, as :class:`SpecDecodeMetadata` lays them out): each row's
    index, the sequence position it samples (``starts[j]`` for listed request j's first row, one more a row) and its
    owner ``j``; as :func:`keyed_row_samples` takes them."""
    first, at = [], 0
    for n in widths:
        first.append(at)
        at += n + 1
    rows, positions, owner = [], [], []
    for j, i in enumerate(requests):
        rows += range(first[i], first[i] + widths[i] + 1)
        positions += range(starts[j], starts[j] + widths[i] + 1)
        owner += [j] * (widths[i] + 1)
    return rows, positions, owner


def keyed_accept(drafts: list[list[int]], logits: torch.Tensor, metadata: SpecDecodeMetadata | None,
                 requests: list[int], temperature: list[float], top_k: list[int], top_p: list[float],
                 seeds: list[int], starts: list[int]) -> list[list[int]]:
    """Verify keyed requests: for each request index ``i`` in ``requests`` (with its ``temperature`` > 0,
    ``top_k``, ``top_p``, ``seeds`` and ``starts``, the sequence position of its first verify row), the keyed
    samples ``x`` of its rows (its drafts' rows, then its bonus row) over ``logits [N + B, V]``, laid out as
    :class:`SpecDecodeMetadata` lays them out (request i owns ``num_draft_tokens[i] + 1`` consecutive rows; from
    ``metadata`` when given, else from ``drafts``, computed on the host); returns, per listed request, its drafts
    up to the first that differs from ``x`` there, plus ``x`` at that row. One host read for all of them."""
    if not requests:
        return []
    widths = metadata.num_draft_tokens if metadata is not None else [len(d) for d in drafts]
    rows, positions, owner = verify_rows(widths, requests, starts)
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
    keys = keyed_draft_keys(sampling_params, num_tokens, vocab)
    return None if keys is None else keys.noise(steps, device)


@dataclass(frozen=True)
class DraftKeys:
    """Coupled drafting without a noise tensor: which requests of a drafting batch are keyed (seeded, temperature
    > 0), their seeds, temperatures and the sequence position their first draft proposes, all on the host.
    :func:`specdec.draft_sampling.sample_at_temperatures` takes it for ``keyed=`` in place of
    :func:`keyed_draft_noise`'s ``(noise, mask)`` and draws those requests' drafts by the Gumbel-max form of the
    same race, ``argmax_v logits(v) / T - log E(seed, t, v)`` (what :func:`keyed_plain_samples` computes for the
    target): one Triton launch on a CUDA device (with Triton), one numba pass on the CPU (with numba), for every
    keyed row of every step at once, where the noise form spent ~45 tensor operations over ``[B, s, V]`` (medusa
    at batch 8, T = 0.8, H100: 2.6 ms of drafting a step against 0.25 ms greedy). Same law as the noise form's
    ``argmax q(v) / E`` (``q = softmax(logits / T)``); not the same bits (``logits * (1 / T)`` in float32, no
    softmax), which only the drafts' agreement with the target could tell (the target's own keyed samples take
    this form).

    Attributes:
        rows: the batch rows of keyed requests.
        seeds, temperatures: theirs.
        starts: the sequence position each one's first draft proposes (its token count).
        batch: the batch's size.
        unkeyed_sampled: whether any other request samples (temperature > 0, no seed): those draw freely.
        vocab: as :func:`keyed_noise` takes it: the drafts' vocabulary size (their ids are the target's), or a
            ``[V']`` tensor of the target id each draft column stands for.
        target_vocab: the target's vocabulary size, with a ``vocab`` tensor (the kernels then race over the
            target's ids with the draft's logits scattered into them); None keeps the noise form for such a
            drafter.
    """

    rows: tuple[int, ...]
    seeds: tuple[int, ...]
    temperatures: tuple[float, ...]
    starts: tuple[int, ...]
    batch: int
    unkeyed_sampled: bool
    vocab: int | torch.Tensor
    target_vocab: int | None = None

    def step(self, j: int) -> DraftKeys:
        """The keys of draft ``j`` alone (a chain drafter's step ``j`` samples one position: ``starts + j``)."""
        return replace(self, starts=tuple(s + j for s in self.starts))

    def noise(self, steps: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`keyed_draft_noise`'s ``(noise [B, steps, V], keyed [B])`` for these keys."""
        seeds = torch.tensor([seed_halves(s) for s in self.seeds for _ in range(steps)], dtype=torch.long,
                             device=device)
        pos = torch.tensor([p + j for p in self.starts for j in range(steps)], dtype=torch.long, device=device)
        width = self.vocab if isinstance(self.vocab, int) else self.vocab.numel()
        noise = torch.ones(self.batch, steps, width, device=device)
        noise[torch.tensor(self.rows, device=device)] = keyed_noise(seeds, pos, self.vocab).view(
            len(self.rows), steps, width)
        mask = torch.zeros(self.batch, dtype=torch.bool)
        mask[list(self.rows)] = True
        return noise, mask.to(device)

    def samples(self, logits: torch.Tensor) -> torch.Tensor:
        """``[len(rows), s]`` int64 on ``logits``' device (unread): the keyed drafts (draft vocabulary columns) of
        the keyed rows of ``logits [B, s, V']`` (or of ``[len(rows), s, V']``, those rows alone), draft ``j`` of row
        ``rows[m]`` proposing position ``starts[m] + j``."""
        b, steps, width = logits.shape
        device = logits.device
        sub = logits[self.index(device)] if len(self.rows) < b else logits  # [R, s, V']
        mapped = None if isinstance(self.vocab, int) else self.vocab.to(device)
        if mapped is not None and self.target_vocab is None:  # the noise form, over the keyed rows alone
            noise, _ = replace(self, rows=tuple(range(len(self.rows))), batch=len(self.rows)).noise(steps, device)
            temps = torch.tensor(self.temperatures, dtype=torch.float32, device=device)[:, None, None]
            return (torch.softmax(sub.float() / temps, -1) * noise).argmax(-1)
        if mapped is not None:
            full = sub.new_full((len(self.rows), steps, self.target_vocab), float("-inf"))
            sub = full.index_copy_(-1, mapped, sub)
        flat = sub.reshape(-1, sub.shape[-1]).float().contiguous()
        keys = rows_keys([s for s in self.seeds for _ in range(steps)],
                         [p + j for p in self.starts for j in range(steps)])
        temps = [t for t in self.temperatures for _ in range(steps)]
        ids = _gumbel_samples(flat, list(range(flat.shape[0])), temps, keys).view(len(self.rows), steps)
        if mapped is not None:  # target ids back to draft columns (the race never picks a -inf column)
            ids = (mapped[None, None, :] == ids[..., None]).int().argmax(-1)
        return ids

    def index(self, device: torch.device) -> torch.Tensor:
        """The keyed rows as an index on ``device``, without a blocking copy."""
        idx = torch.tensor(self.rows, dtype=torch.long)
        return idx.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else idx


def keyed_draft_keys(sampling_params: list, num_tokens, vocab: int | torch.Tensor,
                     target_vocab: int | None = None) -> DraftKeys | None:
    """The :class:`DraftKeys` of a drafting batch (request ``b`` holds ``num_tokens[b]`` tokens, so its first draft
    proposes that position), or None when no request is keyed (seeded, temperature > 0). ``vocab`` and
    ``target_vocab`` as :class:`DraftKeys` holds them."""
    keyed = [i for i, p in enumerate(sampling_params) if p is not None and p.keyed]
    if not keyed:
        return None
    free = any(p is not None and p.free for p in sampling_params)
    ps = [sampling_params[i] for i in keyed]
    return DraftKeys(tuple(keyed), tuple(p.seed for p in ps), tuple(float(p.temperature) for p in ps),
                     tuple(int(num_tokens[i]) for i in keyed), len(sampling_params), free, vocab, target_vocab)
