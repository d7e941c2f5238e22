"""Keyed sampling's fast paths (specdec.kernels.keyed_triton and keyed_numba, specdec.keyed.gumbel_row_samples): the
host's row keys equal the tensor keys, the Gumbel-max form follows the tempered distribution, the Triton kernel
(interpreter on the CPU, compiled on CUDA) and the numba kernel pick the reference's token for every row, and
keyed_row_samples / keyed_accept keep each row's place when filtered and unfiltered requests share a step."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import specdec.kernels
from specdec import keyed
from specdec.kernels import numba_available
from specdec.keyed import (
    _row_keys,
    gumbel_row_samples,
    inverse_temperatures,
    keyed_accept,
    keyed_noise,
    keyed_row_samples,
    keyed_sample,
    row_keys,
    rows_keys,
    seed_halves,
)
from specdec.metadata import SpecDecodeMetadata

SEEDS = [0, 1, 7, 2 ** 32 + 5, 2 ** 63 + 11, 2 ** 64 - 1, -3]
POSITIONS = [0, 1, 17, 2 ** 31 + 3, 2 ** 32 + 9, 5, 123456]


@pytest.fixture(scope="module")
def kt(interpreted_copy):
    """A private copy of the kernel module whose kernel runs in the Triton interpreter (while the fixture lives)."""
    if importlib.util.find_spec("triton") is None:  # (importing it here would set it up without the interpreter)
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():  # as for the rejection kernels: with a GPU the compiled kernel is tested instead
        pytest.skip("CUDA present: the compiled kernel is tested instead of the interpreter")
    with interpreted_copy(Path(specdec.kernels.__file__).with_name("keyed_triton.py")) as module:
        yield module


def _case(vocab: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(6, vocab, generator=g) * 3).to(dtype)
    logits[2, vocab // 2:] = float("-inf")  # a row with half its vocabulary masked
    rows = [5, 0, 2, 3, 3, 1, 4]
    keys = [row_keys(s, p) for s, p in zip(SEEDS, POSITIONS)]
    temps = [0.8, 1.0, 0.5, 1.3, 1.3, 0.05, 2.0]
    return logits, rows, keys, temps


def _meta(rows, keys):
    return torch.tensor([rows, [k[0] for k in keys], [k[1] for k in keys]], dtype=torch.long)


def test_row_keys_on_the_host_equal_the_tensor_keys():
    seeds = torch.tensor([seed_halves(s) for s in SEEDS])
    k1, k2 = _row_keys(seeds, torch.tensor(POSITIONS))
    assert [row_keys(s, p) for s, p in zip(SEEDS, POSITIONS)] == list(zip(k1.tolist(), k2.tolist()))


@pytest.mark.parametrize("numba", [True, False])
@pytest.mark.parametrize("count", [0, 1, 8, 207])
def test_rows_keys_equal_row_keys_row_by_row(monkeypatch, numba, count):
    """Each form (numba's pass; without numba Python row by row for a few rows, the array form for many) over the
    whole seed range SamplingParams takes (negative ones in two's complement, past 2**63) and positions past 2**32
    (hashed as their low 32 bits)."""
    if numba and not numba_available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(keyed, "numba_available", lambda: numba)
    rng = random.Random(4)
    seeds = [0, 1, -1, -2 ** 63, 2 ** 64 - 1, 2 ** 32, 2 ** 32 - 1, *SEEDS]
    seeds = (seeds + [rng.randrange(-2 ** 63, 2 ** 64) for _ in range(200)])[:count]
    positions = [rng.choice([0, 1, 2 ** 32 - 1, 2 ** 32 + 5, rng.randrange(10 ** 6)]) for _ in seeds]
    got = rows_keys(seeds, positions)
    assert got.dtype == np.int64 and got.shape == (len(seeds), 2)
    assert [tuple(k) for k in got.tolist()] == [row_keys(s, p) for s, p in zip(seeds, positions)]


def test_gumbel_form_is_the_race_on_the_same_noise():
    """argmax l / T - log E == argmax softmax(l / T) / E: the same draw, row by row (random logits have no near-ties
    at float32 resolution here)."""
    logits, rows, keys, temps = _case(300)
    want = keyed_sample(torch.softmax(logits[rows] / torch.tensor(temps)[:, None], -1),
                        torch.tensor([seed_halves(s) for s in SEEDS]), torch.tensor(POSITIONS))
    assert gumbel_row_samples(logits, rows, temps, keys).tolist() == want.tolist()
    # and keyed_noise's weights are 1 / E of the same uniforms
    noise = keyed_noise(torch.tensor([seed_halves(SEEDS[0])]), torch.tensor([POSITIONS[0]]), 300)
    e = 1.0 / noise[0].double()
    scores = logits[rows[0]].double() / temps[0] - torch.log(e)
    assert int(scores.argmax()) == gumbel_row_samples(logits, rows[:1], temps[:1], keys[:1]).item()


def test_gumbel_rows_follow_the_tempered_distribution():
    n, t = 40_000, 0.7
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]])
    p = torch.softmax(logits[0] / t, -1).double()
    x = gumbel_row_samples(logits, [0] * n, [t] * n, [row_keys(s, 33) for s in range(n)])
    freq = torch.bincount(x, minlength=6).double() / n
    assert 0.5 * (freq - p).abs().sum() < 0.012, freq
    run = gumbel_row_samples(logits, [0] * n, [t] * n, [row_keys(5, pos) for pos in range(n)])  # one seed's run
    assert 0.5 * (torch.bincount(run, minlength=6).double() / n - p).abs().sum() < 0.012


@pytest.mark.parametrize("vocab", [7, 2048, 2049, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_picks_the_reference_token_for_every_row(kt, vocab, dtype):
    logits, rows, keys, temps = _case(vocab, dtype, seed=vocab)
    want = gumbel_row_samples(logits, rows, temps, keys)
    got = kt.keyed_argmax(logits, _meta(rows, keys), torch.from_numpy(inverse_temperatures(temps)))
    assert got.dtype == torch.long and got.tolist() == want.tolist()


def test_kernel_breaks_ties_towards_the_lowest_id(kt):
    """Equal scores (a row of +inf logits: every score is +inf): the lowest id wins, as torch.argmax's does."""
    logits = torch.full((1, 4100), -5.0)
    logits[0, [9, 2057, 2500, 4099]] = float("inf")  # 9 and 2057 share a lane of the kernel's tiles
    keys = [row_keys(3, 4)]
    assert kt.keyed_argmax(logits, _meta([0], keys), torch.ones(1)).tolist() == [9]
    assert gumbel_row_samples(logits, [0], [1.0], keys).tolist() == [9]
    assert kt.keyed_argmax(logits, _meta([], []), torch.ones(0)).tolist() == []


def _unmix(h: int) -> int:
    """The inverse of the keyed hash's 32-bit mixer (xorshifts and odd multipliers are bijections)."""
    m = 2 ** 32 - 1
    h ^= h >> 16
    h = (h * pow(0x846CA68B, -1, 2 ** 32)) & m
    h ^= (h >> 15) ^ (h >> 30)
    h = (h * pow(0x7FEB352D, -1, 2 ** 32)) & m
    return h ^ (h >> 16)


def _largest_hash_case():
    """Logits where token 0 is e**30 times likelier than any other, and row keys under which token 5's hash is
    2**32 - 1, the largest: its uniform must stay below 1 (a 24-bit uniform rounded to 1.0 there, E = 0, and
    token 5 won the race against any odds)."""
    k1 = row_keys(3, 4)[0]
    k2 = _unmix(2 ** 32 - 1) ^ keyed._hash32_int(k1 ^ keyed._hash32_int(5))
    logits = torch.zeros(1, 64)
    logits[0, 0] = 30.0
    return logits, [(k1, k2)]


def test_the_largest_hash_is_a_uniform_below_one():
    logits, keys = _largest_hash_case()
    (k1, k2), = keys
    u = keyed._uniforms(torch.tensor([k1]), torch.tensor([k2]), torch.arange(64))
    assert float(u[0, 5]) == 1 - 2 ** -24 and float(u.min()) > 0
    h = keyed._hash32(keyed._hash32(torch.tensor([k1]) ^ keyed._hash32(torch.tensor([5]))) ^ k2)
    assert h.item() == 2 ** 32 - 1
    assert gumbel_row_samples(logits, [0], [1.0], keys).tolist() == [0]


def test_kernel_draws_the_largest_hash_like_the_reference(kt):
    logits, keys = _largest_hash_case()
    assert kt.keyed_argmax(logits, _meta([0], keys), torch.ones(1)).tolist() == [0]


@pytest.mark.parametrize("scale", [1.0, 3.6, 12.0])
@pytest.mark.parametrize("vocab", [7, 5000])
def test_numba_kernel_picks_the_reference_token_for_every_row(vocab, scale):
    """Flat to peaked logits (the skipped tokens: far below the best), masked and +inf entries, bf16 logits."""
    pytest.importorskip("numba", reason="numba is not installed (the torch reference serves the CPU then)")
    from specdec.kernels.keyed_numba import keyed_argmax_rows

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(48, vocab, generator=g) * scale
    logits[3, : vocab // 2] = float("-inf")
    logits[4] = float("-inf")
    logits[5, [1, vocab - 1]] = float("inf")
    rows = list(range(48)) + [7, 7]
    keys = [row_keys(1000 + r, 3 * r) for r in range(48)] + [row_keys(5, 6), row_keys(5, 7)]
    temps = [0.3 + 0.05 * r for r in range(48)] + [0.8, 0.8]
    for x in (logits, logits.to(torch.bfloat16)):
        want = gumbel_row_samples(x, rows, temps, keys).tolist()
        k = np.array(keys, dtype=np.int64)
        got = np.zeros(len(rows), dtype=np.int64)
        keyed_argmax_rows(x.float().numpy(), np.array(rows), k[:, 0].copy(), k[:, 1].copy(),
                          inverse_temperatures(temps), got)
        assert got.tolist() == want
    edge, edge_keys = _largest_hash_case()
    got = np.zeros(1, dtype=np.int64)
    keyed_argmax_rows(edge.numpy(), np.array([0]), np.array([edge_keys[0][0]]), np.array([edge_keys[0][1]]),
                      np.ones(1, dtype=np.float32), got)
    assert got.tolist() == [0]
    # token 5's noise is the largest there is (16.64): it beats token 0, 16 logits above it, by 0.5, so neither
    # skip may drop it
    (k1, k2), = edge_keys
    u0 = float(keyed._uniforms(torch.tensor([k1]), torch.tensor([k2]), torch.tensor([0]))[0, 0])
    edge[0, 0] = float(-np.log(-np.log(1 - 2 ** -24)) + np.log(-np.log(u0))) - 0.5
    edge[0, 1:5] = -100.0
    edge[0, 5:] = 0.0
    assert gumbel_row_samples(edge, [0], [1.0], edge_keys).tolist() == [5]
    keyed_argmax_rows(edge.numpy(), np.array([0]), np.array([k1]), np.array([k2]), np.ones(1, dtype=np.float32), got)
    assert got.tolist() == [5]


def test_row_samples_on_the_cpu_are_the_references_with_and_without_the_kernel(monkeypatch):
    logits, rows, keys, temps = _case(3000)
    args = (rows, list(range(len(rows))), POSITIONS, temps, [0] * len(rows), [1.0] * len(rows), SEEDS)
    want = gumbel_row_samples(logits, rows, temps, keys).tolist()
    assert keyed_row_samples(logits, *args) == want  # numba's pass where installed
    monkeypatch.setattr(keyed, "KEYED_KERNEL", False)
    assert keyed_row_samples(logits, *args) == want


def test_row_samples_keep_each_rows_place_across_filtered_and_plain_requests():
    logits, *_ = _case(64)
    rows, owner, positions = [0, 1, 2, 3, 4, 5], [0, 1, 0, 2, 1, 2], [10, 20, 11, 30, 21, 31]
    temperature, top_k, top_p, seeds = [0.8, 1.0, 0.6], [0, 5, 0], [1.0, 1.0, 0.9], [3, 4, 5]
    got = keyed_row_samples(logits, rows, owner, positions, temperature, top_k, top_p, seeds)
    for m, row in enumerate(rows):  # each row alone: the same token
        j = owner[m]
        assert got[m] == keyed_row_samples(logits, [row], [0], [positions[m]], [temperature[j]], [top_k[j]],
                                           [top_p[j]], [seeds[j]])[0]
    # request 0 is unfiltered (the Gumbel-max form), request 1's top-k keeps 5 tokens
    assert got[0] == gumbel_row_samples(logits, [0], [0.8], [row_keys(3, 10)]).item()
    assert got[1] in logits[1].topk(5).indices.tolist() and got[4] in logits[4].topk(5).indices.tolist()


def test_accept_finds_each_requests_rows_without_the_metadata():
    logits, *_ = _case(50)
    drafts = [[3, 4], [], [7]]  # rows: request 0 owns 0..2, request 1 row 3, request 2 rows 4..5
    args = ([0, 2], [0.9, 1.1], [0, 0], [1.0, 1.0], [8, 9], [40, 50])
    with_md = keyed_accept(drafts, logits, SpecDecodeMetadata.from_draft_token_ids(drafts), *args)
    assert keyed_accept(drafts, logits, None, *args) == with_md
    x0 = gumbel_row_samples(logits, [0], [0.9], [row_keys(8, 40)]).item()
    assert with_md[0][-1] == x0 if x0 != 3 else with_md[0][0] == 3
    x4 = gumbel_row_samples(logits, [4], [1.1], [row_keys(9, 50)]).item()
    assert (with_md[1] == [x4]) if x4 != 7 else with_md[1][0] == 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("vocab", [7, 2049, 128256])
def test_cuda_kernel_matches_reference_and_serves_keyed_rows(vocab, monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed")
    from specdec.kernels import keyed_triton as kt_cuda
    logits, rows, keys, temps = _case(vocab, seed=vocab)
    logits = logits.cuda()
    want = gumbel_row_samples(logits, rows, temps, keys).tolist()
    inv = torch.from_numpy(inverse_temperatures(temps)).cuda()
    assert kt_cuda.keyed_argmax(logits, _meta(rows, keys).cuda(), inv).tolist() == want
    args = (rows, list(range(len(rows))), POSITIONS, temps, [0] * len(rows), [1.0] * len(rows), SEEDS)
    assert keyed_row_samples(logits, *args) == want  # the kernel's path
    monkeypatch.setattr(keyed, "KEYED_KERNEL", False)
    assert keyed_row_samples(logits, *args) == want  # the torch path
    cpu = gumbel_row_samples(logits.cpu(), rows, temps, keys).tolist()
    assert np.mean([a == b for a, b in zip(cpu, want)]) == 1.0
    edge, edge_keys = _largest_hash_case()
    assert kt_cuda.keyed_argmax(edge.cuda(), _meta([0], edge_keys).cuda(), torch.ones(1, device="cuda")).tolist() == [0]


def _draft_case():
    """A drafting batch of four (keyed, unseeded, keyed, greedy) over 3 draft positions and 50 draft columns."""
    from specdec import SamplingParams

    params = [SamplingParams(temperature=0.7, seed=5), SamplingParams(temperature=0.9),
              SamplingParams(temperature=1.4, seed=2 ** 63 + 11), SamplingParams(temperature=0.0)]
    logits = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(3)) * 3
    return params, logits, [12, 3, 40, 7]


def _draft_keys_want(params, logits, n, vocab=None, target_vocab=None):
    """Each keyed row's drafts by the torch reference, over the target's ids (scattered where ``vocab`` maps)."""
    from specdec.keyed import keyed_draft_keys

    keys = keyed_draft_keys(params, n, 50 if vocab is None else vocab, target_vocab)
    full = logits if vocab is None else torch.full((*logits.shape[:2], target_vocab), float("-inf")).index_copy_(
        -1, vocab, logits)
    want = []
    for i in keys.rows:
        ks = [row_keys(params[i].seed, n[i] + j) for j in range(3)]
        ids = gumbel_row_samples(full[i], [0, 1, 2], [params[i].temperature] * 3, ks)
        want.append(ids.tolist() if vocab is None else [int((vocab == t).nonzero()) for t in ids])
    return keys, want


@pytest.mark.parametrize("mapped", [False, True])
def test_draft_keys_through_the_kernel_are_the_references(kt, monkeypatch, mapped):
    """DraftKeys.samples' kernel path (the Triton kernel that serves the target's keyed rows, interpreted here):
    every keyed row's drafts, at their positions and temperatures, as the torch reference draws them; with a
    draft vocabulary mapped into the target's, the race over the mapped ids, answered as draft columns."""
    params, logits, n = _draft_case()
    vocab = torch.randperm(90, generator=torch.Generator().manual_seed(1))[:50] if mapped else None
    keys, want = _draft_keys_want(params, logits, n, vocab, 90 if mapped else None)

    def kernel_samples(flat, rows, temps, ks):  # keyed._kernel_samples without the pinned upload (no CUDA here)
        meta = torch.tensor([rows, ks[:, 0].tolist(), ks[:, 1].tolist()], dtype=torch.long)
        return kt.keyed_argmax(flat, meta, torch.from_numpy(inverse_temperatures(temps)))

    monkeypatch.setattr(keyed, "_on_kernel", lambda t: True)
    monkeypatch.setattr(keyed, "_kernel_samples", kernel_samples)
    assert keys.samples(logits).tolist() == want
    monkeypatch.setattr(keyed, "_on_kernel", lambda t: False)  # numba's pass where installed, else torch's
    assert keys.samples(logits).tolist() == want
    monkeypatch.setattr(keyed, "KEYED_KERNEL", False)
    assert keys.samples(logits).tolist() == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mapped", [False, True])
def test_cuda_draft_keys_are_the_references(mapped):
    """On CUDA: keyed drafts through the compiled kernel, in a batch with greedy and unseeded rows (the index
    upload without a blocking copy), as the CPU's torch reference draws them."""
    pytest.importorskip("triton", reason="triton is not installed")
    from specdec.draft_sampling import sample_at_temperatures

    params, logits, n = _draft_case()
    vocab = torch.randperm(90, generator=torch.Generator().manual_seed(1))[:50] if mapped else None
    keys, want = _draft_keys_want(params, logits, n, vocab, 90 if mapped else None)
    if mapped:
        keys = dataclasses.replace(keys, vocab=vocab.cuda())
    temps = torch.tensor([p.temperature for p in params], device="cuda")
    ids, _ = sample_at_temperatures(logits.cuda(), temps, keys)
    assert ids[[0, 2]].tolist() == want and ids[3].tolist() == logits[3].argmax(-1).tolist()
